package podsync

import (
	"context"
	"net/http"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime is the part of a CRI runtime the Syncer drives. The method signatures
// are those of nodekit's cri.Client, so a *cri.Client satisfies Runtime as it is;
// podsynctest.Runtime is an in-memory one for unit tests.
//
// Errors are returned as the runtime gives them; the Syncer wraps them with the
// container or sandbox at fault and one of this package's sentinels.
type Runtime interface {
	ViewSource

	RunPodSandbox(ctx context.Context, cfg *runtimeapi.PodSandboxConfig, handler string) (string, error)
	StopPodSandbox(ctx context.Context, id string) error
	RemovePodSandbox(ctx context.Context, id string) error

	CreateContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error)
	StartContainer(ctx context.Context, id string) error
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	RemoveContainer(ctx context.Context, id string) error

	// EnsureImage pulls image unless the runtime has it, and returns the image
	// reference to create containers from and whether it pulled.
	EnsureImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (ref string, pulled bool, err error)
	// ExecSync runs cmd in a container. A command that ran returns its exit code
	// with a nil error, whatever the code.
	ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error)
}

// ViewSource is what LoadView reads: the listing and status calls of Runtime.
type ViewSource interface {
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error)
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error)
}

// ImagePuller is optional on a Runtime: when the Runtime also has PullImage
// (as *cri.Client does), imagePullPolicy Always pulls through it every time,
// as the kubelet does; without it Always behaves like IfNotPresent.
type ImagePuller interface {
	PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sandboxCfg *runtimeapi.PodSandboxConfig) (string, error)
}

// ConfigBuilder turns a pod into CRI configs. The agent implements it (with
// cri.PodSandboxConfig and cri.ContainerConfig, plus the environment and mounts
// it resolves), so this package needs no API-server or filesystem access.
//
// An error from ContainerConfig becomes the container's waiting reason
// CreateContainerConfigError with the error's text as the message, and a Failed
// event, as in the kubelet.
type ConfigBuilder interface {
	SandboxConfig(ctx context.Context, pod *corev1.Pod, attempt uint32) (*runtimeapi.PodSandboxConfig, error)
	ContainerConfig(ctx context.Context, pod *corev1.Pod, container *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error)
}

// EventRecorder records events about a pod. client-go's record.EventRecorder
// satisfies it.
type EventRecorder interface {
	Eventf(object runtime.Object, eventType, reason, messageFmt string, args ...any)
}

// Credentials resolves registry credentials for a pod's image (its
// imagePullSecrets and the node's own). A nil result pulls anonymously. Several
// results are tried in order, as the kubelet tries each matching credential.
type Credentials interface {
	ImageAuth(ctx context.Context, pod *corev1.Pod, image string) ([]*runtimeapi.AuthConfig, error)
}

// HTTPDoer sends the requests of httpGet lifecycle hooks. *http.Client
// satisfies it; an agent whose pods live in another network namespace passes a
// client whose transport dials there.
type HTTPDoer interface {
	Do(req *http.Request) (*http.Response, error)
}

// ProbeType names one of a container's probes.
type ProbeType int

const (
	// Liveness is the livenessProbe: a failure kills the container.
	Liveness ProbeType = iota
	// Readiness is the readinessProbe: it sets the container's ready flag.
	Readiness
	// Startup is the startupProbe: it sets the container's started flag, and a
	// failure kills the container.
	Startup
)

// String returns the probe's name as the kubelet writes it ("Liveness", ...).
func (t ProbeType) String() string {
	switch t {
	case Liveness:
		return "Liveness"
	case Readiness:
		return "Readiness"
	case Startup:
		return "Startup"
	}
	return "Unknown"
}

// ProbeResult is the cached result of one probe of one container.
type ProbeResult int

const (
	// ProbeUnknown: no result yet.
	ProbeUnknown ProbeResult = iota
	// ProbeSuccess: the probe passed (a Warning counts as a pass).
	ProbeSuccess
	// ProbeFailure: the probe failed.
	ProbeFailure
)

// ProbeResults gives the prober's cached results. containerID is in
// ContainerStatus.ContainerID form, "<runtime>://<id>" (e.g. "containerd://abc"),
// as nodekit's probe.Manager keys its results; ProbeType's values are in the
// order of probe.Type's. ok is false when there is no result: a container whose
// spec has no such probe is then live, started once running and ready once
// started, as in the kubelet; one whose spec has the probe is not yet started
// (startup) or not yet ready (readiness).
type ProbeResults interface {
	ProbeResult(t ProbeType, containerID string) (result ProbeResult, ok bool)
}

// ProbeResultsFunc adapts a function to ProbeResults.
type ProbeResultsFunc func(t ProbeType, containerID string) (ProbeResult, bool)

// ProbeResult calls f.
func (f ProbeResultsFunc) ProbeResult(t ProbeType, containerID string) (ProbeResult, bool) {
	return f(t, containerID)
}

// noProbes is the default ProbeResults: no probe configured anywhere.
type noProbes struct{}

func (noProbes) ProbeResult(ProbeType, string) (ProbeResult, bool) { return ProbeUnknown, false }

type discardEvents struct{}

func (discardEvents) Eventf(runtime.Object, string, string, string, ...any) {}

// Metrics receives what the kubelet counts while syncing pods. The agent adapts
// it to Prometheus with the kubelet's names; the default drops everything.
// Methods must be safe for concurrent use.
type Metrics interface {
	// SandboxStarted counts a RunPodSandbox attempt (kubelet_started_pods_total).
	SandboxStarted()
	// SandboxStartFailed counts a failed one (kubelet_started_pods_errors_total).
	SandboxStartFailed()
	// ContainerStarted counts a container start attempt past the restart
	// back-off (kubelet_started_containers_total); containerType is
	// "container" or "init_container".
	ContainerStarted(containerType string)
	// ContainerStartFailed counts a failed one with its reason word as code
	// (kubelet_started_containers_errors_total{container_type, code}).
	ContainerStartFailed(containerType, code string)
}

// Container types as the kubelet's metrics label them.
const (
	MetricContainer     = "container"
	MetricInitContainer = "init_container"
)

type noMetrics struct{}

func (noMetrics) SandboxStarted()                     {}
func (noMetrics) SandboxStartFailed()                 {}
func (noMetrics) ContainerStarted(string)             {}
func (noMetrics) ContainerStartFailed(string, string) {}
