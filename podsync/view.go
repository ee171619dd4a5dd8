package podsync

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Labels and annotations the kubelet puts on sandboxes and containers, which
// this package reads back (the agent's ConfigBuilder writes them, with cri's
// config builders).
const (
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelContainerName = "io.kubernetes.container.name"

	AnnotationContainerHash            = "io.kubernetes.container.hash"
	AnnotationRestartCount             = "io.kubernetes.container.restartCount"
	AnnotationTerminationMessagePath   = "io.kubernetes.container.terminationMessagePath"
	AnnotationTerminationMessagePolicy = "io.kubernetes.container.terminationMessagePolicy"
	AnnotationTerminationGracePeriod   = "io.kubernetes.pod.terminationGracePeriod"
)

// PodView is the runtime's view of one pod: every sandbox and container carrying
// its io.kubernetes.pod.uid label, as the kubelet's kubecontainer.PodStatus
// holds them. Build it with LoadView, or by hand in tests.
type PodView struct {
	UID       types.UID
	Name      string
	Namespace string
	// Sandboxes, newest first (by CreatedAt).
	Sandboxes []*runtimeapi.PodSandboxStatus
	// Containers, every attempt of every container, newest first (by CreatedAt).
	Containers []*runtimeapi.ContainerStatus
	// ContainerSandboxes maps a container ID to its sandbox's ID (LoadView fills
	// it from ListContainers). When nil, every container counts as belonging to
	// the newest sandbox.
	ContainerSandboxes map[string]string
	// TerminationMessages holds the termination message found for an exited
	// container, by container ID (see LoadView). PodStatus prefers it to the
	// runtime's ContainerStatus.Message.
	TerminationMessages map[string]string
}

// LoadView lists the sandboxes and containers labelled with uid and reads their
// statuses. A sandbox or container removed between the list and the status call
// is left out. When files is not nil, the termination message of each exited
// container is read as the kubelet reads it (see TerminationMessage).
func LoadView(ctx context.Context, src ViewSource, uid types.UID, files FileReader) (*PodView, error) {
	sel := map[string]string{LabelPodUID: string(uid)}
	sandboxes, err := src.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes of pod %s: %w", uid, err)
	}
	v := &PodView{UID: uid}
	for _, sb := range sandboxes {
		st, err := src.PodSandboxStatus(ctx, sb.GetId())
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("status of sandbox %s of pod %s: %w", sb.GetId(), uid, err)
		}
		v.Sandboxes = append(v.Sandboxes, st)
	}
	containers, err := src.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list containers of pod %s: %w", uid, err)
	}
	v.ContainerSandboxes = make(map[string]string, len(containers))
	for _, c := range containers {
		v.ContainerSandboxes[c.GetId()] = c.GetPodSandboxId()
		st, err := src.ContainerStatus(ctx, c.GetId())
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("status of container %s of pod %s: %w", c.GetId(), uid, err)
		}
		if st.Labels == nil {
			st.Labels = c.GetLabels()
		}
		if st.Annotations == nil {
			st.Annotations = c.GetAnnotations()
		}
		v.Containers = append(v.Containers, st)
	}
	v.sort()
	for _, sb := range v.Sandboxes {
		v.Name = sb.GetMetadata().GetName()
		v.Namespace = sb.GetMetadata().GetNamespace()
		break
	}
	if files != nil {
		for _, c := range v.Containers {
			if c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
				continue
			}
			if msg := TerminationMessage(c, files); msg != "" {
				if v.TerminationMessages == nil {
					v.TerminationMessages = map[string]string{}
				}
				v.TerminationMessages[c.GetId()] = msg
			}
		}
	}
	return v, nil
}

func (v *PodView) sort() {
	// Newest first by creation time; on a tie (a coarse clock) the higher
	// attempt is the newer one.
	sort.SliceStable(v.Sandboxes, func(i, j int) bool {
		a, b := v.Sandboxes[i], v.Sandboxes[j]
		if a.GetCreatedAt() != b.GetCreatedAt() {
			return a.GetCreatedAt() > b.GetCreatedAt()
		}
		return a.GetMetadata().GetAttempt() > b.GetMetadata().GetAttempt()
	})
	sort.SliceStable(v.Containers, func(i, j int) bool {
		a, b := v.Containers[i], v.Containers[j]
		if a.GetCreatedAt() != b.GetCreatedAt() {
			return a.GetCreatedAt() > b.GetCreatedAt()
		}
		return RestartCount(a) > RestartCount(b)
	})
}

// Sandbox returns the newest sandbox, or nil.
func (v *PodView) Sandbox() *runtimeapi.PodSandboxStatus {
	if v == nil || len(v.Sandboxes) == 0 {
		return nil
	}
	return v.Sandboxes[0]
}

// IPs returns the pod's IPs from the newest sandbox (primary first), or nil
// when that sandbox is not ready or has none, as the kubelet's GetPodStatus
// reads them.
func (v *PodView) IPs() []string {
	sb := v.Sandbox()
	if sb.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY || sb.GetNetwork().GetIp() == "" {
		return nil
	}
	ips := []string{sb.GetNetwork().GetIp()}
	for _, ip := range sb.GetNetwork().GetAdditionalIps() {
		if ip.GetIp() != "" {
			ips = append(ips, ip.GetIp())
		}
	}
	return ips
}

// Latest returns the newest attempt of the named container, or nil.
func (v *PodView) Latest(name string) *runtimeapi.ContainerStatus {
	if v == nil {
		return nil
	}
	for _, c := range v.Containers {
		if ContainerName(c) == name {
			return c
		}
	}
	return nil
}

// Active returns the containers of the newest sandbox while it is ready (the
// kubelet's ActiveContainerStatuses), newest first.
func (v *PodView) Active() []*runtimeapi.ContainerStatus {
	sb := v.Sandbox()
	if sb.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY {
		return nil
	}
	if v.ContainerSandboxes == nil {
		return v.Containers
	}
	var out []*runtimeapi.ContainerStatus
	for _, c := range v.Containers {
		if v.ContainerSandboxes[c.GetId()] == sb.GetId() {
			out = append(out, c)
		}
	}
	return out
}

// LatestActive returns the newest attempt of the named container in the
// current sandbox, or nil.
func (v *PodView) LatestActive(name string) *runtimeapi.ContainerStatus {
	for _, c := range v.Active() {
		if ContainerName(c) == name {
			return c
		}
	}
	return nil
}

// anyActiveRegular is HasAnyActiveRegularContainerStarted: an app container,
// in any state, exists in the current sandbox.
func (v *PodView) anyActiveRegular(pod *corev1.Pod) bool {
	for i := range pod.Spec.Containers {
		if v.LatestActive(pod.Spec.Containers[i].Name) != nil {
			return true
		}
	}
	return false
}

// Attempts returns every attempt of the named container, newest first.
func (v *PodView) Attempts(name string) []*runtimeapi.ContainerStatus {
	if v == nil {
		return nil
	}
	var out []*runtimeapi.ContainerStatus
	for _, c := range v.Containers {
		if ContainerName(c) == name {
			out = append(out, c)
		}
	}
	return out
}

// ContainerName returns the container's io.kubernetes.container.name label,
// falling back to its metadata name.
func ContainerName(c *runtimeapi.ContainerStatus) string {
	if n := c.GetLabels()[LabelContainerName]; n != "" {
		return n
	}
	return c.GetMetadata().GetName()
}

// RestartCount returns the restart count the kubelet wrote on the container
// (its io.kubernetes.container.restartCount annotation, else its attempt).
func RestartCount(c *runtimeapi.ContainerStatus) int {
	if s, ok := c.GetAnnotations()[AnnotationRestartCount]; ok {
		if n, err := strconv.Atoi(s); err == nil && n >= 0 {
			return n
		}
	}
	return int(c.GetMetadata().GetAttempt())
}

// ContainerHashOf returns the io.kubernetes.container.hash annotation of c
// ("" when missing).
func ContainerHashOf(c *runtimeapi.ContainerStatus) string {
	return c.GetAnnotations()[AnnotationContainerHash]
}
