package podsync

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func cond(s corev1.PodStatus, t corev1.PodConditionType) corev1.PodCondition {
	for _, c := range s.Conditions {
		if c.Type == t {
			return c
		}
	}
	return corev1.PodCondition{}
}

func ctrStatus(t *testing.T, list []corev1.ContainerStatus, name string) corev1.ContainerStatus {
	t.Helper()
	s, ok := statusOf(list, name)
	require.True(t, ok, "status of %s", name)
	return s
}

// condSummary is type=status/reason/message for compact comparisons.
func condSummary(s corev1.PodStatus) map[corev1.PodConditionType]string {
	out := map[corev1.PodConditionType]string{}
	for _, c := range s.Conditions {
		out[c.Type] = string(c.Status) + "/" + c.Reason + "/" + c.Message
	}
	return out
}

func TestPodStatusNewPod(t *testing.T) {
	s := PodStatus(testPod(), view(nil), StatusInput{Now: t0, HostIPs: []string{"192.168.1.10"}})
	assert.Equal(t, corev1.PodPending, s.Phase)
	assert.Equal(t, map[corev1.PodConditionType]string{
		corev1.PodReadyToStartContainers: "False/PodSandboxNotReady/no pod sandbox exists",
		corev1.PodInitialized:            "True//",
		corev1.PodReady:                  "False/ContainersNotReady/containers with unready status: [app side]",
		corev1.ContainersReady:           "False/ContainersNotReady/containers with unready status: [app side]",
		corev1.PodScheduled:              "True//",
	}, condSummary(s))
	app := ctrStatus(t, s.ContainerStatuses, "app")
	require.NotNil(t, app.State.Waiting)
	assert.Equal(t, "ContainerCreating", app.State.Waiting.Reason)
	assert.Equal(t, "busybox", app.Image)
	assert.False(t, *app.Started)
	assert.Equal(t, "192.168.1.10", s.HostIP)
	assert.Equal(t, []corev1.HostIP{{IP: "192.168.1.10"}}, s.HostIPs)
	assert.Equal(t, corev1.PodQOSBestEffort, s.QOSClass)
	require.NotNil(t, s.StartTime)
	assert.True(t, s.StartTime.Time.Equal(t0))
	assert.Empty(t, s.PodIP)
	assert.Equal(t, []string{"app", "side"}, []string{s.ContainerStatuses[0].Name, s.ContainerStatuses[1].Name}, "sorted by name")
}

func TestPodStatusRunning(t *testing.T) {
	pod := testPod()
	v := view(ready(), cs{name: "app", id: "a2", state: running, created: 10, restarts: 1, started: 10},
		cs{name: "app", id: "a1", state: exited, exit: 2, started: 1, finished: 9},
		cs{name: "side", id: "s1", state: running, started: 2})
	s := PodStatus(pod, v, StatusInput{Now: t0.Add(time.Minute)})
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, "10.0.0.5", s.PodIP)
	assert.Equal(t, []corev1.PodIP{{IP: "10.0.0.5"}}, s.PodIPs)
	for _, c := range s.Conditions {
		assert.Equal(t, corev1.ConditionTrue, c.Status, c.Type)
	}
	app := ctrStatus(t, s.ContainerStatuses, "app")
	assert.Equal(t, "containerd://a2", app.ContainerID)
	assert.Equal(t, "sha256:busybox", app.ImageID)
	assert.EqualValues(t, 1, app.RestartCount)
	require.NotNil(t, app.State.Running)
	assert.True(t, app.State.Running.StartedAt.Time.Equal(t0.Add(10*time.Second)))
	require.NotNil(t, app.LastTerminationState.Terminated, "the previous attempt is lastState")
	assert.Equal(t, corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error", ContainerID: "containerd://a1",
		StartedAt: nanoTime(t0.Add(time.Second).UnixNano()), FinishedAt: nanoTime(t0.Add(9 * time.Second).UnixNano())}, *app.LastTerminationState.Terminated)
	assert.True(t, app.Ready)
	assert.True(t, *app.Started)
}

func TestPodStatusProbes(t *testing.T) {
	pod := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{}
		p.Spec.Containers[1].StartupProbe = &corev1.Probe{}
	})
	v := view(ready(), cs{name: "app", id: "a1", state: running}, cs{name: "side", id: "s1", state: running})

	s := PodStatus(pod, v, StatusInput{Now: t0})
	app, side := ctrStatus(t, s.ContainerStatuses, "app"), ctrStatus(t, s.ContainerStatuses, "side")
	assert.False(t, app.Ready, "readiness probe not run yet")
	assert.True(t, *app.Started)
	assert.False(t, *side.Started, "startup probe not run yet")
	assert.False(t, side.Ready)
	assert.Equal(t, "False/ContainersNotReady/containers with unready status: [app side]", condSummary(s)[corev1.ContainersReady])

	s = PodStatus(pod, v, StatusInput{Now: t0, Probes: probeMap{
		Readiness: {"containerd://a1": ProbeSuccess},
		Startup:   {"containerd://s1": ProbeSuccess},
	}})
	assert.Equal(t, "True//", condSummary(s)[corev1.PodReady])

	s = PodStatus(pod, v, StatusInput{Now: t0, Probes: probeMap{Readiness: {"containerd://a1": ProbeFailure}, Startup: {"containerd://s1": ProbeSuccess}}})
	assert.Equal(t, "False/ContainersNotReady/containers with unready status: [app]", condSummary(s)[corev1.PodReady])
}

func TestPodStatusInitContainers(t *testing.T) {
	pod := testPod(withInits("i1", "i2"))
	s := PodStatus(pod, view(ready(), cs{name: "i1", id: "x", state: running}), StatusInput{Now: t0})
	assert.Equal(t, corev1.PodPending, s.Phase)
	assert.Equal(t, "False/ContainersNotInitialized/containers with incomplete status: [i1 i2]", condSummary(s)[corev1.PodInitialized])
	assert.Equal(t, "PodInitializing", ctrStatus(t, s.ContainerStatuses, "app").State.Waiting.Reason)
	assert.Equal(t, "PodInitializing", ctrStatus(t, s.InitContainerStatuses, "i2").State.Waiting.Reason)
	assert.Equal(t, []string{"i1", "i2"}, []string{s.InitContainerStatuses[0].Name, s.InitContainerStatuses[1].Name}, "spec order")

	s = PodStatus(pod, view(ready(), cs{name: "i1", id: "x", state: exited}, cs{name: "i2", id: "y", state: exited, created: 1},
		cs{name: "app", id: "a", state: running, created: 2}, cs{name: "side", id: "b", state: running, created: 2}), StatusInput{Now: t0})
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, "True//", condSummary(s)[corev1.PodInitialized])
	i1 := ctrStatus(t, s.InitContainerStatuses, "i1")
	assert.True(t, i1.Ready, "a completed init container is ready")
	assert.Equal(t, "Completed", i1.State.Terminated.Reason)

	// A failed init container under Never fails the pod.
	s = PodStatus(testPod(withInits("i1"), withPolicy(corev1.RestartPolicyNever)), view(ready(), cs{name: "i1", id: "x", state: exited, exit: 3}), StatusInput{Now: t0})
	assert.Equal(t, corev1.PodFailed, s.Phase)
	assert.Equal(t, "False/PodFailed/", condSummary(s)[corev1.ContainersReady])
}

func TestPodStatusSidecar(t *testing.T) {
	pod := testPod(withSidecar("proxy"))
	s := PodStatus(pod, view(ready(), cs{name: "proxy", id: "p", state: running},
		cs{name: "app", id: "a", state: running, created: 1}, cs{name: "side", id: "b", state: running, created: 1}), StatusInput{Now: t0})
	assert.Equal(t, corev1.PodRunning, s.Phase)
	assert.Equal(t, "True//", condSummary(s)[corev1.PodInitialized])
	proxy := ctrStatus(t, s.InitContainerStatuses, "proxy")
	assert.True(t, proxy.Ready)
	assert.True(t, *proxy.Started)

	// Sidecar not ready counts against ContainersReady.
	pod.Spec.InitContainers[0].ReadinessProbe = &corev1.Probe{}
	s = PodStatus(pod, view(ready(), cs{name: "proxy", id: "p", state: running},
		cs{name: "app", id: "a", state: running, created: 1}, cs{name: "side", id: "b", state: running, created: 1}), StatusInput{Now: t0})
	assert.Equal(t, "False/ContainersNotReady/containers with unready status: [proxy]", condSummary(s)[corev1.ContainersReady])
}

func TestPodStatusTerminalPhases(t *testing.T) {
	tests := []struct {
		name   string
		policy corev1.RestartPolicy
		codes  [2]int32
		want   corev1.PodPhase
	}{
		{"Never, all succeeded", corev1.RestartPolicyNever, [2]int32{0, 0}, corev1.PodSucceeded},
		{"Never, one failed", corev1.RestartPolicyNever, [2]int32{0, 1}, corev1.PodFailed},
		{"OnFailure, all succeeded", corev1.RestartPolicyOnFailure, [2]int32{0, 0}, corev1.PodSucceeded},
		{"OnFailure, one failed: restarting", corev1.RestartPolicyOnFailure, [2]int32{0, 1}, corev1.PodRunning},
		{"Always, all stopped: restarting", corev1.RestartPolicyAlways, [2]int32{0, 0}, corev1.PodRunning},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := view(ready(), cs{name: "app", id: "a", state: exited, exit: tc.codes[0]}, cs{name: "side", id: "b", state: exited, exit: tc.codes[1]})
			s := PodStatus(testPod(withPolicy(tc.policy)), v, StatusInput{Now: t0})
			assert.Equal(t, tc.want, s.Phase)
			if tc.want == corev1.PodSucceeded {
				assert.Equal(t, "True/PodCompleted/", condSummary(s)[corev1.PodInitialized])
				assert.Equal(t, "False/PodCompleted/", condSummary(s)[corev1.ContainersReady])
			}
		})
	}
	// A terminal pod: stopped containers decide whatever the policy.
	v := view(ready(), cs{name: "app", id: "a", state: exited, exit: 137}, cs{name: "side", id: "b", state: exited})
	assert.Equal(t, corev1.PodFailed, PodStatus(testPod(), v, StatusInput{Now: t0, Terminal: true}).Phase)
	// Never leave a terminal phase.
	pod := testPod()
	pod.Status.Phase = corev1.PodSucceeded
	assert.Equal(t, corev1.PodSucceeded, PodStatus(pod, view(ready(), cs{name: "app", id: "a", state: running}, cs{name: "side", id: "b", state: running}), StatusInput{Now: t0}).Phase)
}

func TestPodStatusWaitingReasons(t *testing.T) {
	pod := testPod()
	v := view(ready(), cs{name: "app", id: "a", state: exited, exit: 1, restarts: 3, reason: "OOMKilled"})
	s := PodStatus(pod, v, StatusInput{Now: t0, Waiting: map[string]Waiting{
		"app":  {Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container=app pod=web_default(uid-1)"},
		"side": {Reason: "ErrImagePull", Message: "rpc error: not found"},
	}})
	app := ctrStatus(t, s.ContainerStatuses, "app")
	assert.Equal(t, &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container=app pod=web_default(uid-1)"}, app.State.Waiting)
	require.NotNil(t, app.LastTerminationState.Terminated)
	assert.Equal(t, "OOMKilled", app.LastTerminationState.Terminated.Reason)
	assert.EqualValues(t, 1, app.LastTerminationState.Terminated.ExitCode)
	assert.EqualValues(t, 3, app.RestartCount)
	side := ctrStatus(t, s.ContainerStatuses, "side")
	assert.Equal(t, &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "rpc error: not found"}, side.State.Waiting)
	assert.Equal(t, corev1.PodPending, s.Phase, "a container waiting to be created keeps the pod Pending")

	// A container that will not restart keeps its terminated state.
	s = PodStatus(testPod(withPolicy(corev1.RestartPolicyNever)), v, StatusInput{Now: t0, Waiting: map[string]Waiting{"app": {Reason: "CrashLoopBackOff"}}})
	assert.NotNil(t, ctrStatus(t, s.ContainerStatuses, "app").State.Terminated)
}

func TestPodStatusTerminationMessage(t *testing.T) {
	v := view(ready(), cs{name: "app", id: "a", state: exited, exit: 1, message: "runtime says"})
	v.TerminationMessages = map[string]string{"a": "app says"}
	s := PodStatus(testPod(withPolicy(corev1.RestartPolicyNever)), v, StatusInput{Now: t0})
	assert.Equal(t, "runtime says: app says", ctrStatus(t, s.ContainerStatuses, "app").State.Terminated.Message)
}

func TestPodStatusKeepsHistory(t *testing.T) {
	pod := testPod(withPolicy(corev1.RestartPolicyNever))
	old := metav1.NewTime(t0.Add(-time.Hour))
	pod.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		StartTime: &old,
		QOSClass:  corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: old},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: old},
			{Type: "example.com/gate", Status: corev1.ConditionTrue, LastTransitionTime: old},
		},
		ContainerStatuses: []corev1.ContainerStatus{
			{Name: "app", RestartCount: 0, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed"}}},
			{Name: "side", RestartCount: 4, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: old}}},
		},
	}
	// The runtime has forgotten both containers.
	now := t0
	s := PodStatus(pod, view(ready()), StatusInput{Now: now})
	assert.Equal(t, corev1.PodQOSBurstable, s.QOSClass, "the API server's QoS class is kept")
	assert.True(t, s.StartTime.Time.Equal(old.Time))
	assert.Equal(t, "Completed", ctrStatus(t, s.ContainerStatuses, "app").State.Terminated.Reason, "an old terminated state survives")
	side := ctrStatus(t, s.ContainerStatuses, "side")
	require.NotNil(t, side.LastTerminationState.Terminated, "a running container that vanished ended")
	assert.Equal(t, "ContainerStatusUnknown", side.LastTerminationState.Terminated.Reason)
	assert.EqualValues(t, 137, side.LastTerminationState.Terminated.ExitCode)
	assert.EqualValues(t, 5, side.RestartCount)
	assert.Equal(t, corev1.ConditionTrue, cond(s, "example.com/gate").Status, "conditions the kubelet does not own are kept")
	assert.True(t, cond(s, corev1.PodScheduled).LastTransitionTime.Time.Equal(old.Time), "unchanged condition keeps its time")
	assert.True(t, cond(s, corev1.PodReady).LastTransitionTime.Time.Equal(old.Time))
	assert.True(t, cond(s, corev1.PodInitialized).LastTransitionTime.Time.Equal(now), "new condition stamped now")
}

func TestPodStatusReadinessGates(t *testing.T) {
	pod := testPod(func(p *corev1.Pod) {
		p.Spec.ReadinessGates = []corev1.PodReadinessGate{{ConditionType: "a.example/one"}, {ConditionType: "a.example/two"}}
		p.Status.Conditions = []corev1.PodCondition{{Type: "a.example/two", Status: corev1.ConditionFalse}}
	})
	s := PodStatus(pod, view(ready(), cs{name: "app", id: "a", state: running}, cs{name: "side", id: "b", state: running}), StatusInput{Now: t0})
	assert.Equal(t, `False/ReadinessGatesNotReady/corresponding condition of pod readiness gate "a.example/one" does not exist., the status of pod readiness gate "a.example/two" is not "True", but False`,
		condSummary(s)[corev1.PodReady])
	assert.Equal(t, "True//", condSummary(s)[corev1.ContainersReady])
}

func TestPodStatusActiveDeadline(t *testing.T) {
	pod := testPod()
	start := metav1.NewTime(t0)
	pod.Status.StartTime = &start
	deadline := int64(30)
	pod.Spec.ActiveDeadlineSeconds = &deadline
	v := view(ready(), cs{name: "app", id: "a", state: running}, cs{name: "side", id: "b", state: running})
	assert.Equal(t, corev1.PodRunning, PodStatus(pod, v, StatusInput{Now: t0.Add(29 * time.Second)}).Phase)
	s := PodStatus(pod, v, StatusInput{Now: t0.Add(30 * time.Second)})
	assert.Equal(t, corev1.PodFailed, s.Phase)
	assert.Equal(t, "DeadlineExceeded", s.Reason)
	assert.Equal(t, "Pod was active on the node longer than the specified deadline", s.Message)
}

func TestPodStatusHostNetwork(t *testing.T) {
	pod := testPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true })
	sb := sandbox("sb1", 0, true, "")
	sb.Linux.Namespaces.Options.Network = runtimeapi.NamespaceMode_NODE
	s := PodStatus(pod, view([]*runtimeapi.PodSandboxStatus{sb}), StatusInput{Now: t0, HostIPs: []string{"192.168.1.10", "fd00::10", "10.9.9.9"}})
	assert.Equal(t, "192.168.1.10", s.PodIP)
	assert.Equal(t, []corev1.PodIP{{IP: "192.168.1.10"}, {IP: "fd00::10"}}, s.PodIPs)
	assert.Len(t, s.HostIPs, 2)
	assert.Equal(t, "True//", condSummary(s)[corev1.PodReadyToStartContainers])
}

func TestQOSClass(t *testing.T) {
	rl := func(cpu, mem string) corev1.ResourceList {
		l := corev1.ResourceList{}
		if cpu != "" {
			l[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			l[corev1.ResourceMemory] = resource.MustParse(mem)
		}
		return l
	}
	with := func(req, lim corev1.ResourceList) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Resources: corev1.ResourceRequirements{Requests: req, Limits: lim}}}}}
	}
	assert.Equal(t, corev1.PodQOSBestEffort, QOSClass(with(nil, nil)))
	assert.Equal(t, corev1.PodQOSGuaranteed, QOSClass(with(nil, rl("1", "1Gi"))), "limits alone: requests default to them")
	assert.Equal(t, corev1.PodQOSGuaranteed, QOSClass(with(rl("1", "1Gi"), rl("1", "1Gi"))))
	assert.Equal(t, corev1.PodQOSBurstable, QOSClass(with(rl("500m", "1Gi"), rl("1", "1Gi"))))
	assert.Equal(t, corev1.PodQOSBurstable, QOSClass(with(rl("1", ""), nil)))
}

type mapFiles map[string]string

func (m mapFiles) ReadFile(p string) ([]byte, error) {
	if s, ok := m[p]; ok {
		return []byte(s), nil
	}
	if p == "/broken" {
		return nil, errors.New("permission denied")
	}
	return nil, os.ErrNotExist
}

func TestTerminationMessage(t *testing.T) {
	mk := func(policy corev1.TerminationMessagePolicy, exit int32, hostPath string) *runtimeapi.ContainerStatus {
		return &runtimeapi.ContainerStatus{
			State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: exit, LogPath: "/logs/0.log",
			Annotations: map[string]string{AnnotationTerminationMessagePath: "/dev/termination-log", AnnotationTerminationMessagePolicy: string(policy)},
			Mounts:      []*runtimeapi.Mount{{ContainerPath: "/dev/termination-log", HostPath: hostPath}},
		}
	}
	var long []byte
	for i := 0; i < 5000; i++ {
		long = append(long, byte('a'+i%26))
	}
	var logLines string
	for i := 0; i < 100; i++ {
		logLines += fmt.Sprintf("2026-12-03T06:00:00.000000000Z stdout F line %03d\n", i)
	}
	files := mapFiles{
		"/msg":        "goodbye",
		"/empty":      "",
		"/long":       string(long),
		"/logs/0.log": "2026-12-03T06:00:00.000000000Z stdout P part one \n2026-12-03T06:00:00.100000000Z stdout F and two\n2026-12-03T06:00:00.200000000Z stderr F oops\n",
		"/logs/big":   logLines,
	}
	assert.Equal(t, "goodbye", TerminationMessage(mk(corev1.TerminationMessageReadFile, 1, "/msg"), files))
	assert.Equal(t, "goodbye", TerminationMessage(mk(corev1.TerminationMessageFallbackToLogsOnError, 1, "/msg"), files), "the file wins")
	assert.Equal(t, "", TerminationMessage(mk(corev1.TerminationMessageReadFile, 1, "/empty"), files))
	assert.Equal(t, "part one and two\noops\n", TerminationMessage(mk(corev1.TerminationMessageFallbackToLogsOnError, 1, "/empty"), files), "fallback to the log")
	assert.Equal(t, "", TerminationMessage(mk(corev1.TerminationMessageFallbackToLogsOnError, 0, "/empty"), files), "no fallback on success")
	assert.Equal(t, "part one and two\noops\n", TerminationMessage(mk(corev1.TerminationMessageFallbackToLogsOnError, 2, "/missing"), files))
	assert.Equal(t, string(long[5000-4096:]), TerminationMessage(mk(corev1.TerminationMessageReadFile, 1, "/long"), files), "last 4096 bytes")
	assert.Contains(t, TerminationMessage(mk(corev1.TerminationMessageReadFile, 1, "/broken"), files), "Error on reading termination log /broken")

	// `echo -n DONE; false`: containerd writes the unterminated output as a
	// partial record, and its text is the whole message, without a newline.
	files["/logs/nonl"] = "2026-12-03T06:00:00.000000000Z stdout P DONE\n"
	nonl := mk(corev1.TerminationMessageFallbackToLogsOnError, 1, "/empty")
	nonl.LogPath = "/logs/nonl"
	assert.Equal(t, "DONE", TerminationMessage(nonl, files), "a trailing partial record")
	nonl.Reason = "ContainerCannotRun"
	assert.Equal(t, "", TerminationMessage(nonl, files), "no fallback when the container could not run")
	// Records that do not parse are skipped; the tail counts raw records.
	files["/logs/mixed"] = "garbage\n2026-12-03T06:00:00Z stdin F no\n2026-12-03T06:00:00Z stderr P a\n2026-12-03T06:00:01Z stderr F b\n"
	nonl.Reason, nonl.LogPath = "Error", "/logs/mixed"
	assert.Equal(t, "ab\n", TerminationMessage(nonl, files))
	var partials string
	for i := 0; i < 100; i++ {
		partials += fmt.Sprintf("2026-12-03T06:00:00.000000000Z stdout P %02d\n", i)
	}
	files["/logs/partials"] = partials
	nonl.LogPath = "/logs/partials"
	got := TerminationMessage(nonl, files)
	assert.True(t, strings.HasPrefix(got, "2021"), "the last 80 records, partial ones too: %q", got)
	assert.True(t, strings.HasSuffix(got, "9899"), "%q", got)

	big := mk(corev1.TerminationMessageFallbackToLogsOnError, 1, "/empty")
	big.LogPath = "/logs/big"
	got = TerminationMessage(big, files)
	assert.True(t, strings.HasPrefix(got, "line 020\n"), "only the last 80 lines: %q", got[:20])
	assert.True(t, strings.HasSuffix(got, "line 099\n"))

	var wide string
	for i := 0; i < 50; i++ {
		wide += fmt.Sprintf("2026-12-03T06:00:00.000000000Z stdout F %03d%s\n", i, strings.Repeat("x", 96))
	}
	files["/logs/wide"] = wide
	big.LogPath = "/logs/wide"
	got = TerminationMessage(big, files)
	assert.Len(t, got, 2048, "at most the last 2048 bytes")
	assert.True(t, strings.HasSuffix(got, "049"+strings.Repeat("x", 96)+"\n"))
}

func TestPodStatusObservedGeneration(t *testing.T) {
	pod := testPod()
	pod.Generation = 3
	pod.Status.Conditions = []corev1.PodCondition{{Type: "example.com/gate", Status: corev1.ConditionTrue, ObservedGeneration: 1}}
	s := PodStatus(pod, view(ready()), StatusInput{Now: t0})
	assert.EqualValues(t, 3, s.ObservedGeneration)
	for _, c := range s.Conditions {
		want := int64(3)
		if c.Type == "example.com/gate" {
			want = 1 // not the kubelet's: left as it was
		}
		assert.Equal(t, want, c.ObservedGeneration, c.Type)
	}
}

func TestPodStatusPhaseWithContainerRestartPolicies(t *testing.T) {
	never := corev1.ContainerRestartPolicyNever
	always := corev1.ContainerRestartPolicyAlways
	// An Always pod whose only stopped container may not restart is done.
	pod := testPod(func(p *corev1.Pod) {
		p.Spec.Containers = p.Spec.Containers[:1]
		p.Spec.Containers[0].RestartPolicy = &never
	})
	v := view(ready(), cs{name: "app", id: "a", state: exited, exit: 1})
	assert.Equal(t, corev1.PodFailed, PodStatus(pod, v, StatusInput{Now: t0}).Phase)
	v = view(ready(), cs{name: "app", id: "a", state: exited, exit: 0})
	assert.Equal(t, corev1.PodSucceeded, PodStatus(pod, v, StatusInput{Now: t0}).Phase)

	// A Never pod whose container restarts on its own policy keeps Running.
	pod = testPod(withPolicy(corev1.RestartPolicyNever), func(p *corev1.Pod) {
		p.Spec.Containers = p.Spec.Containers[:1]
		p.Spec.Containers[0].RestartPolicy = &always
	})
	v = view(ready(), cs{name: "app", id: "a", state: exited, exit: 1})
	assert.Equal(t, corev1.PodRunning, PodStatus(pod, v, StatusInput{Now: t0}).Phase)

	// A failed init container that restarts on its own policy does not fail a Never pod.
	onFailure := corev1.ContainerRestartPolicyOnFailure
	pod = testPod(withInits("i1"), withPolicy(corev1.RestartPolicyNever), func(p *corev1.Pod) { p.Spec.InitContainers[0].RestartPolicy = &onFailure })
	v = view(ready(), cs{name: "i1", id: "x", state: exited, exit: 2})
	assert.Equal(t, corev1.PodPending, PodStatus(pod, v, StatusInput{Now: t0}).Phase)

	// A terminal static pod is not forced to a terminal phase.
	pod = testPod(func(p *corev1.Pod) { p.Annotations = map[string]string{"kubernetes.io/config.source": "file"} })
	v = view(ready(), cs{name: "app", id: "a", state: exited, exit: 0}, cs{name: "side", id: "b", state: exited, exit: 0})
	assert.Equal(t, corev1.PodRunning, PodStatus(pod, v, StatusInput{Now: t0, Terminal: true}).Phase)
}

func TestPodStatusImageIDAndVolumeMounts(t *testing.T) {
	rro := corev1.RecursiveReadOnlyEnabled
	pod := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{
			{Name: "data", MountPath: "/data"},
			{Name: "cfg", MountPath: "/etc/cfg", ReadOnly: true},
			{Name: "ro", MountPath: "/ro", ReadOnly: true, RecursiveReadOnly: &rro},
		}
	})
	v := view(ready(), cs{name: "app", id: "a", state: running})
	// containerd 2.x reports both: the API's imageID is the image_ref, as upstream's
	// convertToAPIContainerStatuses has it, not the bare image_id.
	v.Containers[0].ImageId = "sha256:image-id"
	v.Containers[0].ImageRef = "registry.k8s.io/pause@sha256:image-ref"
	s := PodStatus(pod, v, StatusInput{Now: t0})
	assert.Equal(t, "registry.k8s.io/pause@sha256:image-ref", ctrStatus(t, s.ContainerStatuses, "app").ImageID, "image_ref, not image_id")
	disabled := corev1.RecursiveReadOnlyDisabled
	assert.Equal(t, []corev1.VolumeMountStatus{
		{Name: "data", MountPath: "/data"},
		{Name: "cfg", MountPath: "/etc/cfg", ReadOnly: true, RecursiveReadOnly: &disabled},
		{Name: "ro", MountPath: "/ro", ReadOnly: true, RecursiveReadOnly: &rro},
	}, ctrStatus(t, s.ContainerStatuses, "side").VolumeMounts)
}

func TestPodStatusAfterAgentRestart(t *testing.T) {
	pod := testPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].StartupProbe = &corev1.Probe{}
		p.Spec.Containers[1].ReadinessProbe = &corev1.Probe{}
	})
	v := view(ready(), cs{name: "app", id: "a", state: running}, cs{name: "side", id: "b", state: running})
	// The old status says both were started and the pod Ready.
	started := true
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: "app", Started: &started, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		{Name: "side", Started: &started, Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
	}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	agentStart := t0.Add(time.Hour)
	s := PodStatus(pod, v, StatusInput{Now: agentStart, AgentStart: agentStart})
	assert.True(t, *ctrStatus(t, s.ContainerStatuses, "app").Started, "started survives with no startup result yet")
	assert.True(t, ctrStatus(t, s.ContainerStatuses, "side").Ready, "readiness survives the restart until the probe answers")
	assert.Equal(t, corev1.ConditionTrue, cond(s, corev1.PodReady).Status)

	// Once the probes answer, they decide.
	s = PodStatus(pod, v, StatusInput{Now: agentStart, AgentStart: agentStart, Probes: probeMap{
		Startup: {"containerd://a": ProbeUnknown}, Readiness: {"containerd://b": ProbeFailure},
	}})
	assert.False(t, *ctrStatus(t, s.ContainerStatuses, "app").Started, "a startup worker with no verdict: not started")
	assert.False(t, ctrStatus(t, s.ContainerStatuses, "side").Ready)

	// Without AgentStart (or for a container started after it) no grace.
	s = PodStatus(pod, v, StatusInput{Now: agentStart})
	assert.False(t, ctrStatus(t, s.ContainerStatuses, "side").Ready)
}

func TestPodStatusKeepsInitializedAndRestartHistory(t *testing.T) {
	pod := testPod(withInits("i1"))
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}}
	// The runtime lost everything of the current sandbox but a fresh init attempt.
	v := view(ready(), cs{name: "i1", id: "x", state: running})
	s := PodStatus(pod, v, StatusInput{Now: t0})
	assert.Equal(t, "True//", condSummary(s)[corev1.PodInitialized], "once initialized, stays so (RestartAllContainersOnContainerExits)")

	// Older attempts garbage-collected: restart count and last termination come
	// from the old status.
	pod = testPod()
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "app", ContainerID: "containerd://old", RestartCount: 6,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 2, Reason: "Error"}},
	}}
	v = view(ready(), cs{name: "app", id: "new", state: running, restarts: 6}, cs{name: "side", id: "b", state: running})
	app := ctrStatus(t, PodStatus(pod, v, StatusInput{Now: t0}).ContainerStatuses, "app")
	assert.EqualValues(t, 7, app.RestartCount, "running again after a recorded termination")
	require.NotNil(t, app.LastTerminationState.Terminated)
	assert.EqualValues(t, 2, app.LastTerminationState.Terminated.ExitCode)
}

func TestTerminationMessageReadsOnlyTheTail(t *testing.T) {
	dir := t.TempDir()
	logPath := dir + "/0.log"
	var log strings.Builder
	for i := 0; i < 20000; i++ { // about 1 MiB of log
		fmt.Fprintf(&log, "2026-12-03T06:00:00.000000000Z stdout F line %05d %s\n", i, strings.Repeat("y", 10))
	}
	require.NoError(t, os.WriteFile(logPath, []byte(log.String()), 0o644))
	msgPath := dir + "/msg"
	require.NoError(t, os.WriteFile(msgPath, []byte(strings.Repeat("m", 5000)+"END"), 0o644))
	c := &runtimeapi.ContainerStatus{
		State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 1, LogPath: logPath,
		Annotations: map[string]string{AnnotationTerminationMessagePath: "/dev/termination-log", AnnotationTerminationMessagePolicy: string(corev1.TerminationMessageFallbackToLogsOnError)},
		Mounts:      []*runtimeapi.Mount{{ContainerPath: "/dev/termination-log", HostPath: msgPath}},
	}
	got := TerminationMessage(c, OSFiles{})
	assert.Len(t, got, MaxTerminationMessageLength)
	assert.True(t, strings.HasSuffix(got, "END"))

	require.NoError(t, os.WriteFile(msgPath, nil, 0o644))
	got = TerminationMessage(c, OSFiles{})
	want := lastLogText([]byte(log.String())) // the whole file, the slow way
	assert.Equal(t, want, got, "the tail window gives the same message as the whole log")
	assert.True(t, strings.HasSuffix(got, "line 19999 yyyyyyyyyy\n"))
}
