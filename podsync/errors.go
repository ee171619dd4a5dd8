package podsync

import (
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	crierrors "k8s.io/cri-api/pkg/errors"
)

// Sentinel errors. Each one's text is the kubelet's reason for the failure, the
// word that appears as a container's waiting reason (kubectl get pods shows it in
// STATUS). Errors from the Syncer wrap one of them, so errors.Is works and
// Reason finds the word.
var (
	// ErrCrashLoopBackOff: the container is waiting out its restart back-off.
	ErrCrashLoopBackOff = errors.New("CrashLoopBackOff")
	// ErrImagePull: pulling the image failed.
	ErrImagePull = errors.New("ErrImagePull")
	// ErrImagePullBackOff: the image pull is waiting out its back-off after a failure.
	ErrImagePullBackOff = errors.New("ImagePullBackOff")
	// ErrImageNeverPull: imagePullPolicy Never and the image is not on the node.
	ErrImageNeverPull = errors.New("ErrImageNeverPull")
	// ErrRegistryUnavailable and ErrSignatureValidationFailed: the runtime said so
	// when pulling (k8s.io/cri-api/pkg/errors, the same values).
	ErrRegistryUnavailable       = crierrors.ErrRegistryUnavailable
	ErrSignatureValidationFailed = crierrors.ErrSignatureValidationFailed
	// ErrInvalidImageName: the image name does not parse.
	ErrInvalidImageName = errors.New("InvalidImageName")
	// ErrCreateContainerConfig: the ConfigBuilder could not build the container's config.
	ErrCreateContainerConfig = errors.New("CreateContainerConfigError")
	// ErrCreateContainer: the runtime refused CreateContainer.
	ErrCreateContainer = errors.New("CreateContainerError")
	// ErrRunContainer: the runtime refused StartContainer.
	ErrRunContainer = errors.New("RunContainerError")
	// ErrPostStartHook: the postStart hook failed; the container is killed.
	ErrPostStartHook = errors.New("PostStartHookError")
	// ErrKillContainer: stopping or removing a container failed.
	ErrKillContainer = errors.New("KillContainerError")
	// ErrCreatePodSandbox: the runtime refused RunPodSandbox.
	ErrCreatePodSandbox = errors.New("CreatePodSandboxError")
	// ErrConfigPodSandbox: the ConfigBuilder could not build the sandbox config.
	ErrConfigPodSandbox = errors.New("ConfigPodSandboxError")
	// ErrKillPodSandbox: stopping the sandbox failed.
	ErrKillPodSandbox = errors.New("KillPodSandboxError")
	// ErrDeadlineExceeded: the pod ran past its activeDeadlineSeconds; SyncPod
	// killed it instead of syncing it.
	ErrDeadlineExceeded = errors.New("DeadlineExceeded")
	// ErrInvalidPod: the pod lacks what is needed to run it (UID, name, namespace).
	ErrInvalidPod = errors.New("invalid pod")
	// ErrInvalidConfig: Config passed to New is unusable.
	ErrInvalidConfig = errors.New("invalid podsync config")
)

// reasons lists the sentinels that are kubelet reasons, most specific first.
var reasons = []error{
	ErrCrashLoopBackOff, ErrImagePullBackOff, ErrImageNeverPull, ErrInvalidImageName, ErrImagePull,
	ErrRegistryUnavailable, ErrSignatureValidationFailed, errImageInspect,
	ErrCreateContainerConfig, ErrCreateContainer, ErrRunContainer, ErrPostStartHook,
	ErrKillContainer, ErrCreatePodSandbox, ErrConfigPodSandbox, ErrKillPodSandbox,
}

// Reason returns the kubelet reason err carries ("CrashLoopBackOff",
// "ErrImagePull", ...), or "" when it wraps none of the reason sentinels.
func Reason(err error) string {
	for _, r := range reasons {
		if errors.Is(err, r) {
			return r.Error()
		}
	}
	return ""
}

// reasonError is an error that carries a kubelet reason and the message the
// kubelet shows with it, and names the object at fault in Error.
type reasonError struct {
	reason  error  // one of the sentinels
	message string // the kubelet's message for the waiting state
	context string // what failed, e.g. `container "app" of pod "ns/name"`
}

func (e *reasonError) Error() string {
	if e.context == "" {
		return e.reason.Error() + ": " + e.message
	}
	return e.context + ": " + e.reason.Error() + ": " + e.message
}

func (e *reasonError) Unwrap() error { return e.reason }

// Message returns the message the kubelet shows beside err's reason (the
// waiting state's message), or err's text when it carries none.
func Message(err error) string {
	var re *reasonError
	if errors.As(err, &re) {
		return re.message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

// isNotFound reports whether err is a NotFound from the runtime: a gRPC status
// NotFound anywhere in its chain.
func isNotFound(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if st, ok := status.FromError(e); ok && st.Code() == codes.NotFound {
			return true
		}
	}
	return false
}
