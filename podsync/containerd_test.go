package podsync_test

// An integration test against a real containerd + runc started by
// internal/testenv/containerd. It skips with a reason when run casually without
// root or NODEKIT_IMAGES_DIR, and fails under CI=true. Host-network pods need no
// CNI, so nothing touches the machine's network.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// rawRuntime is a test-only podsync.Runtime over the raw CRI gRPC clients (the
// library rule keeps nodekit's cri package out of podsync's tests).
type rawRuntime struct {
	rs runtimeapi.RuntimeServiceClient
	is runtimeapi.ImageServiceClient
}

func newRawRuntime(conn *grpc.ClientConn) *rawRuntime {
	return &rawRuntime{rs: runtimeapi.NewRuntimeServiceClient(conn), is: runtimeapi.NewImageServiceClient(conn)}
}

func (r *rawRuntime) RunPodSandbox(ctx context.Context, cfg *runtimeapi.PodSandboxConfig, handler string) (string, error) {
	resp, err := r.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	return resp.GetPodSandboxId(), err
}

func (r *rawRuntime) StopPodSandbox(ctx context.Context, id string) error {
	_, err := r.rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	return err
}

func (r *rawRuntime) RemovePodSandbox(ctx context.Context, id string) error {
	_, err := r.rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	return err
}

func (r *rawRuntime) PodSandboxStatus(ctx context.Context, id string) (*runtimeapi.PodSandboxStatus, error) {
	resp, err := r.rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id})
	return resp.GetStatus(), err
}

func (r *rawRuntime) ListPodSandbox(ctx context.Context, f *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	resp, err := r.rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: f})
	return resp.GetItems(), err
}

func (r *rawRuntime) CreateContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig, sbCfg *runtimeapi.PodSandboxConfig) (string, error) {
	resp, err := r.rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sandboxID, Config: cfg, SandboxConfig: sbCfg})
	return resp.GetContainerId(), err
}

func (r *rawRuntime) StartContainer(ctx context.Context, id string) error {
	_, err := r.rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: id})
	return err
}

func (r *rawRuntime) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	_, err := r.rs.StopContainer(ctx, &runtimeapi.StopContainerRequest{ContainerId: id, Timeout: int64(grace / time.Second)})
	return err
}

func (r *rawRuntime) RemoveContainer(ctx context.Context, id string) error {
	_, err := r.rs.RemoveContainer(ctx, &runtimeapi.RemoveContainerRequest{ContainerId: id})
	return err
}

func (r *rawRuntime) ContainerStatus(ctx context.Context, id string) (*runtimeapi.ContainerStatus, error) {
	resp, err := r.rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id})
	return resp.GetStatus(), err
}

func (r *rawRuntime) ListContainers(ctx context.Context, f *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	resp, err := r.rs.ListContainers(ctx, &runtimeapi.ListContainersRequest{Filter: f})
	return resp.GetContainers(), err
}

func (r *rawRuntime) ImageStatus(ctx context.Context, image string) (*runtimeapi.Image, error) {
	resp, err := r.is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: image}})
	return resp.GetImage(), err
}

func (r *rawRuntime) PullImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sbCfg *runtimeapi.PodSandboxConfig) (string, error) {
	resp, err := r.is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: image}, Auth: auth, SandboxConfig: sbCfg})
	return resp.GetImageRef(), err
}

func (r *rawRuntime) EnsureImage(ctx context.Context, image string, auth *runtimeapi.AuthConfig, sbCfg *runtimeapi.PodSandboxConfig) (string, bool, error) {
	img, err := r.ImageStatus(ctx, image)
	if err != nil {
		return "", false, err
	}
	if img != nil {
		return img.GetId(), false, nil
	}
	ref, err := r.PullImage(ctx, image, auth, sbCfg)
	return ref, err == nil, err
}

func (r *rawRuntime) ExecSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	resp, err := r.rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: int64(timeout / time.Second)})
	return resp.GetStdout(), resp.GetStderr(), int(resp.GetExitCode()), err
}

// hostBuilder builds configs for host-network pods with a log directory under
// logs and one host folder mounted at /out in every container.
type hostBuilder struct {
	podsynctest.Builder
	logs, out string
}

func (b *hostBuilder) SandboxConfig(ctx context.Context, pod *corev1.Pod, attempt uint32) (*runtimeapi.PodSandboxConfig, error) {
	cfg, err := b.Builder.SandboxConfig(ctx, pod, attempt)
	if err != nil {
		return nil, err
	}
	cfg.LogDirectory = filepath.Join(b.logs, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID))
	cfg.Linux.SecurityContext.NamespaceOptions = &runtimeapi.NamespaceOption{
		Network: runtimeapi.NamespaceMode_NODE, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD,
	}
	return cfg, os.MkdirAll(cfg.LogDirectory, 0o755)
}

func (b *hostBuilder) ContainerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error) {
	cfg, err := b.Builder.ContainerConfig(ctx, pod, c, restartCount, imageRef, podIPs)
	if err != nil {
		return nil, err
	}
	cfg.Mounts = []*runtimeapi.Mount{{HostPath: b.out, ContainerPath: "/out"}}
	dir := filepath.Join(b.logs, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), c.Name)
	return cfg, os.MkdirAll(dir, 0o755)
}

func TestContainerdPodLifecycle(t *testing.T) {
	testenv.RequireLong(t)
	cd := containerd.Start(t, containerd.Options{})
	rt := newRawRuntime(cd.Conn(t))
	events := &podsynctest.Recorder{}
	out := t.TempDir()
	syncer, err := podsync.New(podsync.Config{
		Runtime: rt, Builder: &hostBuilder{logs: t.TempDir(), out: out}, Events: events,
	})
	require.NoError(t, err)

	grace := int64(20)
	image := cd.BusyboxImage()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "lifecycle", Namespace: "nodekit-test", UID: "uid-podsync-lifecycle"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyAlways,
			TerminationGracePeriodSeconds: &grace,
			InitContainers: []corev1.Container{{
				Name: "init", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", "echo initialized > /out/init"},
			}},
			Containers: []corev1.Container{{
				Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				// Exit 0 on SIGTERM, so a graceful stop is told from a SIGKILL (137).
				Command: []string{"sh", "-c", `test -f /out/init || exit 9; trap 'echo term > /out/term; exit 0' TERM; while true; do sleep 0.2; done`},
				Lifecycle: &corev1.Lifecycle{
					PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo started > /out/poststart"}}},
					PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo stopping > /out/prestop"}}},
				},
			}},
		},
	}
	ctx := context.Background()
	status := func() corev1.PodStatus {
		v, err := podsync.LoadView(ctx, rt, pod.UID, podsync.OSFiles{})
		require.NoError(t, err)
		st := syncer.PodStatus(pod, v, podsync.StatusInput{HostIPs: []string{"127.0.0.1"}})
		pod.Status = st
		return st
	}

	// Pod worker rounds until the pod is Ready.
	deadline := time.Now().Add(60 * time.Second)
	var st corev1.PodStatus
	for {
		res := syncer.SyncPod(ctx, pod, nil)
		require.NoError(t, res.Error())
		st = status()
		if st.Phase == corev1.PodRunning && len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].Ready {
			break
		}
		require.True(t, time.Now().Before(deadline), "pod not Running and Ready in time: %+v", st)
		time.Sleep(200 * time.Millisecond)
	}

	init := st.InitContainerStatuses[0]
	require.NotNil(t, init.State.Terminated, "init ran to completion first")
	assert.EqualValues(t, 0, init.State.Terminated.ExitCode)
	assert.Equal(t, "Completed", init.State.Terminated.Reason)
	assert.True(t, strings.HasPrefix(init.ContainerID, "containerd://"))
	app := st.ContainerStatuses[0]
	require.NotNil(t, app.State.Running)
	assert.EqualValues(t, 0, app.RestartCount)
	assert.True(t, *app.Started)
	assert.NotEmpty(t, app.ImageID)
	assert.Equal(t, "127.0.0.1", st.PodIP, "a host-network pod has the node's IP")
	for _, c := range st.Conditions {
		assert.Equal(t, corev1.ConditionTrue, c.Status, "%s: %s %s", c.Type, c.Reason, c.Message)
	}
	assertFile(t, filepath.Join(out, "init"), "initialized\n")
	assertFile(t, filepath.Join(out, "poststart"), "started\n")
	ev := strings.Join(events.WithFields(), "\n")
	for _, want := range []string{
		fmt.Sprintf(`spec.initContainers{init}: Normal Pulled Container image %q already present on machine`, image),
		"spec.initContainers{init}: Normal Created Container created", "spec.initContainers{init}: Normal Started Container started",
		"spec.containers{app}: Normal Created Container created", "spec.containers{app}: Normal Started Container started",
	} {
		assert.Contains(t, ev, want)
	}
	assert.Less(t, strings.Index(ev, "spec.initContainers{init}: Normal Started"), strings.Index(ev, "spec.containers{app}: Normal Created"), "init before app")

	// Graceful kill: preStop, then SIGTERM within the grace; the app exits 0.
	events.Reset()
	start := time.Now()
	res := syncer.KillPod(ctx, pod, nil, nil)
	require.NoError(t, res.Error())
	took := time.Since(start)
	assert.Less(t, took, 10*time.Second, "SIGTERM honoured well before the 20s grace")
	assert.Equal(t, []string{"Normal Killing Stopping container app"}, events.Strings())
	assertFile(t, filepath.Join(out, "prestop"), "stopping\n")
	assertFile(t, filepath.Join(out, "term"), "term\n")

	v, err := podsync.LoadView(ctx, rt, pod.UID, nil)
	require.NoError(t, err)
	require.NotNil(t, v.Sandbox())
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, v.Sandbox().GetState())
	st = syncer.PodStatus(pod, v, podsync.StatusInput{HostIPs: []string{"127.0.0.1"}, Terminal: true})
	term := st.ContainerStatuses[0].State.Terminated
	require.NotNil(t, term)
	assert.EqualValues(t, 0, term.ExitCode, "stopped by SIGTERM, not killed")
	assert.Equal(t, "Completed", term.Reason)
	assert.Equal(t, corev1.PodSucceeded, st.Phase)
	t.Logf("KillPod took %v", took)

	require.NoError(t, syncer.RemovePod(ctx, pod.UID))
	v, err = podsync.LoadView(ctx, rt, pod.UID, nil)
	require.NoError(t, err)
	assert.Empty(t, v.Sandboxes)
	assert.Empty(t, v.Containers)
}

func assertFile(t *testing.T, path, want string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if assert.NoError(t, err) {
		assert.Equal(t, want, string(b))
	}
}

// msgHostBuilder also mounts a fresh host file at the container's
// terminationMessagePath, as the kubelet does.
type msgHostBuilder struct {
	hostBuilder
}

func (b *msgHostBuilder) ContainerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error) {
	cfg, err := b.hostBuilder.ContainerConfig(ctx, pod, c, restartCount, imageRef, podIPs)
	if err != nil || c.TerminationMessagePath == "" {
		return cfg, err
	}
	host := filepath.Join(b.out, fmt.Sprintf("%s-%s-%d.termination-log", pod.Name, c.Name, restartCount))
	if err := os.WriteFile(host, nil, 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(host, 0o666); err != nil {
		return nil, err
	}
	cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{HostPath: host, ContainerPath: c.TerminationMessagePath})
	return cfg, nil
}

// TestContainerdFailuresAndMessages runs containers that fail for real:
// termination messages from the file and from the CRI log, exit codes and
// reasons, a Failed phase under restartPolicy Never, and an image pull that
// fails then backs off.
func TestContainerdFailuresAndMessages(t *testing.T) {
	testenv.RequireLong(t)
	cd := containerd.Start(t, containerd.Options{})
	rt := newRawRuntime(cd.Conn(t))
	events := &podsynctest.Recorder{}
	syncer, err := podsync.New(podsync.Config{
		Runtime: rt, Builder: &msgHostBuilder{hostBuilder{logs: t.TempDir(), out: t.TempDir()}}, Events: events,
	})
	require.NoError(t, err)
	ctx := context.Background()
	image := cd.BusyboxImage()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "messages", Namespace: "nodekit-test", UID: "uid-podsync-messages"},
		Spec: corev1.PodSpec{
			HostNetwork:   true,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "file", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:                []string{"sh", "-c", "printf 'all done' > /dev/termination-log"},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageReadFile,
			}, {
				Name: "logs", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:                []string{"sh", "-c", "echo starting; echo 'cannot open /data: no such file' >&2; exit 3"},
				TerminationMessagePath: "/dev/termination-log", TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	var st corev1.PodStatus
	deadline := time.Now().Add(60 * time.Second)
	for {
		require.NoError(t, syncer.SyncPod(ctx, pod, nil).Error())
		v, err := podsync.LoadView(ctx, rt, pod.UID, podsync.OSFiles{})
		require.NoError(t, err)
		st = syncer.PodStatus(pod, v, podsync.StatusInput{HostIPs: []string{"127.0.0.1"}})
		pod.Status = st
		logs := statusOf(t, st.ContainerStatuses, "logs")
		if st.Phase == corev1.PodFailed && logs.State.Terminated != nil && logs.State.Terminated.Message != "" {
			break
		}
		require.True(t, time.Now().Before(deadline), "pod not Failed with messages in time: %+v", st)
		time.Sleep(200 * time.Millisecond)
	}
	file := statusOf(t, st.ContainerStatuses, "file").State.Terminated
	require.NotNil(t, file)
	assert.EqualValues(t, 0, file.ExitCode)
	assert.Equal(t, "Completed", file.Reason)
	assert.Equal(t, "all done", file.Message, "read from the mounted termination-log file")
	logs := statusOf(t, st.ContainerStatuses, "logs").State.Terminated
	assert.EqualValues(t, 3, logs.ExitCode)
	assert.Equal(t, "Error", logs.Reason)
	// Both streams, in the order containerd wrote them to the log (stdout and
	// stderr are separate pipes, so that order may vary, as on any node).
	assert.ElementsMatch(t, []string{"starting", "cannot open /data: no such file", ""}, strings.Split(logs.Message, "\n"), "the log tail: %q", logs.Message)
	assert.Equal(t, "False/PodFailed/", func() string {
		for _, c := range st.Conditions {
			if c.Type == corev1.ContainersReady {
				return string(c.Status) + "/" + c.Reason + "/" + c.Message
			}
		}
		return ""
	}())
	require.NoError(t, syncer.SyncPod(ctx, pod, nil).Error())
	assert.Len(t, mustView(t, rt, pod).Containers, 2, "Never: nothing restarted")

	// A pull from a registry that is not there fails, then backs off.
	bad := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pullfail", Namespace: "nodekit-test", UID: "uid-podsync-pullfail"},
		Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "app", Image: "127.0.0.1:1/nodekit/missing:1", ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	events.Reset()
	res := syncer.SyncPod(ctx, bad, nil)
	require.ErrorIs(t, res.Error(), podsync.ErrImagePull)
	st = syncer.PodStatus(bad, mustView(t, rt, bad), podsync.StatusInput{})
	w := st.ContainerStatuses[0].State.Waiting
	require.NotNil(t, w)
	assert.Equal(t, "ErrImagePull", w.Reason)
	assert.Contains(t, w.Message, "127.0.0.1:1/nodekit/missing:1")
	ev := events.Strings()
	require.GreaterOrEqual(t, len(ev), 3)
	assert.Equal(t, `Normal Pulling Pulling image "127.0.0.1:1/nodekit/missing:1"`, ev[0])
	assert.True(t, strings.HasPrefix(ev[1], `Warning Failed Failed to pull image "127.0.0.1:1/nodekit/missing:1": rpc error:`), ev[1])
	assert.Equal(t, "Warning Failed Error: ErrImagePull", ev[2])
	require.ErrorIs(t, syncer.SyncPod(ctx, bad, nil).Error(), podsync.ErrImagePullBackOff)
	st = syncer.PodStatus(bad, mustView(t, rt, bad), podsync.StatusInput{})
	assert.Equal(t, "ImagePullBackOff", st.ContainerStatuses[0].State.Waiting.Reason)
	assert.Equal(t, corev1.PodPending, st.Phase)
	t.Logf("pull failure message: %s", w.Message)

	for _, p := range []*corev1.Pod{pod, bad} {
		require.NoError(t, syncer.KillPod(ctx, p, nil, nil).Error())
		require.NoError(t, syncer.RemovePod(ctx, p.UID))
	}
}

func mustView(t *testing.T, rt podsync.ViewSource, pod *corev1.Pod) *podsync.PodView {
	t.Helper()
	v, err := podsync.LoadView(context.Background(), rt, pod.UID, podsync.OSFiles{})
	require.NoError(t, err)
	return v
}

// TestContainerdCrashLoopWithSidecar runs a sidecar and an app that crashes,
// on a short back-off (1s doubling to 2s) so the test stays quick: the app is
// restarted with growing restart counts and reported in CrashLoopBackOff in
// between, while the sidecar keeps running untouched.
func TestContainerdCrashLoopWithSidecar(t *testing.T) {
	testenv.RequireLong(t)
	cd := containerd.Start(t, containerd.Options{})
	rt := newRawRuntime(cd.Conn(t))
	events := &podsynctest.Recorder{}
	syncer, err := podsync.New(podsync.Config{
		Runtime: rt, Builder: &hostBuilder{logs: t.TempDir(), out: t.TempDir()}, Events: events,
		Backoff: podsync.NewBackoffWith(nil, time.Second, 2*time.Second),
	})
	require.NoError(t, err)
	ctx := context.Background()
	image := cd.BusyboxImage()
	always := corev1.ContainerRestartPolicyAlways
	grace := int64(5)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "crashy", Namespace: "nodekit-test", UID: "uid-podsync-crashy"},
		Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: &grace,
			InitContainers: []corev1.Container{{Name: "proxy", Image: image, ImagePullPolicy: corev1.PullIfNotPresent, RestartPolicy: &always,
				Command: []string{"sh", "-c", "trap 'exit 0' TERM; while true; do sleep 0.2; done"}}},
			Containers: []corev1.Container{{Name: "app", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"sh", "-c", "echo crashing; exit 1"}}},
		},
	}
	var proxyID string
	sawBackOff := false
	deadline := time.Now().Add(60 * time.Second)
	for {
		syncer.SyncPod(ctx, pod, nil)
		st := syncer.PodStatus(pod, mustView(t, rt, pod), podsync.StatusInput{HostIPs: []string{"127.0.0.1"}})
		pod.Status = st
		proxy := st.InitContainerStatuses[0]
		if proxy.State.Running != nil {
			if proxyID == "" {
				proxyID = proxy.ContainerID
			}
			assert.Equal(t, proxyID, proxy.ContainerID, "the sidecar is never restarted")
		}
		if len(st.ContainerStatuses) == 1 {
			app := st.ContainerStatuses[0]
			if w := app.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
				sawBackOff = true
				assert.Contains(t, w.Message, "restarting failed container=app pod=crashy_nodekit-test(uid-podsync-crashy)")
				require.NotNil(t, app.LastTerminationState.Terminated)
				assert.EqualValues(t, 1, app.LastTerminationState.Terminated.ExitCode)
			}
			if sawBackOff && app.RestartCount >= 3 {
				assert.Equal(t, corev1.PodRunning, st.Phase, "a crash-looping Always pod stays Running")
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "no crash loop seen in time: %+v", st)
		time.Sleep(100 * time.Millisecond)
	}
	assert.Contains(t, strings.Join(events.WithFields(), "\n"), "spec.containers{app}: Warning BackOff Back-off restarting failed container app in pod crashy_nodekit-test(uid-podsync-crashy)")

	// The app may be exiting (it crashes every second) as it is stopped, and
	// containerd 1.6 can then fail StopContainer with "ttrpc: closed" as the shim goes
	// (seen once in CI). The kubelet retries a failed kill at its next sync; so does
	// the test, a bounded number of times.
	var killErr error
	for range 3 {
		if killErr = syncer.KillPod(ctx, pod, nil, nil).Error(); killErr == nil {
			break
		}
		t.Logf("KillPod failed, trying again as the next sync would: %v", killErr)
	}
	require.NoError(t, killErr)
	st := syncer.PodStatus(pod, mustView(t, rt, pod), podsync.StatusInput{Terminal: true})
	require.NotNil(t, st.InitContainerStatuses[0].State.Terminated)
	assert.EqualValues(t, 0, st.InitContainerStatuses[0].State.Terminated.ExitCode, "the sidecar got SIGTERM and exited cleanly")
	require.NoError(t, syncer.RemovePod(ctx, pod.UID))
}
