package podsynctest

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
)

var (
	_ podsync.Runtime        = (*Runtime)(nil)
	_ podsync.ImagePuller    = (*Runtime)(nil)
	_ podsync.ImageInspector = (*Runtime)(nil)
	_ podsync.ConfigBuilder  = (*Builder)(nil)
	_ podsync.EventRecorder  = (*Recorder)(nil)
)

// Builder is a minimal podsync.ConfigBuilder: the kubelet's labels and the
// annotations podsync reads back (hash, restart count, termination message path
// and policy, grace period), command and args, the pod's hostNetwork and the
// mounts of image volumes. Set
// Fail to make ContainerConfig fail for a container name.
type Builder struct {
	// Hash is the container hash (nil: podsync.ContainerHash).
	Hash func(*corev1.Container) string
	// Fail maps a container name to the error ContainerConfig returns for it.
	Fail map[string]error
}

// SandboxConfig returns the sandbox config of pod.
func (b *Builder) SandboxConfig(_ context.Context, pod *corev1.Pod, attempt uint32) (*runtimeapi.PodSandboxConfig, error) {
	ns := &runtimeapi.NamespaceOption{}
	if pod.Spec.HostNetwork {
		ns.Network = runtimeapi.NamespaceMode_NODE
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID), Attempt: attempt},
		Labels: map[string]string{
			podsync.LabelPodName: pod.Name, podsync.LabelPodNamespace: pod.Namespace, podsync.LabelPodUID: string(pod.UID),
		},
		LogDirectory: fmt.Sprintf("/var/log/pods/%s_%s_%s", pod.Namespace, pod.Name, pod.UID),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{NamespaceOptions: ns}},
	}, nil
}

// ContainerConfig returns the container config.
func (b *Builder) ContainerConfig(_ context.Context, pod *corev1.Pod, c *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error) {
	if err := b.Fail[c.Name]; err != nil {
		return nil, err
	}
	hash := podsync.ContainerHash
	if b.Hash != nil {
		hash = b.Hash
	}
	image := imageRef
	if image == "" {
		image = c.Image
	}
	ann := map[string]string{
		podsync.AnnotationContainerHash:            hash(c),
		podsync.AnnotationRestartCount:             strconv.Itoa(restartCount),
		podsync.AnnotationTerminationMessagePath:   c.TerminationMessagePath,
		podsync.AnnotationTerminationMessagePolicy: string(c.TerminationMessagePolicy),
	}
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		ann[podsync.AnnotationTerminationGracePeriod] = strconv.FormatInt(*pod.Spec.TerminationGracePeriodSeconds, 10)
	}
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: c.Name, Attempt: uint32(restartCount)},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Command:  c.Command,
		Args:     c.Args,
		Labels: map[string]string{
			podsync.LabelPodName: pod.Name, podsync.LabelPodNamespace: pod.Namespace, podsync.LabelPodUID: string(pod.UID),
			podsync.LabelContainerName: c.Name,
		},
		Annotations: ann,
		LogPath:     fmt.Sprintf("%s/%d.log", c.Name, restartCount),
		Mounts:      imageMounts(pod, c),
	}, nil
}

// imageMounts are the mounts of c's image volumes as volume.Manager.Mounts makes
// them: the image named as the pod spec names it, read-only, subPath in
// ImageSubPath.
func imageMounts(pod *corev1.Pod, c *corev1.Container) []*runtimeapi.Mount {
	var out []*runtimeapi.Mount
	for _, vm := range c.VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name != vm.Name || v.Image == nil {
				continue
			}
			out = append(out, &runtimeapi.Mount{
				ContainerPath: vm.MountPath, Readonly: true, ImageSubPath: vm.SubPath,
				Image: &runtimeapi.ImageSpec{Image: v.Image.Reference, UserSpecifiedImage: v.Image.Reference},
			})
		}
	}
	return out
}

// Event is one recorded event. FieldPath is the container the event is about
// ("spec.containers{app}", as the kubelet's container references carry it), or
// "" for events about the pod.
type Event struct {
	Type, Reason, Message string
	FieldPath             string
}

// String returns "Type Reason Message", the shape of client-go's FakeRecorder.
func (e Event) String() string { return e.Type + " " + e.Reason + " " + e.Message }

// Recorder records events; it satisfies podsync.EventRecorder.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

// Eventf records an event.
func (r *Recorder) Eventf(obj runtime.Object, eventType, reason, messageFmt string, args ...any) {
	var field string
	if ref, ok := obj.(*corev1.ObjectReference); ok {
		field = ref.FieldPath
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, Event{Type: eventType, Reason: reason, Message: fmt.Sprintf(messageFmt, args...), FieldPath: field})
}

// Events returns the events recorded so far.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// Strings returns the events as "Type Reason Message" strings.
func (r *Recorder) Strings() []string {
	var out []string
	for _, e := range r.Events() {
		out = append(out, e.String())
	}
	return out
}

// WithFields returns the events as "FieldPath: Type Reason Message" strings, the
// shape kubectl describe prints them in.
func (r *Recorder) WithFields() []string {
	var out []string
	for _, e := range r.Events() {
		out = append(out, e.FieldPath+": "+e.String())
	}
	return out
}

// Reset forgets the recorded events.
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = nil
}

// Metrics counts what a Syncer reports; it satisfies podsync.Metrics.
type Metrics struct {
	mu sync.Mutex
	// Counts by metric: "sandbox", "sandbox_errors", "started/<type>",
	// "errors/<type>/<code>".
	counts map[string]int
}

func (m *Metrics) inc(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.counts == nil {
		m.counts = map[string]int{}
	}
	m.counts[key]++
}

// SandboxStarted counts "sandbox".
func (m *Metrics) SandboxStarted() { m.inc("sandbox") }

// SandboxStartFailed counts "sandbox_errors".
func (m *Metrics) SandboxStartFailed() { m.inc("sandbox_errors") }

// ContainerStarted counts "started/<type>".
func (m *Metrics) ContainerStarted(t string) { m.inc("started/" + t) }

// ContainerStartFailed counts "errors/<type>/<code>".
func (m *Metrics) ContainerStartFailed(t, code string) { m.inc("errors/" + t + "/" + code) }

// Counts returns a copy of the counts.
func (m *Metrics) Counts() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for k, v := range m.counts {
		out[k] = v
	}
	return out
}
