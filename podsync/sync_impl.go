package podsync

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"strings"

	"github.com/distribution/reference"
	"github.com/go-logr/logr"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Event reasons the Syncer records (pkg/kubelet/events).
const (
	EventCreated                = "Created"
	EventStarted                = "Started"
	EventFailed                 = "Failed"
	EventKilling                = "Killing"
	EventBackOff                = "BackOff"
	EventPulling                = "Pulling"
	EventPulled                 = "Pulled"
	EventErrImageNeverPull      = "ErrImageNeverPull"
	EventInspectFailed          = "InspectFailed"
	EventSandboxChanged         = "SandboxChanged"
	EventFailedCreatePodSandBox = "FailedCreatePodSandBox"
	EventFailedPodSandBoxStatus = "FailedPodSandBoxStatus"
	EventFailedPostStartHook    = "FailedPostStartHook"
	EventFailedPreStopHook      = "FailedPreStopHook"
)

// Step names of StepResult.Action (the kubelet's SyncAction values).
const (
	ActionStartContainer   = "StartContainer"
	ActionKillContainer    = "KillContainer"
	ActionCreatePodSandbox = "CreatePodSandbox"
	ActionConfigPodSandbox = "ConfigPodSandbox"
	ActionKillPodSandbox   = "KillPodSandbox"
)

// ImageInspector is optional on a Runtime: with it (as *cri.Client has it) the
// Syncer checks for the image before pulling, so events come in the kubelet's
// order with the image size; without it EnsureImage does both.
type ImageInspector interface {
	ImageStatus(ctx context.Context, image string) (*runtimeapi.Image, error)
}

// containerRef is the object container events are recorded against, as the
// kubelet's GenerateContainerRef makes it.
func containerRef(pod *corev1.Pod, ctr *corev1.Container) *corev1.ObjectReference {
	field := fmt.Sprintf("spec.containers{%s}", ctr.Name)
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == ctr.Name {
			field = fmt.Sprintf("spec.initContainers{%s}", ctr.Name)
		}
	}
	if isEphemeral(pod, ctr.Name) {
		field = fmt.Sprintf("spec.ephemeralContainers{%s}", ctr.Name)
	}
	return &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion, FieldPath: field,
	}
}

func grpcMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Message()
	}
	for e := err; e != nil; e = errors.Unwrap(e) {
		if st, ok := status.FromError(e); ok && st.Code() != 0 {
			return st.Message()
		}
	}
	return err.Error()
}

func failure(reason error, msg, format string, args ...any) error {
	return &reasonError{reason: reason, message: msg, context: fmt.Sprintf(format, args...)}
}

func (s *Syncer) event(obj any, typ, reason, format string, args ...any) {
	switch o := obj.(type) {
	case *corev1.Pod:
		s.cfg.Events.Eventf(o, typ, reason, format, args...)
	case *corev1.ObjectReference:
		s.cfg.Events.Eventf(o, typ, reason, format, args...)
	}
}

func (s *Syncer) load(ctx context.Context, pod *corev1.Pod, view *PodView) (*PodView, error) {
	if view != nil {
		return view, nil
	}
	return LoadView(ctx, s.cfg.Runtime, pod.UID, nil)
}

func validPod(pod *corev1.Pod) error {
	if pod == nil {
		return fmt.Errorf("%w: nil pod", ErrInvalidPod)
	}
	if pod.Name == "" || pod.Namespace == "" || pod.UID == "" {
		return fmt.Errorf("%w: pod %q in namespace %q needs a name, a namespace and a UID", ErrInvalidPod, pod.Name, pod.Namespace)
	}
	return nil
}

func (s *Syncer) syncPod(ctx context.Context, pod *corev1.Pod, view *PodView) *SyncResult {
	res := &SyncResult{}
	if err := validPod(pod); err != nil {
		res.Err = err
		return res
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("pod", pod.Namespace+"/"+pod.Name, "podUID", pod.UID)
	view, err := s.load(ctx, pod, view)
	if err != nil {
		res.Err = err
		return res
	}
	defer s.updateWaiting(pod.UID, res)

	// The kubelet's active deadline handler evicts the pod; the pod worker then
	// kills it and it never runs again.
	if ActiveDeadlineExceeded(pod, s.cfg.Clock.Now()) {
		s.event(pod, corev1.EventTypeNormal, ReasonDeadlineExceeded, "%s", MessageDeadlineExceeded)
		kr := s.killPod(ctx, pod, view, nil)
		res.Steps = append(res.Steps, kr.Steps...)
		res.Err = errors.Join(fmt.Errorf("pod %s: %w", formatPod(pod), ErrDeadlineExceeded), kr.Err)
		return res
	}

	s.initActuated(pod)
	actuated := func(name string) (corev1.ResourceRequirements, bool) { return s.actuatedResources(pod.UID, name) }
	actions := ComputeActions(pod, view, ActionOptions{Probes: s.cfg.Probes, Hash: s.cfg.Hash, RuntimeName: s.cfg.RuntimeName, Actuated: actuated})
	log.V(4).Info("Computed pod actions", "actions", actions)
	if actions.CreateSandbox && actions.SandboxID != "" {
		s.event(pod, corev1.EventTypeNormal, EventSandboxChanged, "Pod sandbox changed, it will be killed and re-created.")
	}

	if actions.KillPod {
		kr := s.killPod(ctx, pod, view, nil)
		res.Steps = append(res.Steps, kr.Steps...)
		if err := kr.Error(); err != nil {
			res.Err = err
			return res
		}
		if actions.CreateSandbox {
			s.purgeInitContainers(ctx, pod, view)
		}
	} else {
		for _, k := range actions.ContainersToKill {
			err := s.killContainer(ctx, pod, k.ContainerID, k.Container, k.Message, k.Reason, nil, view.IPs(), nil)
			res.add(ActionKillContainer, k.Name, err)
			if err != nil {
				return res
			}
		}
	}
	s.pruneInitContainers(ctx, pod, view)

	podIPs := view.IPs()
	sandboxID := actions.SandboxID
	if actions.CreateSandbox {
		id, ips, err := s.createSandbox(ctx, pod, actions.Attempt)
		res.add(ActionCreatePodSandbox, formatPod(pod), err)
		if err != nil {
			return res
		}
		sandboxID = id
		if !pod.Spec.HostNetwork {
			podIPs = ips
		}
	}
	if len(actions.ContainersToUpdate) > 0 || actions.UpdatePodResources {
		res.add(ActionResizePodInPlace, formatPod(pod), s.resizePod(ctx, pod, actions))
	}
	if !actions.CreateSandbox && len(actions.InitContainersToStart) == 0 && len(actions.ContainersToStart) == 0 &&
		len(actions.EphemeralContainersToStart) == 0 {
		return res
	}
	sbCfg, err := s.cfg.Builder.SandboxConfig(ctx, pod, actions.Attempt)
	if err != nil {
		msg := fmt.Sprintf("GeneratePodSandboxConfig for pod %q failed: %v", formatPod(pod), err)
		res.add(ActionConfigPodSandbox, sandboxID, failure(ErrConfigPodSandbox, msg, "pod %s", formatPod(pod)))
		return res
	}

	// Image volumes are pulled once, before the first container starts (the
	// kubelet's lazyStart).
	var volumeImages map[string]imageVolumePull
	pulled := false
	start := func(ctr *corev1.Container) error {
		if !pulled {
			volumeImages, pulled = s.pullImageVolumes(ctx, pod, sbCfg), true
		}
		err := s.startContainer(ctx, pod, ctr, view, sandboxID, sbCfg, podIPs, volumeImages)
		res.add(ActionStartContainer, ctr.Name, err)
		if err != nil {
			log.V(2).Info("Container start failed", "container", ctr.Name, "err", err)
		}
		return err
	}
	// Ephemeral containers first, so a failing init container does not keep a
	// debugger out.
	for _, i := range actions.EphemeralContainersToStart {
		_ = start(ephemeralAsContainer(pod, i))
	}
	for _, i := range actions.InitContainersToStart {
		ctr := &pod.Spec.InitContainers[i]
		if err := start(ctr); err != nil {
			if IsRestartableInitContainer(ctr) {
				continue
			}
			return res
		}
	}
	for _, i := range actions.ContainersToStart {
		_ = start(&pod.Spec.Containers[i])
	}
	return res
}

// updateWaiting records start failures as waiting reasons and forgets them on
// success, as the kubelet's reason cache does.
func (s *Syncer) updateWaiting(uid types.UID, res *SyncResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range res.Steps {
		if st.Action != ActionStartContainer {
			continue
		}
		if st.Err == nil {
			delete(s.waiting[uid], st.Target)
			continue
		}
		if s.waiting[uid] == nil {
			s.waiting[uid] = map[string]Waiting{}
		}
		s.waiting[uid][st.Target] = Waiting{Reason: Reason(st.Err), Message: Message(st.Err)}
	}
}

func (s *Syncer) createSandbox(ctx context.Context, pod *corev1.Pod, attempt uint32) (string, []string, error) {
	cfg, err := s.cfg.Builder.SandboxConfig(ctx, pod, attempt)
	if err != nil {
		msg := fmt.Sprintf("GeneratePodSandboxConfig for pod %q failed: %v", formatPod(pod), err)
		s.event(pod, corev1.EventTypeWarning, EventFailedCreatePodSandBox, "Failed to create pod sandbox: %v", err)
		return "", nil, failure(ErrCreatePodSandbox, msg, "pod %s", formatPod(pod))
	}
	s.cfg.Metrics.SandboxStarted()
	id, err := s.cfg.Runtime.RunPodSandbox(ctx, cfg, s.cfg.RuntimeHandler)
	if err != nil {
		s.cfg.Metrics.SandboxStartFailed()
		msg := fmt.Sprintf("Failed to create sandbox for pod %q: %v", formatPod(pod), err)
		s.event(pod, corev1.EventTypeWarning, EventFailedCreatePodSandBox, "Failed to create pod sandbox: %v", err)
		return "", nil, &reasonError{reason: ErrCreatePodSandbox, message: msg, context: "pod " + formatPod(pod)}
	}
	st, err := s.cfg.Runtime.PodSandboxStatus(ctx, id)
	if err != nil {
		s.event(pod, corev1.EventTypeWarning, EventFailedPodSandBoxStatus, "Unable to get pod sandbox status: %v", err)
		return "", nil, fmt.Errorf("status of new sandbox %s of pod %s: %w", id, formatPod(pod), err)
	}
	v := &PodView{Sandboxes: []*runtimeapi.PodSandboxStatus{st}}
	return id, v.IPs(), nil
}

// purgeInitContainers removes every init container of the pod before a new
// sandbox starts them over, so old results do not count.
func (s *Syncer) purgeInitContainers(ctx context.Context, pod *corev1.Pod, view *PodView) {
	for i := range pod.Spec.InitContainers {
		for _, c := range view.Attempts(pod.Spec.InitContainers[i].Name) {
			if err := s.cfg.Runtime.RemoveContainer(ctx, c.GetId()); err != nil && !isNotFound(err) {
				logr.FromContextOrDiscard(ctx).V(2).Info("Failed to remove init container", "container", c.GetId(), "err", err)
			}
		}
	}
}

// pruneInitContainers keeps the newest exited (or unknown) attempt of each init
// container and removes older ones (pruneInitContainersBeforeStart). Their log
// files are the agent's to remove.
func (s *Syncer) pruneInitContainers(ctx context.Context, pod *corev1.Pod, view *PodView) {
	for i := range pod.Spec.InitContainers {
		kept := false
		for _, c := range view.Attempts(pod.Spec.InitContainers[i].Name) {
			if st := c.GetState(); st != runtimeapi.ContainerState_CONTAINER_EXITED && st != runtimeapi.ContainerState_CONTAINER_UNKNOWN {
				continue
			}
			if !kept {
				kept = true
				continue
			}
			if err := s.cfg.Runtime.RemoveContainer(ctx, c.GetId()); err != nil && !isNotFound(err) {
				logr.FromContextOrDiscard(ctx).V(2).Info("Failed to remove init container", "container", c.GetId(), "err", err)
			}
		}
	}
}

// startContainer is the kubelet's start helper: back-off, image, config,
// create, start, postStart.
func (s *Syncer) startContainer(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, view *PodView,
	sandboxID string, sbCfg *runtimeapi.PodSandboxConfig, podIPs []string, volumeImages map[string]imageVolumePull) error {
	ref := containerRef(pod, ctr)
	what := fmt.Sprintf("container %q of pod %s", ctr.Name, formatPod(pod))

	// Restart back-off, counted from the last exit.
	for _, c := range view.Attempts(ctr.Name) {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_EXITED {
			continue
		}
		key := ContainerBackoffKey(pod, ctr)
		finished := time.Unix(0, c.GetFinishedAt())
		if in, delay := s.cfg.Backoff.InBackoff(key, finished); in {
			s.event(ref, corev1.EventTypeWarning, EventBackOff, "Back-off restarting failed container %s in pod %s", ctr.Name, formatPod(pod))
			msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", delay, ctr.Name, formatPod(pod))
			return failure(ErrCrashLoopBackOff, msg, "%s", what)
		}
		s.cfg.Backoff.Next(key, finished)
		break
	}

	metricType := metricType(pod, ctr)
	s.cfg.Metrics.ContainerStarted(metricType)
	err := s.imageVolumeFailure(ctr, ref, volumeImages)
	if err == nil {
		err = s.startContainerSteps(ctx, pod, ctr, view, sandboxID, sbCfg, podIPs, ref, what, volumeImages)
	}
	if err != nil {
		s.cfg.Metrics.ContainerStartFailed(metricType, Reason(err))
	}
	return err
}

func (s *Syncer) startContainerSteps(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, view *PodView,
	sandboxID string, sbCfg *runtimeapi.PodSandboxConfig, podIPs []string, ref *corev1.ObjectReference, what string, volumeImages map[string]imageVolumePull) error {
	imageRef, err := s.ensureImage(ctx, pod, ctr.Image, pullPolicy(ctr.Image, ctr.ImagePullPolicy), ref, what, sbCfg)
	if err != nil {
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", Reason(err))
		return err
	}

	restartCount := 0
	if latest := view.Latest(ctr.Name); latest != nil {
		restartCount = RestartCount(latest) + 1
	}
	target, err := ephemeralTarget(pod, ctr, view)
	if err != nil {
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", err)
		return failure(ErrCreateContainerConfig, err.Error(), "%s", what)
	}
	cfg, err := s.cfg.Builder.ContainerConfig(ctx, pod, ctr, restartCount, imageRef, podIPs)
	if err != nil {
		msg := grpcMessage(err)
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", msg)
		return failure(ErrCreateContainerConfig, msg, "%s", what)
	}
	resolveImageMounts(cfg, ctr, volumeImages)
	joinTargetPID(cfg, target)
	// Created with the pod's (allocated) resources: they are now actuated.
	s.setActuated(pod.UID, ctr.Name, ctr.Resources)
	id, err := s.cfg.Runtime.CreateContainer(ctx, sandboxID, cfg, sbCfg)
	if err != nil {
		msg := grpcMessage(err)
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", msg)
		return failure(ErrCreateContainer, msg, "%s", what)
	}
	s.event(ref, corev1.EventTypeNormal, EventCreated, "Container created")
	if err := s.cfg.Runtime.StartContainer(ctx, id); err != nil {
		msg := grpcMessage(err)
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Error: %v", msg)
		return failure(ErrRunContainer, msg, "%s", what)
	}
	s.event(ref, corev1.EventTypeNormal, EventStarted, "Container started")

	if ctr.Lifecycle != nil && ctr.Lifecycle.PostStart != nil {
		msg, err := s.runHook(ctx, pod, ctr, id, podIPs, ctr.Lifecycle.PostStart)
		if err != nil {
			// The message stays out of the event so secrets do not leak.
			s.event(ref, corev1.EventTypeWarning, EventFailedPostStartHook, "PostStartHook failed")
			if kerr := s.killContainer(ctx, pod, id, ctr, "FailedPostStartHook", KillFailedPostStartHook, nil, podIPs, nil); kerr != nil {
				logr.FromContextOrDiscard(ctx).Error(kerr, "Failed to kill container after its postStart hook failed", "container", ctr.Name)
			}
			return failure(ErrPostStartHook, msg, "%s", what)
		}
	}
	return nil
}

// pullPolicy defaults the policy as the API server does: Always for an image
// without a tag or with tag latest, IfNotPresent otherwise.
// The same defaulting applies to image volumes' pullPolicy.
func pullPolicy(image string, policy corev1.PullPolicy) corev1.PullPolicy {
	if policy != "" {
		return policy
	}
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return corev1.PullIfNotPresent
	}
	if _, digested := named.(reference.Digested); digested {
		return corev1.PullIfNotPresent
	}
	if tagged, ok := named.(reference.Tagged); ok && tagged.Tag() != "latest" {
		return corev1.PullIfNotPresent
	}
	return corev1.PullAlways
}

// withDefaultTag is the kubelet's applyDefaultImageTag: an image without tag or
// digest gets ":latest" appended, without normalizing the name (so the CRI
// sees "busybox:latest", not "docker.io/library/busybox:latest").
func withDefaultTag(image string) (string, error) {
	named, err := reference.ParseNormalizedNamed(image)
	if err != nil {
		return "", fmt.Errorf("couldn't parse image reference %q: %v", image, err)
	}
	_, tagged := named.(reference.Tagged)
	_, digested := named.(reference.Digested)
	if !tagged && !digested {
		image += ":latest"
	}
	return image, nil
}

// ensureImage is the kubelet's EnsureImageExists (v1.37.2): pull policy
// precheck, image back-off (key <pod UID>_<image>) whose waiting message carries
// the previous pull error, events in the kubelet's words.
// It serves containers (ref is the container's) and image volumes (ref is the
// pod's, policy the volume's), as upstream calls it for both; requested is the
// image as the spec names it, what names the object in errors.
func (s *Syncer) ensureImage(ctx context.Context, pod *corev1.Pod, requested string, policy corev1.PullPolicy, ref *corev1.ObjectReference, what string, sbCfg *runtimeapi.PodSandboxConfig) (string, error) {
	image, err := withDefaultTag(requested)
	if err != nil {
		msg := fmt.Sprintf("Failed to apply default image tag %q: %v", requested, err)
		s.event(ref, corev1.EventTypeWarning, EventInspectFailed, "%s", msg)
		return "", failure(ErrInvalidImageName, msg, "%s", what)
	}
	inspector, canInspect := s.cfg.Runtime.(ImageInspector)
	puller, canPull := s.cfg.Runtime.(ImagePuller)

	// Precheck: Always pulls whatever is present; the others look first. Without
	// ImageStatus the image's presence is unknown: Never then reports
	// ErrImageNeverPull, IfNotPresent leaves it to EnsureImage.
	var present string
	if policy != corev1.PullAlways && canInspect {
		img, err := inspector.ImageStatus(ctx, image)
		if err != nil {
			// The kubelet prints the (empty) reference here, not the image.
			msg := fmt.Sprintf("Failed to inspect image %q: %v", "", err)
			s.event(ref, corev1.EventTypeWarning, EventInspectFailed, "%s", msg)
			return "", failure(errImageInspect, msg, "%s", what)
		}
		present = img.GetId()
	}
	if present != "" {
		s.event(ref, corev1.EventTypeNormal, EventPulled, "Container image %q already present on machine", requested)
		return present, nil
	}
	if policy == corev1.PullNever {
		msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", requested)
		s.event(ref, corev1.EventTypeWarning, EventErrImageNeverPull, "%s", msg)
		return "", failure(ErrImageNeverPull, msg, "%s", what)
	}

	key := fmt.Sprintf("%s_%s", pod.UID, requested)
	if s.cfg.ImageBackoff.InBackoffSinceUpdate(key, s.cfg.Clock.Now()) {
		msg := fmt.Sprintf("Back-off pulling image %q", requested)
		s.event(ref, corev1.EventTypeNormal, EventBackOff, "%s", msg)
		s.mu.Lock()
		prev, ok := s.pullErrors[key]
		s.mu.Unlock()
		if ok {
			msg = fmt.Sprintf("%s: %s", msg, prev)
		}
		return "", failure(ErrImagePullBackOff, msg, "%s", what)
	}
	s.mu.Lock()
	delete(s.pullErrors, key)
	s.mu.Unlock()

	auths := []*runtimeapi.AuthConfig{nil}
	if s.cfg.Credentials != nil {
		list, err := s.cfg.Credentials.ImageAuth(ctx, pod, image)
		if err != nil {
			return "", failure(ErrImagePull, err.Error(), "%s", what)
		}
		if len(list) > 0 {
			auths = list
		}
	}

	start := s.cfg.Clock.Now()
	announced := false
	announce := func() {
		if !announced {
			announced = true
			s.event(ref, corev1.EventTypeNormal, EventPulling, "Pulling image %q", requested)
		}
	}
	var imageRef string
	var pulled bool
	var pullErrs []error
	for _, auth := range auths {
		if canPull && (policy == corev1.PullAlways || canInspect) {
			announce()
			imageRef, err = puller.PullImage(ctx, image, auth, sbCfg)
			pulled = err == nil
		} else {
			imageRef, pulled, err = s.cfg.Runtime.EnsureImage(ctx, image, auth, sbCfg)
			if pulled || err != nil {
				announce()
			}
		}
		if err == nil {
			break
		}
		pullErrs = append(pullErrs, err)
	}
	if err != nil {
		// Every credential failed: the kubelet reports them all (one error prints
		// as itself, several as [e1, e2]).
		err = utilerrors.NewAggregate(pullErrs)
		s.event(ref, corev1.EventTypeWarning, EventFailed, "Failed to pull image %q: %v", requested, err)
		s.cfg.ImageBackoff.Next(key, s.cfg.Clock.Now())
		msg, reason := pullError(requested, err)
		s.mu.Lock()
		s.pullErrors[key] = fmt.Sprintf("%s: %s", reason, msg)
		s.mu.Unlock()
		return "", failure(reason, msg, "%s", what)
	}
	if !pulled {
		s.event(ref, corev1.EventTypeNormal, EventPulled, "Container image %q already present on machine", requested)
		return imageRef, nil
	}
	took := s.cfg.Clock.Since(start).Truncate(time.Millisecond)
	var size uint64
	if canInspect {
		if img, err := inspector.ImageStatus(ctx, image); err == nil {
			size = img.GetSize()
		}
	}
	s.event(ref, corev1.EventTypeNormal, EventPulled, "Successfully pulled image %q in %v (%v including waiting). Image size: %v bytes.",
		requested, took, took, size)
	s.cfg.ImageBackoff.GC()
	return imageRef, nil
}

// pullError is the kubelet's evalCRIPullErr: runtimes that prefix their error
// with RegistryUnavailable or SignatureValidationFailed (k8s.io/cri-api/pkg/errors)
// get that reason and a sentence; anything else is ErrImagePull with the error's
// text.
func pullError(image string, err error) (message string, reason error) {
	text := err.Error()
	switch {
	case strings.HasPrefix(text, ErrRegistryUnavailable.Error()):
		return fmt.Sprintf("image pull failed for %s because the registry is unavailable%s",
			image, strings.TrimPrefix(text, ErrRegistryUnavailable.Error())), ErrRegistryUnavailable
	case strings.HasPrefix(text, ErrSignatureValidationFailed.Error()):
		return fmt.Sprintf("image pull failed for %s because the signature validation failed%s",
			image, strings.TrimPrefix(text, ErrSignatureValidationFailed.Error())), ErrSignatureValidationFailed
	}
	return text, ErrImagePull
}

// errImageInspect is the kubelet's ImageInspectError.
var errImageInspect = errors.New("ImageInspectError")

// gracePeriod is the kubelet's setTerminationGracePeriod, in seconds.
func gracePeriod(pod *corev1.Pod, ctr *corev1.Container, reason KillReason) int64 {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return *pod.DeletionGracePeriodSeconds
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		if ctr != nil {
			switch reason {
			case KillStartupProbe:
				if p := ctr.StartupProbe; p != nil && p.TerminationGracePeriodSeconds != nil {
					return *p.TerminationGracePeriodSeconds
				}
			case KillLivenessProbe:
				if p := ctr.LivenessProbe; p != nil && p.TerminationGracePeriodSeconds != nil {
					return *p.TerminationGracePeriodSeconds
				}
			}
		}
		return *pod.Spec.TerminationGracePeriodSeconds
	}
	return 2
}

// killContainer is the kubelet's killContainer: Killing event, preStop hook
// within the grace period, optional wait for its turn, then StopContainer with
// what is left of the grace (at least MinGracePeriod).
func (s *Syncer) killContainer(ctx context.Context, pod *corev1.Pod, id string, ctr *corev1.Container, message string,
	reason KillReason, override *int64, podIPs []string, wait func(remaining time.Duration)) error {
	name := ""
	if ctr != nil {
		name = ctr.Name
	}
	grace := time.Duration(gracePeriod(pod, ctr, reason)) * time.Second
	if message == "" {
		message = fmt.Sprintf("Stopping container %s", name)
	}
	if ctr != nil {
		s.event(containerRef(pod, ctr), corev1.EventTypeNormal, EventKilling, "%s", message)
	}
	if override != nil {
		grace = time.Duration(*override) * time.Second
	}
	begin := s.cfg.Clock.Now()
	if ctr != nil && ctr.Lifecycle != nil && ctr.Lifecycle.PreStop != nil && grace > 0 {
		s.runPreStop(ctx, pod, ctr, id, podIPs, grace)
		grace -= s.cfg.Clock.Since(begin).Truncate(time.Second)
	}
	if wait != nil && grace > 0 {
		before := s.cfg.Clock.Now()
		wait(grace)
		grace -= s.cfg.Clock.Since(before).Truncate(time.Second)
	}
	if grace < s.cfg.MinGracePeriod {
		grace = s.cfg.MinGracePeriod
	}
	logr.FromContextOrDiscard(ctx).V(2).Info("Killing container with a grace period", "pod", formatPod(pod), "container", name, "containerID", id, "gracePeriod", grace)
	if err := s.cfg.Runtime.StopContainer(ctx, id, grace); err != nil && !isNotFound(err) {
		return failure(ErrKillContainer, err.Error(), "container %q of pod %s", name, formatPod(pod))
	}
	return nil
}

// runPreStop runs the preStop hook and returns when it finishes or grace ends,
// whichever comes first (the hook goes on in the background, as upstream's does).
func (s *Syncer) runPreStop(ctx context.Context, pod *corev1.Pod, ctr *corev1.Container, id string, podIPs []string, grace time.Duration) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := s.runHook(ctx, pod, ctr, id, podIPs, ctr.Lifecycle.PreStop); err != nil {
			s.event(containerRef(pod, ctr), corev1.EventTypeWarning, EventFailedPreStopHook, "PreStopHook failed")
		}
	}()
	select {
	case <-done:
	case <-s.cfg.Clock.After(grace):
	case <-ctx.Done():
	}
}

// specFor finds a container's spec among the pod's init and app containers.
func specFor(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

// killPod stops every running container, app containers (and regular init
// containers) first and in parallel, sidecars after them in reverse order, as
// the kubelet's termination ordering does; then stops every sandbox.
func (s *Syncer) killPod(ctx context.Context, pod *corev1.Pod, view *PodView, override *int64) *SyncResult {
	res := &SyncResult{}
	if err := validPod(pod); err != nil {
		res.Err = err
		return res
	}
	view, err := s.load(ctx, pod, view)
	if err != nil {
		res.Err = err
		return res
	}
	type victim struct {
		id   string
		ctr  *corev1.Container
		name string
	}
	var running []victim
	for _, c := range view.Containers {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		name := ContainerName(c)
		ctr := specFor(pod, name)
		if ctr == nil {
			ctr = &corev1.Container{Name: name}
		}
		running = append(running, victim{id: c.GetId(), ctr: ctr, name: name})
	}

	// Termination ordering: each sidecar waits for every regular container and
	// for the sidecars started after it.
	done := map[string]chan struct{}{}
	for _, v := range running {
		done[v.name] = make(chan struct{})
	}
	appNames := map[string]bool{}
	for i := range pod.Spec.Containers {
		appNames[pod.Spec.Containers[i].Name] = true
	}
	sidecarIndex := map[string]int{}
	for i := range pod.Spec.InitContainers {
		if IsRestartableInitContainer(&pod.Spec.InitContainers[i]) {
			sidecarIndex[pod.Spec.InitContainers[i].Name] = i
		}
	}
	waitFor := func(name string) func(time.Duration) {
		idx, sidecar := sidecarIndex[name]
		if !sidecar {
			return nil
		}
		return func(remaining time.Duration) {
			timeout := s.cfg.Clock.After(remaining)
			for _, other := range running {
				oi, otherSidecar := sidecarIndex[other.name]
				// App containers, and the sidecars started after this one; not
				// regular init containers (newTerminationOrdering).
				if other.name == name || (otherSidecar && oi < idx) || (!otherSidecar && !appNames[other.name]) {
					continue
				}
				select {
				case <-done[other.name]:
				case <-timeout:
					return
				case <-ctx.Done():
					return
				}
			}
		}
	}

	var mu sync.Mutex
	var wg sync.WaitGroup
	podIPs := view.IPs()
	for _, v := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(done[v.name])
			err := s.killContainer(ctx, pod, v.id, v.ctr, "", KillUnknown, override, podIPs, waitFor(v.name))
			mu.Lock()
			res.add(ActionKillContainer, v.name, err)
			mu.Unlock()
		}()
	}
	wg.Wait()

	var sbErr error
	for _, sb := range view.Sandboxes {
		if err := s.cfg.Runtime.StopPodSandbox(ctx, sb.GetId()); err != nil && !isNotFound(err) {
			sbErr = errors.Join(sbErr, failure(ErrKillPodSandbox, err.Error(), "sandbox %s of pod %s", sb.GetId(), formatPod(pod)))
		}
	}
	res.add(ActionKillPodSandbox, string(pod.UID), sbErr)
	return res
}

func (s *Syncer) removePod(ctx context.Context, uid types.UID) error {
	sel := map[string]string{LabelPodUID: string(uid)}
	var errs []error
	ctrs, err := s.cfg.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: sel})
	if err != nil {
		return fmt.Errorf("list containers of pod %s: %w", uid, err)
	}
	for _, c := range ctrs {
		if err := s.cfg.Runtime.RemoveContainer(ctx, c.GetId()); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("remove container %s of pod %s: %w", c.GetId(), uid, err))
		}
	}
	sbs, err := s.cfg.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: sel})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list sandboxes of pod %s: %w", uid, err))...)
	}
	for _, sb := range sbs {
		if err := s.cfg.Runtime.StopPodSandbox(ctx, sb.GetId()); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("stop sandbox %s of pod %s: %w", sb.GetId(), uid, err))
			continue
		}
		if err := s.cfg.Runtime.RemovePodSandbox(ctx, sb.GetId()); err != nil && !isNotFound(err) {
			errs = append(errs, fmt.Errorf("remove sandbox %s of pod %s: %w", sb.GetId(), uid, err))
		}
	}
	if len(errs) == 0 {
		s.mu.Lock()
		delete(s.waiting, uid)
		s.actuated.RemovePodActuated(uid)
		for key := range s.pullErrors {
			if strings.HasPrefix(key, string(uid)+"_") {
				delete(s.pullErrors, key)
			}
		}
		s.mu.Unlock()
	}
	// The kubelet collects expired back-off entries on its housekeeping pass.
	s.cfg.Backoff.GC()
	s.cfg.ImageBackoff.GC()
	return errors.Join(errs...)
}
