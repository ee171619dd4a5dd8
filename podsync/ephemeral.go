package podsync

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Ephemeral containers (spec.ephemeralContainers, added through the pods'
// ephemeralcontainers subresource, e.g. by kubectl debug) as the kubelet runs
// them (v1.37.2): each starts once when the runtime has never seen a container
// of its name, even before the pod is initialized; it is never restarted, has
// no probes, lifecycle hooks or ports (the API server forbids them), does not
// count for the pod's phase or conditions, and with targetContainerName it
// runs in that container's PID namespace.

// MetricEphemeralContainer is the container type of ephemeral container starts
// in the kubelet's metrics.
const MetricEphemeralContainer = "ephemeral_container"

// ephemeralActions fills EphemeralContainersToStart: every ephemeral container
// with no attempt in the runtime, in any sandbox (computePodActions), and none
// recorded in the pod's status either. Runs only when the sandbox is kept: a new
// sandbox starts regular containers first, and an ephemeral container that ran
// in the old one stays done.
//
// The status check is nodekit's: the v1.37.2 kubelet looks at the runtime only,
// so an exited ephemeral container removed from the runtime (by hand, or by a
// garbage collector keeping fewer dead containers) is started again there
// (kubernetes/kubernetes#124176). Ephemeral containers are never restarted, so
// a status that shows one ran is as final as the runtime's record.
func (c *computer) ephemeralActions() {
	for i := range c.pod.Spec.EphemeralContainers {
		name := c.pod.Spec.EphemeralContainers[i].Name
		if c.latest(name) == nil && !ephemeralRan(c.pod, name) {
			c.actions.EphemeralContainersToStart = append(c.actions.EphemeralContainersToStart, i)
		}
	}
}

// ephemeralRan tells whether the pod's status records that the ephemeral
// container name was created: it has a container ID, or ran or ended. A waiting
// status without an ID (an image that could not be pulled, a config error) is
// no attempt, so the container is still started.
func ephemeralRan(pod *corev1.Pod, name string) bool {
	for i := range pod.Status.EphemeralContainerStatuses {
		st := &pod.Status.EphemeralContainerStatuses[i]
		if st.Name != name {
			continue
		}
		return st.ContainerID != "" || st.State.Running != nil || st.State.Terminated != nil ||
			st.LastTerminationState.Terminated != nil
	}
	return false
}

// ephemeralAsContainer is the i-th ephemeral container's common part, the
// Container the start path and the ConfigBuilder see.
func ephemeralAsContainer(pod *corev1.Pod, i int) *corev1.Container {
	return (*corev1.Container)(&pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
}

// ephemeralSpecs lists the pod's ephemeral containers as Containers, in spec
// order, as the kubelet converts them for their statuses.
func ephemeralSpecs(pod *corev1.Pod) []corev1.Container {
	if len(pod.Spec.EphemeralContainers) == 0 {
		return nil
	}
	out := make([]corev1.Container, 0, len(pod.Spec.EphemeralContainers))
	for i := range pod.Spec.EphemeralContainers {
		out = append(out, corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon))
	}
	return out
}

func isEphemeral(pod *corev1.Pod, name string) bool {
	return ephemeralByName(pod, name) != nil
}

func ephemeralByName(pod *corev1.Pod, name string) *corev1.EphemeralContainer {
	for i := range pod.Spec.EphemeralContainers {
		if pod.Spec.EphemeralContainers[i].Name == name {
			return &pod.Spec.EphemeralContainers[i]
		}
	}
	return nil
}

// ephemeralTarget is the runtime ID of the container whose PID namespace the
// ephemeral container ctr joins (startSpec.getTargetID): "" when ctr is not an
// ephemeral container or names no target; an error when the runtime has no
// container of the target's name.
func ephemeralTarget(pod *corev1.Pod, ctr *corev1.Container, view *PodView) (string, error) {
	ec := ephemeralByName(pod, ctr.Name)
	if ec == nil || ec.TargetContainerName == "" {
		return "", nil
	}
	st := view.Latest(ec.TargetContainerName)
	if st == nil {
		return "", fmt.Errorf("unable to find target container %v", ec.TargetContainerName)
	}
	return st.GetId(), nil
}

// joinTargetPID makes the container share target's PID namespace, as the
// kubelet does when the pod gives the container a namespace of its own (not
// with shareProcessNamespace or hostPID).
func joinTargetPID(cfg *runtimeapi.ContainerConfig, target string) {
	ns := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions()
	if target == "" || ns == nil || ns.GetPid() != runtimeapi.NamespaceMode_CONTAINER {
		return
	}
	ns.Pid = runtimeapi.NamespaceMode_TARGET
	ns.TargetId = target
}

// metricType is the container type of a start in the kubelet's metrics.
func metricType(pod *corev1.Pod, ctr *corev1.Container) string {
	if isEphemeral(pod, ctr.Name) {
		return MetricEphemeralContainer
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == ctr.Name {
			return MetricInitContainer
		}
	}
	return MetricContainer
}
