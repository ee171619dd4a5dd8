package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/podsync"
)

// In-place pod resize (InPlacePodVerticalScaling, GA in 1.35), the agent's
// half: the allocation manager (what each admitted pod was granted), the
// admission of a resize against the node's allocatable, and the
// PodResizePending / PodResizeInProgress conditions the status manager keeps.
// podsync actuates the allocation (UpdateContainerResources and the pod cgroup).

// Event reasons of a resize (pkg/kubelet/events).
const (
	eventResizeDeferred   = "ResizeDeferred"
	eventResizeInfeasible = "ResizeInfeasible"
	eventResizeCompleted  = "ResizeCompleted"
	eventResizeStarted    = "ResizeStarted"
	eventResizeError      = "ResizeError"
)

// allocations is the allocation manager: the resources each admitted pod's
// containers were allocated, checkpointed in allocated_pods_state as upstream
// does so a restart keeps a Deferred resize unallocated, and the resize
// conditions per pod, kept in memory as the status manager keeps them.
type allocations struct {
	allocated  *resourceCheckpoint
	mu         sync.Mutex
	pending    map[types.UID]*corev1.PodCondition
	inProgress map[types.UID]*corev1.PodCondition
	// awaitingSources are pods whose resize waits for every pod source to
	// have loaded (woken then).
	awaitingSources map[types.UID]struct{}
	now             func() time.Time
}

func newAllocations(now func() time.Time, allocated *resourceCheckpoint) *allocations {
	return &allocations{
		allocated:  allocated,
		pending:    map[types.UID]*corev1.PodCondition{},
		inProgress: map[types.UID]*corev1.PodCondition{},
		now:        now,

		awaitingSources: map[types.UID]struct{}{},
	}
}

// set records pod's containers' resources as allocated and checkpoints them
// (SetAllocatedResources). A failed write is logged, as upstream's AddPod
// does; the allocation holds in memory.
func (a *allocations) set(pod *corev1.Pod) {
	m := map[string]corev1.ResourceRequirements{}
	for i := range pod.Spec.InitContainers {
		m[pod.Spec.InitContainers[i].Name] = pod.Spec.InitContainers[i].Resources
	}
	for i := range pod.Spec.Containers {
		m[pod.Spec.Containers[i].Name] = pod.Spec.Containers[i].Resources
	}
	if err := a.allocated.setContainers(pod.UID, m); err != nil {
		klog.ErrorS(err, "SetPodAllocation failed", "pod", klog.KObj(pod))
	}
}

// has reports whether the pod has an allocation (HasPodAllocatedResources).
func (a *allocations) has(uid types.UID) bool {
	if a == nil {
		return false
	}
	_, ok := a.allocated.containers(uid)
	return ok
}

// pod returns pod with its containers' resources replaced by the allocated
// ones (UpdatePodFromAllocation), and whether any differed.
func (a *allocations) pod(pod *corev1.Pod) (*corev1.Pod, bool) {
	if a == nil {
		return pod, false // no allocation manager: the spec is the allocation
	}
	alloc, ok := a.allocated.containers(pod.UID)
	if !ok {
		return pod, false
	}
	out := pod
	updated := false
	apply := func(list func(*corev1.Pod) []corev1.Container) {
		for i, c := range list(out) {
			r, ok := alloc[c.Name]
			if !ok || apiequality.Semantic.DeepEqual(c.Resources, r) {
				continue
			}
			if !updated {
				out, updated = pod.DeepCopy(), true
			}
			list(out)[i].Resources = *r.DeepCopy()
		}
	}
	apply(func(p *corev1.Pod) []corev1.Container { return p.Spec.InitContainers })
	apply(func(p *corev1.Pod) []corev1.Container { return p.Spec.Containers })
	return out, updated
}

// forget drops the pod's allocation (in memory only, as upstream's RemovePod:
// the next write leaves it out) and its conditions.
func (a *allocations) forget(uid types.UID) {
	a.allocated.remove(uid)
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, uid)
	delete(a.inProgress, uid)
	delete(a.awaitingSources, uid)
}

// backfill takes the resize conditions the pod's status carries, as this
// kubelet (before a restart) wrote them (BackfillPodResizeConditions): a resize
// still pending is not announced again. Their times start anew.
func (a *allocations) backfill(pod *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range pod.Status.Conditions {
		switch c.Type {
		case corev1.PodResizePending:
			a.pending[pod.UID] = a.condition(c.Type, nil, c.Reason, c.Message, c.ObservedGeneration)
		case corev1.PodResizeInProgress:
			a.inProgress[pod.UID] = a.condition(c.Type, nil, c.Reason, c.Message, c.ObservedGeneration)
		}
	}
}

// awaitSources records that the pod's resize waits for the pod sources.
func (a *allocations) awaitSources(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.awaitingSources[uid] = struct{}{}
}

// takeAwaitingSources returns and forgets the pods awaiting the sources.
func (a *allocations) takeAwaitingSources() []types.UID {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]types.UID, 0, len(a.awaitingSources))
	for uid := range a.awaitingSources {
		out = append(out, uid)
	}
	clear(a.awaitingSources)
	return out
}

// condition builds a resize condition, keeping the old one's transition
// time while its reason stays (updatedPodResizeCondition).
func (a *allocations) condition(t corev1.PodConditionType, old *corev1.PodCondition, reason, message string, gen int64) *corev1.PodCondition {
	now := metav1.NewTime(a.now())
	ltt := now
	if old != nil && old.Reason == reason {
		ltt = old.LastTransitionTime
	}
	return &corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: ltt,
		ObservedGeneration: gen, Reason: reason, Message: message}
}

// setPending is SetPodResizePendingCondition: any reason but Infeasible reads
// Deferred. It reports whether the reason or generation changed.
func (a *allocations) setPending(uid types.UID, reason, message string, gen int64) bool {
	if reason != corev1.PodReasonInfeasible {
		reason = corev1.PodReasonDeferred
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.pending[uid]
	a.pending[uid] = a.condition(corev1.PodResizePending, prev, reason, message, gen)
	return prev == nil || prev.Reason != reason || prev.ObservedGeneration != gen
}

func (a *allocations) clearPending(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, uid)
}

// setInProgress is SetPodResizeInProgressCondition: an existing condition
// keeps its generation, and its reason and message unless new ones are given.
// It returns the condition's generation and whether it changed.
func (a *allocations) setInProgress(uid types.UID, reason, message string, gen int64) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev := a.inProgress[uid]
	if prev != nil {
		if reason == "" && message == "" {
			reason, message = prev.Reason, prev.Message
		}
		gen = prev.ObservedGeneration
	}
	a.inProgress[uid] = a.condition(corev1.PodResizeInProgress, prev, reason, message, gen)
	return gen, prev == nil || prev.Reason != reason || prev.Message != message
}

// clearInProgress removes the condition, returning its generation and whether
// there was one.
func (a *allocations) clearInProgress(uid types.UID) (int64, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev, ok := a.inProgress[uid]
	if !ok {
		return 0, false
	}
	delete(a.inProgress, uid)
	return prev.ObservedGeneration, true
}

// conditions are the pod's resize conditions for its status (pending first).
func (a *allocations) conditions(uid types.UID) []corev1.PodCondition {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []corev1.PodCondition
	for _, c := range []*corev1.PodCondition{a.pending[uid], a.inProgress[uid]} {
		if c != nil {
			out = append(out, *c)
		}
	}
	return out
}

// resizeMessage is the kubelet's podResizeMessage: prefix, then the spec's
// container resources and the generation as JSON.
func resizeMessage(pod *corev1.Pod, gen int64, errMsg, prefix string) string {
	type alloc struct {
		Name      string                      `json:"name"`
		Resources corev1.ResourceRequirements `json:"resources,omitempty"`
	}
	summary := struct {
		InitContainers []alloc `json:"initContainers,omitempty"`
		Containers     []alloc `json:"containers,omitempty"`
		Generation     int64   `json:"generation"`
		Error          string  `json:"error,omitempty"`
	}{Generation: gen, Error: errMsg}
	for _, c := range pod.Spec.InitContainers {
		summary.InitContainers = append(summary.InitContainers, alloc{c.Name, c.Resources})
	}
	for _, c := range pod.Spec.Containers {
		summary.Containers = append(summary.Containers, alloc{c.Name, c.Resources})
	}
	b, err := json.Marshal(summary)
	if err != nil {
		return prefix
	}
	return prefix + ": " + string(b)
}

// handleResize is handlePodResourcesResize, run on every sync of an admitted
// pod: when the spec asks for other resources than allocated, the resize is
// admitted against the node's allocatable and the other pods' allocations; if
// it fits the allocation follows the spec (ResizeStarted, PodResizeInProgress),
// else PodResizePending says why. It returns the allocated pod to run.
func (m *podManager) handleResize(pod *corev1.Pod) *corev1.Pod {
	allocated, differs := m.alloc.pod(pod)
	if !differs {
		m.alloc.clearPending(pod.UID)
		return pod
	}
	if !m.sourcesReady() {
		// As upstream, no resize is decided before every pod source has loaded
		// (after a restart, pods not yet seen again would not count against the
		// node). The pod runs with its allocation meanwhile.
		m.alloc.awaitSources(pod.UID)
		return allocated
	}
	reason, message, ok := m.fits(pod)
	if ok {
		m.alloc.set(pod)
		m.alloc.clearPending(pod.UID)
		m.alloc.clearInProgress(pod.UID)
		m.alloc.setInProgress(pod.UID, "", "", pod.Generation)
		m.events.Eventf(pod, corev1.EventTypeNormal, eventResizeStarted, "%s", resizeMessage(pod, pod.Generation, "", "Pod resize started"))
		klog.V(2).InfoS("Pod resize admitted", "pod", klog.KObj(pod), "generation", pod.Generation)
		m.retryPendingResizes() // it may have shrunk
		return pod
	}
	if m.alloc.setPending(pod.UID, reason, message, pod.Generation) {
		typ := eventResizeDeferred
		if reason == corev1.PodReasonInfeasible {
			typ = eventResizeInfeasible
		}
		shown := corev1.PodReasonDeferred
		if reason == corev1.PodReasonInfeasible {
			shown = reason
		}
		m.events.Eventf(pod, corev1.EventTypeWarning, typ, "%s", resizeMessage(pod, pod.Generation, message, "Pod resize "+shown))
	}
	return allocated
}

// retryPendingResizes wakes the pods whose resize is pending, so they are
// admitted again now that resources may have been freed (RetryPendingResizes,
// run when a pod leaves the node or another resize is admitted).
func (m *podManager) retryPendingResizes() {
	m.alloc.mu.Lock()
	uids := make([]types.UID, 0, len(m.alloc.pending))
	for uid := range m.alloc.pending {
		uids = append(uids, uid)
	}
	m.alloc.mu.Unlock()
	for _, uid := range uids {
		m.wakePod(uid)
	}
}

// resizeProgress updates PodResizeInProgress after a sync, as SyncPod does:
// kept while a running container has not reached its allocation, cleared with
// ResizeCompleted once all have, and set with reason Error when the resize
// step failed. view is the runtime's state after the sync (nil when it could not
// be read: the progress is left as it was).
func (m *podManager) resizeProgress(allocated *corev1.Pod, view *podsync.PodView, res *podsync.SyncResult) {
	if view != nil {
		if m.syncer.ResizeInProgress(allocated, view) {
			m.alloc.setInProgress(allocated.UID, "", "", allocated.Generation)
		} else if gen, cleared := m.alloc.clearInProgress(allocated.UID); cleared {
			m.events.Eventf(allocated, corev1.EventTypeNormal, eventResizeCompleted, "%s", resizeMessage(allocated, gen, "", "Pod resize completed"))
		}
	}
	if res == nil {
		return
	}
	for _, st := range res.Steps {
		if st.Action != podsync.ActionResizePodInPlace || st.Err == nil {
			continue
		}
		msg := podsync.Message(st.Err)
		if gen, changed := m.alloc.setInProgress(allocated.UID, corev1.PodReasonError, msg, allocated.Generation); changed {
			m.events.Eventf(allocated, corev1.EventTypeWarning, eventResizeError, "%s", resizeMessage(allocated, gen, msg, "Pod resize error"))
		}
	}
}

// ContainerResources is podsync.ResourcesBuilder: the Linux resources
// ContainerConfig gives a container, for UpdateContainerResources.
func (b *configBuilder) ContainerResources(_ *corev1.Pod, c *corev1.Container) (*runtimeapi.LinuxContainerResources, error) {
	return cri.ContainerResources(c), nil
}

// podResizer adapts podCgroups to podsync.PodCgroups.
type podResizer struct{ c *podCgroups }

var _ podsync.PodCgroups = podResizer{}

func (r podResizer) DesiredPodCgroupConfig(pod *corev1.Pod) podsync.PodCgroupConfig {
	rc := resourceConfigForPod(pod, r.c.enforceCPU, r.c.period)
	return podsync.PodCgroupConfig{CPUShares: rc.CPUShares, CPUQuota: rc.CPUQuota, CPUPeriod: rc.CPUPeriod, Memory: rc.Memory}
}

func (r podResizer) CurrentPodCgroupConfig(pod *corev1.Pod) (podsync.PodCgroupConfig, error) {
	return r.c.podConfig(r.c.podName(pod))
}

func (r podResizer) SetPodCgroupConfig(pod *corev1.Pod, cfg podsync.PodCgroupConfig) error {
	if !r.c.perQOS {
		return nil
	}
	return r.c.set(r.c.podName(pod), resourceConfig{CPUShares: cfg.CPUShares, CPUQuota: cfg.CPUQuota, CPUPeriod: cfg.CPUPeriod, Memory: cfg.Memory})
}

var _ podsync.MemoryUsage = podResizer{}

// PodMemoryUsage is the pod cgroup's memory usage (memory.usage_in_bytes, or
// memory.current on v2), the figure the kubelet's stats give.
func (r podResizer) PodMemoryUsage(pod *corev1.Pod) (int64, error) {
	if !r.c.perQOS {
		return 0, fmt.Errorf("pod %s has no pod cgroup (cgroupsPerQOS is off)", klog.KObj(pod))
	}
	return r.c.memoryUsage(r.c.podName(pod))
}

// ContainerMemoryUsage reads the container's cgroup, which containerd's
// cgroupfs layout puts under the pod cgroup, named by the container ID.
func (r podResizer) ContainerMemoryUsage(pod *corev1.Pod, containerID string) (int64, error) {
	if !r.c.perQOS {
		return 0, fmt.Errorf("pod %s has no pod cgroup (cgroupsPerQOS is off)", klog.KObj(pod))
	}
	return r.c.memoryUsage(r.c.podName(pod) + "/" + containerID)
}

func (c *podCgroups) memoryUsage(name string) (int64, error) {
	p := filepath.Join(c.mountRoot, "memory", name, "memory.usage_in_bytes")
	if c.v2 {
		p = filepath.Join(c.mountRoot, name, "memory.current")
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("memory usage of cgroup %s: %w", name, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("memory usage of cgroup %s: %w", name, err)
	}
	return v, nil
}

// set writes res into the existing cgroup name (the kubelet's
// SetPodCgroupConfig); fields left nil are not touched.
func (c *podCgroups) set(name string, res resourceConfig) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.manager(name, res)
	if err != nil {
		return err
	}
	if err := m.Set(resourcesOf(res)); err != nil {
		return fmt.Errorf("configure cgroup %s: %w", name, err)
	}
	return nil
}

// podConfig reads the cpu shares, quota and period and the memory limit of
// cgroup name (GetPodCgroupConfig). Without cgroupsPerQOS there is no pod
// cgroup: an empty config, so nothing is compared or written.
func (c *podCgroups) podConfig(name string) (podsync.PodCgroupConfig, error) {
	var out podsync.PodCgroupConfig
	if !c.perQOS {
		return out, nil
	}
	read := func(ctrl, file string) (string, error) {
		p := filepath.Join(c.mountRoot, name, file)
		if !c.v2 {
			p = filepath.Join(c.mountRoot, ctrl, name, file)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return "", fmt.Errorf("read %s of cgroup %s: %w", file, name, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	parse := func(s string) (int64, error) {
		if s == "max" {
			return -1, nil
		}
		return strconv.ParseInt(s, 10, 64)
	}
	var shares, period uint64
	var quota, mem int64
	if c.v2 {
		w, err := read("", "cpu.weight")
		if err != nil {
			return out, err
		}
		weight, err := strconv.ParseUint(w, 10, 64)
		if err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.weight %q: %w", name, w, err)
		}
		// The inverse of the kubelet's shares-to-weight conversion.
		shares = ((weight-1)*(maxShares-minShares))/9999 + minShares
		cpuMax, err := read("", "cpu.max")
		if err != nil {
			return out, err
		}
		f := strings.Fields(cpuMax)
		if len(f) != 2 {
			return out, fmt.Errorf("cgroup %s: cpu.max %q: want quota and period", name, cpuMax)
		}
		if quota, err = parse(f[0]); err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.max %q: %w", name, cpuMax, err)
		}
		if period, err = strconv.ParseUint(f[1], 10, 64); err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.max %q: %w", name, cpuMax, err)
		}
		m, err := read("", "memory.max")
		if err != nil {
			return out, err
		}
		if mem, err = parse(m); err != nil {
			return out, fmt.Errorf("cgroup %s: memory.max %q: %w", name, m, err)
		}
	} else {
		values := map[string]string{}
		for _, f := range []struct{ ctrl, file string }{
			{"cpu", "cpu.shares"}, {"cpu", "cpu.cfs_quota_us"}, {"cpu", "cpu.cfs_period_us"}, {"memory", "memory.limit_in_bytes"},
		} {
			v, err := read(f.ctrl, f.file)
			if err != nil {
				return out, err
			}
			values[f.file] = v
		}
		var err error
		if shares, err = strconv.ParseUint(values["cpu.shares"], 10, 64); err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.shares: %w", name, err)
		}
		if quota, err = parse(values["cpu.cfs_quota_us"]); err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.cfs_quota_us: %w", name, err)
		}
		if period, err = strconv.ParseUint(values["cpu.cfs_period_us"], 10, 64); err != nil {
			return out, fmt.Errorf("cgroup %s: cpu.cfs_period_us: %w", name, err)
		}
		if mem, err = parse(values["memory.limit_in_bytes"]); err != nil {
			return out, fmt.Errorf("cgroup %s: memory.limit_in_bytes: %w", name, err)
		}
	}
	if mem == -1 {
		// No limit reads as the largest value, so any limit is a decrease.
		mem = int64(^uint64(0) >> 1)
	}
	out.CPUShares, out.CPUQuota, out.CPUPeriod, out.Memory = &shares, &quota, &period, &mem
	return out, nil
}
