package podsync

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Waiting is a container's last sync failure, shown as its waiting state
// (the kubelet's reason cache): Reason is one of the sentinels' words.
type Waiting struct {
	Reason  string
	Message string
}

// StatusInput holds what PodStatus needs besides the pod and the runtime's view.
type StatusInput struct {
	// Probes gives readiness and startup results (nil: no probes run).
	Probes ProbeResults
	// Waiting holds the last sync failure per container name (see
	// Syncer.PodStatus, which fills it from its own record).
	Waiting map[string]Waiting
	// HostIPs are the node's IPs, primary first.
	HostIPs []string
	// Now stamps changed conditions' lastTransitionTime and the start time of a
	// pod that has none; zero means time.Now().
	Now time.Time
	// Terminal says the pod will not run again (it was deleted, or the kubelet
	// decided it is done): stopped containers then give Succeeded or Failed
	// whatever the restart policy.
	Terminal bool
	// AgentStart is when the agent (its prober) started. When set, a container
	// that has run since at least 10s before it and has no readiness result
	// yet keeps the readiness its pod had, as the kubelet does after a restart.
	AgentStart time.Time
	// RuntimeName prefixes container IDs ("containerd://<id>"); empty means
	// DefaultRuntimeName.
	RuntimeName string
	// ResizeConditions are the PodResizePending and PodResizeInProgress
	// conditions the agent keeps for the pod (the kubelet's status manager
	// does); they replace any in pod.Status.
	ResizeConditions []corev1.PodCondition
}

// PodStatus computes the status the kubelet would write for pod from the
// runtime's view (generateAPIPodStatus): phase, the conditions
// PodReadyToStartContainers, Initialized, ContainersReady and Ready (PodScheduled
// and other conditions in pod.Status are kept), container and init container
// statuses with their waiting and terminated reasons and messages, restart
// counts, lastState, started and ready, podIP(s), hostIP(s), startTime and
// qosClass. pod.Status is read as the previous status: restart counts and
// terminated states survive containers the runtime has removed, and
// unchanged conditions keep their lastTransitionTime. It is pure.
//
// Ephemeral container statuses are made as the others, except that the prober
// leaves them alone (never ready, started unset) and they count for neither
// phase nor conditions.
func PodStatus(pod *corev1.Pod, view *PodView, in StatusInput) corev1.PodStatus {
	return podStatus(pod, view, in)
}
