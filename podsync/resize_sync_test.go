package podsync_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// fakePodCgroups records pod cgroup writes into the runtime's call log, so a
// test sees them in order with the UpdateContainerResources calls. Its desired
// memory limit is the sum of the containers' limits.
type fakePodCgroups struct {
	log     *[]string
	current podsync.PodCgroupConfig
}

func (f *fakePodCgroups) DesiredPodCgroupConfig(pod *corev1.Pod) podsync.PodCgroupConfig {
	var mem int64
	var shares uint64
	for _, c := range pod.Spec.Containers {
		mem += c.Resources.Limits.Memory().Value()
		shares += uint64(c.Resources.Requests.Cpu().MilliValue() * 1024 / 1000)
	}
	return podsync.PodCgroupConfig{Memory: &mem, CPUShares: &shares}
}

func (f *fakePodCgroups) CurrentPodCgroupConfig(*corev1.Pod) (podsync.PodCgroupConfig, error) {
	return f.current, nil
}

func (f *fakePodCgroups) SetPodCgroupConfig(_ *corev1.Pod, cfg podsync.PodCgroupConfig) error {
	if cfg.Memory != nil {
		*f.log = append(*f.log, fmt.Sprintf("pod memory=%d", *cfg.Memory))
		f.current.Memory = cfg.Memory
	}
	if cfg.CPUShares != nil {
		*f.log = append(*f.log, fmt.Sprintf("pod shares=%d", *cfg.CPUShares))
		f.current.CPUShares = cfg.CPUShares
	}
	return nil
}

// loggingRuntime logs UpdateContainerResources into the same log as the pod
// cgroup writes.
type loggingRuntime struct {
	*podsynctest.Runtime
	log *[]string
}

func (r loggingRuntime) UpdateContainerResources(ctx context.Context, id string, res *runtimeapi.LinuxContainerResources) error {
	*r.log = append(*r.log, "UpdateContainerResources "+id)
	return r.Runtime.UpdateContainerResources(ctx, id, res)
}

func limits(mem string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(mem)},
		}
	}
}

func TestSyncPodResizeOrder(t *testing.T) {
	for _, tt := range []struct {
		name string
		to   string
		want []string
	}{
		// Growing: the pod cgroup first, so the container fits inside it.
		{name: "memory limit increase", to: "256Mi", want: []string{"pod memory=268435456", "UpdateContainerResources"}},
		// Shrinking: the container first, then the pod cgroup.
		{name: "memory limit decrease", to: "64Mi", want: []string{"UpdateContainerResources", "pod memory=67108864"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log []string
			e := newEnv(t)
			mem := int64(128 << 20)
			shares := uint64(102)
			pcg := &fakePodCgroups{log: &log, current: podsync.PodCgroupConfig{Memory: &mem, CPUShares: &shares}}
			s, err := podsync.New(podsync.Config{Runtime: loggingRuntime{e.rt, &log}, Builder: e.builder, Clock: e.clk, PodCgroups: pcg})
			require.NoError(t, err)
			e.syncer = s

			pod := newPod(limits("128Mi"))
			require.NoError(t, e.sync(pod).Error())
			app := e.running("app")
			require.Empty(t, log, "nothing resized at start")

			resized := newPod(limits(tt.to))
			res := e.sync(resized)
			require.NoError(t, res.Error())
			for i := range tt.want {
				if tt.want[i] == "UpdateContainerResources" {
					tt.want[i] += " " + app.Id
				}
			}
			assert.Equal(t, tt.want, log)
			assert.Equal(t, app.Id, e.running("app").Id, "resized in place, not restarted")

			v, err := podsync.LoadView(context.Background(), e.rt, pod.UID, nil)
			require.NoError(t, err)
			assert.False(t, e.syncer.ResizeInProgress(resized, v))
			assert.True(t, e.syncer.ResizeInProgress(newPod(limits("1Gi")), v), "a newer allocation is not actuated yet")

			// The status reports the runtime's values and the allocated requests.
			st := e.status(resized)
			require.Len(t, st.ContainerStatuses, 1)
			cs := st.ContainerStatuses[0]
			require.NotNil(t, cs.Resources)
			q := cs.Resources.Limits[corev1.ResourceMemory]
			assert.Equal(t, tt.to, q.String())
			assert.Equal(t, resized.Spec.Containers[0].Resources.Requests, cs.AllocatedResources)

			// Nothing left to do: the next sync updates nothing.
			e.rt.ResetCalls()
			require.NoError(t, e.sync(resized).Error())
			assert.NotContains(t, strings.Join(e.rt.CallNames(), " "), "UpdateContainerResources(")
		})
	}
}

func TestSyncPodResizeRestartContainer(t *testing.T) {
	e := newEnv(t)
	restart := func(p *corev1.Pod) {
		p.Spec.Containers[0].ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	}
	pod := newPod(limits("128Mi"), restart)
	require.NoError(t, e.sync(pod).Error())
	old := e.running("app")

	resized := newPod(limits("256Mi"), restart)
	require.NoError(t, e.sync(resized).Error())
	assert.NotContains(t, strings.Join(e.rt.CallNames(), " "), "UpdateContainerResources(")
	assert.NotEqual(t, old.Id, e.running("app").Id, "restarted for the resize")
	assert.Contains(t, e.events.Strings(), "Normal Killing Container app resize requires restart")
	v, err := podsync.LoadView(context.Background(), e.rt, pod.UID, nil)
	require.NoError(t, err)
	assert.False(t, e.syncer.ResizeInProgress(resized, v))
}

func TestSyncPodResizeRuntimeError(t *testing.T) {
	e := newEnv(t)
	pod := newPod(limits("128Mi"))
	require.NoError(t, e.sync(pod).Error())
	e.rt.FailNext("UpdateContainerResources", fmt.Errorf("cgroup write failed"))
	res := e.sync(newPod(limits("256Mi")))
	err := res.Error()
	require.ErrorIs(t, err, podsync.ErrResizePodInPlace)
	assert.Contains(t, podsync.Message(err), `container "app": UpdateContainerResources: cgroup write failed`)
	v, verr := podsync.LoadView(context.Background(), e.rt, pod.UID, nil)
	require.NoError(t, verr)
	assert.True(t, e.syncer.ResizeInProgress(newPod(limits("256Mi")), v), "still to do")
	// The next sync retries and succeeds.
	require.NoError(t, e.sync(newPod(limits("256Mi"))).Error())
}

// usageCgroups is fakePodCgroups with memory usage.
type usageCgroups struct {
	*fakePodCgroups
	pod, container int64
}

func (u usageCgroups) PodMemoryUsage(*corev1.Pod) (int64, error) { return u.pod, nil }
func (u usageCgroups) ContainerMemoryUsage(*corev1.Pod, string) (int64, error) {
	return u.container, nil
}

func TestSyncPodResizeRefusesLimitBelowUsage(t *testing.T) {
	var log []string
	e := newEnv(t)
	mem := int64(128 << 20)
	shares := uint64(102)
	pcg := usageCgroups{fakePodCgroups: &fakePodCgroups{log: &log, current: podsync.PodCgroupConfig{Memory: &mem, CPUShares: &shares}},
		pod: 70 << 20, container: 65 << 20}
	s, err := podsync.New(podsync.Config{Runtime: loggingRuntime{e.rt, &log}, Builder: e.builder, Clock: e.clk, PodCgroups: pcg})
	require.NoError(t, err)
	e.syncer = s
	require.NoError(t, e.sync(newPod(limits("128Mi"))).Error())

	res := e.sync(newPod(limits("64Mi")))
	err = res.Error()
	require.ErrorIs(t, err, podsync.ErrResizePodInPlace)
	assert.Equal(t, "cannot decrease memory limits: [attempting to set pod memory limit (67108864) below current usage (73400320), "+
		`attempting to set container "app" memory limit (67108864) below current usage (73400320)]`, podsync.Message(err))
	assert.Empty(t, log, "nothing changed")

	// Above usage it goes through.
	require.NoError(t, e.sync(newPod(limits("96Mi"))).Error())
	assert.Len(t, log, 2)
}

// mapActuated is an ActuatedStore an agent would persist; two Syncers sharing
// one stand for the agent before and after a restart.
type mapActuated struct {
	mu   sync.Mutex
	pods map[types.UID]map[string]corev1.ResourceRequirements
}

func (m *mapActuated) PodActuated(uid types.UID) (map[string]corev1.ResourceRequirements, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.pods[uid]
	out := map[string]corev1.ResourceRequirements{}
	for k, v := range r {
		out[k] = *v.DeepCopy()
	}
	return out, ok
}

func (m *mapActuated) SetPodActuated(uid types.UID, c map[string]corev1.ResourceRequirements) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pods[uid] = c
}

func (m *mapActuated) RemovePodActuated(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pods, uid)
}

func TestSyncPodActuatedStoreAcrossRestart(t *testing.T) {
	e := newEnv(t)
	store := &mapActuated{pods: map[types.UID]map[string]corev1.ResourceRequirements{}}
	newSyncer := func(a podsync.ActuatedStore) *podsync.Syncer {
		s, err := podsync.New(podsync.Config{Runtime: e.rt, Builder: e.builder, Clock: e.clk, Actuated: a})
		require.NoError(t, err)
		return s
	}
	e.syncer = newSyncer(store)
	pod := newPod(limits("128Mi"))
	require.NoError(t, e.sync(pod).Error())
	app := e.running("app")
	rec, ok := store.PodActuated(pod.UID)
	require.True(t, ok, "the container's creation is recorded in the store")
	q := rec["app"].Limits[corev1.ResourceMemory]
	assert.Equal(t, "128Mi", q.String())

	// The allocation moved on while the agent was down (or its actuation had not
	// run): a Syncer given the store resizes the running container...
	resized := newPod(limits("256Mi"))
	e.syncer = newSyncer(store)
	e.rt.ResetCalls()
	require.NoError(t, e.sync(resized).Error())
	assert.Contains(t, e.rt.CallNames(), "UpdateContainerResources("+app.Id+")")
	assert.Equal(t, app.Id, e.running("app").Id, "resized in place")
	rec, _ = store.PodActuated(pod.UID)
	q = rec["app"].Limits[corev1.ResourceMemory]
	assert.Equal(t, "256Mi", q.String())

	// ...while one keeping its record in memory takes the allocation as actuated.
	e.syncer = newSyncer(nil)
	e.rt.ResetCalls()
	require.NoError(t, e.sync(newPod(limits("512Mi"))).Error())
	assert.NotContains(t, e.rt.CallNames(), "UpdateContainerResources("+app.Id+")")

	// Removing the pod removes its record.
	e.syncer = newSyncer(store)
	require.NoError(t, e.syncer.RemovePod(context.Background(), pod.UID))
	_, ok = store.PodActuated(pod.UID)
	assert.False(t, ok)
}
