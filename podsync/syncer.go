package podsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// Config configures a Syncer. Runtime and Builder are required; every other field
// has the default its comment states.
type Config struct {
	// Runtime is the CRI runtime the pods run on (a *cri.Client).
	Runtime Runtime
	// Builder builds the sandbox and container configs.
	Builder ConfigBuilder
	// Events receives the kubelet's pod events. Nil drops them.
	Events EventRecorder
	// Metrics counts sandbox and container starts. Nil: not counted.
	Metrics Metrics
	// Probes gives liveness, readiness and startup results. Nil: no probes.
	Probes ProbeResults
	// Credentials resolves registry credentials for image pulls. Nil: anonymous.
	Credentials Credentials
	// HTTP sends httpGet hook requests. Nil: an http.Client with the kubelet's
	// hook transport settings (no proxy, TLS not verified, no keep-alives).
	HTTP HTTPDoer
	// Clock drives back-offs, grace periods and sleep hooks. Nil: the real clock.
	Clock clock.Clock
	// Backoff is the container restart back-off (CrashLoopBackOff). Nil:
	// NewBackoff(Clock), 10s doubling to 300s.
	Backoff *Backoff
	// ImageBackoff is the image pull back-off (ImagePullBackOff). Nil:
	// NewBackoff(Clock).
	ImageBackoff *Backoff
	// RuntimeHandler is passed to RunPodSandbox when the pod names no
	// runtimeClassName handler of its own. Empty: the runtime's default.
	RuntimeHandler string
	// RuntimeName prefixes container IDs in pod status ("containerd://..."):
	// the runtime's VersionResponse.RuntimeName. Empty: "containerd".
	RuntimeName string
	// Hash is the container hash the Builder writes (nil: ContainerHash).
	Hash func(*corev1.Container) string
	// MinGracePeriod is the least grace a container gets when its preStop hook
	// used up the pod's (the kubelet's minimum, 2s, when zero).
	MinGracePeriod time.Duration
	// PodCgroups resizes the pod cgroup around an in-place resize of its
	// containers. Nil: only the containers are resized.
	PodCgroups PodCgroups
	// Actuated keeps what each container was last created or updated with, for
	// in-place resize. Nil: kept in memory, so after a restart of the agent a
	// running pod is taken to run with what it is allocated.
	Actuated ActuatedStore
}

// Syncer drives pods on a Runtime the way the kubelet's kuberuntime manager does.
// Build it with New. SyncPod and KillPod for different pods may run concurrently;
// calls for one pod must not overlap (the kubelet's pod workers serialize them).
type Syncer struct {
	cfg     Config
	started time.Time // when New ran: the agent's start for StatusInput.AgentStart

	mu      sync.Mutex
	waiting map[types.UID]map[string]Waiting
	// pullErrors keeps the last pull failure per image back-off key, for the
	// ImagePullBackOff message.
	pullErrors map[string]string
	// actuated are the resources each container was last created or updated
	// with (the kubelet's actuated state); s.mu makes its read-modify-writes atomic.
	actuated ActuatedStore
}

// New validates cfg and returns a Syncer.
func New(cfg Config) (*Syncer, error) {
	if cfg.Runtime == nil {
		return nil, fmt.Errorf("%w: Runtime is required", ErrInvalidConfig)
	}
	if cfg.Builder == nil {
		return nil, fmt.Errorf("%w: Builder is required", ErrInvalidConfig)
	}
	if cfg.MinGracePeriod < 0 {
		return nil, fmt.Errorf("%w: MinGracePeriod %v is negative", ErrInvalidConfig, cfg.MinGracePeriod)
	}
	if cfg.Events == nil {
		cfg.Events = discardEvents{}
	}
	if cfg.Probes == nil {
		cfg.Probes = noProbes{}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Backoff == nil {
		cfg.Backoff = NewBackoff(cfg.Clock)
	}
	if cfg.ImageBackoff == nil {
		cfg.ImageBackoff = NewBackoff(cfg.Clock)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = defaultHookClient()
	}
	if cfg.Hash == nil {
		cfg.Hash = ContainerHash
	}
	if cfg.Actuated == nil {
		cfg.Actuated = &memoryActuated{pods: map[types.UID]map[string]corev1.ResourceRequirements{}}
	}
	if cfg.MinGracePeriod == 0 {
		cfg.MinGracePeriod = minimumGracePeriod
	}
	return &Syncer{cfg: cfg, started: cfg.Clock.Now(), waiting: map[types.UID]map[string]Waiting{}, pullErrors: map[string]string{},
		actuated: cfg.Actuated}, nil
}

// minimumGracePeriod is the kubelet's floor for a container's stop grace.
const minimumGracePeriod = 2 * time.Second

// StepResult is the outcome of one step of a sync, like the kubelet's
// SyncResult: what was done to which container or sandbox, and the error.
type StepResult struct {
	// Action is one of "StartContainer", "KillContainer", "CreatePodSandbox",
	// "KillPodSandbox", "InitContainer".
	Action string
	// Target is the container name, or the pod's UID for sandbox steps.
	Target string
	// Err is nil on success; else it wraps a reason sentinel.
	Err error
}

// SyncResult is the outcome of one SyncPod or KillPod.
type SyncResult struct {
	Steps []StepResult
	// Err is set when the sync stopped before doing all it meant to (a failed
	// sandbox, an error listing the runtime).
	Err error
}

// Error joins every failed step and Err; nil when all went well.
func (r *SyncResult) Error() error {
	if r == nil {
		return nil
	}
	var errs []error
	if r.Err != nil {
		errs = append(errs, r.Err)
	}
	for _, s := range r.Steps {
		if s.Err != nil {
			errs = append(errs, s.Err)
		}
	}
	return errors.Join(errs...)
}

func (r *SyncResult) add(action, target string, err error) {
	r.Steps = append(r.Steps, StepResult{Action: action, Target: target, Err: err})
}

// SyncPod brings pod's containers on the runtime one step closer to its spec, as
// the kubelet's SyncPod does: it computes the actions, kills the pod or the
// containers to kill, creates the sandbox when needed, then starts the next init
// containers and the app containers (pulling images, running postStart hooks,
// honouring restart back-off). view is the runtime's state read just before
// (LoadView); a nil view is loaded here. Failures are recorded per container and
// show up in PodStatus as waiting reasons. A pod past its activeDeadlineSeconds
// is killed instead (event DeadlineExceeded, error ErrDeadlineExceeded), as the
// kubelet's active deadline handler makes the pod worker do.
func (s *Syncer) SyncPod(ctx context.Context, pod *corev1.Pod, view *PodView) *SyncResult {
	return s.syncPod(ctx, pod, view)
}

// KillPod stops every container of the pod (running preStop hooks, with the
// pod's grace period, or gracePeriodOverride seconds when not nil) and then its
// sandboxes, as the kubelet's KillPod does. It does not remove them: the agent's
// garbage collection (or RemovePod) does. A nil view is loaded here.
func (s *Syncer) KillPod(ctx context.Context, pod *corev1.Pod, view *PodView, gracePeriodOverride *int64) *SyncResult {
	return s.killPod(ctx, pod, view, gracePeriodOverride)
}

// RemovePod removes the pod's stopped containers and sandboxes from the runtime,
// forgets what the Syncer recorded about it, and collects expired back-off
// entries (the kubelet's housekeeping does both).
func (s *Syncer) RemovePod(ctx context.Context, uid types.UID) error {
	return s.removePod(ctx, uid)
}

// PodStatus computes the pod's status (see the package function PodStatus).
// Fields of in left empty take the Syncer's: Probes, Waiting (the start
// failures SyncPod recorded), Now (its clock), AgentStart (when New ran) and
// RuntimeName.
func (s *Syncer) PodStatus(pod *corev1.Pod, view *PodView, in StatusInput) corev1.PodStatus {
	if in.Probes == nil {
		in.Probes = s.cfg.Probes
	}
	if in.Waiting == nil {
		in.Waiting = s.waitingFor(pod.UID)
	}
	if in.Now.IsZero() {
		in.Now = s.cfg.Clock.Now()
	}
	if in.RuntimeName == "" {
		in.RuntimeName = s.cfg.RuntimeName
	}
	if in.AgentStart.IsZero() {
		in.AgentStart = s.started
	}
	return PodStatus(pod, view, in)
}

// ActiveDeadlineExceeded reports whether pod has run longer than its
// activeDeadlineSeconds (counted from status.startTime), in which case the
// kubelet kills it and marks it Failed with reason DeadlineExceeded.
func (s *Syncer) ActiveDeadlineExceeded(pod *corev1.Pod) bool {
	return ActiveDeadlineExceeded(pod, s.cfg.Clock.Now())
}

// ActiveDeadlineExceeded reports whether pod has run longer than its
// activeDeadlineSeconds at now.
func ActiveDeadlineExceeded(pod *corev1.Pod, now time.Time) bool {
	if pod.Spec.ActiveDeadlineSeconds == nil || pod.Status.StartTime == nil {
		return false
	}
	allowed := time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second
	return now.Sub(pod.Status.StartTime.Time) >= allowed
}

// The kubelet's words for a pod killed for its deadline.
const (
	ReasonDeadlineExceeded  = "DeadlineExceeded"
	MessageDeadlineExceeded = "Pod was active on the node longer than the specified deadline"
)

func (s *Syncer) waitingFor(uid types.UID) map[string]Waiting {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Waiting, len(s.waiting[uid]))
	for k, v := range s.waiting[uid] {
		out[k] = v
	}
	return out
}
