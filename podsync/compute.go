package podsync

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// computer holds one ComputeActions run.
type computer struct {
	pod    *corev1.Pod
	view   *PodView
	probes ProbeResults
	hash   func(*corev1.Container) string
	// runtimeName prefixes container IDs given to probes.
	runtimeName string
	actions     Actions
	killed      map[string]bool
	actuated    func(string) (corev1.ResourceRequirements, bool)
}

func computeActions(pod *corev1.Pod, view *PodView, opts ActionOptions) Actions {
	if view == nil {
		view = &PodView{}
	}
	c := &computer{pod: pod, view: view, probes: opts.Probes, hash: opts.Hash, runtimeName: opts.RuntimeName, killed: map[string]bool{}, actuated: opts.Actuated}
	if c.runtimeName == "" {
		c.runtimeName = DefaultRuntimeName
	}
	if c.probes == nil {
		c.probes = noProbes{}
	}
	if c.hash == nil {
		c.hash = ContainerHash
	}
	return c.compute()
}

// Messages of the PodReadyToStartContainers condition when the pod needs a new
// sandbox (pkg/kubelet/types), with its reason.
const (
	ReasonPodSandboxNotReady                  = "PodSandboxNotReady"
	MessageNoPodSandbox                       = "no pod sandbox exists"
	MessageMultipleSandboxes                  = "multiple pod sandboxes are ready and need to be reconciled"
	MessageSandboxNotReady                    = "pod sandbox is not ready"
	MessageSandboxNetworkNamespaceModeChanged = "network namespace mode changed and sandbox needs to be recreated"
	MessageSandboxNoIPAddress                 = "pod sandbox has no IP address"
)

// sandboxChanged says whether the pod needs a new sandbox, the new sandbox's
// attempt, the current sandbox's ID and why (runtimeutil.PodSandboxChanged).
func sandboxChanged(pod *corev1.Pod, view *PodView) (bool, uint32, string, string) {
	if len(view.Sandboxes) == 0 {
		return true, 0, "", MessageNoPodSandbox
	}
	ready := 0
	for _, sb := range view.Sandboxes {
		if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
			ready++
		}
	}
	newest := view.Sandboxes[0]
	next := newest.GetMetadata().GetAttempt() + 1
	switch {
	case ready > 1:
		// Several ready sandboxes: reconcile by starting over.
		return true, next, newest.GetId(), MessageMultipleSandboxes
	case newest.GetState() != runtimeapi.PodSandboxState_SANDBOX_READY:
		return true, next, newest.GetId(), MessageSandboxNotReady
	case newest.GetLinux().GetNamespaces().GetOptions().GetNetwork() != networkMode(pod):
		// hostNetwork changed: the old sandbox cannot be reused.
		return true, next, "", MessageSandboxNetworkNamespaceModeChanged
	case !pod.Spec.HostNetwork && newest.GetNetwork() != nil && newest.GetNetwork().GetIp() == "":
		return true, next, newest.GetId(), MessageSandboxNoIPAddress
	}
	return false, newest.GetMetadata().GetAttempt(), newest.GetId(), ""
}

func networkMode(pod *corev1.Pod) runtimeapi.NamespaceMode {
	if pod.Spec.HostNetwork {
		return runtimeapi.NamespaceMode_NODE
	}
	return runtimeapi.NamespaceMode_POD
}

func restartOnFailure(pod *corev1.Pod) bool {
	return pod.Spec.RestartPolicy != corev1.RestartPolicyNever
}

// ContainerShouldRestart reports whether a container that exited with exitCode
// restarts: its restartPolicyRules first (the first rule whose exit codes
// match; action Restart restarts), then its own restartPolicy, then the pod's
// (pkg/api/v1/pod ContainerShouldRestart, ContainerRestartRules being on by
// default since 1.35). A matching RestartAllContainers rule also says restart
// (RestartAllContainersOnContainerExits is beta and on in 1.37); restarting the
// other containers with it is not implemented.
func ContainerShouldRestart(ctr *corev1.Container, spec *corev1.PodSpec, exitCode int32) bool {
	if ctr.RestartPolicy != nil {
		if rule, ok := matchingRestartRule(ctr, exitCode); ok {
			switch rule.Action {
			case corev1.ContainerRestartRuleActionRestart, corev1.ContainerRestartRuleActionRestartAllContainers:
				return true
			}
		}
		switch *ctr.RestartPolicy {
		case corev1.ContainerRestartPolicyAlways:
			return true
		case corev1.ContainerRestartPolicyOnFailure:
			return exitCode != 0
		case corev1.ContainerRestartPolicyNever:
			return false
		}
	}
	switch spec.RestartPolicy {
	case corev1.RestartPolicyOnFailure:
		return exitCode != 0
	case corev1.RestartPolicyNever:
		return false
	}
	return true
}

func matchingRestartRule(ctr *corev1.Container, exitCode int32) (corev1.ContainerRestartRule, bool) {
	for _, rule := range ctr.RestartPolicyRules {
		if rule.ExitCodes == nil {
			continue
		}
		matched := false
		for _, code := range rule.ExitCodes.Values {
			if code == exitCode {
				matched = true
			}
		}
		switch rule.ExitCodes.Operator {
		case corev1.ContainerRestartRuleOnExitCodesOpIn:
			if matched {
				return rule, true
			}
		case corev1.ContainerRestartRuleOnExitCodesOpNotIn:
			if !matched {
				return rule, true
			}
		}
	}
	return corev1.ContainerRestartRule{}, false
}

// IsRestartableInitContainer reports whether an init container is a sidecar
// (restartPolicy Always).
func IsRestartableInitContainer(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func (c *computer) latest(name string) *runtimeapi.ContainerStatus { return c.view.Latest(name) }

func (c *computer) succeeded(ctr *corev1.Container) bool {
	st := c.latest(ctr.Name)
	if st == nil || st.GetState() == runtimeapi.ContainerState_CONTAINER_RUNNING {
		return false
	}
	return st.GetExitCode() == 0
}

func initFailed(st *runtimeapi.ContainerStatus) bool {
	if st.GetReason() == "OOMKilled" {
		return true
	}
	switch st.GetState() {
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return st.GetExitCode() != 0
	case runtimeapi.ContainerState_CONTAINER_UNKNOWN:
		return true
	}
	return false
}

// shouldRestart is kubecontainer.ShouldContainerBeRestarted.
func (c *computer) shouldRestart(ctr *corev1.Container) bool {
	if c.pod.DeletionTimestamp != nil {
		return false
	}
	st := c.latest(ctr.Name)
	if st == nil {
		return true
	}
	switch st.GetState() {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return false
	case runtimeapi.ContainerState_CONTAINER_UNKNOWN, runtimeapi.ContainerState_CONTAINER_CREATED:
		return true
	}
	return ContainerShouldRestart(ctr, &c.pod.Spec, st.GetExitCode())
}

func (c *computer) kill(st *runtimeapi.ContainerStatus, ctr *corev1.Container, reason KillReason, msg string) {
	if c.killed[st.GetId()] {
		return
	}
	c.killed[st.GetId()] = true
	c.actions.ContainersToKill = append(c.actions.ContainersToKill, KillAction{
		ContainerID: st.GetId(), Name: ctr.Name, Container: ctr, Reason: reason, Message: msg,
	})
}

// probe asks for a result by the container's status ID ("containerd://<id>").
func (c *computer) probe(t ProbeType, id string) (ProbeResult, bool) {
	return c.probes.ProbeResult(t, c.runtimeName+"://"+id)
}

func (c *computer) changed(ctr *corev1.Container, st *runtimeapi.ContainerStatus) bool {
	return ContainerHashOf(st) != c.hash(ctr)
}

func stateName(st *runtimeapi.ContainerStatus) string {
	switch st.GetState() {
	case runtimeapi.ContainerState_CONTAINER_CREATED:
		return "created"
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		return "running"
	case runtimeapi.ContainerState_CONTAINER_EXITED:
		return "exited"
	}
	return "unknown"
}

func (c *computer) compute() Actions {
	pod := c.pod
	create, attempt, sandboxID, _ := sandboxChanged(pod, c.view)
	c.actions = Actions{KillPod: create, CreateSandbox: create, SandboxID: sandboxID, Attempt: attempt}

	if create {
		if !restartOnFailure(pod) && attempt != 0 && len(c.view.Containers) != 0 {
			// Everything ran and nothing restarts: kill what is left, make no sandbox.
			c.actions.CreateSandbox = false
			return c.actions
		}
		var start []int
		for i := range pod.Spec.Containers {
			ctr := &pod.Spec.Containers[i]
			runOnce := pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure
			if ctr.RestartPolicy != nil {
				runOnce = *ctr.RestartPolicy == corev1.ContainerRestartPolicyOnFailure
			}
			if runOnce && c.succeeded(ctr) {
				continue
			}
			start = append(start, i)
		}
		if len(start) == 0 && c.anyRegularCreated() {
			c.actions.CreateSandbox = false
			return c.actions
		}
		if len(pod.Spec.InitContainers) != 0 {
			c.actions.InitContainersToStart = []int{0}
			return c.actions
		}
		c.actions.ContainersToStart = start
		return c.actions
	}

	c.ephemeralActions()
	initialized := c.initActions()
	if c.actions.KillPod || !initialized {
		return c.actions
	}

	keep := 0
	for i := range pod.Spec.Containers {
		ctr := &pod.Spec.Containers[i]
		st := c.latest(ctr.Name)
		if st == nil || st.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			if c.shouldRestart(ctr) {
				c.actions.ContainersToStart = append(c.actions.ContainersToStart, i)
				if st != nil && st.GetState() == runtimeapi.ContainerState_CONTAINER_UNKNOWN {
					c.kill(st, ctr, KillUnknown, fmt.Sprintf("Container is in %q state, try killing it before restart", stateName(st)))
				}
			}
			continue
		}
		var msg string
		var reason KillReason
		restart := restartOnFailure(pod)
		if ctr.RestartPolicy != nil {
			restart = *ctr.RestartPolicy != corev1.ContainerRestartPolicyNever
		}
		if c.changed(ctr, st) {
			msg = fmt.Sprintf("Container %s definition changed", ctr.Name)
			restart = true
			reason = KillUnknown
		} else if r, ok := c.probe(Liveness, st.GetId()); ok && r == ProbeFailure {
			msg = fmt.Sprintf("Container %s failed liveness probe", ctr.Name)
			reason = KillLivenessProbe
		} else if r, ok := c.probe(Startup, st.GetId()); ok && r == ProbeFailure {
			msg = fmt.Sprintf("Container %s failed startup probe", ctr.Name)
			reason = KillStartupProbe
		} else if !c.resize(ctr, st, func() { c.actions.ContainersToStart = append(c.actions.ContainersToStart, i) }) {
			continue // resizePolicy RestartContainer: killed and started again
		} else {
			keep++
			continue
		}
		if restart {
			msg += ", will be restarted"
			c.actions.ContainersToStart = append(c.actions.ContainersToStart, i)
		}
		c.kill(st, ctr, reason, msg)
	}
	if keep == 0 && len(c.actions.ContainersToStart) == 0 {
		c.actions.KillPod = true
		// Sidecars alone must not keep the pod alive.
		c.actions.InitContainersToStart = nil
	}
	if !c.actions.UpdatePodResources {
		c.actions.UpdatePodResources = c.startingResized()
	}
	return c.actions
}

func (c *computer) anyRegularCreated() bool {
	for i := range c.pod.Spec.Containers {
		st := c.latest(c.pod.Spec.Containers[i].Name)
		if st == nil {
			continue
		}
		switch st.GetState() {
		case runtimeapi.ContainerState_CONTAINER_CREATED, runtimeapi.ContainerState_CONTAINER_RUNNING, runtimeapi.ContainerState_CONTAINER_EXITED:
			return true
		}
	}
	return false
}

// initActions is computeInitContainerActions (the SidecarContainers path, the
// only one since the gate went GA): it returns whether the pod is initialized.
func (c *computer) initActions() bool {
	pod := c.pod
	inits := pod.Spec.InitContainers
	if len(inits) == 0 {
		return true
	}
	// Any app container in the current sandbox proves initialization happened,
	// even if the runtime has since removed the init containers; containers of
	// an older sandbox (after a node reboot) prove nothing.
	initialized := c.view.anyActiveRegular(pod)
	previouslyInitialized := initialized
	onFailure := restartOnFailure(pod)
	var toStart []int

	// Walk backwards: finished init containers may have been removed, so the last
	// one the runtime knows tells how far initialization got.
	for i := len(inits) - 1; i >= 0; i-- {
		ctr := &inits[i]
		sidecar := IsRestartableInitContainer(ctr)
		st := c.view.LatestActive(ctr.Name)
		if st == nil {
			if previouslyInitialized && sidecar {
				toStart = append(toStart, i)
			}
			continue
		}
		if previouslyInitialized && !sidecar {
			continue
		}
		switch st.GetState() {
		case runtimeapi.ContainerState_CONTAINER_CREATED:
			// Created but never started: the start failed; start it again.
			toStart = append(toStart, i)
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			if !sidecar {
				break // wait for it to finish
			}
			if ctr.StartupProbe != nil {
				r, ok := c.probe(Startup, st.GetId())
				if !ok {
					break // wait for the startup probe
				}
				if r != ProbeSuccess {
					if r == ProbeFailure {
						c.kill(st, ctr, KillStartupProbe, fmt.Sprintf("Init container %s failed startup probe", ctr.Name))
						toStart = append(toStart, i)
					}
					break
				}
			}
			if i == len(inits)-1 {
				initialized = true
			} else if !previouslyInitialized {
				toStart = append(toStart, i+1)
			}
			if c.changed(ctr, st) {
				c.kill(st, ctr, KillUnknown, fmt.Sprintf("Init container %s definition changed", ctr.Name))
				toStart = append(toStart, i)
				break
			}
			if ctr.LivenessProbe != nil {
				r, ok := c.probe(Liveness, st.GetId())
				if !ok {
					break
				}
				if r == ProbeFailure {
					c.kill(st, ctr, KillLivenessProbe, fmt.Sprintf("Init container %s failed liveness probe", ctr.Name))
					toStart = append(toStart, i)
					break
				}
			}
			c.resize(ctr, st, func() { toStart = append(toStart, i) })
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			if sidecar {
				toStart = append(toStart, i)
				break
			}
			if initFailed(st) {
				if !c.shouldRestart(ctr) {
					c.actions.KillPod = true
					c.actions.InitContainersToStart = nil
					return false
				}
				toStart = append(toStart, i)
				break
			}
			if i == len(inits)-1 {
				initialized = true
			} else {
				toStart = append(toStart, i+1)
			}
		default:
			msg := fmt.Sprintf("Init container is in %q state, try killing it before restart", stateName(st))
			restart := onFailure
			if ctr.RestartPolicy != nil {
				// No exit code to match rules against: the container's policy alone.
				restart = *ctr.RestartPolicy != corev1.ContainerRestartPolicyNever
			}
			if !sidecar && !restart {
				c.actions.KillPod = true
				c.actions.InitContainersToStart = nil
				return false
			}
			c.kill(st, ctr, KillUnknown, msg)
			toStart = append(toStart, i)
		}
		previouslyInitialized = true
	}
	if !previouslyInitialized {
		toStart = append(toStart, 0)
	}
	for l, r := 0, len(toStart)-1; l < r; l, r = l+1, r-1 {
		toStart[l], toStart[r] = toStart[r], toStart[l]
	}
	c.actions.InitContainersToStart = toStart
	return initialized
}
