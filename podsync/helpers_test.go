package podsync

import (
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// t0 is the test epoch.
var t0 = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

func testPod(mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{
				{Name: "app", Image: "busybox"},
				{Name: "side", Image: "busybox"},
			},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func withPolicy(rp corev1.RestartPolicy) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = rp }
}

func withInits(names ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, n := range names {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: n, Image: "busybox"})
		}
	}
}

func withSidecar(name string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: name, Image: "busybox", RestartPolicy: &always})
	}
}

func sandbox(id string, attempt uint32, ready bool, ip string) *runtimeapi.PodSandboxStatus {
	st := runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	if ready {
		st = runtimeapi.PodSandboxState_SANDBOX_READY
	}
	return &runtimeapi.PodSandboxStatus{
		Id:        id,
		Metadata:  &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "default", Uid: "uid-1", Attempt: attempt},
		State:     st,
		CreatedAt: t0.Add(time.Duration(attempt) * time.Minute).UnixNano(),
		Network:   &runtimeapi.PodSandboxNetworkStatus{Ip: ip},
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{
			Options: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_POD},
		}},
	}
}

// cs is a container status: created at t0+created seconds, with the hash of
// image busybox.
type cs struct {
	name     string
	id       string
	state    runtimeapi.ContainerState
	exit     int32
	created  int
	restarts int
	image    string
	reason   string
	message  string
	started  int // seconds after t0, for running/exited
	finished int // seconds after t0, for exited
}

func (c cs) status() *runtimeapi.ContainerStatus {
	image := c.image
	if image == "" {
		image = "busybox"
	}
	st := &runtimeapi.ContainerStatus{
		Id:        c.id,
		Metadata:  &runtimeapi.ContainerMetadata{Name: c.name, Attempt: uint32(c.restarts)},
		State:     c.state,
		CreatedAt: t0.Add(time.Duration(c.created) * time.Second).UnixNano(),
		ExitCode:  c.exit,
		Image:     &runtimeapi.ImageSpec{Image: image},
		ImageRef:  "sha256:" + image,
		Reason:    c.reason,
		Message:   c.message,
		Labels:    map[string]string{LabelContainerName: c.name, LabelPodUID: "uid-1"},
		Annotations: map[string]string{
			AnnotationContainerHash: ContainerHash(&corev1.Container{Name: c.name, Image: image}),
			AnnotationRestartCount:  strconv.Itoa(c.restarts),
		},
	}
	if c.state == runtimeapi.ContainerState_CONTAINER_RUNNING || c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
		st.StartedAt = t0.Add(time.Duration(c.started) * time.Second).UnixNano()
	}
	if c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
		st.FinishedAt = t0.Add(time.Duration(c.finished) * time.Second).UnixNano()
		if st.Reason == "" {
			st.Reason = "Completed"
			if c.exit != 0 {
				st.Reason = "Error"
			}
		}
	}
	return st
}

const (
	created = runtimeapi.ContainerState_CONTAINER_CREATED
	running = runtimeapi.ContainerState_CONTAINER_RUNNING
	exited  = runtimeapi.ContainerState_CONTAINER_EXITED
	unknown = runtimeapi.ContainerState_CONTAINER_UNKNOWN
)

func view(sbs []*runtimeapi.PodSandboxStatus, ctrs ...cs) *PodView {
	v := &PodView{UID: "uid-1", Name: "web", Namespace: "default", Sandboxes: sbs}
	for _, c := range ctrs {
		v.Containers = append(v.Containers, c.status())
	}
	v.sort()
	return v
}

func ready() []*runtimeapi.PodSandboxStatus {
	return []*runtimeapi.PodSandboxStatus{sandbox("sb1", 0, true, "10.0.0.5")}
}

// probeMap is a ProbeResults from a map keyed by type and container ID.
type probeMap map[ProbeType]map[string]ProbeResult

func (m probeMap) ProbeResult(t ProbeType, id string) (ProbeResult, bool) {
	r, ok := m[t][id]
	return r, ok
}
