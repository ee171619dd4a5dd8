package podsync

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/dump"
)

// KillReason says why a container is to be killed; it picks the grace period
// (a probe-level terminationGracePeriodSeconds applies to probe kills only).
type KillReason string

const (
	// KillLivenessProbe: the liveness probe failed.
	KillLivenessProbe KillReason = "LivenessProbe"
	// KillStartupProbe: the startup probe failed.
	KillStartupProbe KillReason = "StartupProbe"
	// KillFailedPostStartHook: the postStart hook failed.
	KillFailedPostStartHook KillReason = "FailedPostStartHook"
	// KillUnknown: any other reason (spec changed, not wanted any more).
	KillUnknown KillReason = "Unknown"
)

// KillAction is one container to kill, with the message the Killing event carries.
type KillAction struct {
	// ContainerID is the runtime's ID of the container.
	ContainerID string
	// Name is the container's name.
	Name string
	// Container is its spec, nil when the pod no longer has a container of that name.
	Container *corev1.Container
	// Reason picks the grace period; Message is the kubelet's explanation
	// ("Container app failed liveness probe", ...).
	Reason  KillReason
	Message string
}

// Actions is what the kubelet's computePodActions decides for one pod: whether to
// kill the pod and (re)create its sandbox, which init containers and app
// containers to start, and which containers to kill.
type Actions struct {
	// KillPod: stop every container and the sandbox before anything else. Set
	// when the sandbox must be recreated, or when nothing is left to run.
	KillPod bool
	// CreateSandbox: run a new sandbox with attempt Attempt.
	CreateSandbox bool
	// SandboxID is the sandbox to use when it is kept (or the old one to kill).
	SandboxID string
	// Attempt is the new sandbox's attempt: one more than the newest sandbox's.
	Attempt uint32
	// InitContainersToStart are indexes into Spec.InitContainers, in start order.
	// Ordinary init containers start one at a time; restartable ones (sidecars)
	// start and the next one follows once the sidecar is started.
	InitContainersToStart []int
	// ContainersToStart are indexes into Spec.Containers.
	ContainersToStart []int
	// EphemeralContainersToStart are indexes into Spec.EphemeralContainers: the
	// ones the runtime has never run (they start once, before init containers).
	EphemeralContainersToStart []int
	// ContainersToKill, in the order found (init containers, then app containers).
	ContainersToKill []KillAction
	// ContainersToUpdate are the running containers resized in place, per
	// resource (cpu, memory), decreases before increases. Set only when
	// ActionOptions.Actuated is given.
	ContainersToUpdate map[corev1.ResourceName][]ContainerUpdate
	// UpdatePodResources: a container restarts or starts with resources other
	// than it ran with (resizePolicy RestartContainer), so the pod cgroup is
	// resized before it starts.
	UpdatePodResources bool
}

// ActionOptions are the inputs of ComputeActions besides the pod and its view.
type ActionOptions struct {
	// Probes gives liveness and startup results (nil: no probes run).
	Probes ProbeResults
	// Hash is the container spec hash written in the io.kubernetes.container.hash
	// annotation, as a lowercase hex string. Nil means ContainerHash. Pass the hash
	// function of your ConfigBuilder if it writes another one.
	Hash func(*corev1.Container) string
	// RuntimeName prefixes the container IDs handed to Probes, which are in
	// ContainerStatus.ContainerID form ("containerd://<id>"). Empty means
	// DefaultRuntimeName.
	RuntimeName string
	// Actuated gives the resources a container of the pod was last created or
	// updated with (the kubelet's actuated state); the pod's spec holds the
	// allocated ones. Nil: no in-place resize is computed.
	Actuated func(container string) (corev1.ResourceRequirements, bool)
}

// ContainerHash is the kubelet's container hash as nodekit writes it: FNV-32a over
// the apimachinery hash dump of the JSON of the container's name and image, in
// lowercase hex. Only a changed name or image makes the kubelet restart a
// container (since Kubernetes 1.31).
func ContainerHash(c *corev1.Container) string {
	b, _ := json.Marshal(struct {
		Image string `json:"image"`
		Name  string `json:"name"`
	}{c.Image, c.Name})
	h := fnv.New32a()
	fmt.Fprintf(h, "%v", dump.ForHash(b))
	return strconv.FormatUint(uint64(h.Sum32()), 16)
}

// ComputeActions decides what to do next for pod given the runtime's view of it,
// as the kubelet's computePodActions does. It is pure: it reads pod and view and
// changes neither.
func ComputeActions(pod *corev1.Pod, view *PodView, opts ActionOptions) Actions {
	return computeActions(pod, view, opts)
}
