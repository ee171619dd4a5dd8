package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"
)

const mi = 1 << 20

func u64(v uint64) *uint64 { return &v }

// fakeEvictionStats serves a summary the test edits between rounds.
type fakeEvictionStats struct {
	sum       *statsapi.Summary
	dedicated bool
}

func (f *fakeEvictionStats) summary(context.Context, []*corev1.Pod) (*statsapi.Summary, error) {
	return f.sum, nil
}
func (f *fakeEvictionStats) dedicatedImageFs(context.Context) (bool, error) { return f.dedicated, nil }

// fakeEvictionPods records evictions and applies their status to a copy.
type fakeEvictionPods struct {
	pods    []*corev1.Pod
	evicted []*corev1.Pod
	grace   []int64
	status  map[types.UID]*corev1.PodStatus
}

func (f *fakeEvictionPods) evictionCandidates() []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range f.pods {
		if _, gone := f.status[p.UID]; !gone {
			out = append(out, p)
		}
	}
	return out
}

func (f *fakeEvictionPods) evictPod(pod *corev1.Pod, grace int64, apply func(*corev1.PodStatus)) (<-chan struct{}, bool) {
	st := &corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	apply(st)
	if f.status == nil {
		f.status = map[types.UID]*corev1.PodStatus{}
	}
	f.status[pod.UID] = st
	f.evicted = append(f.evicted, pod)
	f.grace = append(f.grace, grace)
	done := make(chan struct{})
	close(done)
	return done, true
}

func testPod(name string, requests corev1.ResourceList, limits corev1.ResourceList) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), Generation: 3},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "main", Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits},
		}}},
	}
}

func memList(q string) corev1.ResourceList {
	return corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(q)}
}

func podMemStats(pod *corev1.Pod, workingSet uint64) statsapi.PodStats {
	return statsapi.PodStats{
		PodRef:     statsapi.PodReference{Name: pod.Name, Namespace: pod.Namespace, UID: string(pod.UID)},
		Memory:     &statsapi.MemoryStats{WorkingSetBytes: u64(workingSet)},
		Containers: []statsapi.ContainerStats{{Name: "main", Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(workingSet)}}},
	}
}

func nodeSummary(memAvailable uint64, at time.Time, pods ...statsapi.PodStats) *statsapi.Summary {
	return &statsapi.Summary{
		Node: statsapi.NodeStats{
			Memory: &statsapi.MemoryStats{Time: metav1.NewTime(at), AvailableBytes: u64(memAvailable), WorkingSetBytes: u64(1024 * mi)},
			Fs:     &statsapi.FsStats{Time: metav1.NewTime(at), AvailableBytes: u64(50 << 30), CapacityBytes: u64(100 << 30), InodesFree: u64(1e6), Inodes: u64(2e6)},
		},
		Pods: pods,
	}
}

func newTestEvictionManager(t *testing.T, hard, soft, grace map[string]string, clk *clocktesting.FakeClock, st *fakeEvictionStats, pods *fakeEvictionPods) (*evictionManager, *record.FakeRecorder) {
	t.Helper()
	ts, err := parseEvictionConfig(hard, soft, grace, nil, []string{"pods"})
	require.NoError(t, err)
	rec := record.NewFakeRecorder(50)
	m := newEvictionManager(evictionConfig{thresholds: ts, pressureTransitionPeriod: 5 * time.Minute, maxPodGracePeriod: 30, localStorage: true},
		clk, rec, &corev1.ObjectReference{Kind: "Node", Name: "n1", UID: "n1"})
	m.stats, m.pods = st, pods
	return m, rec
}

func events(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestParseEvictionConfig(t *testing.T) {
	ts, err := parseEvictionConfig(
		map[string]string{"memory.available": "100Mi", "nodefs.available": "10%", "imagefs.available": "0%"},
		map[string]string{"memory.available": "300Mi"},
		map[string]string{"memory.available": "30s"},
		map[string]string{"memory.available": "50Mi"},
		[]string{"pods"})
	require.NoError(t, err)
	var got []string
	for _, th := range ts {
		got = append(got, fmt.Sprintf("%s<%s grace=%s reclaim=%v", th.signal, th.value, th.gracePeriod, th.minReclaim != nil))
	}
	// 0% is ignored; the hard memory threshold is copied for the pods cgroup.
	assert.Equal(t, []string{
		"memory.available<100Mi grace=0s reclaim=true",
		"nodefs.available<10% grace=0s reclaim=false",
		"memory.available<300Mi grace=30s reclaim=true",
		"allocatableMemory.available<100Mi grace=0s reclaim=true",
	}, got)

	for name, tc := range map[string]struct {
		hard, soft, grace, reclaim map[string]string
		want                       string
	}{
		"unknown signal":     {hard: map[string]string{"memory.free": "1Mi"}, want: `evictionHard["memory.free"]: unsupported eviction signal memory.free`},
		"negative quantity":  {hard: map[string]string{"memory.available": "-1Mi"}, want: `evictionHard["memory.available"]: eviction threshold memory.available must be positive`},
		"over 100%":          {hard: map[string]string{"nodefs.available": "120%"}, want: `must be <= 100%`},
		"soft without grace": {soft: map[string]string{"memory.available": "1Gi"}, want: `evictionSoft["memory.available"]: grace period must be specified`},
		"bad grace":          {soft: map[string]string{"memory.available": "1Gi"}, grace: map[string]string{"memory.available": "soon"}, want: `evictionSoftGracePeriod["memory.available"]`},
		"bad reclaim":        {reclaim: map[string]string{"nodefs.available": "0%"}, want: `evictionMinimumReclaim["nodefs.available"]`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseEvictionConfig(tc.hard, tc.soft, tc.grace, tc.reclaim, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// A hard memory threshold: the condition appears, the BestEffort pod goes first
// with the kubelet's message, status, condition and events, one pod per round,
// and the condition stays for the transition period after the pressure ends.
func TestEvictionHardMemory(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	guaranteed := testPod("guaranteed", memList("200Mi"), memList("200Mi"))
	burstable := testPod("burstable", memList("100Mi"), nil)
	bestEffort := testPod("besteffort", nil, nil)
	pods := &fakeEvictionPods{pods: []*corev1.Pod{guaranteed, burstable, bestEffort}}
	st := &fakeEvictionStats{sum: nodeSummary(50*mi, clk.Now(),
		podMemStats(guaranteed, 150*mi), podMemStats(burstable, 80*mi), podMemStats(bestEffort, 10*mi))}
	m, rec := newTestEvictionManager(t, map[string]string{"memory.available": "100Mi"}, nil, nil, clk, st, pods)

	evicted := m.synchronize(context.Background())
	require.Len(t, evicted, 1)
	assert.Equal(t, "besteffort", evicted[0].pod.Name, "the only pod above its request goes first")
	assert.Equal(t, []int64{1}, pods.grace, "hard thresholds evict with the immediate grace period")
	msg := "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container main was using 10Mi, request is 0, has larger consumption of memory. "
	annotations := " map[offending_containers:main offending_containers_usage:10Mi starved_resource:memory]"
	stBE := pods.status[bestEffort.UID]
	assert.Equal(t, corev1.PodFailed, stBE.Phase)
	assert.Equal(t, "Evicted", stBE.Reason)
	assert.Equal(t, msg, stBE.Message)
	require.Len(t, stBE.Conditions, 2)
	assert.Equal(t, corev1.PodCondition{
		Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "TerminationByKubelet", Message: msg,
		ObservedGeneration: 3, LastTransitionTime: metav1.NewTime(clk.Now()),
	}, stBE.Conditions[1])
	assert.Equal(t, []string{
		"Warning EvictionThresholdMet Attempting to reclaim memory",
		"Warning Evicted " + msg + annotations,
	}, events(rec))
	assert.Equal(t, pressures{memory: true}, m.pressures())
	reason, amsg, ok := m.admit(testPod("new-besteffort", nil, nil))
	assert.False(t, ok)
	assert.Equal(t, "Evicted", reason)
	assert.Equal(t, "The node had condition: [MemoryPressure]. ", amsg)
	_, _, ok = m.admit(testPod("new-burstable", memList("1Mi"), nil))
	assert.True(t, ok, "only BestEffort pods are refused under memory pressure alone")

	// Same stats time: the kubelet does not act twice on one observation.
	assert.Empty(t, m.synchronize(context.Background()))

	// Next round, still low: neither pod exceeds its request and both have the same
	// priority, so usage above request decides.
	clk.Step(10 * time.Second)
	st.sum = nodeSummary(60*mi, clk.Now(), podMemStats(guaranteed, 150*mi), podMemStats(burstable, 80*mi))
	evicted = m.synchronize(context.Background())
	require.Len(t, evicted, 1)
	assert.Equal(t, "burstable", evicted[0].pod.Name, "80Mi-100Mi is larger than 150Mi-200Mi")

	// Pressure gone: no eviction, but the condition stays for the transition period.
	clk.Step(10 * time.Second)
	st.sum = nodeSummary(2048*mi, clk.Now(), podMemStats(guaranteed, 150*mi))
	assert.Empty(t, m.synchronize(context.Background()))
	assert.Equal(t, pressures{memory: true}, m.pressures())
	clk.Step(5 * time.Minute)
	st.sum = nodeSummary(2048*mi, clk.Now(), podMemStats(guaranteed, 150*mi))
	assert.Empty(t, m.synchronize(context.Background()))
	assert.Equal(t, pressures{}, m.pressures())
	_, _, ok = m.admit(testPod("later", nil, nil))
	assert.True(t, ok)
	assert.Len(t, pods.evicted, 2, "the Guaranteed pod stays")
}

// A soft threshold evicts only after its grace period, with the pod's own grace
// capped by evictionMaxPodGracePeriod, and without one when it clears before.
func TestEvictionSoftGracePeriod(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	pod := testPod("p", nil, nil)
	pod.Spec.TerminationGracePeriodSeconds = new(int64)
	*pod.Spec.TerminationGracePeriodSeconds = 60
	pods := &fakeEvictionPods{pods: []*corev1.Pod{pod}}
	st := &fakeEvictionStats{sum: nodeSummary(400*mi, clk.Now(), podMemStats(pod, 10*mi))}
	m, _ := newTestEvictionManager(t, nil, map[string]string{"memory.available": "500Mi"}, map[string]string{"memory.available": "30s"}, clk, st, pods)

	assert.Empty(t, m.synchronize(context.Background()))
	assert.Equal(t, pressures{memory: true}, m.pressures(), "the condition does not wait for the grace period")
	clk.Step(20 * time.Second)
	st.sum = nodeSummary(400*mi, clk.Now(), podMemStats(pod, 10*mi))
	assert.Empty(t, m.synchronize(context.Background()))
	clk.Step(10 * time.Second)
	st.sum = nodeSummary(400*mi, clk.Now(), podMemStats(pod, 10*mi))
	evicted := m.synchronize(context.Background())
	require.Len(t, evicted, 1)
	assert.Equal(t, []int64{30}, pods.grace, "min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds)")

	// Cleared before the grace period: the clock starts again.
	clk2 := clocktesting.NewFakeClock(clk.Now())
	pods2 := &fakeEvictionPods{pods: []*corev1.Pod{pod}}
	st2 := &fakeEvictionStats{sum: nodeSummary(400*mi, clk2.Now(), podMemStats(pod, 10*mi))}
	m2, _ := newTestEvictionManager(t, nil, map[string]string{"memory.available": "500Mi"}, map[string]string{"memory.available": "30s"}, clk2, st2, pods2)
	m2.synchronize(context.Background())
	clk2.Step(20 * time.Second)
	st2.sum = nodeSummary(900*mi, clk2.Now(), podMemStats(pod, 10*mi))
	m2.synchronize(context.Background())
	clk2.Step(20 * time.Second)
	st2.sum = nodeSummary(400*mi, clk2.Now(), podMemStats(pod, 10*mi))
	assert.Empty(t, m2.synchronize(context.Background()))
	assert.Empty(t, pods2.evicted)
}

// evictionMinimumReclaim keeps a met threshold met until that much more is free.
func TestEvictionMinimumReclaim(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	a, b := testPod("a", nil, nil), testPod("b", nil, nil)
	pods := &fakeEvictionPods{pods: []*corev1.Pod{a, b}}
	st := &fakeEvictionStats{sum: nodeSummary(90*mi, clk.Now(), podMemStats(a, 20*mi), podMemStats(b, 10*mi))}
	ts, err := parseEvictionConfig(map[string]string{"memory.available": "100Mi"}, nil, nil, map[string]string{"memory.available": "500Mi"}, nil)
	require.NoError(t, err)
	m := newEvictionManager(evictionConfig{thresholds: ts, pressureTransitionPeriod: time.Minute}, clk, nil, nil)
	m.stats, m.pods = st, pods
	require.Len(t, m.synchronize(context.Background()), 1)
	assert.Equal(t, "a", pods.evicted[0].Name, "the larger user goes first")
	clk.Step(10 * time.Second)
	st.sum = nodeSummary(300*mi, clk.Now(), podMemStats(b, 10*mi))
	require.Len(t, m.synchronize(context.Background()), 1, "300Mi free is above 100Mi but below 100Mi+500Mi")
	clk.Step(10 * time.Second)
	st.sum = nodeSummary(700*mi, clk.Now())
	assert.Empty(t, m.synchronize(context.Background()))
}

func TestRankMemoryPressure(t *testing.T) {
	low, high := int32(0), int32(1000)
	over := testPod("over", memList("10Mi"), nil)  // 50Mi over
	under := testPod("under", memList("1Gi"), nil) // under
	overHigh := testPod("over-high", memList("10Mi"), nil)
	overHigh.Spec.Priority = &high
	over.Spec.Priority = &low
	noStats := testPod("nostats", memList("1Gi"), nil)
	stats := statsByUID([]statsapi.PodStats{podMemStats(over, 60*mi), podMemStats(under, 100*mi), podMemStats(overHigh, 500*mi)})
	pods := []*corev1.Pod{under, overHigh, over, noStats}
	rankMemoryPressure(pods, stats)
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	// No stats first; then over request by priority (low first) whatever the usage.
	assert.Equal(t, []string{"nostats", "over", "over-high", "under"}, names)
}

func TestRankDiskPressure(t *testing.T) {
	mk := func(p *corev1.Pod, rootfs, logs, vol uint64) statsapi.PodStats {
		return statsapi.PodStats{
			PodRef: statsapi.PodReference{UID: string(p.UID)},
			Containers: []statsapi.ContainerStats{{Name: "main",
				Rootfs: &statsapi.FsStats{UsedBytes: u64(rootfs)}, Logs: &statsapi.FsStats{UsedBytes: u64(logs)}}},
			VolumeStats: []statsapi.VolumeStats{{Name: "scratch", FsStats: statsapi.FsStats{UsedBytes: u64(vol)}}},
		}
	}
	withVol := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		return p
	}
	a := withVol(testPod("a", corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("1Gi")}, nil))
	b := withVol(testPod("b", nil, nil))
	c := withVol(testPod("c", nil, nil))
	stats := statsByUID([]statsapi.PodStats{mk(a, 500*mi, 0, 100*mi), mk(b, mi, mi, 5*mi), mk(c, 10*mi, 0, 50*mi)})
	rank, ok := rankFuncFor(signalNodeFsAvailable, false)
	require.True(t, ok)
	pods := []*corev1.Pod{a, b, c}
	rank(pods, stats)
	assert.Equal(t, []string{"c", "b", "a"}, []string{pods[0].Name, pods[1].Name, pods[2].Name})
	// With a dedicated image file system nodefs ranks by logs and volumes only.
	rank, _ = rankFuncFor(signalNodeFsAvailable, true)
	stats = statsByUID([]statsapi.PodStats{mk(b, 900*mi, mi, 5*mi), mk(c, 0, 0, 50*mi)})
	pods = []*corev1.Pod{b, c}
	rank(pods, stats)
	assert.Equal(t, "c", pods[0].Name)
}

// Local storage limits: emptyDir sizeLimit, the pod's total limit, a container's
// limit, each with the kubelet's message, no DisruptionTarget condition, and no
// threshold needed.
func TestEvictionLocalStorage(t *testing.T) {
	storage := func(q string) corev1.ResourceList {
		return corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse(q)}
	}
	emptyDir := testPod("emptydir", nil, nil)
	emptyDir.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrTo(resource.MustParse("4Mi"))}}}}
	podLimit := testPod("podlimit", nil, storage("10Mi"))
	podLimit.Spec.Containers = append(podLimit.Spec.Containers, corev1.Container{Name: "side", Resources: corev1.ResourceRequirements{Limits: storage("10Mi")}})
	ctrLimit := testPod("ctrlimit", nil, storage("30Mi"))
	ctrLimit.Spec.Containers = append(ctrLimit.Spec.Containers, corev1.Container{Name: "side", Resources: corev1.ResourceRequirements{Limits: storage("100Mi")}})
	fine := testPod("fine", nil, storage("1Gi"))
	fine.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptrTo(resource.MustParse("4Mi"))}}}}

	clk := clocktesting.NewFakeClock(time.Now())
	ps := func(p *corev1.Pod, vol, eph uint64, ctr ...statsapi.ContainerStats) statsapi.PodStats {
		return statsapi.PodStats{PodRef: statsapi.PodReference{UID: string(p.UID)}, Containers: ctr,
			VolumeStats:      []statsapi.VolumeStats{{Name: "scratch", FsStats: statsapi.FsStats{UsedBytes: u64(vol)}}},
			EphemeralStorage: &statsapi.FsStats{UsedBytes: u64(eph)}}
	}
	ctr := func(name string, rootfs, logs uint64) statsapi.ContainerStats {
		return statsapi.ContainerStats{Name: name, Rootfs: &statsapi.FsStats{UsedBytes: u64(rootfs)}, Logs: &statsapi.FsStats{UsedBytes: u64(logs)}}
	}
	pods := &fakeEvictionPods{pods: []*corev1.Pod{emptyDir, podLimit, ctrLimit, fine}}
	st := &fakeEvictionStats{sum: nodeSummary(10<<30, clk.Now(),
		ps(emptyDir, 8*mi, 8*mi), ps(podLimit, 0, 25*mi, ctr("main", 12*mi, 0), ctr("side", mi, 0)),
		ps(ctrLimit, 0, 31*mi, ctr("main", 25*mi, 6*mi), ctr("side", 0, 0)), ps(fine, 4*mi, 4*mi))}
	m, rec := newTestEvictionManager(t, nil, nil, nil, clk, st, pods)
	evicted := m.synchronize(context.Background())
	require.Len(t, evicted, 3)
	msgs := map[string]string{}
	for name, s := range map[string]*corev1.PodStatus{"emptydir": pods.status[emptyDir.UID], "podlimit": pods.status[podLimit.UID], "ctrlimit": pods.status[ctrLimit.UID]} {
		require.NotNil(t, s, name)
		assert.Equal(t, corev1.PodFailed, s.Phase)
		assert.Equal(t, "Evicted", s.Reason)
		assert.Len(t, s.Conditions, 1, "no DisruptionTarget for a limit eviction")
		msgs[name] = s.Message
	}
	assert.Equal(t, map[string]string{
		"emptydir": `Usage of EmptyDir volume "scratch" exceeds the limit "4Mi". `,
		"podlimit": "Pod ephemeral local storage usage exceeds the total limit of containers 20Mi. ",
		"ctrlimit": `Container main exceeded its local ephemeral storage limit "30Mi". `,
	}, msgs)
	assert.Equal(t, []int64{1, 1, 1}, pods.grace)
	assert.Len(t, events(rec), 3)
}

// Critical pods are never evicted and always admitted; other pressures refuse
// every other pod; a BestEffort pod tolerating the memory-pressure taint passes.
func TestEvictionCriticalAndAdmission(t *testing.T) {
	critical := testPod("critical", nil, nil)
	prio := int32(systemCriticalPriority)
	critical.Spec.Priority = &prio
	static := testPod("static", nil, nil)
	static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	assert.True(t, isCriticalPod(critical))
	assert.True(t, isCriticalPod(static))
	assert.False(t, isCriticalPod(testPod("plain", nil, nil)))

	clk := clocktesting.NewFakeClock(time.Now())
	pods := &fakeEvictionPods{pods: []*corev1.Pod{critical}}
	st := &fakeEvictionStats{sum: nodeSummary(mi, clk.Now(), podMemStats(critical, 500*mi))}
	m, _ := newTestEvictionManager(t, map[string]string{"memory.available": "100Mi"}, nil, nil, clk, st, pods)
	assert.Empty(t, m.synchronize(context.Background()))
	assert.Empty(t, pods.evicted)

	tolerant := testPod("tolerant", nil, nil)
	tolerant.Spec.Tolerations = []corev1.Toleration{{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	_, _, ok := evictionAdmit([]corev1.NodeConditionType{corev1.NodeMemoryPressure}, tolerant)
	assert.True(t, ok)
	reason, msg, ok := evictionAdmit([]corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure}, testPod("g", memList("1Mi"), memList("1Mi")))
	assert.False(t, ok)
	assert.Equal(t, "Evicted", reason)
	assert.Equal(t, "The node had condition: [MemoryPressure DiskPressure]. ", msg)
	_, _, ok = evictionAdmit([]corev1.NodeConditionType{corev1.NodeDiskPressure}, critical)
	assert.True(t, ok)
}

// Disk and PID signals from the summary, and the pods cgroup for
// allocatableMemory.available; percentages against each signal's capacity.
func TestEvictionObservationsAndConditions(t *testing.T) {
	now := time.Now()
	sum := &statsapi.Summary{Node: statsapi.NodeStats{
		Memory: &statsapi.MemoryStats{AvailableBytes: u64(8 << 30), WorkingSetBytes: u64(8 << 30)},
		SystemContainers: []statsapi.ContainerStats{{Name: "pods",
			Memory: &statsapi.MemoryStats{AvailableBytes: u64(50 * mi), WorkingSetBytes: u64(350 * mi)}}},
		Fs:      &statsapi.FsStats{AvailableBytes: u64(13 << 30), CapacityBytes: u64(100 << 30), InodesFree: u64(900), Inodes: u64(1000)},
		Runtime: &statsapi.RuntimeStats{ImageFs: &statsapi.FsStats{AvailableBytes: u64(13 << 30), CapacityBytes: u64(100 << 30)}},
		Rlimit:  &statsapi.RlimitStats{MaxPID: ptrTo(int64(1000)), NumOfRunningProcesses: ptrTo(int64(950))},
	}}
	obs := makeObservations(sum)
	assert.Equal(t, "16Gi", obs[signalMemoryAvailable].capacity.String())
	assert.Equal(t, "400Mi", obs[signalAllocatableMemoryAvailable].capacity.String())
	assert.Equal(t, "50", obs[signalPIDAvailable].available.String())
	ts, err := parseEvictionConfig(map[string]string{
		"memory.available": "100Mi", "nodefs.available": "10%", "imagefs.available": "15%", "pid.available": "10%",
	}, nil, nil, nil, []string{"pods"})
	require.NoError(t, err)
	var s evictionState
	met := s.step(evictionConfig{thresholds: ts, pressureTransitionPeriod: time.Minute}, obs, now)
	var signals []string
	for _, m := range met {
		signals = append(signals, string(m.signal))
	}
	assert.ElementsMatch(t, []string{"imagefs.available", "pid.available", "allocatableMemory.available"}, signals)
	assert.Equal(t, []corev1.NodeConditionType{corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure}, s.conditions)
	target, res, ok := reclaimTarget(met)
	require.True(t, ok)
	assert.Equal(t, signalAllocatableMemoryAvailable, target.signal, "memory first")
	assert.Equal(t, corev1.ResourceMemory, res)
}

// The node status reads its pressure conditions from the eviction manager.
func TestNodePressureFromEvictionManager(t *testing.T) {
	m := newEvictionManager(evictionConfig{}, clocktesting.NewFakeClock(time.Now()), nil, nil)
	m.state.conditions = []corev1.NodeConditionType{corev1.NodeDiskPressure}
	n := &nodeStatus{eviction: m}
	assert.Equal(t, pressures{disk: true}, n.pressure())
	assert.True(t, strings.HasPrefix(fmt.Sprintf(nodeConditionMessageFmt, m.conditions()), "The node had condition: [DiskPressure]"))
}

func ptrTo[T any](v T) *T { return &v }

// The pods cgroup's memory as cAdvisor computes it: working set = usage -
// inactive file, available = limit - working set; no figures without a limit.
func TestAllocatableMemoryFromCgroup(t *testing.T) {
	for _, v2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("v2=%v", v2), func(t *testing.T) {
			root := t.TempDir()
			c := &podCgroups{root: "/nk/kubepods", perQOS: true, v2: v2, mountRoot: root}
			dir := filepath.Join(root, "memory", "nk", "kubepods")
			files := map[string]string{"memory.usage_in_bytes": "314572800\n", "memory.limit_in_bytes": "419430400\n", "memory.stat": "cache 1\ntotal_inactive_file 52428800\n"}
			if v2 {
				dir = filepath.Join(root, "nk", "kubepods")
				files = map[string]string{"memory.current": "314572800\n", "memory.max": "419430400\n", "memory.stat": "anon 1\ninactive_file 52428800\n"}
			}
			require.NoError(t, os.MkdirAll(dir, 0o755))
			for k, v := range files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644))
			}
			mem, err := c.allocatableMemory()
			require.NoError(t, err)
			require.NotNil(t, mem)
			assert.Equal(t, uint64(250*mi), *mem.WorkingSetBytes)
			assert.Equal(t, uint64(150*mi), *mem.AvailableBytes)
			unlimited := "9223372036854771712\n"
			name := "memory.limit_in_bytes"
			if v2 {
				unlimited, name = "max\n", "memory.max"
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(unlimited), 0o644))
			mem, err = c.allocatableMemory()
			require.NoError(t, err)
			assert.Nil(t, mem)
		})
	}
}

// emptyDir usage is du's: allocated blocks, counted in the pod's ephemeral
// storage for disk-backed volumes only.
func TestEmptyDirStats(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "scratch", "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "scratch", "sub", "f"), make([]byte, 3*mi), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "mem"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "mem", "f"), make([]byte, mi), 0o644))
	pod := testPod("p", nil, nil)
	pod.Spec.Volumes = []corev1.Volume{
		{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: "mem", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}},
		{Name: "missing", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
	ps := statsapi.PodStats{EphemeralStorage: &statsapi.FsStats{UsedBytes: u64(mi)}}
	addEmptyDirStats(&ps, pod, dir)
	require.Len(t, ps.VolumeStats, 2)
	assert.Equal(t, "scratch", ps.VolumeStats[0].Name)
	assert.GreaterOrEqual(t, *ps.VolumeStats[0].UsedBytes, uint64(3*mi))
	assert.Equal(t, uint64(3), *ps.VolumeStats[0].InodesUsed, "the folder, sub and f")
	assert.Equal(t, mi+*ps.VolumeStats[0].UsedBytes, *ps.EphemeralStorage.UsedBytes, "the memory-backed volume is not ephemeral storage")
}

func TestContainerFsThresholds(t *testing.T) {
	ts, err := parseEvictionConfig(map[string]string{"nodefs.available": "10%", "imagefs.available": "15%", "containerfs.available": "50%"}, nil, nil, nil, nil)
	require.NoError(t, err)
	describe := func(ts []evictionThreshold) []string {
		var out []string
		for _, t := range ts {
			out = append(out, fmt.Sprintf("%s<%s", t.signal, t.value))
		}
		return out
	}
	assert.Equal(t, []string{"imagefs.available<15%", "nodefs.available<10%", "containerfs.available<10%"}, describe(withContainerFsThresholds(ts, false)))
	assert.Equal(t, []string{"imagefs.available<15%", "nodefs.available<10%", "containerfs.available<15%"}, describe(withContainerFsThresholds(ts, true)))
}

// The pod manager's side: the eviction admit handler runs first in admit, an
// eviction wakes the pod's worker once, and a pod being evicted is no longer a
// candidate.
func TestPodManagerEvictionHooks(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	em := newEvictionManager(evictionConfig{}, clocktesting.NewFakeClock(time.Now()), nil, nil)
	em.state.conditions = []corev1.NodeConditionType{corev1.NodeMemoryPressure}
	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[types.UID]*podEntry{}, eviction: em, sysctls: &sysctlAllowlist{}}
	reason, msg, ok := m.admit(testPod("be", nil, nil))
	assert.False(t, ok)
	assert.Equal(t, "Evicted", reason)
	assert.Equal(t, "The node had condition: [MemoryPressure]. ", msg)

	a, b := testPod("a", memList("1Mi"), nil), testPod("b", memList("1Mi"), nil)
	for _, p := range []*corev1.Pod{a, b} {
		m.pods[p.UID] = &podEntry{pod: p, admitted: true, wake: make(chan struct{}, 1)}
	}
	assert.Len(t, m.evictionCandidates(), 2)
	done, ok := m.evictPod(a, 1, func(*corev1.PodStatus) {})
	require.True(t, ok)
	require.NotNil(t, done)
	again, _ := m.evictPod(a, 1, func(*corev1.PodStatus) {})
	assert.Equal(t, done, again, "one eviction per pod")
	assert.Len(t, m.pods[a.UID].wake, 1, "the worker is woken")
	require.Len(t, m.evictionCandidates(), 1)
	assert.Equal(t, "b", m.evictionCandidates()[0].Name)
	assert.NotNil(t, m.evicting(m.pods[a.UID]))
	_, ok = m.evictPod(testPod("unknown", nil, nil), 1, func(*corev1.PodStatus) {})
	assert.False(t, ok)
}

// The message and event annotations for memory, with a pod-level request
// (PodLevelResources, beta and on in 1.37) and two containers of which one is
// over its request.
func TestEvictionMessageAnnotations(t *testing.T) {
	pod := testPod("web", memList("10Mi"), nil)
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side", Resources: corev1.ResourceRequirements{Requests: memList("100Mi")}})
	pod.Spec.Resources = &corev1.ResourceRequirements{Requests: memList("64Mi")}
	ps := statsapi.PodStats{
		PodRef: statsapi.PodReference{UID: string(pod.UID)},
		Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(80 * mi)},
		Containers: []statsapi.ContainerStats{
			{Name: "main", Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(30 * mi)}},
			{Name: "side", Memory: &statsapi.MemoryStats{WorkingSetBytes: u64(50 * mi)}},
		},
	}
	ts, err := parseEvictionConfig(map[string]string{"memory.available": "10%"}, nil, nil, nil, nil)
	require.NoError(t, err)
	obs := signalObservations{signalMemoryAvailable: {available: resource.NewQuantity(500*mi, resource.BinarySI), capacity: resource.NewQuantity(8<<30, resource.BinarySI)}}
	msg, ann := evictionMessage(corev1.ResourceMemory, pod, statsByUID([]statsapi.PodStats{ps}), ts, obs)
	assert.Equal(t, "The node was low on resource: memory. Threshold quantity: 858993472, available: 500Mi. "+
		"Pod web was using 80Mi, request is 64Mi, has larger consumption of memory. "+
		"Container main was using 30Mi, request is 10Mi, has larger consumption of memory. ", msg)
	assert.Equal(t, map[string]string{
		"offending_pod": "web", "offending_pod_usage": "80Mi",
		"offending_containers": "main", "offending_containers_usage": "30Mi", "starved_resource": "memory",
	}, ann)
}
