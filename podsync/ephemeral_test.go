package podsync

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func withEphemeral(name, target string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: name, Image: "busybox"},
			TargetContainerName:      target,
		})
	}
}

func withEphemeralStatus(st corev1.ContainerStatus) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.EphemeralContainerStatuses = append(p.Status.EphemeralContainerStatuses, st)
	}
}

func TestComputeActionsEphemeral(t *testing.T) {
	appsRunning := []cs{{name: "app", id: "a1", state: running}, {name: "side", id: "s1", state: running}}
	with := func(extra ...cs) []cs { return append(append([]cs{}, appsRunning...), extra...) }
	tests := []struct {
		name string
		pod  *corev1.Pod
		view *PodView
		want Actions
	}{{
		name: "added to a running pod: start it",
		pod:  testPod(withEphemeral("debugger", "")),
		view: view(ready(), appsRunning...),
		want: Actions{SandboxID: "sb1", EphemeralContainersToStart: []int{0}},
	}, {
		name: "running: nothing to do",
		pod:  testPod(withEphemeral("debugger", "")),
		view: view(ready(), with(cs{name: "debugger", id: "d1", state: running})...),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "exited with an error in a restartPolicy Always pod: never restarted",
		pod:  testPod(withEphemeral("debugger", "")),
		view: view(ready(), with(cs{name: "debugger", id: "d1", state: exited, exit: 1})...),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "created but never started: not started again either",
		pod:  testPod(withEphemeral("debugger", "")),
		view: view(ready(), with(cs{name: "debugger", id: "d1", state: created})...),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "a second one added: only the new one starts",
		pod:  testPod(withEphemeral("debugger", ""), withEphemeral("debugger2", "app")),
		view: view(ready(), with(cs{name: "debugger", id: "d1", state: running})...),
		want: Actions{SandboxID: "sb1", EphemeralContainersToStart: []int{1}},
	}, {
		name: "pod still initializing: it starts beside the running init container",
		pod:  testPod(withInits("i1"), withEphemeral("debugger", "")),
		view: view(ready(), cs{name: "i1", id: "i1a", state: running}),
		want: Actions{SandboxID: "sb1", EphemeralContainersToStart: []int{0}},
	}, {
		name: "new sandbox: regular containers first, no ephemeral start",
		pod:  testPod(withEphemeral("debugger", "")),
		view: view(nil),
		want: Actions{KillPod: true, CreateSandbox: true, ContainersToStart: []int{0, 1}},
	}, {
		name: "ran in the old sandbox: not started in the new one",
		pod:  testPod(withEphemeral("debugger", "")),
		view: func() *PodView {
			sbs := []*runtimeapi.PodSandboxStatus{sandbox("sb2", 1, true, "10.0.0.6"), sandbox("sb1", 0, false, "10.0.0.5")}
			v := view(sbs, cs{name: "app", id: "a2", state: running, created: 10}, cs{name: "side", id: "s2", state: running, created: 10},
				cs{name: "debugger", id: "d1", state: exited, exit: 137})
			v.ContainerSandboxes = map[string]string{"a2": "sb2", "s2": "sb2", "d1": "sb1"}
			return v
		}(),
		want: Actions{SandboxID: "sb2", Attempt: 1},
	}, {
		name: "exited, then removed from the runtime: the status says it ran, not started again",
		pod: testPod(withEphemeral("debugger", ""), withEphemeralStatus(corev1.ContainerStatus{
			Name: "debugger", ContainerID: "containerd://d1",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}},
		})),
		view: view(ready(), appsRunning...),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "running, then removed from the runtime: not started again",
		pod: testPod(withEphemeral("debugger", ""), withEphemeralStatus(corev1.ContainerStatus{
			Name: "debugger", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
		})),
		view: view(ready(), appsRunning...),
		want: Actions{SandboxID: "sb1"},
	}, {
		name: "waiting without an ID (its image failed): started",
		pod: testPod(withEphemeral("debugger", ""), withEphemeralStatus(corev1.ContainerStatus{
			Name: "debugger", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}},
		})),
		view: view(ready(), appsRunning...),
		want: Actions{SandboxID: "sb1", EphemeralContainersToStart: []int{0}},
	}, {
		name: "another ephemeral container's status does not count",
		pod: testPod(withEphemeral("debugger", ""), withEphemeralStatus(corev1.ContainerStatus{
			Name: "other", ContainerID: "containerd://o1",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}},
		})),
		view: view(ready(), appsRunning...),
		want: Actions{SandboxID: "sb1", EphemeralContainersToStart: []int{0}},
	}, {
		name: "every app container done (restartPolicy Never): the pod is killed, the debugger still listed",
		pod:  testPod(withPolicy(corev1.RestartPolicyNever), withEphemeral("debugger", "")),
		view: view(ready(), cs{name: "app", id: "a1", state: exited}, cs{name: "side", id: "s1", state: exited}),
		want: Actions{KillPod: true, SandboxID: "sb1", EphemeralContainersToStart: []int{0}},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ComputeActions(tc.pod, tc.view, ActionOptions{}))
		})
	}
}

func TestEphemeralTarget(t *testing.T) {
	pod := testPod(withEphemeral("plain", ""), withEphemeral("dbg", "app"), withEphemeral("lost", "gone"))
	v := view(ready(), cs{name: "app", id: "a1", state: running})

	id, err := ephemeralTarget(pod, &pod.Spec.Containers[0], v)
	require.NoError(t, err)
	assert.Empty(t, id, "an app container has no target")
	id, err = ephemeralTarget(pod, ephemeralAsContainer(pod, 0), v)
	require.NoError(t, err)
	assert.Empty(t, id, "no targetContainerName")
	id, err = ephemeralTarget(pod, ephemeralAsContainer(pod, 1), v)
	require.NoError(t, err)
	assert.Equal(t, "a1", id)
	_, err = ephemeralTarget(pod, ephemeralAsContainer(pod, 2), v)
	require.EqualError(t, err, "unable to find target container gone")

	cfg := func(pid runtimeapi.NamespaceMode) *runtimeapi.ContainerConfig {
		return &runtimeapi.ContainerConfig{Linux: &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Pid: pid},
		}}}
	}
	own := cfg(runtimeapi.NamespaceMode_CONTAINER)
	joinTargetPID(own, "a1")
	assert.Equal(t, runtimeapi.NamespaceMode_TARGET, own.Linux.SecurityContext.NamespaceOptions.Pid)
	assert.Equal(t, "a1", own.Linux.SecurityContext.NamespaceOptions.TargetId)
	for _, mode := range []runtimeapi.NamespaceMode{runtimeapi.NamespaceMode_POD, runtimeapi.NamespaceMode_NODE} {
		shared := cfg(mode)
		joinTargetPID(shared, "a1")
		assert.Equal(t, mode, shared.Linux.SecurityContext.NamespaceOptions.Pid, "shareProcessNamespace and hostPID win")
		assert.Empty(t, shared.Linux.SecurityContext.NamespaceOptions.TargetId)
	}
	untouched := cfg(runtimeapi.NamespaceMode_CONTAINER)
	joinTargetPID(untouched, "")
	assert.Equal(t, runtimeapi.NamespaceMode_CONTAINER, untouched.Linux.SecurityContext.NamespaceOptions.Pid)
	joinTargetPID(&runtimeapi.ContainerConfig{}, "a1") // no Linux section: no panic
}

func TestPodStatusEphemeral(t *testing.T) {
	pod := testPod(withEphemeral("zeta", ""), withEphemeral("debugger", "app"))
	appsRunning := []cs{{name: "app", id: "a1", state: running, started: 1}, {name: "side", id: "s1", state: running, started: 1}}

	// Added, not yet run: waiting in ContainerCreating, listed by name.
	s := PodStatus(pod, view(ready(), appsRunning...), StatusInput{Now: t0})
	require.Len(t, s.EphemeralContainerStatuses, 2)
	assert.Equal(t, "debugger", s.EphemeralContainerStatuses[0].Name)
	assert.Equal(t, "zeta", s.EphemeralContainerStatuses[1].Name)
	dbg := s.EphemeralContainerStatuses[0]
	assert.Equal(t, "busybox", dbg.Image)
	require.NotNil(t, dbg.State.Waiting)
	assert.Equal(t, ReasonContainerCreating, dbg.State.Waiting.Reason)
	assert.Len(t, s.ContainerStatuses, 2, "ephemeral containers are not app containers")
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, corev1.ConditionTrue, cond(s, corev1.PodReady).Status, "a waiting debugger does not make the pod unready")

	// Running.
	v := view(ready(), append(appsRunning, cs{name: "debugger", id: "d1", state: running, created: 5, started: 6})...)
	s = PodStatus(pod, v, StatusInput{Now: t0})
	dbg = ctrStatus(t, s.EphemeralContainerStatuses, "debugger")
	require.NotNil(t, dbg.State.Running)
	assert.Equal(t, t0.Add(6e9).Unix(), dbg.State.Running.StartedAt.Unix())
	assert.Equal(t, "containerd://d1", dbg.ContainerID)
	assert.Equal(t, "sha256:busybox", dbg.ImageID)
	assert.False(t, dbg.Ready, "the prober leaves ephemeral containers alone")
	assert.Nil(t, dbg.Started)
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, corev1.ConditionTrue, cond(s, corev1.ContainersReady).Status)

	// Exited with an error: terminated, the pod runs on and nothing waits to restart it.
	pod.Status = s
	v = view(ready(), append(appsRunning, cs{name: "debugger", id: "d1", state: exited, exit: 3, created: 5, started: 6, finished: 9})...)
	s = PodStatus(pod, v, StatusInput{Now: t0})
	dbg = ctrStatus(t, s.EphemeralContainerStatuses, "debugger")
	require.NotNil(t, dbg.State.Terminated)
	assert.Equal(t, int32(3), dbg.State.Terminated.ExitCode)
	assert.Equal(t, "Error", dbg.State.Terminated.Reason)
	assert.Equal(t, "containerd://d1", dbg.State.Terminated.ContainerID)
	assert.Equal(t, int32(0), dbg.RestartCount)
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, corev1.ConditionTrue, cond(s, corev1.PodReady).Status)

	// A failed start shows its reason while nothing of that name ran.
	s = PodStatus(pod, view(ready(), appsRunning...), StatusInput{Now: t0, Waiting: map[string]Waiting{
		"zeta": {Reason: "ErrImagePull", Message: "pull failed"},
	}})
	zeta := ctrStatus(t, s.EphemeralContainerStatuses, "zeta")
	require.NotNil(t, zeta.State.Waiting)
	assert.Equal(t, Waiting{Reason: "ErrImagePull", Message: "pull failed"}, Waiting{Reason: zeta.State.Waiting.Reason, Message: zeta.State.Waiting.Message})

	// A pod with init containers reports PodInitializing, as for app containers.
	s = PodStatus(testPod(withInits("i1"), withEphemeral("debugger", "")), view(ready(), cs{name: "i1", id: "i1a", state: running}), StatusInput{Now: t0})
	assert.Equal(t, ReasonPodInitializing, ctrStatus(t, s.EphemeralContainerStatuses, "debugger").State.Waiting.Reason)

	// No ephemeral containers: the field stays nil.
	assert.Nil(t, PodStatus(testPod(), view(ready(), appsRunning...), StatusInput{Now: t0}).EphemeralContainerStatuses)
}
