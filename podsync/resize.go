package podsync

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// In-place pod resize (KEP-1287, GA in 1.35): the decision half. The pod
// handed to ComputeActions carries the allocated resources (what the agent
// admitted); ActionOptions.Actuated gives what each container was last created
// or updated with. A running container whose cpu or memory differs is updated
// in place, or restarted when its resizePolicy says RestartContainer for a
// resource that changed (computePodResizeAction).

// ErrResizePodInPlace is the reason of a failed in-place resize step (the
// kubelet's ResizePodInPlaceError); Message gives the text the kubelet puts in
// the PodResizeInProgress condition with reason Error.
var ErrResizePodInPlace = errors.New("ResizePodInPlaceError")

// ActionResizePodInPlace is the StepResult.Action of a resize.
const ActionResizePodInPlace = "ResizePodInPlace"

// ResourceValues are the four numbers a resize compares, as the kubelet's
// resourceRequirements: memory in bytes, cpu in millicores, zero when unset.
type ResourceValues struct {
	MemoryLimit   int64
	MemoryRequest int64
	CPULimit      int64
	CPURequest    int64
}

// ResourceValuesOf reads r's cpu and memory requests and limits.
func ResourceValuesOf(r *corev1.ResourceRequirements) ResourceValues {
	return ResourceValues{
		MemoryLimit:   r.Limits.Memory().Value(),
		MemoryRequest: r.Requests.Memory().Value(),
		CPULimit:      r.Limits.Cpu().MilliValue(),
		CPURequest:    r.Requests.Cpu().MilliValue(),
	}
}

// ContainerUpdate is one running container whose resources change in place.
type ContainerUpdate struct {
	// ContainerID is the runtime's ID of the running container.
	ContainerID string
	// Container is its spec with the allocated resources.
	Container *corev1.Container
	// Desired are the allocated values; Current the actuated ones. Current is
	// shared by a container's cpu and memory updates, and moves to Desired for
	// the resource just updated, so the second update carries the first's
	// values.
	Desired ResourceValues
	Current *ResourceValues
}

// resize is computePodResizeAction for the running container ctr (an app
// container or a sidecar): it records an in-place update, or a restart when
// the resizePolicy asks for one, calling start to start it again. It returns
// false when the container is to be restarted.
func (c *computer) resize(ctr *corev1.Container, st *runtimeapi.ContainerStatus, start func()) bool {
	if c.actuated == nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
		return true
	}
	// A container with no record counts as actuated at zero, as upstream: for
	// NotRequired that is one idempotent update.
	actuated, _ := c.actuated(ctr.Name)
	desired := ResourceValuesOf(&ctr.Resources)
	current := ResourceValuesOf(&actuated)
	if desired == current {
		return true
	}
	decide := func(name corev1.ResourceName, want, have int64) (resize, restart bool) {
		if want == have {
			return false, false
		}
		for _, p := range ctr.ResizePolicy {
			if p.ResourceName == name {
				return true, p.RestartPolicy == corev1.RestartContainer
			}
		}
		return true, false // NotRequired is the default
	}
	memLim, restartMemLim := decide(corev1.ResourceMemory, desired.MemoryLimit, current.MemoryLimit)
	memReq, restartMemReq := decide(corev1.ResourceMemory, desired.MemoryRequest, current.MemoryRequest)
	cpuLim, restartCPULim := decide(corev1.ResourceCPU, desired.CPULimit, current.CPULimit)
	cpuReq, restartCPUReq := decide(corev1.ResourceCPU, desired.CPURequest, current.CPURequest)
	if restartMemLim || restartMemReq || restartCPULim || restartCPUReq {
		c.kill(st, ctr, KillUnknown, fmt.Sprintf("Container %s resize requires restart", ctr.Name))
		start()
		c.actions.UpdatePodResources = true
		return false
	}
	shared := &current
	mark := func(name corev1.ResourceName, want, have int64) {
		if c.actions.ContainersToUpdate == nil {
			c.actions.ContainersToUpdate = map[corev1.ResourceName][]ContainerUpdate{}
		}
		u := ContainerUpdate{ContainerID: st.GetId(), Container: ctr, Desired: desired, Current: shared}
		list := c.actions.ContainersToUpdate[name]
		// Decreases go first, so the pod's total shrinks before anything grows.
		if want < have {
			list = append([]ContainerUpdate{u}, list...)
		} else {
			list = append(list, u)
		}
		c.actions.ContainersToUpdate[name] = list
	}
	switch {
	case memLim:
		mark(corev1.ResourceMemory, desired.MemoryLimit, current.MemoryLimit)
	case memReq:
		mark(corev1.ResourceMemory, desired.MemoryRequest, current.MemoryRequest)
	}
	switch {
	case cpuLim:
		mark(corev1.ResourceCPU, desired.CPULimit, current.CPULimit)
	case cpuReq:
		mark(corev1.ResourceCPU, desired.CPURequest, current.CPURequest)
	}
	return true
}

// startingResized reports whether a container about to start has resources
// other than the ones it last ran with, so the pod cgroup must follow first
// (startingResizedContainer).
func (c *computer) startingResized() bool {
	if c.actuated == nil {
		return false
	}
	changed := func(ctr *corev1.Container) bool {
		actuated, _ := c.actuated(ctr.Name)
		return ResourceValuesOf(&ctr.Resources) != ResourceValuesOf(&actuated)
	}
	for _, i := range c.actions.InitContainersToStart {
		if changed(&c.pod.Spec.InitContainers[i]) {
			return true
		}
	}
	for _, i := range c.actions.ContainersToStart {
		if changed(&c.pod.Spec.Containers[i]) {
			return true
		}
	}
	return false
}
