package podsync

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestComputeActions(t *testing.T) {
	notReady := []*runtimeapi.PodSandboxStatus{sandbox("sb1", 0, false, "10.0.0.5")}
	hostNet := func(p *corev1.Pod) { p.Spec.HostNetwork = true }
	deleted := func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
	startupProbe := func(p *corev1.Pod) { p.Spec.InitContainers[0].StartupProbe = &corev1.Probe{} }
	livenessProbe := func(p *corev1.Pod) { p.Spec.InitContainers[0].LivenessProbe = &corev1.Probe{} }
	changedImage := func(p *corev1.Pod) { p.Spec.Containers[0].Image = "busybox:2" }

	tests := []struct {
		name   string
		pod    *corev1.Pod
		view   *PodView
		probes probeMap
		want   Actions
	}{{
		name: "new pod: create the sandbox and start every container",
		pod:  testPod(),
		view: view(nil),
		want: Actions{KillPod: true, CreateSandbox: true, ContainersToStart: []int{0, 1}},
	}, {
		name: "everything running: nothing to do",
		pod:  testPod(),
		view: view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "sandbox not ready: kill and recreate with attempt+1",
		pod:  testPod(),
		view: view(notReady, cs{name: "app", id: "a1", state: exited, exit: 137}, cs{name: "side", id: "s1", state: exited, exit: 137}),
		want: Actions{KillPod: true, CreateSandbox: true, SandboxID: "sb1", Attempt: 1, ContainersToStart: []int{0, 1}},
	}, {
		name: "sandbox without IP: recreate",
		pod:  testPod(),
		view: view([]*runtimeapi.PodSandboxStatus{sandbox("sb1", 2, true, "")}, cs{name: "app", id: "a1", state: running}),
		want: Actions{KillPod: true, CreateSandbox: true, SandboxID: "sb1", Attempt: 3, ContainersToStart: []int{0, 1}},
	}, {
		name: "host-network pod without IP keeps its sandbox... once the sandbox matches",
		pod:  testPod(hostNet),
		view: view([]*runtimeapi.PodSandboxStatus{func() *runtimeapi.PodSandboxStatus {
			s := sandbox("sb1", 0, true, "")
			s.Linux.Namespaces.Options.Network = runtimeapi.NamespaceMode_NODE
			return s
		}()}, cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "network mode changed: new sandbox, old one not reused",
		pod:  testPod(hostNet),
		view: view(ready(), cs{name: "app", id: "a1", state: running}),
		want: Actions{KillPod: true, CreateSandbox: true, Attempt: 1, ContainersToStart: []int{0, 1}},
	}, {
		name: "two ready sandboxes: start over from the newest",
		pod:  testPod(),
		view: view([]*runtimeapi.PodSandboxStatus{sandbox("sb1", 0, true, "10.0.0.5"), sandbox("sb2", 1, true, "10.0.0.6")}),
		want: Actions{KillPod: true, CreateSandbox: true, SandboxID: "sb2", Attempt: 2, ContainersToStart: []int{0, 1}},
	}, {
		name: "restartPolicy Never, sandbox dead after containers ran: kill only",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever)),
		view: view(notReady, cs{name: "app", id: "a1", state: exited, exit: 1}),
		want: Actions{KillPod: true, SandboxID: "sb1", Attempt: 1},
	}, {
		name: "restartPolicy Never, sandbox never got containers: retry the sandbox",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever)),
		view: view(notReady),
		want: Actions{KillPod: true, CreateSandbox: true, SandboxID: "sb1", Attempt: 1, ContainersToStart: []int{0, 1}},
	}, {
		name: "restartPolicy OnFailure, sandbox dead: restart only the failed container",
		pod:  testPod(withPolicy(corev1.RestartPolicyOnFailure)),
		view: view(notReady, cs{name: "app", id: "a1", state: exited, exit: 0}, cs{name: "side", id: "s1", state: exited, exit: 2}),
		want: Actions{KillPod: true, CreateSandbox: true, SandboxID: "sb1", Attempt: 1, ContainersToStart: []int{1}},
	}, {
		name: "restartPolicy OnFailure, sandbox dead, all succeeded: no new sandbox",
		pod:  testPod(withPolicy(corev1.RestartPolicyOnFailure)),
		view: view(notReady, cs{name: "app", id: "a1", state: exited}, cs{name: "side", id: "s1", state: exited}),
		want: Actions{KillPod: true, SandboxID: "sb1", Attempt: 1},
	}, {
		name: "Always: an exited container restarts, whatever its code",
		pod:  testPod(),
		view: view(ready(), cs{name: "app", id: "a1", state: exited, exit: 0}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0}},
	}, {
		name: "OnFailure: a failed container restarts, a succeeded one does not",
		pod:  testPod(withPolicy(corev1.RestartPolicyOnFailure)),
		view: view(ready(), cs{name: "app", id: "a1", state: exited, exit: 0}, cs{name: "side", id: "s1", state: exited, exit: 3}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{1}},
	}, {
		name: "Never: all exited, kill the pod",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever)),
		view: view(ready(), cs{name: "app", id: "a1", state: exited, exit: 0}, cs{name: "side", id: "s1", state: exited, exit: 3}),
		want: Actions{KillPod: true, SandboxID: "sb1"},
	}, {
		name: "Never: one still running keeps the pod",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever)),
		view: view(ready(), cs{name: "app", id: "a1", state: exited, exit: 0}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "a created container is started again",
		pod:  testPod(),
		view: view(ready(), cs{name: "app", id: "a1", state: created}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0}},
	}, {
		name: "unknown state: kill it before restarting",
		pod:  testPod(),
		view: view(ready(), cs{name: "app", id: "a1", state: unknown}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "a1", Name: "app", Reason: KillUnknown, Message: `Container is in "unknown" state, try killing it before restart`},
		}},
	}, {
		name: "changed image: kill and restart, even under Never",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever), changedImage),
		view: view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "a1", Name: "app", Reason: KillUnknown, Message: "Container app definition changed, will be restarted"},
		}},
	}, {
		name:   "liveness failure: kill and restart",
		pod:    testPod(),
		view:   view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		probes: probeMap{Liveness: {"containerd://a1": ProbeFailure, "containerd://s1": ProbeSuccess}},
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "a1", Name: "app", Reason: KillLivenessProbe, Message: "Container app failed liveness probe, will be restarted"},
		}},
	}, {
		name:   "startup failure under Never: kill, no restart, and the pod goes",
		pod:    testPod(withPolicy(corev1.RestartPolicyNever), func(p *corev1.Pod) { p.Spec.Containers = p.Spec.Containers[:1] }),
		view:   view(ready(), cs{name: "app", id: "a1", state: running}),
		probes: probeMap{Startup: {"containerd://a1": ProbeFailure}},
		want: Actions{KillPod: true, SandboxID: "sb1", ContainersToKill: []KillAction{
			{ContainerID: "a1", Name: "app", Reason: KillStartupProbe, Message: "Container app failed startup probe"},
		}},
	}, {
		name: "deleted pod: exited containers are not restarted",
		pod:  testPod(deleted),
		view: view(ready(), cs{name: "app", id: "a1", state: exited, exit: 1}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "init containers: a new pod starts the first one only",
		pod:  testPod(withInits("i1", "i2")),
		view: view(nil),
		want: Actions{KillPod: true, CreateSandbox: true, InitContainersToStart: []int{0}},
	}, {
		name: "init containers: first one running, wait",
		pod:  testPod(withInits("i1", "i2")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "init containers: first one done, start the second",
		pod:  testPod(withInits("i1", "i2")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: exited}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{1}},
	}, {
		name: "init containers: all done, start the app containers",
		pod:  testPod(withInits("i1", "i2")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: exited}, cs{name: "i2", id: "i2a", state: exited, created: 1}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0, 1}},
	}, {
		name: "init containers: the last one removed by GC but app running: initialized",
		pod:  testPod(withInits("i1", "i2")),
		view: view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "init container failed under Always: run it again",
		pod:  testPod(withInits("i1", "i2")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: exited, exit: 1}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}},
	}, {
		name: "init container OOMKilled with exit 0 counts as failed",
		pod:  testPod(withInits("i1")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: exited, exit: 0, reason: "OOMKilled"}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}},
	}, {
		name: "init container failed under Never: kill the pod",
		pod:  testPod(withInits("i1", "i2"), withPolicy(corev1.RestartPolicyNever)),
		view: view(ready(), cs{name: "i1", id: "i1a", state: exited, exit: 1}),
		want: Actions{KillPod: true, SandboxID: "sb1"},
	}, {
		name: "init container in unknown state: kill and restart it",
		pod:  testPod(withInits("i1")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: unknown}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "i1a", Name: "i1", Reason: KillUnknown, Message: `Init container is in "unknown" state, try killing it before restart`},
		}},
	}, {
		name: "sidecar running without startup probe: the next init container starts",
		pod:  testPod(withSidecar("proxy"), withInits("i2")),
		view: view(ready(), cs{name: "proxy", id: "p1", state: running}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{1}},
	}, {
		name: "sidecar with startup probe not yet run: wait",
		pod:  testPod(withSidecar("proxy"), withInits("i2"), startupProbe),
		view: view(ready(), cs{name: "proxy", id: "p1", state: running}),
		want: Actions{SandboxID: "sb1"},
	}, {
		name:   "sidecar startup probe passed: the next init container starts",
		pod:    testPod(withSidecar("proxy"), withInits("i2"), startupProbe),
		view:   view(ready(), cs{name: "proxy", id: "p1", state: running}),
		probes: probeMap{Startup: {"containerd://p1": ProbeSuccess}},
		want:   Actions{SandboxID: "sb1", InitContainersToStart: []int{1}},
	}, {
		name:   "sidecar startup probe failed: kill and restart the sidecar",
		pod:    testPod(withSidecar("proxy"), withInits("i2"), startupProbe),
		view:   view(ready(), cs{name: "proxy", id: "p1", state: running}),
		probes: probeMap{Startup: {"containerd://p1": ProbeFailure}},
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "p1", Name: "proxy", Reason: KillStartupProbe, Message: "Init container proxy failed startup probe"},
		}},
	}, {
		name: "sidecar as last init container running: app containers start beside it",
		pod:  testPod(withSidecar("proxy")),
		view: view(ready(), cs{name: "proxy", id: "p1", state: running}),
		want: Actions{SandboxID: "sb1", ContainersToStart: []int{0, 1}},
	}, {
		name: "sidecar exited after init: restart it, keep the app",
		pod:  testPod(withSidecar("proxy"), withInits("i2")),
		view: view(ready(), cs{name: "proxy", id: "p1", state: exited, exit: 1}, cs{name: "i2", id: "i2a", state: exited, created: 1},
			cs{name: "app", id: "a1", state: running, created: 2}, cs{name: "side", id: "s1", state: running, created: 2}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}},
	}, {
		name:   "sidecar liveness failure: kill and restart it",
		pod:    testPod(withSidecar("proxy"), livenessProbe),
		view:   view(ready(), cs{name: "proxy", id: "p1", state: running}, cs{name: "app", id: "a1", state: running, created: 1}, cs{name: "side", id: "s1", state: running, created: 1}),
		probes: probeMap{Liveness: {"containerd://p1": ProbeFailure}},
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "p1", Name: "proxy", Reason: KillLivenessProbe, Message: "Init container proxy failed liveness probe"},
		}},
	}, {
		name: "sidecar image changed: kill and restart it",
		pod:  testPod(withSidecar("proxy"), func(p *corev1.Pod) { p.Spec.InitContainers[0].Image = "proxy:2" }),
		view: view(ready(), cs{name: "proxy", id: "p1", state: running}, cs{name: "app", id: "a1", state: running, created: 1}, cs{name: "side", id: "s1", state: running, created: 1}),
		want: Actions{SandboxID: "sb1", InitContainersToStart: []int{0}, ContainersToKill: []KillAction{
			{ContainerID: "p1", Name: "proxy", Reason: KillUnknown, Message: "Init container proxy definition changed"},
		}},
	}, {
		name: "Never: app containers done, sidecar running: kill the pod, do not restart sidecars",
		pod:  testPod(withSidecar("proxy"), withPolicy(corev1.RestartPolicyNever)),
		view: view(ready(), cs{name: "proxy", id: "p1", state: running}, cs{name: "app", id: "a1", state: exited, created: 1}, cs{name: "side", id: "s1", state: exited, created: 1}),
		want: Actions{KillPod: true, SandboxID: "sb1"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var probes ProbeResults
			if tc.probes != nil {
				probes = tc.probes
			}
			got := ComputeActions(tc.pod, tc.view, ActionOptions{Probes: probes})
			for i := range got.ContainersToKill {
				assert.NotNil(t, got.ContainersToKill[i].Container, "kill action carries the spec")
				got.ContainersToKill[i].Container = nil
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestComputeActionsIsPure(t *testing.T) {
	pod := testPod(withInits("i1"))
	v := view(ready(), cs{name: "i1", id: "i1a", state: exited})
	before := pod.DeepCopy()
	nBefore := len(v.Containers)
	a1 := ComputeActions(pod, v, ActionOptions{})
	a2 := ComputeActions(pod, v, ActionOptions{})
	assert.Equal(t, a1, a2)
	assert.Equal(t, before, pod)
	assert.Len(t, v.Containers, nBefore)
}

func TestComputeActionsProbeIDsCarryTheRuntimeName(t *testing.T) {
	pod := testPod()
	v := view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running})
	probes := probeMap{Liveness: {"cri-o://a1": ProbeFailure}}
	assert.Empty(t, ComputeActions(pod, v, ActionOptions{Probes: probes}).ContainersToKill, "containerd:// by default")
	got := ComputeActions(pod, v, ActionOptions{Probes: probes, RuntimeName: "cri-o"})
	require.Len(t, got.ContainersToKill, 1)
	assert.Equal(t, "a1", got.ContainersToKill[0].ContainerID)
}

func TestComputeActionsContainerRestartRules(t *testing.T) {
	never, onFailure := corev1.ContainerRestartPolicyNever, corev1.ContainerRestartPolicyOnFailure
	withCtrPolicy := func(p *corev1.ContainerRestartPolicy, rules ...corev1.ContainerRestartRule) func(*corev1.Pod) {
		return func(pod *corev1.Pod) {
			pod.Spec.Containers[0].RestartPolicy = p
			pod.Spec.Containers[0].RestartPolicyRules = rules
		}
	}
	restartOn := func(op corev1.ContainerRestartRuleOnExitCodesOperator, codes ...int32) corev1.ContainerRestartRule {
		return corev1.ContainerRestartRule{Action: corev1.ContainerRestartRuleActionRestart,
			ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: op, Values: codes}}
	}
	tests := []struct {
		name  string
		pod   *corev1.Pod
		exit  int32
		start bool
	}{
		{"container Never in an Always pod", testPod(withCtrPolicy(&never)), 1, false},
		{"container OnFailure in a Never pod, failed", testPod(withPolicy(corev1.RestartPolicyNever), withCtrPolicy(&onFailure)), 1, true},
		{"container OnFailure in a Never pod, succeeded", testPod(withPolicy(corev1.RestartPolicyNever), withCtrPolicy(&onFailure)), 0, false},
		{"rule In [42] matches", testPod(withPolicy(corev1.RestartPolicyNever), withCtrPolicy(&never, restartOn(corev1.ContainerRestartRuleOnExitCodesOpIn, 42))), 42, true},
		{"rule In [42] does not match: container Never", testPod(withPolicy(corev1.RestartPolicyNever), withCtrPolicy(&never, restartOn(corev1.ContainerRestartRuleOnExitCodesOpIn, 42))), 1, false},
		{"rule NotIn [0] matches a failure", testPod(withCtrPolicy(&never, restartOn(corev1.ContainerRestartRuleOnExitCodesOpNotIn, 0))), 3, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := view(ready(), cs{name: "app", id: "a1", state: exited, exit: tc.exit}, cs{name: "side", id: "s1", state: running})
			got := ComputeActions(tc.pod, v, ActionOptions{})
			assert.Equal(t, tc.start, len(got.ContainersToStart) == 1 && got.ContainersToStart[0] == 0, "%+v", got)
		})
	}

	// A liveness kill of a container with restartPolicy Never does not restart it.
	pod := testPod(withCtrPolicy(&never))
	v := view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running})
	got := ComputeActions(pod, v, ActionOptions{Probes: probeMap{Liveness: {"containerd://a1": ProbeFailure}}})
	assert.Empty(t, got.ContainersToStart)
	require.Len(t, got.ContainersToKill, 1)
	assert.Equal(t, "Container app failed liveness probe", got.ContainersToKill[0].Message)
}

func TestComputeActionsInitIgnoresOldSandboxContainers(t *testing.T) {
	pod := testPod(withInits("i1", "i2"))
	sbs := []*runtimeapi.PodSandboxStatus{sandbox("sb2", 1, true, "10.0.0.6"), sandbox("sb1", 0, false, "10.0.0.5")}
	v := view(sbs, cs{name: "app", id: "old-app", state: exited, exit: 0}, cs{name: "i1", id: "new-i1", state: exited, created: 5})
	v.ContainerSandboxes = map[string]string{"old-app": "sb1", "new-i1": "sb2"}
	got := ComputeActions(pod, v, ActionOptions{})
	assert.Equal(t, []int{1}, got.InitContainersToStart, "the old sandbox's app container does not mean initialized")
	assert.Empty(t, got.ContainersToStart)

	// In the current sandbox, an exited app container does mean initialized.
	v.ContainerSandboxes["old-app"] = "sb2"
	got = ComputeActions(pod, v, ActionOptions{})
	assert.Empty(t, got.InitContainersToStart)
	assert.Equal(t, []int{0, 1}, got.ContainersToStart)
}
