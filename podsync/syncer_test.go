package podsync_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

var epoch = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

type env struct {
	t       *testing.T
	clk     *testingclock.FakeClock
	rt      *podsynctest.Runtime
	events  *podsynctest.Recorder
	builder *podsynctest.Builder
	syncer  *podsync.Syncer
	probes  map[podsync.ProbeType]map[string]podsync.ProbeResult
	metrics *podsynctest.Metrics
}

func newEnv(t *testing.T) *env {
	e := &env{t: t, clk: testingclock.NewFakeClock(epoch), events: &podsynctest.Recorder{}, builder: &podsynctest.Builder{},
		probes: map[podsync.ProbeType]map[string]podsync.ProbeResult{}, metrics: &podsynctest.Metrics{}}
	e.rt = podsynctest.New(e.clk)
	e.rt.AddImage("busybox:1.36")
	s, err := podsync.New(podsync.Config{
		Runtime: e.rt, Builder: e.builder, Events: e.events, Clock: e.clk, Metrics: e.metrics,
		Probes: podsync.ProbeResultsFunc(func(pt podsync.ProbeType, id string) (podsync.ProbeResult, bool) {
			r, ok := e.probes[pt][id]
			return r, ok
		}),
	})
	require.NoError(t, err)
	e.syncer = s
	return e
}

func (e *env) sync(pod *corev1.Pod) *podsync.SyncResult {
	e.t.Helper()
	v, err := podsync.LoadView(context.Background(), e.rt, pod.UID, nil)
	require.NoError(e.t, err)
	return e.syncer.SyncPod(context.Background(), pod, v)
}

func (e *env) status(pod *corev1.Pod) corev1.PodStatus {
	e.t.Helper()
	v, err := podsync.LoadView(context.Background(), e.rt, pod.UID, nil)
	require.NoError(e.t, err)
	return e.syncer.PodStatus(pod, v, podsync.StatusInput{HostIPs: []string{"192.168.1.10"}})
}

func (e *env) running(name string) *runtimeapi.ContainerStatus {
	e.t.Helper()
	c := e.rt.ContainerByName(name)
	require.NotNil(e.t, c, "container %s exists", name)
	require.Equal(e.t, runtimeapi.ContainerState_CONTAINER_RUNNING, c.State, "container %s runs", name)
	return c
}

func (e *env) exit(name string, code int32) {
	e.t.Helper()
	require.NoError(e.t, e.rt.Exit(e.running(name).Id, code, "", ""))
}

func newPod(mods ...func(*corev1.Pod)) *corev1.Pod {
	grace := int64(30)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-1"},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "app", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func statusOf(t *testing.T, list []corev1.ContainerStatus, name string) corev1.ContainerStatus {
	t.Helper()
	for _, s := range list {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no status for %s", name)
	return corev1.ContainerStatus{}
}

func TestNewValidates(t *testing.T) {
	_, err := podsync.New(podsync.Config{Builder: &podsynctest.Builder{}})
	assert.ErrorIs(t, err, podsync.ErrInvalidConfig)
	_, err = podsync.New(podsync.Config{Runtime: podsynctest.New(nil)})
	assert.ErrorIs(t, err, podsync.ErrInvalidConfig)
	_, err = podsync.New(podsync.Config{Runtime: podsynctest.New(nil), Builder: &podsynctest.Builder{}, MinGracePeriod: -1})
	assert.ErrorIs(t, err, podsync.ErrInvalidConfig)
}

func TestSyncPodStartsPodWithEvents(t *testing.T) {
	e := newEnv(t)
	pod := newPod()
	res := e.sync(pod)
	require.NoError(t, res.Error())
	assert.Equal(t, []string{"RunPodSandbox(web)", "CreateContainer(app)", "StartContainer(" + e.rt.ContainerByName("app").Id + ")"}, e.rt.CallNames())
	assert.Equal(t, []string{
		`Normal Pulled Container image "busybox:1.36" already present on machine`,
		"Normal Created Container created",
		"Normal Started Container started",
	}, e.events.Strings())
	for _, ev := range e.events.Events() {
		assert.Equal(t, "spec.containers{app}", ev.FieldPath, "container events are about the container")
	}

	s := e.status(pod)
	assert.Equal(t, corev1.PodRunning, s.Phase)
	app := statusOf(t, s.ContainerStatuses, "app")
	assert.True(t, app.Ready)
	assert.Equal(t, "containerd://"+e.rt.ContainerByName("app").Id, app.ContainerID)
	assert.NotEmpty(t, s.PodIP)

	// A second sync with everything running does nothing.
	e.rt.ResetCalls()
	require.NoError(t, e.sync(pod).Error())
	assert.Empty(t, e.rt.CallNames())
}

func TestSyncPodInitContainersInOrder(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{
			{Name: "i1", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent},
			{Name: "i2", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent},
		}
	})
	require.NoError(t, e.sync(pod).Error())
	e.running("i1")
	assert.Nil(t, e.rt.ContainerByName("i2"))
	assert.Nil(t, e.rt.ContainerByName("app"))
	s := e.status(pod)
	assert.Equal(t, corev1.PodPending, s.Phase)
	assert.Equal(t, "PodInitializing", statusOf(t, s.ContainerStatuses, "app").State.Waiting.Reason)
	assert.Equal(t, map[string]int{"sandbox": 1, "started/init_container": 1}, e.metrics.Counts())

	require.NoError(t, e.sync(pod).Error())
	assert.Nil(t, e.rt.ContainerByName("i2"), "i1 still running: wait")

	e.exit("i1", 0)
	require.NoError(t, e.sync(pod).Error())
	e.running("i2")
	assert.Nil(t, e.rt.ContainerByName("app"))

	e.exit("i2", 0)
	require.NoError(t, e.sync(pod).Error())
	e.running("app")
	s = e.status(pod)
	assert.Equal(t, corev1.PodRunning, s.Phase)
	for _, c := range s.Conditions {
		assert.Equal(t, corev1.ConditionTrue, c.Status, c.Type)
	}
}

func TestSyncPodFailedInitContainerUnderNever(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.InitContainers = []corev1.Container{{Name: "i1", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}}
	})
	require.NoError(t, e.sync(pod).Error())
	e.exit("i1", 3)
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, e.rt.Sandboxes()[0].State, "the pod is killed")
	assert.Nil(t, e.rt.ContainerByName("app"))
	s := e.status(pod)
	assert.Equal(t, corev1.PodFailed, s.Phase)
	assert.EqualValues(t, 3, statusOf(t, s.InitContainerStatuses, "i1").State.Terminated.ExitCode)
}

func TestSyncPodCrashLoopBackOff(t *testing.T) {
	e := newEnv(t)
	pod := newPod()
	require.NoError(t, e.sync(pod).Error())

	// First crash: restarted at once (nothing recorded yet).
	e.exit("app", 1)
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, "1", e.running("app").Annotations[podsync.AnnotationRestartCount])

	// Second crash: 10s back-off from its finish.
	e.exit("app", 1)
	e.events.Reset()
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrCrashLoopBackOff)
	assert.Equal(t, []string{"Warning BackOff Back-off restarting failed container app in pod web_default(uid-1)"}, e.events.Strings())
	s := e.status(pod)
	app := statusOf(t, s.ContainerStatuses, "app")
	require.NotNil(t, app.State.Waiting)
	assert.Equal(t, "CrashLoopBackOff", app.State.Waiting.Reason)
	assert.Equal(t, "back-off 10s restarting failed container=app pod=web_default(uid-1)", app.State.Waiting.Message)
	assert.EqualValues(t, 1, app.RestartCount)
	assert.EqualValues(t, 1, app.LastTerminationState.Terminated.ExitCode)
	assert.Equal(t, corev1.PodRunning, s.Phase)

	assert.Equal(t, map[string]int{"sandbox": 1, "started/container": 2}, e.metrics.Counts(), "a start held by the back-off is not counted")

	e.clk.Step(9 * time.Second)
	require.ErrorIs(t, e.sync(pod).Error(), podsync.ErrCrashLoopBackOff)
	e.clk.Step(time.Second)
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, "2", e.running("app").Annotations[podsync.AnnotationRestartCount])
	assert.NotEqual(t, "CrashLoopBackOff", reasonOf(statusOf(t, e.status(pod).ContainerStatuses, "app")), "a successful start clears the reason")

	// Third crash: 20s.
	e.exit("app", 1)
	e.sync(pod)
	assert.Equal(t, "back-off 20s restarting failed container=app pod=web_default(uid-1)", statusOf(t, e.status(pod).ContainerStatuses, "app").State.Waiting.Message)
}

func reasonOf(s corev1.ContainerStatus) string {
	if s.State.Waiting != nil {
		return s.State.Waiting.Reason
	}
	return ""
}

func TestSyncPodImagePullFailureAndBackOff(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.example/missing:1" })
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrImagePull)
	ev := e.events.Strings()
	require.Len(t, ev, 3)
	assert.Equal(t, `Normal Pulling Pulling image "registry.example/missing:1"`, ev[0])
	assert.True(t, strings.HasPrefix(ev[1], `Warning Failed Failed to pull image "registry.example/missing:1": rpc error: code = NotFound`), ev[1])
	assert.Equal(t, "Warning Failed Error: ErrImagePull", ev[2])
	app := statusOf(t, e.status(pod).ContainerStatuses, "app")
	assert.Equal(t, "ErrImagePull", app.State.Waiting.Reason)
	assert.Equal(t, 1, e.metrics.Counts()["errors/container/ErrImagePull"])
	assert.Contains(t, app.State.Waiting.Message, "not found")

	e.events.Reset()
	require.ErrorIs(t, e.sync(pod).Error(), podsync.ErrImagePullBackOff)
	assert.Equal(t, []string{`Normal BackOff Back-off pulling image "registry.example/missing:1"`, "Warning Failed Error: ImagePullBackOff"}, e.events.Strings())
	app = statusOf(t, e.status(pod).ContainerStatuses, "app")
	assert.Equal(t, "ImagePullBackOff", app.State.Waiting.Reason)
	assert.True(t, strings.HasPrefix(app.State.Waiting.Message, `Back-off pulling image "registry.example/missing:1": ErrImagePull: rpc error: code = NotFound`),
		"the back-off message carries the last pull error: %s", app.State.Waiting.Message)

	// After the back-off the pull is tried again, and now the image exists.
	e.rt.SetPullable("registry.example/missing:1", true)
	e.clk.Step(10 * time.Second)
	e.events.Reset()
	require.NoError(t, e.sync(pod).Error())
	ev = e.events.Strings()
	assert.Equal(t, `Normal Pulling Pulling image "registry.example/missing:1"`, ev[0])
	assert.Equal(t, `Normal Pulled Successfully pulled image "registry.example/missing:1" in 0s (0s including waiting). Image size: 26000 bytes.`, ev[1])
	e.running("app")
}

func TestSyncPodPullPolicies(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{
			{Name: "never", Image: "absent:1", ImagePullPolicy: corev1.PullNever},
			{Name: "always", Image: "busybox:1.36", ImagePullPolicy: corev1.PullAlways},
			{Name: "latest", Image: "busybox"},
		}
	})
	e.rt.AddImage("busybox:latest")
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrImageNeverPull)
	assert.Contains(t, e.events.Strings(), `Warning ErrImageNeverPull Container image "absent:1" is not present with pull policy of Never`)
	assert.Contains(t, e.rt.CallNames(), "PullImage(busybox:1.36)", "Always pulls even when present")
	assert.Contains(t, e.rt.CallNames(), "PullImage(busybox:latest)", "no tag means Always, and the CRI sees the default tag")
	never := statusOf(t, e.status(pod).ContainerStatuses, "never")
	assert.Equal(t, &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: `Container image "absent:1" is not present with pull policy of Never`}, never.State.Waiting)
	e.running("always")
	e.running("latest")
}

func TestSyncPodInvalidImageName(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) { p.Spec.Containers[0].Image = "Bad Image" })
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrInvalidImageName)
	app := statusOf(t, e.status(pod).ContainerStatuses, "app")
	assert.Equal(t, "InvalidImageName", app.State.Waiting.Reason)
	assert.Equal(t, `Failed to apply default image tag "Bad Image": couldn't parse image reference "Bad Image": invalid reference format: repository name (library/Bad Image) must be lowercase`, app.State.Waiting.Message)
	assert.Equal(t, "Warning InspectFailed "+app.State.Waiting.Message, e.events.Strings()[0])
}

func TestSyncPodConfigErrorIsolated(t *testing.T) {
	e := newEnv(t)
	e.builder.Fail = map[string]error{"bad": errors.New(`configmap "x" not found`)}
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "bad", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent})
	})
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrCreateContainerConfig)
	assert.Contains(t, res.Error().Error(), `container "bad" of pod web_default(uid-1)`, "the error names the object at fault")
	assert.Contains(t, e.events.Strings(), `Warning Failed Error: configmap "x" not found`)
	e.running("app")
	s := e.status(pod)
	assert.Equal(t, &corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: `configmap "x" not found`}, statusOf(t, s.ContainerStatuses, "bad").State.Waiting)
	assert.Equal(t, corev1.PodPending, s.Phase)
}

func TestSyncPodRuntimeErrors(t *testing.T) {
	e := newEnv(t)
	pod := newPod()
	e.rt.FailNext("RunPodSandbox", status.Error(codes.Unknown, "cni plugin not initialized"))
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrCreatePodSandbox)
	assert.Equal(t, map[string]int{"sandbox": 1, "sandbox_errors": 1}, e.metrics.Counts())
	assert.Equal(t, []string{"Warning FailedCreatePodSandBox Failed to create pod sandbox: rpc error: code = Unknown desc = cni plugin not initialized"}, e.events.Strings())

	e.events.Reset()
	e.rt.FailNext("StartContainer", status.Error(codes.Unknown, "exec: \"nope\": executable file not found in $PATH"))
	res = e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrRunContainer)
	assert.Contains(t, e.events.Strings(), "Warning Failed Error: exec: \"nope\": executable file not found in $PATH")
	app := statusOf(t, e.status(pod).ContainerStatuses, "app")
	assert.Equal(t, "RunContainerError", app.State.Waiting.Reason)

	// The created-but-not-started container is started over on the next sync.
	require.NoError(t, e.sync(pod).Error())
	e.running("app")
}

func TestSyncPodPostStartHookFailure(t *testing.T) {
	e := newEnv(t)
	e.rt.SetExec(func(id string, cmd []string, _ time.Duration) ([]byte, []byte, int, error) {
		return []byte("out"), []byte("boom"), 2, nil
	})
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "exit 2"}}}}
	})
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrPostStartHook)
	assert.Equal(t, []string{
		`Normal Pulled Container image "busybox:1.36" already present on machine`,
		"Normal Created Container created",
		"Normal Started Container started",
		"Warning FailedPostStartHook PostStartHook failed",
		"Normal Killing FailedPostStartHook",
	}, e.events.Strings())
	app := statusOf(t, e.status(pod).ContainerStatuses, "app")
	assert.Equal(t, "PostStartHookError", app.State.Waiting.Reason)
	assert.Equal(t, `Exec lifecycle hook ([sh -c exit 2]) for Container "app" in Pod "web_default(uid-1)" failed - error: command 'sh -c exit 2' exited with 2: boom, message: "outboom"`, app.State.Waiting.Message)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, e.rt.ContainerByName("app").State)
}

func stopGrace(t *testing.T, rt *podsynctest.Runtime, id string) string {
	t.Helper()
	for _, c := range rt.Calls() {
		if c.Method == "StopContainer" && strings.HasPrefix(c.Arg, id+",") {
			return strings.TrimPrefix(c.Arg, id+",")
		}
	}
	t.Fatalf("no StopContainer for %s", id)
	return ""
}

func TestKillPodGracePeriodsAndPreStop(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*corev1.Pod)
		override *int64
		want     string
	}{
		{"pod grace", nil, nil, "30s"},
		{"deletion grace wins", func(p *corev1.Pod) { g := int64(5); p.DeletionGracePeriodSeconds = &g }, nil, "5s"},
		{"override 0 still gets the 2s minimum", nil, ptr(int64(0)), "2s"},
		{"no grace set: 2s", func(p *corev1.Pod) { p.Spec.TerminationGracePeriodSeconds = nil }, nil, "2s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			var execs []string
			e.rt.SetExec(func(id string, cmd []string, _ time.Duration) ([]byte, []byte, int, error) {
				execs = append(execs, strings.Join(cmd, " "))
				return nil, nil, 0, nil
			})
			pod := newPod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/drain"}}}}
			})
			require.NoError(t, e.sync(pod).Error())
			id := e.running("app").Id
			if tc.mod != nil {
				tc.mod(pod)
			}
			e.events.Reset()
			res := e.syncer.KillPod(context.Background(), pod, nil, tc.override)
			require.NoError(t, res.Error())
			if tc.override != nil && *tc.override == 0 {
				assert.Empty(t, execs, "no time left for preStop")
			} else {
				assert.Equal(t, []string{"/bin/drain"}, execs)
			}
			assert.Equal(t, tc.want, stopGrace(t, e.rt, id))
			assert.Equal(t, []string{"Normal Killing Stopping container app"}, e.events.Strings())
			assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, e.rt.Sandboxes()[0].State)
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestKillPodPreStopSleepUsesGrace(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 12}}}
	})
	require.NoError(t, e.sync(pod).Error())
	id := e.running("app").Id
	done := make(chan *podsync.SyncResult)
	go func() { done <- e.syncer.KillPod(context.Background(), pod, nil, nil) }()
	// The hook sleeps 12s on the fake clock; the grace timer waits too: wait for both.
	require.Eventually(t, func() bool { return e.clk.Waiters() >= 2 }, 5*time.Second, time.Millisecond)
	select {
	case <-done:
		t.Fatal("KillPod returned before the sleep hook ended")
	case <-time.After(20 * time.Millisecond):
	}
	e.clk.Step(12 * time.Second)
	res := <-done
	require.NoError(t, res.Error())
	assert.Equal(t, "18s", stopGrace(t, e.rt, id), "what the hook left of the 30s")
}

func TestLivenessFailureKillsWithProbeGrace(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].LivenessProbe = &corev1.Probe{TerminationGracePeriodSeconds: ptr(int64(7))}
	})
	require.NoError(t, e.sync(pod).Error())
	id := e.running("app").Id
	e.probes[podsync.Liveness] = map[string]podsync.ProbeResult{"containerd://" + id: podsync.ProbeFailure}
	e.events.Reset()
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, "7s", stopGrace(t, e.rt, id))
	assert.Equal(t, "Normal Killing Container app failed liveness probe, will be restarted", e.events.Strings()[0])
	newer := e.running("app")
	assert.NotEqual(t, id, newer.Id)
	assert.Equal(t, "1", newer.Annotations[podsync.AnnotationRestartCount])
}

func TestSandboxDiedRecreatesWithNextAttempt(t *testing.T) {
	e := newEnv(t)
	pod := newPod()
	require.NoError(t, e.sync(pod).Error())
	old := e.rt.Sandboxes()[0]
	require.NoError(t, e.rt.StopPodSandbox(context.Background(), old.Id))
	e.events.Reset()
	require.NoError(t, e.sync(pod).Error())
	assert.Equal(t, "Normal SandboxChanged Pod sandbox changed, it will be killed and re-created.", e.events.Strings()[0])
	sbs := e.rt.Sandboxes()
	require.Len(t, sbs, 2)
	assert.EqualValues(t, 1, sbs[0].Metadata.Attempt)
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_READY, sbs[0].State)
	assert.Equal(t, "1", e.running("app").Annotations[podsync.AnnotationRestartCount])
}

func TestKillPodStopsSidecarsLast(t *testing.T) {
	e := newEnv(t)
	always := corev1.ContainerRestartPolicyAlways
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{
			{Name: "proxy", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent, RestartPolicy: &always},
			{Name: "logger", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent, RestartPolicy: &always},
		}
	})
	for i := 0; i < 3; i++ {
		require.NoError(t, e.sync(pod).Error())
	}
	e.running("proxy")
	e.running("logger")
	e.running("app")
	e.rt.ResetCalls()
	require.NoError(t, e.syncer.KillPod(context.Background(), pod, nil, nil).Error())
	var order []string
	for _, c := range e.rt.Calls() {
		if c.Method == "StopContainer" {
			for _, n := range []string{"proxy", "logger", "app"} {
				if strings.HasPrefix(c.Arg, e.rt.ContainerByName(n).Id) {
					order = append(order, n)
				}
			}
		}
	}
	assert.Equal(t, []string{"app", "logger", "proxy"}, order, "app first, sidecars in reverse start order")
}

func TestHTTPGetHook(t *testing.T) {
	got := make(chan *http.Request, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r
		w.WriteHeader(http.StatusInternalServerError) // ignored, as by the kubelet
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())

	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}
		p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
			Host: "127.0.0.1", Port: intstr.FromString("http"), Path: "started?x=1",
			HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Hook", Value: "post"}},
		}}}
	})
	require.NoError(t, e.sync(pod).Error())
	r := <-got
	assert.Equal(t, "/started", r.URL.Path)
	assert.Equal(t, "x=1", r.URL.RawQuery)
	assert.Equal(t, "kube-lifecycle/1.37", r.Header.Get("User-Agent"))
	assert.Equal(t, "*/*", r.Header.Get("Accept"))
	assert.Equal(t, "post", r.Header.Get("X-Hook"))
	e.running("app")

	// A hook that cannot connect fails the container.
	srv.Close()
	e2 := newEnv(t)
	res := e2.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrPostStartHook)
	msg := statusOf(t, e2.status(pod).ContainerStatuses, "app").State.Waiting.Message
	assert.True(t, strings.HasPrefix(msg, `HTTP lifecycle hook (started?x=1) for Container "app" in Pod "web_default(uid-1)" failed - error: `), msg)
}

func TestRemovePod(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "bad", Image: "nowhere:1", ImagePullPolicy: corev1.PullIfNotPresent})
	})
	require.Error(t, e.sync(pod).Error())
	assert.Equal(t, "ErrImagePull", reasonOf(statusOf(t, e.status(pod).ContainerStatuses, "bad")))
	require.NoError(t, e.syncer.KillPod(context.Background(), pod, nil, nil).Error())
	require.NoError(t, e.syncer.RemovePod(context.Background(), pod.UID))
	assert.Empty(t, e.rt.Sandboxes())
	assert.Empty(t, e.rt.Containers())
	assert.Equal(t, "ContainerCreating", reasonOf(statusOf(t, e.status(pod).ContainerStatuses, "bad")), "recorded failures are forgotten")
}

func TestSyncPodRejectsInvalidPod(t *testing.T) {
	e := newEnv(t)
	res := e.syncer.SyncPod(context.Background(), &corev1.Pod{}, nil)
	assert.ErrorIs(t, res.Error(), podsync.ErrInvalidPod)
	res = e.syncer.SyncPod(context.Background(), nil, nil)
	assert.ErrorIs(t, res.Error(), podsync.ErrInvalidPod)
	assert.ErrorIs(t, e.syncer.KillPod(context.Background(), nil, nil, nil).Error(), podsync.ErrInvalidPod)
}

func TestSyncPodActiveDeadlineKills(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) { p.Spec.ActiveDeadlineSeconds = ptr(int64(60)) })
	require.NoError(t, e.sync(pod).Error())
	pod.Status = e.status(pod)
	e.clk.Step(59 * time.Second)
	require.NoError(t, e.sync(pod).Error())
	e.running("app")

	e.clk.Step(time.Second)
	e.events.Reset()
	res := e.sync(pod)
	require.ErrorIs(t, res.Error(), podsync.ErrDeadlineExceeded)
	assert.Equal(t, []string{
		"Normal DeadlineExceeded Pod was active on the node longer than the specified deadline",
		"Normal Killing Stopping container app",
	}, e.events.Strings())
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, e.rt.ContainerByName("app").State)
	s := e.status(pod)
	assert.Equal(t, corev1.PodFailed, s.Phase)
	assert.Equal(t, "DeadlineExceeded", s.Reason)
}

func TestSyncPodPrunesOldInitAttempts(t *testing.T) {
	e := newEnv(t)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "i1", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}}
	})
	require.NoError(t, e.sync(pod).Error())
	first := e.running("i1").Id
	e.exit("i1", 1)
	e.clk.Step(time.Second)
	require.NoError(t, e.sync(pod).Error()) // restarted at once (first failure)
	second := e.running("i1").Id
	e.exit("i1", 1)
	e.clk.Step(time.Minute)
	require.NoError(t, e.sync(pod).Error()) // third attempt; the first is pruned
	var ids []string
	for _, c := range e.rt.Containers() {
		ids = append(ids, c.Id)
	}
	assert.NotContains(t, ids, first, "older exited attempts are removed")
	assert.Contains(t, ids, second, "the newest exited attempt is kept")
	assert.Len(t, ids, 2)
}
