package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// resizeCondition returns the pod's PodResizePending or PodResizeInProgress
// condition, nil when it has none.
func resizeCondition(p *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == t {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

func statusOf(p *corev1.Pod, name string) *corev1.ContainerStatus {
	for i := range p.Status.ContainerStatuses {
		if p.Status.ContainerStatuses[i].Name == name {
			return &p.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// TestKubeletPodResize resizes a running pod through the pods/resize
// subresource of a real API server and checks what the kubelet did on a real
// containerd: the container's and the pod's cgroup files, the reported
// status (allocatedResources, resources, observedGeneration, no resize
// conditions left, ResizeStarted/ResizeCompleted events), a resizePolicy
// RestartContainer container restarted, and a resize the node cannot fit
// left pending (Deferred) until it is reverted.
func TestKubeletPodResize(t *testing.T) {
	testenv.RequireRoot(t)
	if cgroups.IsCgroup2UnifiedMode() {
		t.Skip("the cgroup file checks are written for cgroup v1 (this machine's); v2 is not covered")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-node-rs", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	image := n.ctd.BusyboxImage()
	ctx := context.Background()

	pod := busyboxPod("resize", image, corev1.RestartPolicyAlways, "sleep 3600")
	app := pod.Spec.Containers[0]
	app.Name = "app"
	app.Resources = corev1.ResourceRequirements{Requests: rl("100m", "32Mi"), Limits: rl("200m", "64Mi")}
	restarter := *app.DeepCopy()
	restarter.Name = "restarter"
	restarter.ResizePolicy = []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}
	pod.Spec.Containers = []corev1.Container{app, restarter}
	pod = n.createPod(t, pod)
	allRunning := func(p *corev1.Pod) bool {
		if p.Status.Phase != corev1.PodRunning || len(p.Status.ContainerStatuses) != 2 {
			return false
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil || !cs.Ready {
				return false
			}
		}
		return true
	}
	before := n.waitPod(t, "resize", 60*time.Second, "running", allRunning)
	require.Equal(t, int64(1), before.Generation)
	require.Equal(t, int64(1), before.Status.ObservedGeneration)
	require.NotNil(t, statusOf(before, "app").Resources, "status.resources is reported before any resize")
	appID := statusOf(before, "app").ContainerID
	restarterID := statusOf(before, "restarter").ContainerID
	podCg := n.cgroupRoot + "/kubepods/burstable/pod" + string(pod.UID)
	ctrCg := func(p *corev1.Pod, name string) string {
		_, id, _ := strings.Cut(statusOf(p, name).ContainerID, "://")
		return podCg + "/" + id
	}
	assert.Equal(t, "20000", cgroupFile(t, "cpu", ctrCg(before, "app"), "cpu.cfs_quota_us"))
	assert.Equal(t, "40000", cgroupFile(t, "cpu", podCg, "cpu.cfs_quota_us"))

	resize := func(t *testing.T, patch map[string]any) *corev1.Pod {
		t.Helper()
		b, err := json.Marshal(patch)
		require.NoError(t, err)
		p, err := n.admin.CoreV1().Pods("default").Patch(ctx, "resize", types.StrategicMergePatchType, b, metav1.PatchOptions{}, "resize")
		require.NoError(t, err, "patch pods/resize")
		return p
	}
	containers := func(cs ...map[string]any) map[string]any {
		return map[string]any{"spec": map[string]any{"containers": cs}}
	}
	res := func(name, cpuReq, cpuLim, memReq, memLim string) map[string]any {
		return map[string]any{"name": name, "resources": map[string]any{
			"requests": map[string]string{"cpu": cpuReq, "memory": memReq},
			"limits":   map[string]string{"cpu": cpuLim, "memory": memLim},
		}}
	}
	resized := func(gen int64) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool {
			return p.Status.ObservedGeneration >= gen && allRunning(p) &&
				resizeCondition(p, corev1.PodResizePending) == nil && resizeCondition(p, corev1.PodResizeInProgress) == nil
		}
	}

	t.Run("cpu and memory up in place, memory of a RestartContainer container up by a restart", func(t *testing.T) {
		start := time.Now()
		patched := resize(t, containers(
			res("app", "150m", "300m", "32Mi", "128Mi"),
			res("restarter", "100m", "200m", "32Mi", "96Mi"),
		))
		require.Equal(t, int64(2), patched.Generation)
		got := n.waitPod(t, "resize", 60*time.Second, "resize actuated", resized(2))
		t.Logf("resize actuated and reported in %v", time.Since(start).Round(time.Millisecond))

		a, r := statusOf(got, "app"), statusOf(got, "restarter")
		assert.Equal(t, appID, a.ContainerID, "app resized in place")
		assert.Equal(t, int32(0), a.RestartCount)
		assert.NotEqual(t, restarterID, r.ContainerID, "restarter restarted")
		assert.Equal(t, int32(1), r.RestartCount)
		require.NotNil(t, a.Resources)
		assert.True(t, resource.MustParse("300m").Equal(a.Resources.Limits[corev1.ResourceCPU]), "app cpu limit %v", a.Resources.Limits)
		assert.True(t, resource.MustParse("150m").Equal(a.Resources.Requests[corev1.ResourceCPU]), "app cpu request %v", a.Resources.Requests)
		assert.True(t, resource.MustParse("128Mi").Equal(a.Resources.Limits[corev1.ResourceMemory]), "app memory limit %v", a.Resources.Limits)
		assert.True(t, resource.MustParse("150m").Equal(a.AllocatedResources[corev1.ResourceCPU]), "allocated %v", a.AllocatedResources)
		assert.True(t, resource.MustParse("96Mi").Equal(r.Resources.Limits[corev1.ResourceMemory]), "restarter memory limit %v", r.Resources.Limits)

		// The container cgroups hold the new values...
		assert.Equal(t, "30000", cgroupFile(t, "cpu", ctrCg(got, "app"), "cpu.cfs_quota_us"))
		assert.Equal(t, "153", cgroupFile(t, "cpu", ctrCg(got, "app"), "cpu.shares"))
		assert.Equal(t, strconv.Itoa(128<<20), cgroupFile(t, "memory", ctrCg(got, "app"), "memory.limit_in_bytes"))
		assert.Equal(t, strconv.Itoa(96<<20), cgroupFile(t, "memory", ctrCg(got, "restarter"), "memory.limit_in_bytes"))
		// ...and so does the pod's: 250m requested, 500m and 224Mi of limits.
		assert.Equal(t, "256", cgroupFile(t, "cpu", podCg, "cpu.shares"))
		assert.Equal(t, "50000", cgroupFile(t, "cpu", podCg, "cpu.cfs_quota_us"))
		assert.Equal(t, strconv.Itoa(224<<20), cgroupFile(t, "memory", podCg, "memory.limit_in_bytes"))

		eventually(t, 10*time.Second, "ResizeStarted, ResizeCompleted and Killing events", func() (bool, string) {
			evs := n.events(t, "resize")
			return hasEvent(evs, "ResizeStarted", `Pod resize started: {"containers":[{"name":"app"`) &&
				hasEvent(evs, "ResizeCompleted", `"generation":2`) &&
				hasEvent(evs, "Killing", "Container restarter resize requires restart"), fmt.Sprint(evs)
		})
	})

	t.Run("memory down: container first, then the pod cgroup", func(t *testing.T) {
		resize(t, containers(res("app", "150m", "300m", "32Mi", "48Mi")))
		got := n.waitPod(t, "resize", 60*time.Second, "resize actuated", resized(3))
		assert.Equal(t, appID, statusOf(got, "app").ContainerID)
		assert.Equal(t, strconv.Itoa(48<<20), cgroupFile(t, "memory", ctrCg(got, "app"), "memory.limit_in_bytes"))
		assert.Equal(t, strconv.Itoa((48+96)<<20), cgroupFile(t, "memory", podCg, "memory.limit_in_bytes"))
	})

	t.Run("a resize that does not fit beside another pod waits (Deferred) until that pod leaves", func(t *testing.T) {
		node, err := n.admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		require.NoError(t, err)
		alloc := node.Status.Allocatable[corev1.ResourceCPU]
		// The hog leaves 500m; the resize asks app for 1 cpu (1100m for the pod).
		hogCPU := alloc.MilliValue() - 500
		hog := busyboxPod("hog", image, corev1.RestartPolicyAlways, "sleep 3600")
		hog.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(hogCPU, resource.DecimalSI)}
		n.createPod(t, hog)
		n.waitPod(t, "hog", 60*time.Second, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

		resize(t, containers(res("app", "1", "1", "32Mi", "48Mi")))
		got := n.waitPod(t, "resize", 30*time.Second, "PodResizePending", func(p *corev1.Pod) bool {
			return resizeCondition(p, corev1.PodResizePending) != nil
		})
		c := resizeCondition(got, corev1.PodResizePending)
		assert.Equal(t, corev1.PodReasonDeferred, c.Reason)
		assert.Contains(t, c.Message, fmt.Sprintf("Node didn't have enough resource: cpu, requested: 1100, used: %d, capacity: %d", hogCPU, alloc.MilliValue()))
		assert.Equal(t, int64(4), c.ObservedGeneration)
		assert.Equal(t, int64(4), got.Status.ObservedGeneration)
		assert.Equal(t, "30000", cgroupFile(t, "cpu", ctrCg(got, "app"), "cpu.cfs_quota_us"), "nothing actuated")
		assert.True(t, resource.MustParse("150m").Equal(statusOf(got, "app").AllocatedResources[corev1.ResourceCPU]))
		eventually(t, 10*time.Second, "ResizeDeferred event", func() (bool, string) {
			evs := n.events(t, "resize")
			return hasEvent(evs, "ResizeDeferred", "Pod resize Deferred"), fmt.Sprint(evs)
		})

		start := time.Now()
		require.NoError(t, n.admin.CoreV1().Pods("default").Delete(ctx, "hog", metav1.DeleteOptions{}))
		got = n.waitPod(t, "resize", 60*time.Second, "the pending resize actuated once the hog left", resized(4))
		t.Logf("pending resize actuated %v after the hog's deletion", time.Since(start).Round(time.Millisecond))
		assert.Equal(t, "100000", cgroupFile(t, "cpu", ctrCg(got, "app"), "cpu.cfs_quota_us"))
		assert.Equal(t, "1024", cgroupFile(t, "cpu", ctrCg(got, "app"), "cpu.shares"))
		assert.Equal(t, appID, statusOf(got, "app").ContainerID)
	})

	t.Run("a memory limit below what the container uses is refused (Error) until usage drops", func(t *testing.T) {
		resize(t, containers(res("app", "1", "1", "32Mi", "128Mi")))
		got := n.waitPod(t, "resize", 60*time.Second, "resize actuated", resized(5))
		out, code := n.exec(t, got, "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=40")
		require.Equal(t, 0, code, out)

		resize(t, containers(res("app", "1", "1", "16Mi", "24Mi")))
		got = n.waitPod(t, "resize", 30*time.Second, "PodResizeInProgress Error", func(p *corev1.Pod) bool {
			c := resizeCondition(p, corev1.PodResizeInProgress)
			return c != nil && c.Reason == corev1.PodReasonError
		})
		c := resizeCondition(got, corev1.PodResizeInProgress)
		assert.Contains(t, c.Message, `cannot decrease memory limits: attempting to set container "app" memory limit (25165824) below current usage (`)
		assert.Equal(t, int64(6), c.ObservedGeneration)
		assert.Equal(t, strconv.Itoa(128<<20), cgroupFile(t, "memory", ctrCg(got, "app"), "memory.limit_in_bytes"), "nothing changed")
		eventually(t, 10*time.Second, "ResizeError event", func() (bool, string) {
			evs := n.events(t, "resize")
			return hasEvent(evs, "ResizeError", "Pod resize error"), fmt.Sprint(evs)
		})

		_, code = n.exec(t, got, "rm", "/dev/shm/fill")
		require.Equal(t, 0, code)
		got = n.waitPod(t, "resize", 45*time.Second, "resize actuated once usage dropped (the worker retries a failed sync after 10s)", resized(6))
		assert.Equal(t, strconv.Itoa(24<<20), cgroupFile(t, "memory", ctrCg(got, "app"), "memory.limit_in_bytes"))
	})
}
