package podsync

import (
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Waiting reasons the kubelet writes by default.
const (
	ReasonContainerCreating = "ContainerCreating"
	ReasonPodInitializing   = "PodInitializing"
	// ReasonContainerStatusUnknown is the terminated reason of a container the
	// runtime lost track of.
	ReasonContainerStatusUnknown = "ContainerStatusUnknown"
	// ReasonRestartingAllContainers marks containers stopped by a
	// RestartAllContainers rule.
	ReasonRestartingAllContainers = "RestartingAllContainers"
)

// Condition reasons (pkg/kubelet/status/generate.go).
const (
	ReasonUnknownContainerStatuses = "UnknownContainerStatuses"
	ReasonPodCompleted             = "PodCompleted"
	ReasonPodFailed                = "PodFailed"
	ReasonContainersNotReady       = "ContainersNotReady"
	ReasonContainersNotInitialized = "ContainersNotInitialized"
	ReasonReadinessGatesNotReady   = "ReadinessGatesNotReady"
)

// DefaultRuntimeName prefixes container IDs in the status ("containerd://...")
// when StatusInput.RuntimeName is empty.
const DefaultRuntimeName = "containerd"

// kubeletConditions are the pod conditions the kubelet owns and rewrites.
var kubeletConditions = map[corev1.PodConditionType]bool{
	corev1.PodScheduled:              true,
	corev1.PodReady:                  true,
	corev1.PodInitialized:            true,
	corev1.ContainersReady:           true,
	corev1.PodReadyToStartContainers: true,
}

func podStatus(pod *corev1.Pod, view *PodView, in StatusInput) corev1.PodStatus {
	if view == nil {
		view = &PodView{}
	}
	if in.Probes == nil {
		in.Probes = noProbes{}
	}
	if in.Now.IsZero() {
		in.Now = time.Now()
	}
	if in.RuntimeName == "" {
		in.RuntimeName = DefaultRuntimeName
	}
	old := pod.Status
	var s corev1.PodStatus

	newSandbox, _, _, why := sandboxChanged(pod, view)
	for _, ip := range view.IPs() {
		s.PodIPs = append(s.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(s.PodIPs) > 0 {
		s.PodIP = s.PodIPs[0].IP
	}
	s.QOSClass = old.QOSClass
	if s.QOSClass == "" {
		s.QOSClass = QOSClass(pod)
	}
	hasInits := len(pod.Spec.InitContainers) > 0
	s.ContainerStatuses = containerStatuses(pod, view, in, old.ContainerStatuses, pod.Spec.Containers, hasInits, false)
	s.InitContainerStatuses = containerStatuses(pod, view, in, old.InitContainerStatuses, pod.Spec.InitContainers, hasInits, true)
	s.EphemeralContainerStatuses = containerStatuses(pod, view, in, old.EphemeralContainerStatuses, ephemeralSpecs(pod), hasInits, false)
	setProbeFlags(pod, &s, in)
	setResourceStatuses(pod, view, s.ContainerStatuses, old.ContainerStatuses, pod.Spec.Containers)
	setResourceStatuses(pod, view, s.InitContainerStatuses, old.InitContainerStatuses, pod.Spec.InitContainers)

	all := append(append([]corev1.ContainerStatus{}, s.ContainerStatuses...), s.InitContainerStatuses...)
	s.Phase = phase(pod, all, in.Terminal, view.anyActiveRegular(pod))
	if s.Phase != corev1.PodFailed && s.Phase != corev1.PodSucceeded &&
		(old.Phase == corev1.PodFailed || old.Phase == corev1.PodSucceeded) {
		s.Phase = old.Phase // never leave a terminal phase
	}
	if s.Phase == old.Phase {
		s.Reason, s.Message = old.Reason, old.Message
	}
	if ActiveDeadlineExceeded(pod, in.Now) {
		s.Phase = corev1.PodFailed
		s.Reason, s.Message = ReasonDeadlineExceeded, MessageDeadlineExceeded
	}

	for _, c := range old.Conditions {
		if !kubeletConditions[c.Type] && !resizeConditions[c.Type] {
			s.Conditions = append(s.Conditions, c)
		}
	}
	statuses := append(append([]corev1.ContainerStatus{}, s.InitContainerStatuses...), s.ContainerStatuses...)
	rtsc := corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}
	if newSandbox {
		rtsc = corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, Reason: ReasonPodSandboxNotReady, Message: why}
	}
	s.Conditions = append(s.Conditions,
		rtsc,
		initializedCondition(&pod.Spec, old.Conditions, statuses, s.Phase),
		readyCondition(&pod.Spec, s.Conditions, statuses, s.Phase),
		containersReadyCondition(&pod.Spec, statuses, s.Phase),
		corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
	)
	// PodObservedGenerationTracking (on by default since 1.34): the kubelet's
	// conditions and the status record the generation they were computed for.
	for i := range s.Conditions {
		if kubeletConditions[s.Conditions[i].Type] {
			s.Conditions[i].ObservedGeneration = pod.Generation
		}
	}
	s.ObservedGeneration = pod.Generation
	stampConditions(s.Conditions, old.Conditions, in.Now)
	// The resize conditions carry the generation and times the agent gave them.
	s.Conditions = append(s.Conditions, in.ResizeConditions...)

	for _, ip := range in.HostIPs {
		s.HostIPs = append(s.HostIPs, corev1.HostIP{IP: ip})
		if len(s.HostIPs) == 2 {
			break
		}
	}
	if len(s.HostIPs) > 0 {
		s.HostIP = s.HostIPs[0].IP
		if pod.Spec.HostNetwork {
			if s.PodIP == "" {
				s.PodIP = s.HostIP
				s.PodIPs = []corev1.PodIP{{IP: s.HostIP}}
			}
			if len(s.HostIPs) == 2 && len(s.PodIPs) == 1 && isIPv6(s.PodIPs[0].IP) != isIPv6(s.HostIPs[1].IP) {
				s.PodIPs = append(s.PodIPs, corev1.PodIP(s.HostIPs[1]))
			}
		}
	}
	if old.StartTime != nil {
		s.StartTime = old.StartTime.DeepCopy()
	} else {
		t := metav1.NewTime(in.Now)
		s.StartTime = &t
	}
	return s
}

func isIPv6(ip string) bool { return strings.Contains(ip, ":") }

// stampConditions keeps an old condition's lastTransitionTime when its status
// did not change, and stamps now otherwise (the status manager's rule).
func stampConditions(conds, old []corev1.PodCondition, now time.Time) {
	for i := range conds {
		if !conds[i].LastTransitionTime.IsZero() {
			continue
		}
		conds[i].LastTransitionTime = metav1.NewTime(now.Truncate(time.Second))
		for _, o := range old {
			if o.Type == conds[i].Type && o.Status == conds[i].Status && !o.LastTransitionTime.IsZero() {
				conds[i].LastTransitionTime = o.LastTransitionTime
			}
		}
	}
}

// convertContainer turns one runtime container into the API's terms
// (toKubeContainerStatus, then convertContainerStatus).
func convertContainer(c *runtimeapi.ContainerStatus, view *PodView, runtimeName string, old *corev1.ContainerStatus) corev1.ContainerStatus {
	cid := runtimeName + "://" + c.GetId()
	st := corev1.ContainerStatus{
		Name:         ContainerName(c),
		RestartCount: int32(RestartCount(c)),
		Image:        c.GetImage().GetImage(),
		ImageID:      imageID(c),
		ContainerID:  cid,
	}
	if old != nil {
		st.VolumeMounts = old.VolumeMounts
		// With RestartAllContainersOnContainerExits on (1.37 default), the old
		// status's restart count and last termination survive the runtime
		// having removed older attempts.
		if old.RestartCount > st.RestartCount {
			st.RestartCount = old.RestartCount
		}
		if old.ContainerID != st.ContainerID && old.State.Terminated != nil {
			st.LastTerminationState.Terminated = old.State.Terminated.DeepCopy()
		} else if old.LastTerminationState.Terminated != nil {
			st.LastTerminationState.Terminated = old.LastTerminationState.Terminated.DeepCopy()
		}
	}
	switch c.GetState() {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		st.State.Running = &corev1.ContainerStateRunning{StartedAt: nanoTime(c.GetStartedAt())}
		if old != nil && old.State.Terminated != nil && old.RestartCount >= int32(RestartCount(c)) {
			st.RestartCount = old.RestartCount + 1
		}
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		st.State.Waiting = &corev1.ContainerStateWaiting{}
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		msg := c.GetMessage()
		if tm := view.TerminationMessages[c.GetId()]; tm != "" {
			if msg != "" {
				msg += ": "
			}
			msg += tm
		}
		st.State.Terminated = &corev1.ContainerStateTerminated{
			ExitCode:    c.GetExitCode(),
			Reason:      c.GetReason(),
			Message:     msg,
			StartedAt:   nanoTime(c.GetStartedAt()),
			FinishedAt:  nanoTime(c.GetFinishedAt()),
			ContainerID: cid,
		}
	default:
		if old != nil && old.State.Running != nil {
			// It ran and the runtime lost it: it ended, with an unknown code.
			st.State.Terminated = &corev1.ContainerStateTerminated{
				Reason:   ReasonContainerStatusUnknown,
				Message:  "The container could not be located when the pod was terminated",
				ExitCode: 137,
			}
			st.RestartCount = old.RestartCount + 1
		} else {
			st.State.Waiting = &corev1.ContainerStateWaiting{}
		}
	}
	return st
}

// imageID is the API's containerStatuses[].imageID: the runtime's image_ref (the
// image's digested reference), as convertToAPIContainerStatuses sets it. The
// kubelet's own records take image_id (CRI 1.30+) first, but the API field has
// always been the image_ref and upstream keeps it so; containerd 2.x reports the
// two apart (image_id is the bare config digest), containerd 1.6 leaves image_id
// empty.
func imageID(c *runtimeapi.ContainerStatus) string {
	return c.GetImageRef()
}

func nanoTime(ns int64) metav1.Time {
	if ns == 0 {
		return metav1.Time{}
	}
	return metav1.NewTime(time.Unix(0, ns))
}

// containerStatuses is convertToAPIContainerStatuses.
func containerStatuses(pod *corev1.Pod, view *PodView, in StatusInput, previous []corev1.ContainerStatus,
	containers []corev1.Container, hasInits, isInit bool) []corev1.ContainerStatus {
	if len(containers) == 0 {
		return nil
	}
	olds := make(map[string]corev1.ContainerStatus, len(previous))
	for _, o := range previous {
		olds[o.Name] = o
	}
	defaultReason := ReasonContainerCreating
	if hasInits {
		defaultReason = ReasonPodInitializing
	}
	statuses := make(map[string]*corev1.ContainerStatus, len(containers))
	for _, ctr := range containers {
		st := &corev1.ContainerStatus{
			Name:         ctr.Name,
			Image:        ctr.Image,
			State:        corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: defaultReason}},
			VolumeMounts: volumeMountStatuses(&ctr),
		}
		if o, ok := olds[ctr.Name]; ok {
			if o.State.Terminated != nil {
				o := o
				st = &o
			} else {
				st.RestartCount = o.RestartCount
				st.LastTerminationState = o.LastTerminationState
			}
		}
		statuses[ctr.Name] = st
	}

	// A container that was running and vanished from the runtime ended somehow:
	// record that, so the pod does not fall back to Pending.
	for _, ctr := range containers {
		if view.Latest(ctr.Name) != nil {
			continue
		}
		o, ok := olds[ctr.Name]
		if !ok || o.State.Terminated != nil || o.State.Running == nil {
			continue
		}
		st := statuses[ctr.Name]
		if st.State.Waiting == nil || st.State.Waiting.Reason != defaultReason || st.LastTerminationState.Terminated != nil {
			continue
		}
		st.LastTerminationState.Terminated = &corev1.ContainerStateTerminated{
			Reason:   ReasonContainerStatusUnknown,
			Message:  "The container could not be located when the pod was deleted.  The container used to be Running",
			ExitCode: 137,
		}
		if pod.DeletionTimestamp == nil {
			st.RestartCount++
		}
	}

	// The newest attempt is the state, the one before it lastState.
	seen := map[string]int{}
	for _, c := range view.Containers { // newest first
		name := ContainerName(c)
		if _, ok := statuses[name]; !ok || seen[name] >= 2 {
			continue
		}
		var oldPtr *corev1.ContainerStatus
		if o, ok := olds[name]; ok {
			oldPtr = &o
		}
		st := convertContainer(c, view, in.RuntimeName, oldPtr)
		if st.State.Running != nil && oldPtr != nil && oldPtr.Started != nil {
			// Since ChangeContainerStatusOnKubeletRestart went off by default (1.35)
			// a running container keeps the started flag it had.
			started := *oldPtr.Started
			st.Started = &started
		}
		if seen[name] == 0 {
			statuses[name] = &st
		} else {
			statuses[name].LastTerminationState = st.State
		}
		seen[name]++
	}

	// A container the next sync will (re)start shows the last sync failure.
	comp := &computer{pod: pod, view: view}
	for i := range containers {
		ctr := &containers[i]
		latest := view.Latest(ctr.Name)
		if isInit && latest != nil && latest.GetState() == runtimeapi.ContainerState_CONTAINER_EXITED && latest.GetExitCode() == 0 {
			continue
		}
		if !comp.shouldRestart(ctr) {
			continue
		}
		w, ok := in.Waiting[ctr.Name]
		if !ok {
			continue
		}
		st := statuses[ctr.Name]
		if st.State.Terminated != nil {
			st.LastTerminationState = st.State
		}
		st.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: w.Reason, Message: w.Message}}
	}

	out := make([]corev1.ContainerStatus, 0, len(containers))
	if isInit {
		for _, ctr := range containers { // spec order
			out = append(out, *statuses[ctr.Name])
		}
		return out
	}
	for _, st := range statuses {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// volumeMountStatuses is the kubelet's volumeMounts status (RecursiveReadOnlyMounts
// is GA): each mount, and for read-only ones whether the read-only is recursive.
// The runtime's support for recursive read-only mounts is not known here, so
// IfPossible reports Disabled; Enabled reports Enabled.
func volumeMountStatuses(ctr *corev1.Container) []corev1.VolumeMountStatus {
	var out []corev1.VolumeMountStatus
	for _, m := range ctr.VolumeMounts {
		vs := corev1.VolumeMountStatus{Name: m.Name, MountPath: m.MountPath, ReadOnly: m.ReadOnly}
		if m.ReadOnly {
			mode := corev1.RecursiveReadOnlyDisabled
			if m.RecursiveReadOnly != nil && *m.RecursiveReadOnly == corev1.RecursiveReadOnlyEnabled {
				mode = corev1.RecursiveReadOnlyEnabled
			}
			vs.RecursiveReadOnly = &mode
		}
		out = append(out, vs)
	}
	return out
}

// setProbeFlags sets started and ready as the kubelet's prober manager does
// (UpdatePodStatus, v1.37.2).
func setProbeFlags(pod *corev1.Pod, s *corev1.PodStatus, in StatusInput) {
	spec := func(list []corev1.Container, name string) *corev1.Container {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
		return nil
	}
	for i := range s.ContainerStatuses {
		cs := &s.ContainerStatuses[i]
		ctr := spec(pod.Spec.Containers, cs.Name)
		started := isStarted(ctr, cs, in.Probes)
		cs.Started = &started
		cs.Ready = started && isReady(pod, ctr, cs, in)
	}
	for i := range s.InitContainerStatuses {
		cs := &s.InitContainerStatuses[i]
		ctr := spec(pod.Spec.InitContainers, cs.Name)
		started := isStarted(ctr, cs, in.Probes)
		cs.Started = &started
		if ctr == nil || !IsRestartableInitContainer(ctr) {
			cs.Ready = cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0
			continue
		}
		cs.Ready = started && isReady(pod, ctr, cs, in)
	}
}

func isStarted(ctr *corev1.Container, cs *corev1.ContainerStatus, probes ProbeResults) bool {
	if cs.State.Running == nil {
		return false
	}
	if r, ok := probes.ProbeResult(Startup, cs.ContainerID); ok {
		return r == ProbeSuccess
	}
	if cs.Started != nil && *cs.Started {
		return true // started before, e.g. before the agent restarted
	}
	// A startup probe that has not answered yet: not started.
	return ctr == nil || ctr.StartupProbe == nil
}

func isReady(pod *corev1.Pod, ctr *corev1.Container, cs *corev1.ContainerStatus, in StatusInput) bool {
	if cs.State.Running == nil {
		return false
	}
	r, ok := in.Probes.ProbeResult(Readiness, cs.ContainerID)
	if ok && r == ProbeSuccess {
		return true
	}
	// No readiness probe: ready once started.
	ready := ctr == nil || ctr.ReadinessProbe == nil
	// A container that ran since before the agent started (10s of grace) and has
	// no readiness result yet keeps the readiness the pod had, so an agent
	// restart does not flap endpoints (setReadyStateOnKubeletRestart).
	if !in.AgentStart.IsZero() && cs.State.Running.StartedAt.Time.Before(in.AgentStart.Add(-10*time.Second)) {
		if !ready && !ok {
			ready = true
		}
		if ctr != nil && ctr.ReadinessProbe != nil && !podReady(pod) {
			ready = false
		}
	}
	return ready
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func statusOf(statuses []corev1.ContainerStatus, name string) (corev1.ContainerStatus, bool) {
	for _, s := range statuses {
		if s.Name == name {
			return s, true
		}
	}
	return corev1.ContainerStatus{}, false
}

func anyRegularStarted(spec *corev1.PodSpec, statuses []corev1.ContainerStatus) bool {
	for _, c := range spec.Containers {
		if s, ok := statusOf(statuses, c.Name); ok && (s.State.Running != nil || s.State.Terminated != nil) {
			return true
		}
	}
	return false
}

// phase is the kubelet's getPhase (v1.37.2, ContainerRestartRules on):
// podHasInitialized says an app container exists in the current sandbox.
func phase(pod *corev1.Pod, info []corev1.ContainerStatus, terminal, podHasInitialized bool) corev1.PodPhase {
	spec := &pod.Spec
	pendingSidecars, pendingInits, failedInitNotRestartable := 0, 0, 0
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if IsRestartableInitContainer(c) {
			continue
		}
		s, ok := statusOf(info, c.Name)
		switch {
		case !ok, s.State.Running != nil:
			pendingInits++
		case s.State.Terminated != nil:
			if code := s.State.Terminated.ExitCode; code != 0 && !ContainerShouldRestart(c, spec, code) && s.State.Terminated.Reason != ReasonRestartingAllContainers {
				failedInitNotRestartable++
			}
		case s.State.Waiting != nil:
			if t := s.LastTerminationState.Terminated; t != nil {
				if t.ExitCode != 0 && !ContainerShouldRestart(c, spec, t.ExitCode) && t.Reason != ReasonRestartingAllContainers {
					failedInitNotRestartable++
				}
			} else {
				pendingInits++
			}
		default:
			pendingInits++
		}
	}
	unknown, running, waiting, stopped, stoppedNotRestartable, succeeded := 0, 0, 0, 0, 0, 0
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if !IsRestartableInitContainer(c) {
			continue
		}
		s, ok := statusOf(info, c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			if s.Started == nil || !*s.Started {
				pendingSidecars++
			}
			running++
		case s.State.Terminated != nil:
			// A stopped sidecar does not count.
		case s.State.Waiting != nil:
			if s.LastTerminationState.Terminated == nil {
				pendingSidecars++
				waiting++
			}
		default:
			pendingSidecars++
			unknown++
		}
	}
	for i := range spec.Containers {
		c := &spec.Containers[i]
		s, ok := statusOf(info, c.Name)
		switch {
		case !ok:
			unknown++
		case s.State.Running != nil:
			running++
		case s.State.Terminated != nil:
			stopped++
			code := s.State.Terminated.ExitCode
			if !ContainerShouldRestart(c, spec, code) && s.State.Terminated.Reason != ReasonRestartingAllContainers {
				stoppedNotRestartable++
			}
			if code == 0 {
				succeeded++
			}
		case s.State.Waiting != nil:
			if t := s.LastTerminationState.Terminated; t != nil {
				stopped++
				if !ContainerShouldRestart(c, spec, t.ExitCode) && t.Reason != ReasonRestartingAllContainers {
					stoppedNotRestartable++
				}
			} else {
				waiting++
			}
		default:
			unknown++
		}
	}

	if failedInitNotRestartable > 0 {
		return corev1.PodFailed
	}
	switch {
	case pendingInits > 0 || (pendingSidecars > 0 && !podHasInitialized), waiting > 0:
		return corev1.PodPending
	case running > 0 && unknown == 0:
		return corev1.PodRunning
	case running == 0 && stopped > 0 && unknown == 0:
		if terminal && !isStaticPod(pod) {
			if stopped == succeeded {
				return corev1.PodSucceeded
			}
			return corev1.PodFailed
		}
		if stopped != stoppedNotRestartable {
			return corev1.PodRunning // something will restart
		}
		if stopped == succeeded {
			return corev1.PodSucceeded
		}
		return corev1.PodFailed
	}
	return corev1.PodPending
}

// isStaticPod: the kubelet's config source annotation says the pod did not come
// from the API server.
func isStaticPod(pod *corev1.Pod) bool {
	src, ok := pod.Annotations["kubernetes.io/config.source"]
	return ok && src != "api"
}

func containersReadyCondition(spec *corev1.PodSpec, statuses []corev1.ContainerStatus, ph corev1.PodPhase) corev1.PodCondition {
	var unknown, unready []string
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		if !IsRestartableInitContainer(c) {
			continue
		}
		if s, ok := statusOf(statuses, c.Name); !ok {
			unknown = append(unknown, c.Name)
		} else if !s.Ready {
			unready = append(unready, c.Name)
		}
	}
	for _, c := range spec.Containers {
		if s, ok := statusOf(statuses, c.Name); !ok {
			unknown = append(unknown, c.Name)
		} else if !s.Ready {
			unready = append(unready, c.Name)
		}
	}
	cond := corev1.PodCondition{Type: corev1.ContainersReady, Status: corev1.ConditionFalse}
	if (ph == corev1.PodSucceeded && len(unknown) == 0) || ph == corev1.PodFailed {
		cond.Reason = ReasonPodCompleted
		if ph == corev1.PodFailed {
			cond.Reason = ReasonPodFailed
		}
		return cond
	}
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unknown status: %s", unknown))
	}
	if len(unready) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unready status: %s", unready))
	}
	if len(msgs) > 0 {
		cond.Reason = ReasonContainersNotReady
		cond.Message = strings.Join(msgs, ", ")
		return cond
	}
	cond.Status = corev1.ConditionTrue
	return cond
}

func readyCondition(spec *corev1.PodSpec, conds []corev1.PodCondition, statuses []corev1.ContainerStatus, ph corev1.PodPhase) corev1.PodCondition {
	cr := containersReadyCondition(spec, statuses, ph)
	if cr.Status != corev1.ConditionTrue {
		return corev1.PodCondition{Type: corev1.PodReady, Status: cr.Status, Reason: cr.Reason, Message: cr.Message}
	}
	var msgs []string
	for _, rg := range spec.ReadinessGates {
		var found *corev1.PodCondition
		for i := range conds {
			if conds[i].Type == rg.ConditionType {
				found = &conds[i]
			}
		}
		if found == nil {
			msgs = append(msgs, fmt.Sprintf("corresponding condition of pod readiness gate %q does not exist.", string(rg.ConditionType)))
		} else if found.Status != corev1.ConditionTrue {
			msgs = append(msgs, fmt.Sprintf("the status of pod readiness gate %q is not \"True\", but %v", string(rg.ConditionType), found.Status))
		}
	}
	if len(msgs) > 0 {
		return corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: ReasonReadinessGatesNotReady, Message: strings.Join(msgs, ", ")}
	}
	return corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
}

func initializedCondition(spec *corev1.PodSpec, old []corev1.PodCondition, statuses []corev1.ContainerStatus, ph corev1.PodPhase) corev1.PodCondition {
	var unknown, incomplete []string
	for i := range spec.InitContainers {
		c := &spec.InitContainers[i]
		s, ok := statusOf(statuses, c.Name)
		if !ok {
			unknown = append(unknown, c.Name)
			continue
		}
		done := s.Ready
		if IsRestartableInitContainer(c) {
			done = s.Started != nil && *s.Started
		}
		if !done {
			incomplete = append(incomplete, c.Name)
		}
	}
	if ph == corev1.PodSucceeded && len(unknown) == 0 {
		return corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, Reason: ReasonPodCompleted}
	}
	if anyRegularStarted(spec, statuses) {
		return corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}
	}
	var msgs []string
	if len(unknown) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with unknown status: %s", unknown))
	}
	if len(incomplete) > 0 {
		msgs = append(msgs, fmt.Sprintf("containers with incomplete status: %s", incomplete))
	}
	if len(msgs) > 0 {
		// With RestartAllContainersOnContainerExits (on by default in 1.37) a pod
		// once initialized stays so while its containers are being restarted.
		for _, c := range old {
			if c.Type == corev1.PodInitialized && c.Status == corev1.ConditionTrue {
				return corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}
			}
		}
		return corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionFalse, Reason: ReasonContainersNotInitialized, Message: strings.Join(msgs, ", ")}
	}
	return corev1.PodCondition{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}
}

// QOSClass computes a pod's QoS class as the API server does when it creates the
// pod: Guaranteed when every container has cpu and memory limits equal to its
// requests, BestEffort when none has any cpu or memory request or limit,
// Burstable otherwise.
func QOSClass(pod *corev1.Pod) corev1.PodQOSClass {
	requests, limits := corev1.ResourceList{}, corev1.ResourceList{}
	guaranteed := true
	all := append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
	for _, c := range all {
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := c.Resources.Requests[name]; ok && !q.IsZero() {
				requests[name] = q
			}
			if q, ok := c.Resources.Limits[name]; ok && !q.IsZero() {
				limits[name] = q
			}
		}
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			l, ok := c.Resources.Limits[name]
			if !ok || l.IsZero() {
				guaranteed = false
				continue
			}
			if r, ok := c.Resources.Requests[name]; ok && r.Cmp(l) != 0 {
				guaranteed = false
			}
		}
	}
	if len(requests) == 0 && len(limits) == 0 {
		return corev1.PodQOSBestEffort
	}
	if guaranteed {
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}
