package podsync

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ResourceUpdater is optional on a Runtime: with it (as *cri.Client has it)
// running containers are resized in place through the CRI's
// UpdateContainerResources; without it a resize fails with ErrResizePodInPlace.
type ResourceUpdater interface {
	UpdateContainerResources(ctx context.Context, containerID string, resources *runtimeapi.LinuxContainerResources) error
}

// ResourcesBuilder is optional on a ConfigBuilder: it gives the Linux
// resources ContainerConfig would put in a container's config, for the
// UpdateContainerResources of an in-place resize.
type ResourcesBuilder interface {
	ContainerResources(pod *corev1.Pod, container *corev1.Container) (*runtimeapi.LinuxContainerResources, error)
}

// PodCgroupConfig is a pod cgroup's cpu and memory settings (the kubelet's
// ResourceConfig); nil fields are not set.
type PodCgroupConfig struct {
	CPUShares *uint64
	CPUQuota  *int64
	CPUPeriod *uint64
	Memory    *int64
}

// PodCgroups is the pod-level cgroup the agent keeps around a pod's
// containers (the kubelet's pod container manager). An in-place resize moves
// it in step with the containers.
type PodCgroups interface {
	// DesiredPodCgroupConfig is what the pod's cgroup should hold for pod's
	// (allocated) resources: the kubelet's ResourceConfigForPod.
	DesiredPodCgroupConfig(pod *corev1.Pod) PodCgroupConfig
	// CurrentPodCgroupConfig reads what the cgroup holds (cpu shares, quota,
	// period and the memory limit all set).
	CurrentPodCgroupConfig(pod *corev1.Pod) (PodCgroupConfig, error)
	// SetPodCgroupConfig writes the fields of cfg that are set.
	SetPodCgroupConfig(pod *corev1.Pod, cfg PodCgroupConfig) error
}

// MemoryUsage is optional on PodCgroups: with it, a resize that would set a
// memory limit at or below what the pod or the container uses now is refused
// before anything changes (validateMemoryResizeAction), instead of leaving the
// kernel to reclaim or OOM-kill.
type MemoryUsage interface {
	PodMemoryUsage(pod *corev1.Pod) (int64, error)
	ContainerMemoryUsage(pod *corev1.Pod, containerID string) (int64, error)
}

// ActuatedStore keeps what each container of a pod was last created or
// updated with (the kubelet's actuated state). The Syncer keeps it in memory
// unless Config.Actuated gives one, which lets an agent carry it across its
// restarts as the kubelet's actuated_pods_state checkpoint does: a resize that
// was admitted but not yet carried out is then retried after a restart instead
// of being taken as done. It must be safe for concurrent use.
//
// PodActuated returns a map the Syncer may change (a copy of the store's); the
// Syncer does not touch a map once it has passed it to SetPodActuated.
type ActuatedStore interface {
	// PodActuated returns the record of the pod with uid, false when there is none.
	PodActuated(uid types.UID) (map[string]corev1.ResourceRequirements, bool)
	// SetPodActuated replaces the pod's record.
	SetPodActuated(uid types.UID, containers map[string]corev1.ResourceRequirements)
	// RemovePodActuated forgets the pod.
	RemovePodActuated(uid types.UID)
}

// memoryActuated is the default ActuatedStore.
type memoryActuated struct {
	mu   sync.Mutex
	pods map[types.UID]map[string]corev1.ResourceRequirements
}

func (m *memoryActuated) PodActuated(uid types.UID) (map[string]corev1.ResourceRequirements, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.pods[uid]
	return cloneResources(r), ok
}

func (m *memoryActuated) SetPodActuated(uid types.UID, containers map[string]corev1.ResourceRequirements) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pods[uid] = cloneResources(containers)
}

func (m *memoryActuated) RemovePodActuated(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pods, uid)
}

func cloneResources(in map[string]corev1.ResourceRequirements) map[string]corev1.ResourceRequirements {
	if in == nil {
		return nil
	}
	out := make(map[string]corev1.ResourceRequirements, len(in))
	for k, v := range in {
		out[k] = *v.DeepCopy()
	}
	return out
}

// actuatedResources returns what the container was last created or updated
// with.
func (s *Syncer) actuatedResources(uid types.UID, name string) (corev1.ResourceRequirements, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pod, _ := s.actuated.PodActuated(uid)
	r, ok := pod[name]
	return r, ok
}

func (s *Syncer) setActuated(uid types.UID, name string, r corev1.ResourceRequirements) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pod, _ := s.actuated.PodActuated(uid)
	if pod == nil {
		pod = map[string]corev1.ResourceRequirements{}
	}
	pod[name] = *r.DeepCopy()
	s.actuated.SetPodActuated(uid, pod)
}

// initActuated records the pod's resources as actuated when the Syncer has no
// record of it yet (InitializeActuatedPod): a pod found running after the agent
// restarted is taken to run with what it was allocated.
func (s *Syncer) initActuated(pod *corev1.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.actuated.PodActuated(pod.UID); ok {
		return
	}
	m := map[string]corev1.ResourceRequirements{}
	for i := range pod.Spec.InitContainers {
		m[pod.Spec.InitContainers[i].Name] = *pod.Spec.InitContainers[i].Resources.DeepCopy()
	}
	for i := range pod.Spec.Containers {
		m[pod.Spec.Containers[i].Name] = *pod.Spec.Containers[i].Resources.DeepCopy()
	}
	s.actuated.SetPodActuated(pod.UID, m)
}

// ResizeInProgress reports whether a running app container or sidecar of pod (whose spec
// holds the allocated resources) still runs with other cpu or memory values
// than allocated (the kubelet's IsPodResizeInProgress): the agent keeps the
// PodResizeInProgress condition while it does.
func (s *Syncer) ResizeInProgress(pod *corev1.Pod, view *PodView) bool {
	if view == nil {
		return false
	}
	resizable := append([]corev1.Container{}, pod.Spec.Containers...)
	for i := range pod.Spec.InitContainers {
		if IsRestartableInitContainer(&pod.Spec.InitContainers[i]) {
			resizable = append(resizable, pod.Spec.InitContainers[i])
		}
	}
	for i := range resizable {
		ctr := &resizable[i]
		st := view.Latest(ctr.Name)
		if st == nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		actuated, _ := s.actuatedResources(pod.UID, ctr.Name)
		for _, l := range []struct{ want, have corev1.ResourceList }{
			{ctr.Resources.Requests, actuated.Requests}, {ctr.Resources.Limits, actuated.Limits},
		} {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				want, have := l.want[r], l.have[r]
				if !want.Equal(have) {
					return true
				}
			}
		}
	}
	return false
}

// resizePod is doPodResizeAction: memory first, then cpu; for each, the pod
// cgroup grows before the containers and shrinks after them, so the pod's
// limit always covers its containers'. It stops at the first error; the next
// sync retries what is left.
func (s *Syncer) resizePod(ctx context.Context, pod *corev1.Pod, actions Actions) error {
	fail := func(format string, args ...any) error {
		return failure(ErrResizePodInPlace, fmt.Sprintf(format, args...), "pod %s", formatPod(pod))
	}
	var desired, current PodCgroupConfig
	pcg := s.cfg.PodCgroups
	if pcg != nil {
		desired = pcg.DesiredPodCgroupConfig(pod)
		var err error
		if current, err = pcg.CurrentPodCgroupConfig(pod); err != nil {
			return fail("unable to get pod cgroup config for pod %q: %v", formatPod(pod), err)
		}
	}
	if err := s.checkMemoryDecrease(pod, actions, desired, current); err != nil {
		return fail("%v", err)
	}
	setPod := func(name corev1.ResourceName, limit bool) error {
		if pcg == nil {
			return nil
		}
		var cfg PodCgroupConfig
		switch {
		case name == corev1.ResourceCPU && limit:
			cfg.CPUPeriod, cfg.CPUQuota = desired.CPUPeriod, desired.CPUQuota
		case name == corev1.ResourceCPU:
			cfg.CPUShares = desired.CPUShares
		case limit:
			cfg.Memory = desired.Memory
		default:
			return nil // memory requests are not written to cgroups
		}
		if err := pcg.SetPodCgroupConfig(pod, cfg); err != nil {
			return fmt.Errorf("failed to set pod cgroup config (resource=%s): %w", name, err)
		}
		return nil
	}
	step := func(name corev1.ResourceName, curLim, newLim, curReq, newReq int64) error {
		if newLim > curLim {
			if err := setPod(name, true); err != nil {
				return err
			}
		}
		if newReq > curReq {
			if err := setPod(name, false); err != nil {
				return err
			}
		}
		if err := s.updateContainers(ctx, pod, name, actions.ContainersToUpdate[name]); err != nil {
			return err
		}
		if newReq < curReq {
			if err := setPod(name, false); err != nil {
				return err
			}
		}
		if newLim < curLim {
			return setPod(name, true)
		}
		return nil
	}
	deref := func(p *int64) int64 {
		if p == nil {
			return 0
		}
		return *p
	}
	if len(actions.ContainersToUpdate[corev1.ResourceMemory]) > 0 || actions.UpdatePodResources {
		if desired.Memory == nil {
			// No pod memory limit: keep the current one (removing limits is not supported upstream either).
			desired.Memory = current.Memory
		}
		if err := step(corev1.ResourceMemory, deref(current.Memory), deref(desired.Memory), 0, 0); err != nil {
			return fail("%v", err)
		}
	}
	if len(actions.ContainersToUpdate[corev1.ResourceCPU]) > 0 || actions.UpdatePodResources {
		if desired.CPUQuota == nil {
			desired.CPUQuota = current.CPUQuota
		}
		var curShares, newShares int64
		if current.CPUShares != nil {
			curShares = int64(*current.CPUShares)
		}
		if desired.CPUShares != nil {
			newShares = int64(*desired.CPUShares)
		}
		if err := step(corev1.ResourceCPU, deref(current.CPUQuota), deref(desired.CPUQuota), curShares, newShares); err != nil {
			return fail("%v", err)
		}
	}
	return nil
}

// checkMemoryDecrease is validateMemoryResizeAction: a memory limit that is
// added or lowered, for the pod or a container, must stay above current usage.
func (s *Syncer) checkMemoryDecrease(pod *corev1.Pod, actions Actions, desired, current PodCgroupConfig) error {
	usage, ok := s.cfg.PodCgroups.(MemoryUsage)
	if !ok || (len(actions.ContainersToUpdate[corev1.ResourceMemory]) == 0 && !actions.UpdatePodResources) {
		return nil
	}
	podDecreasing := desired.Memory != nil && (current.Memory == nil || *desired.Memory < *current.Memory)
	type decrease struct {
		name, id string
		limit    int64
	}
	var containers []decrease
	for _, u := range actions.ContainersToUpdate[corev1.ResourceMemory] {
		if u.Desired.MemoryLimit != 0 && (u.Current.MemoryLimit == 0 || u.Desired.MemoryLimit < u.Current.MemoryLimit) {
			containers = append(containers, decrease{u.Container.Name, u.ContainerID, u.Desired.MemoryLimit})
		}
	}
	if !podDecreasing && len(containers) == 0 {
		return nil
	}
	var errs []error
	podUsage, err := usage.PodMemoryUsage(pod)
	if err != nil {
		return fmt.Errorf("unable to read memory usage for pod %q", formatPod(pod))
	}
	if podDecreasing && podUsage >= *desired.Memory {
		errs = append(errs, fmt.Errorf("attempting to set pod memory limit (%d) below current usage (%d)", *desired.Memory, podUsage))
	}
	for _, c := range containers {
		used, err := usage.ContainerMemoryUsage(pod, c.id)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("missing container %q memory usage", c.name))
		case used >= c.limit:
			// Upstream prints the pod's usage here, not the container's; kept so the
			// message reads the same.
			errs = append(errs, fmt.Errorf("attempting to set container %q memory limit (%d) below current usage (%d)", c.name, c.limit, podUsage))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("cannot decrease memory limits: %w", utilerrors.NewAggregate(errs))
	}
	return nil
}

// updateContainers is updatePodContainerResources: each container gets the
// new values of one resource and its last values of the other.
func (s *Syncer) updateContainers(ctx context.Context, pod *corev1.Pod, name corev1.ResourceName, list []ContainerUpdate) error {
	if len(list) == 0 {
		return nil
	}
	updater, ok := s.cfg.Runtime.(ResourceUpdater)
	if !ok {
		return fmt.Errorf("the runtime cannot update container resources")
	}
	rb, ok := s.cfg.Builder.(ResourcesBuilder)
	if !ok {
		return fmt.Errorf("the config builder cannot build container resources")
	}
	for _, u := range list {
		ctr := u.Container.DeepCopy()
		mem, cpu := *u.Current, u.Desired
		if name == corev1.ResourceMemory {
			mem, cpu = u.Desired, *u.Current
		}
		ctr.Resources.Limits = corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(cpu.CPULimit, resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(mem.MemoryLimit, resource.BinarySI),
		}
		ctr.Resources.Requests = corev1.ResourceList{
			corev1.ResourceCPU:    *resource.NewMilliQuantity(cpu.CPURequest, resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(mem.MemoryRequest, resource.BinarySI),
		}
		res, err := rb.ContainerResources(pod, ctr)
		if err != nil {
			return fmt.Errorf("container %q: cannot generate resources config: %w", ctr.Name, err)
		}
		if err := updater.UpdateContainerResources(ctx, u.ContainerID, res); err != nil {
			return fmt.Errorf("container %q: UpdateContainerResources: %v", ctr.Name, grpcMessage(err))
		}
		s.setActuated(pod.UID, ctr.Name, ctr.Resources)
		if name == corev1.ResourceMemory {
			u.Current.MemoryLimit, u.Current.MemoryRequest = u.Desired.MemoryLimit, u.Desired.MemoryRequest
		} else {
			u.Current.CPULimit, u.Current.CPURequest = u.Desired.CPULimit, u.Desired.CPURequest
		}
	}
	return nil
}
