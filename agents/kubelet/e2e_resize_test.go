package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
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
	t.Run("a Deferred resize stays Deferred across a kubelet restart (allocated_pods_state)", func(t *testing.T) {
		cur, err := n.admin.CoreV1().Pods("default").Get(ctx, "resize", metav1.GetOptions{})
		require.NoError(t, err)
		require.True(t, allRunning(cur), "the pod runs before the restart")
		var used int64
		for _, cs := range cur.Status.ContainerStatuses {
			q := cs.AllocatedResources[corev1.ResourceCPU]
			used += q.MilliValue()
		}
		appCPU := statusOf(cur, "app").AllocatedResources[corev1.ResourceCPU]
		node, err := n.admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		require.NoError(t, err)
		alloc := node.Status.Allocatable[corev1.ResourceCPU]
		// The hog leaves 100m free; app asks for 200m more.
		hogCPU := alloc.MilliValue() - used - 100
		require.Positive(t, hogCPU, "allocatable %v, the pod uses %dm", alloc, used)
		hog := busyboxPod("hog2", image, corev1.RestartPolicyAlways, "sleep 3600")
		hog.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(hogCPU, resource.DecimalSI)}
		n.createPod(t, hog)
		n.waitPod(t, "hog2", 60*time.Second, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

		want := *resource.NewMilliQuantity(appCPU.MilliValue()+200, resource.DecimalSI)
		appSpec := cur.Spec.Containers[0].Resources
		require.Equal(t, "app", cur.Spec.Containers[0].Name)
		memReq, memLim := appSpec.Requests[corev1.ResourceMemory], appSpec.Limits[corev1.ResourceMemory]
		patched := resize(t, containers(res("app", want.String(), want.String(), memReq.String(), memLim.String())))
		gen := patched.Generation
		before := n.waitPod(t, "resize", 30*time.Second, "PodResizePending", func(p *corev1.Pod) bool {
			c := resizeCondition(p, corev1.PodResizePending)
			return c != nil && c.ObservedGeneration == gen
		})
		require.Equal(t, corev1.PodReasonDeferred, resizeCondition(before, corev1.PodResizePending).Reason)
		files := map[string]string{}
		for _, f := range []struct{ ctrl, file, cg string }{
			{"cpu", "cpu.cfs_quota_us", ctrCg(before, "app")}, {"cpu", "cpu.shares", ctrCg(before, "app")},
			{"memory", "memory.limit_in_bytes", ctrCg(before, "app")},
			{"cpu", "cpu.cfs_quota_us", podCg}, {"cpu", "cpu.shares", podCg},
		} {
			files[f.cg+"/"+f.file] = cgroupFile(t, f.ctrl, f.cg, f.file)
		}
		assert.Equal(t, strconv.FormatInt(appCPU.MilliValue()*100, 10), files[ctrCg(before, "app")+"/cpu.cfs_quota_us"], "app runs with its allocation")

		// The allocation is checkpointed in the kubelet's root dir, as upstream's.
		root := n.dir + "/root"
		allocatedCPU := func() string {
			b, err := os.ReadFile(root + "/allocated_pods_state")
			require.NoError(t, err, "allocated_pods_state in the root dir")
			var f struct{ Data string }
			require.NoError(t, json.Unmarshal(b, &f))
			var d struct {
				Entries map[string]struct {
					ContainerResources map[string]corev1.ResourceRequirements
				}
			}
			require.NoError(t, json.Unmarshal([]byte(f.Data), &d))
			q := d.Entries[string(pod.UID)].ContainerResources["app"].Requests[corev1.ResourceCPU]
			return q.String()
		}
		assert.Equal(t, appCPU.String(), allocatedCPU(), "the checkpoint holds the old allocation")
		assert.FileExists(t, root+"/actuated_pods_state")

		deferredEvents := func() int32 {
			var count int32
			for _, e := range n.events(t, "resize") {
				if e.Reason == "ResizeDeferred" && strings.Contains(e.Message, fmt.Sprintf(`"generation":%d`, gen)) {
					count += max(e.Count, 1)
				}
			}
			return count
		}
		eventually(t, 10*time.Second, "a ResizeDeferred event", func() (bool, string) { return deferredEvents() > 0, "" })
		deferredBefore := deferredEvents()

		after := restartKubeletAndRead(ctx, t, n, corev1.PodResizePending)

		c := resizeCondition(after, corev1.PodResizePending)
		require.NotNil(t, c, "still PodResizePending after the restart; conditions %+v", after.Status.Conditions)
		assert.Equal(t, corev1.PodReasonDeferred, c.Reason)
		assert.Contains(t, c.Message, "Node didn't have enough resource: cpu")
		assert.Equal(t, gen, c.ObservedGeneration)
		assert.Nil(t, resizeCondition(after, corev1.PodResizeInProgress))
		got := statusOf(after, "app").AllocatedResources[corev1.ResourceCPU]
		assert.True(t, appCPU.Equal(got), "allocatedResources keeps the old %v, got %v", appCPU, got)
		for _, name := range []string{"app", "restarter"} {
			b, a := statusOf(before, name), statusOf(after, name)
			assert.Equal(t, b.ContainerID, a.ContainerID, "%s not restarted", name)
			assert.Equal(t, b.RestartCount, a.RestartCount, "%s restart count", name)
		}
		for _, f := range []struct{ ctrl, file, cg string }{
			{"cpu", "cpu.cfs_quota_us", ctrCg(after, "app")}, {"cpu", "cpu.shares", ctrCg(after, "app")},
			{"memory", "memory.limit_in_bytes", ctrCg(after, "app")},
			{"cpu", "cpu.cfs_quota_us", podCg}, {"cpu", "cpu.shares", podCg},
		} {
			assert.Equal(t, files[f.cg+"/"+f.file], cgroupFile(t, f.ctrl, f.cg, f.file), "%s of %s unchanged", f.file, f.cg)
		}
		assert.Equal(t, appCPU.String(), allocatedCPU())
		assert.Equal(t, deferredBefore, deferredEvents(), "the pending resize is not announced again (its condition is backfilled from the status)")
		hogNow, err := n.admin.CoreV1().Pods("default").Get(ctx, "hog2", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, corev1.PodRunning, hogNow.Status.Phase, "the hog keeps its place")

		// The hog leaves: the pending resize is admitted and actuated.
		require.NoError(t, n.admin.CoreV1().Pods("default").Delete(ctx, "hog2", metav1.DeleteOptions{}))
		done := n.waitPod(t, "resize", 60*time.Second, "the pending resize actuated once the hog left", resized(gen))
		assert.Equal(t, strconv.FormatInt(want.MilliValue()*100, 10), cgroupFile(t, "cpu", ctrCg(done, "app"), "cpu.cfs_quota_us"))
		assert.Equal(t, statusOf(before, "app").ContainerID, statusOf(done, "app").ContainerID)
		assert.Equal(t, want.String(), allocatedCPU())
	})
	t.Run("a resize refused by the runtime is retried, not taken as done, after a kubelet restart (actuated_pods_state)", func(t *testing.T) {
		cur, err := n.admin.CoreV1().Pods("default").Get(ctx, "resize", metav1.GetOptions{})
		require.NoError(t, err)
		cpu := cur.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]
		up := resize(t, containers(res("app", cpu.String(), cpu.String(), "32Mi", "128Mi")))
		got := n.waitPod(t, "resize", 60*time.Second, "memory up", resized(up.Generation))
		out, code := n.exec(t, got, "dd", "if=/dev/zero", "of=/dev/shm/fill", "bs=1M", "count=40")
		require.Equal(t, 0, code, out)
		down := resize(t, containers(res("app", cpu.String(), cpu.String(), "16Mi", "24Mi")))
		before := n.waitPod(t, "resize", 30*time.Second, "PodResizeInProgress Error", func(p *corev1.Pod) bool {
			c := resizeCondition(p, corev1.PodResizeInProgress)
			return c != nil && c.Reason == corev1.PodReasonError
		})
		limit := cgroupFile(t, "memory", ctrCg(before, "app"), "memory.limit_in_bytes")
		require.Equal(t, strconv.Itoa(128<<20), limit)

		after := restartKubeletAndRead(ctx, t, n, corev1.PodResizeInProgress)
		c := resizeCondition(after, corev1.PodResizeInProgress)
		require.NotNil(t, c, "the resize is still in progress after the restart; conditions %+v", after.Status.Conditions)
		assert.Equal(t, corev1.PodReasonError, c.Reason)
		assert.Contains(t, c.Message, "cannot decrease memory limits")
		assert.Equal(t, down.Generation, c.ObservedGeneration)
		assert.Equal(t, limit, cgroupFile(t, "memory", ctrCg(after, "app"), "memory.limit_in_bytes"), "nothing changed")
		assert.Equal(t, statusOf(before, "app").ContainerID, statusOf(after, "app").ContainerID)
		assert.Equal(t, statusOf(before, "app").RestartCount, statusOf(after, "app").RestartCount)

		_, code = n.exec(t, after, "rm", "/dev/shm/fill")
		require.Equal(t, 0, code)
		done := n.waitPod(t, "resize", 45*time.Second, "resize actuated once usage dropped", resized(down.Generation))
		assert.Equal(t, strconv.Itoa(24<<20), cgroupFile(t, "memory", ctrCg(done, "app"), "memory.limit_in_bytes"))
	})
}

// restartKubeletAndRead restarts the node's kubelet, waits until it reports the
// "resize" pod again (its resize condition of type cond backfilled from the status
// with a new transition time, as the conditions live in memory as upstream's status
// manager keeps them; or gone, if the restart wrongly took the resize as done),
// gives it a few more sync rounds to (wrongly) actuate anything, and returns the pod.
func restartKubeletAndRead(ctx context.Context, t *testing.T, n *testNode, cond corev1.PodConditionType) *corev1.Pod {
	t.Helper()
	n.stopKubelet()
	restarted := time.Now().Truncate(time.Second)
	n.startKubelet(t)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	n.waitPod(t, "resize", 60*time.Second, "the pod reported by the restarted kubelet", func(p *corev1.Pod) bool {
		c := resizeCondition(p, cond)
		return c == nil || !c.LastTransitionTime.Time.Before(restarted)
	})
	time.Sleep(5 * time.Second)
	after, err := n.admin.CoreV1().Pods("default").Get(ctx, "resize", metav1.GetOptions{})
	require.NoError(t, err)
	return after
}
