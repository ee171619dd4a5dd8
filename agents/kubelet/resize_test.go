package main

import (
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
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func resizePod(cpu string, gen int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Generation: gen},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c1", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)},
		}}}},
	}
}

func TestAllocationsFollowOnlyAdmittedResizes(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	a := newAllocations(func() time.Time { return now }, openResourceCheckpoint(t.TempDir(), allocatedPodsStateFile))
	a.set(resizePod("100m", 1))

	// The spec asks for more: the allocated pod still has the old value.
	got, differs := a.pod(resizePod("300m", 2))
	require.True(t, differs)
	q := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "100m", q.String())

	// Pending: any reason but Infeasible reads Deferred; a repeat is no change.
	assert.True(t, a.setPending("u1", "OutOfcpu", "Node didn't have enough resource: cpu, requested: 300, used: 1800, capacity: 2000", 2))
	assert.False(t, a.setPending("u1", "OutOfcpu", "same", 2))
	assert.True(t, a.setPending("u1", "OutOfcpu", "newer", 3), "a new generation is a change")
	conds := a.conditions("u1")
	require.Len(t, conds, 1)
	assert.Equal(t, corev1.PodResizePending, conds[0].Type)
	assert.Equal(t, corev1.PodReasonDeferred, conds[0].Reason)
	assert.Equal(t, int64(3), conds[0].ObservedGeneration)

	// InProgress keeps its generation until cleared, and an error replaces its reason.
	gen, changed := a.setInProgress("u1", "", "", 2)
	assert.Equal(t, int64(2), gen)
	assert.True(t, changed)
	gen, changed = a.setInProgress("u1", "", "", 5)
	assert.Equal(t, int64(2), gen)
	assert.False(t, changed)
	_, changed = a.setInProgress("u1", corev1.PodReasonError, "boom", 5)
	assert.True(t, changed)
	gen, cleared := a.clearInProgress("u1")
	assert.True(t, cleared)
	assert.Equal(t, int64(2), gen)
	_, cleared = a.clearInProgress("u1")
	assert.False(t, cleared)

	// Once admitted, the allocation follows the spec.
	a.set(resizePod("300m", 2))
	_, differs = a.pod(resizePod("300m", 2))
	assert.False(t, differs)
	a.forget("u1")
	assert.Empty(t, a.conditions("u1"))
}

func TestResizeMessage(t *testing.T) {
	msg := resizeMessage(resizePod("100m", 2), 2, "", "Pod resize started")
	assert.Equal(t, `Pod resize started: {"containers":[{"name":"c1","resources":{"requests":{"cpu":"100m"}}}],"generation":2}`, msg)
}

func TestPodCgroupConfigRead(t *testing.T) {
	root := t.TempDir()
	c := &podCgroups{root: "/kubepods", perQOS: true, mountRoot: root}
	name := "/kubepods/burstable/podu1"
	for file, v := range map[string]string{
		"cpu/" + name + "/cpu.shares":               "102\n",
		"cpu/" + name + "/cpu.cfs_quota_us":         "-1\n",
		"cpu/" + name + "/cpu.cfs_period_us":        "100000\n",
		"memory/" + name + "/memory.limit_in_bytes": "9223372036854771712\n",
	} {
		p := filepath.Join(root, file)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(v), 0o644))
	}
	cfg, err := c.podConfig(name)
	require.NoError(t, err)
	assert.Equal(t, uint64(102), *cfg.CPUShares)
	assert.Equal(t, int64(-1), *cfg.CPUQuota)
	assert.Equal(t, uint64(100000), *cfg.CPUPeriod)
	assert.Equal(t, int64(9223372036854771712), *cfg.Memory)

	_, err = c.podConfig("/kubepods/burstable/podmissing")
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "podmissing"), "the error names the cgroup: %v", err)

	off := &podCgroups{root: "/", perQOS: false, mountRoot: root}
	cfg, err = off.podConfig("/")
	require.NoError(t, err)
	assert.Nil(t, cfg.Memory)
}

func TestHandleResizeAdmitsAgainstAllocations(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[k8stypes.UID]*podEntry{},
		alloc: newAllocations(time.Now, openResourceCheckpoint(t.TempDir(), allocatedPodsStateFile)), events: &eventAdapter{},
		apiSynced: true, staticLoaded: true}
	// Capacity: 3 CPUs. "big" was allocated 2 cpus; its spec now asks for 500m
	// but that resize is not admitted yet, so 2 cpus still count.
	big := podWith("big", "2", "")
	m.alloc.set(big)
	shrinking := podWith("big", "500m", "")
	m.pods[big.UID] = &podEntry{pod: shrinking, admitted: true}

	small := podWith("small", "500m", "")
	m.alloc.set(small)
	m.pods[small.UID] = &podEntry{pod: small, admitted: true}

	grown := podWith("small", "1500m", "")
	grown.Generation = 2
	got := m.handleResize(grown)
	q := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "500m", q.String(), "the pod keeps running with its allocation")
	conds := m.alloc.conditions(small.UID)
	require.Len(t, conds, 1)
	assert.Equal(t, corev1.PodResizePending, conds[0].Type)
	assert.Equal(t, corev1.PodReasonDeferred, conds[0].Reason)
	assert.Equal(t, "Node didn't have enough resource: cpu, requested: 1500, used: 2000, capacity: 3000", conds[0].Message)
	assert.Equal(t, int64(2), conds[0].ObservedGeneration)

	// Once big's shrink is admitted, small's resize fits.
	m.handleResize(shrinking)
	got = m.handleResize(grown)
	q = got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "1500m", q.String())
	conds = m.alloc.conditions(small.UID)
	require.Len(t, conds, 1)
	assert.Equal(t, corev1.PodResizeInProgress, conds[0].Type)
	assert.Equal(t, int64(2), conds[0].ObservedGeneration)
}

func TestPodMemoryUsage(t *testing.T) {
	root := t.TempDir()
	c := &podCgroups{root: "/kubepods", perQOS: true, mountRoot: root}
	pod := resizePod("100m", 1)
	name := c.podName(pod)
	for dir, v := range map[string]string{name: "73400320\n", name + "/abc": "1048576\n"} {
		p := filepath.Join(root, "memory", dir, "memory.usage_in_bytes")
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(v), 0o644))
	}
	r := podResizer{c}
	used, err := r.PodMemoryUsage(pod)
	require.NoError(t, err)
	assert.Equal(t, int64(73400320), used)
	used, err = r.ContainerMemoryUsage(pod, "abc")
	require.NoError(t, err)
	assert.Equal(t, int64(1048576), used)
	_, err = r.ContainerMemoryUsage(pod, "gone")
	assert.ErrorContains(t, err, "gone")
}

// Right after a restart: no resize is decided before the pod sources have
// loaded, and then a pod not yet admitted again counts with the allocation
// its checkpoint holds.
func TestHandleResizeAfterRestart(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	dir := t.TempDir()
	before := newAllocations(time.Now, openResourceCheckpoint(dir, allocatedPodsStateFile))
	big, small := podWith("big", "2", ""), podWith("small", "500m", "")
	before.set(big)
	before.set(small)

	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[k8stypes.UID]*podEntry{},
		alloc: newAllocations(time.Now, openResourceCheckpoint(dir, allocatedPodsStateFile)), events: &eventAdapter{}}
	grown := podWith("small", "1500m", "")
	grown.Generation = 2
	grown.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodResizePending, Status: corev1.ConditionTrue, Reason: corev1.PodReasonDeferred, Message: "old", ObservedGeneration: 2}}
	m.pods[small.UID] = &podEntry{pod: grown, admitted: true}
	m.alloc.backfill(grown)

	got := m.handleResize(grown)
	q := got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "500m", q.String(), "sources not loaded: the allocation holds")
	assert.Equal(t, []k8stypes.UID{small.UID}, m.alloc.takeAwaitingSources())
	conds := m.alloc.conditions(small.UID)
	require.Len(t, conds, 1, "the backfilled condition")
	assert.Equal(t, "old", conds[0].Message)

	// big is known but its worker has not admitted it again yet: its 2 cpus count.
	m.pods[big.UID] = &podEntry{pod: big}
	m.apiSynced, m.staticLoaded = true, true
	got = m.handleResize(grown)
	q = got.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]
	assert.Equal(t, "500m", q.String())
	conds = m.alloc.conditions(small.UID)
	require.Len(t, conds, 1)
	assert.Equal(t, corev1.PodReasonDeferred, conds[0].Reason)
	assert.Equal(t, "Node didn't have enough resource: cpu, requested: 1500, used: 2000, capacity: 3000", conds[0].Message)
}
