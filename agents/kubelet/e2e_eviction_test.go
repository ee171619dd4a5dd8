package main_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// testEvictionHard are the hard eviction thresholds of the real-node tests: the
// kubelet's memory.available default, and the disk signals off ("0%" is ignored),
// as kind configures its nodes. The test nodes share the machine's one disk, and
// shared build machines often have less than the default 15% of it free
// (imagefs.available), which puts every node under DiskPressure: pods refused at
// admission and evicted, as an upstream kubelet would do there. Tests about
// pressure set evictionHard themselves.
const testEvictionHard = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"0%\"\n  nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n  imagefs.inodesFree: \"0%\"\n"

// withTestEvictionHard appends testEvictionHard to a node's KubeletConfiguration
// unless it sets evictionHard itself.
func withTestEvictionHard(cfg string) string {
	if strings.Contains(cfg, "\nevictionHard:") {
		return cfg
	}
	return cfg + testEvictionHard
}

// memTotal is the machine's MemTotal in bytes.
func memTotal(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	require.NoError(t, err)
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			require.NoError(t, err)
			return kb * 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

// TestKubeletEviction runs node-pressure eviction for real, without pressing on
// the machine: systemReserved leaves the node's pods cgroup 400Mi, and the hard
// memory.available threshold of 300Mi becomes, as upstream, an
// allocatableMemory.available threshold on that cgroup. A pod writing 160Mi into
// two memory-backed emptyDirs (tmpfs pages are charged to it) takes what is
// available under 300Mi: the kubelet evicts it, the Guaranteed pod stays, and a
// BestEffort pod created meanwhile is refused. The machine's own free memory
// (gigabytes, moving with whatever else runs) plays no part. Before that, a pod
// writing 8Mi into a 4Mi emptyDir is evicted for its sizeLimit.
func TestKubeletEviction(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{})
	extra := fmt.Sprintf("systemReserved:\n  memory: \"%d\"\nevictionHard:\n  memory.available: 300Mi\nevictionPressureTransitionPeriod: 60s\n",
		memTotal(t)-400<<20)
	n := startNodeWithConfig(t, cp, "nk-evict", true, extra)
	image := n.ctd.BusyboxImage()
	node := n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	alloc := node.Status.Allocatable[corev1.ResourceMemory]
	assert.Equal(t, "100Mi", alloc.String(), "400Mi left by systemReserved, less the 300Mi threshold")
	ctx := context.Background()

	burstable := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Mi")}
		return p
	}
	evicted := func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed && p.Status.Reason == "Evicted" }
	eventMessages := func(pod, reason string) []string {
		evs, err := n.admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			"involvedObject.name": pod, "reason": reason}.String()})
		require.NoError(t, err)
		var out []string
		for _, e := range evs.Items {
			out = append(out, e.Type+" "+e.Message)
		}
		return out
	}

	t.Run("emptyDir over its sizeLimit", func(t *testing.T) {
		p := burstable(busyboxPod("scratch", image, corev1.RestartPolicyAlways,
			"dd if=/dev/zero of=/scratch/f bs=1M count=8 && sync && sleep 3600"))
		limit := resource.MustParse("4Mi")
		p.Spec.Volumes = []corev1.Volume{{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &limit}}}}
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/scratch"}}
		start := time.Now()
		n.createPod(t, p)
		got := n.waitPod(t, "scratch", 90*time.Second, "evicted", evicted)
		t.Logf("scratch evicted %s after its creation", time.Since(start).Round(100*time.Millisecond))
		msg := `Usage of EmptyDir volume "scratch" exceeds the limit "4Mi". `
		assert.Equal(t, msg, got.Status.Message)
		for _, c := range got.Status.Conditions {
			assert.NotEqual(t, corev1.DisruptionTarget, c.Type, "a limit eviction sets no DisruptionTarget")
		}
		require.Len(t, got.Status.ContainerStatuses, 1)
		assert.NotNil(t, got.Status.ContainerStatuses[0].State.Terminated, "%+v", got.Status.ContainerStatuses[0].State)
		eventually(t, 10*time.Second, "the Evicted event", func() (bool, string) {
			evs := eventMessages("scratch", "Evicted")
			return len(evs) == 1 && evs[0] == "Warning "+msg, fmt.Sprint(evs)
		})
	})

	t.Run("container over its ephemeral-storage limit", func(t *testing.T) {
		// Written to the container's writable layer (CRI ContainerStats
		// writable_layer) plus its log, against the container's own limit.
		p := burstable(busyboxPod("layer", image, corev1.RestartPolicyAlways,
			"dd if=/dev/zero of=/big bs=1M count=8 && sync && sleep 3600"))
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("4Mi")}
		start := time.Now()
		n.createPod(t, p)
		got := n.waitPod(t, "layer", 90*time.Second, "evicted", evicted)
		t.Logf("layer evicted %s after its creation", time.Since(start).Round(100*time.Millisecond))
		// The pod's limit is its only container's, so the pod-level check (which
		// comes first, as upstream) is the one that fires.
		assert.Equal(t, "Pod ephemeral local storage usage exceeds the total limit of containers 4Mi. ", got.Status.Message)
	})

	t.Run("memory pressure evicts the pod over its request", func(t *testing.T) {
		steady := busyboxPod("steady", image, corev1.RestartPolicyAlways, "sleep 3600")
		steady.Spec.Containers[0].Resources = corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("20Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("20Mi")},
		}
		n.createPod(t, steady)
		n.waitPod(t, "steady", 60*time.Second, "running", podReady)

		hog := burstable(busyboxPod("hog", image, corev1.RestartPolicyAlways,
			"dd if=/dev/zero of=/a/f bs=1M count=80 && dd if=/dev/zero of=/b/f bs=1M count=80 && sleep 3600"))
		hog.Spec.Containers[0].Name = "hog"
		for _, v := range []string{"a", "b"} {
			hog.Spec.Volumes = append(hog.Spec.Volumes, corev1.Volume{Name: v, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
			hog.Spec.Containers[0].VolumeMounts = append(hog.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: v, MountPath: "/" + v})
		}
		start := time.Now()
		n.createPod(t, hog)
		got := n.waitPod(t, "hog", 120*time.Second, "evicted", evicted)
		msg := got.Status.Message
		t.Logf("hog evicted %s after its creation: %s", time.Since(start).Round(100*time.Millisecond), msg)
		// The figures are resource.Quantity strings, as upstream prints them: an
		// exact number of MiB reads "161Mi", anything else "164436Ki".
		assert.Regexp(t, `^The node was low on resource: memory\. Threshold quantity: 300Mi, available: [0-9]+(Ki|Mi|Gi)?\. `+
			`Container hog was using [0-9]+(Ki|Mi|Gi)?, request is 1Mi, has larger consumption of memory\. $`, msg)
		var cond *corev1.PodCondition
		for i := range got.Status.Conditions {
			if got.Status.Conditions[i].Type == corev1.DisruptionTarget {
				cond = &got.Status.Conditions[i]
			}
		}
		require.NotNil(t, cond, "DisruptionTarget condition: %+v", got.Status.Conditions)
		assert.Equal(t, corev1.ConditionTrue, cond.Status)
		assert.Equal(t, "TerminationByKubelet", cond.Reason)
		assert.Equal(t, msg, cond.Message)
		require.Len(t, got.Status.ContainerStatuses, 1)
		assert.NotNil(t, got.Status.ContainerStatuses[0].State.Terminated)
		assert.Equal(t, []string{"Warning " + msg}, eventMessages("hog", "Evicted"))
		assert.Contains(t, eventMessages(n.name, "EvictionThresholdMet"), "Warning Attempting to reclaim memory")

		// The condition holds for evictionPressureTransitionPeriod after the
		// threshold was last met, and refuses BestEffort pods meanwhile.
		eventually(t, 20*time.Second, "MemoryPressure=True", func() (bool, string) {
			nd, err := n.admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := nodeCondition(nd, corev1.NodeMemoryPressure)
			return c.Status == corev1.ConditionTrue && c.Reason == "KubeletHasInsufficientMemory", fmt.Sprintf("%+v", c)
		})
		n.createPod(t, busyboxPod("late", image, corev1.RestartPolicyAlways, "sleep 3600"))
		late := n.waitPod(t, "late", 30*time.Second, "rejected", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		assert.Equal(t, "Evicted", late.Status.Reason)
		assert.Equal(t, "Pod was rejected: The node had condition: [MemoryPressure]. ", late.Status.Message)

		// With the hog's tmpfs pages reclaimed the threshold is no longer met: the
		// condition clears after the transition period and the Guaranteed pod was
		// never touched.
		evictedAt := time.Now()
		eventually(t, 120*time.Second, "MemoryPressure=False", func() (bool, string) {
			nd, err := n.admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			c := nodeCondition(nd, corev1.NodeMemoryPressure)
			return c.Status == corev1.ConditionFalse, fmt.Sprintf("%+v", c)
		})
		t.Logf("MemoryPressure=False %s after the BestEffort pod was refused (transition period 60s)", time.Since(evictedAt).Round(100*time.Millisecond))
		s, err := n.admin.CoreV1().Pods("default").Get(ctx, "steady", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.PodRunning, s.Status.Phase)
		require.Len(t, s.Status.ContainerStatuses, 1)
		assert.Zero(t, s.Status.ContainerStatuses[0].RestartCount)
		assert.Empty(t, eventMessages("steady", "Evicted"))
	})
}
