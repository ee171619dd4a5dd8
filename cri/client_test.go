package cri_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// socketPath returns a short socket path (unix sockets are limited to 108 bytes).
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "nkcri-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "cri.sock")
}

type fixture struct {
	rt     *fakeruntime.Runtime
	srv    *fakeruntime.Server
	path   string
	client *cri.Client
}

func startFake(t *testing.T, cfg cri.Config) *fixture {
	t.Helper()
	f := &fixture{rt: fakeruntime.New(), path: socketPath(t)}
	var err error
	f.srv, err = f.rt.Serve(f.path)
	require.NoError(t, err)
	t.Cleanup(func() { f.srv.Stop() })
	cfg.Endpoint = f.srv.Endpoint()
	f.client, err = cri.New(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { f.client.Close() })
	return f
}

func TestParseEndpoint(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "unix:///run/containerd/containerd.sock", want: "/run/containerd/containerd.sock"},
		{in: "/run/crio/crio.sock", want: "/run/crio/crio.sock"},
		{in: "unix:///run//x/../crio.sock", want: "/run/crio.sock"},
		{in: "tcp://127.0.0.1:1234", wantErr: true},
		{in: "npipe:////./pipe/containerd", wantErr: true},
		{in: "run/containerd.sock", wantErr: true},
		{in: "unix://relative.sock", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := cri.ParseEndpoint(tt.in)
			if tt.wantErr {
				require.ErrorIs(t, err, cri.ErrInvalidEndpoint)
				assert.Contains(t, err.Error(), tt.in)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestDiscoverEndpoint(t *testing.T) {
	dir := t.TempDir()
	plain := filepath.Join(dir, "not-a-socket")
	require.NoError(t, os.WriteFile(plain, nil, 0o600))
	sock := socketPath(t)
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()

	got, err := cri.DiscoverEndpoint([]string{"unix://" + filepath.Join(dir, "missing.sock"), plain, sock})
	require.NoError(t, err)
	assert.Equal(t, "unix://"+sock, got, "the first candidate that is a socket wins")

	_, err = cri.DiscoverEndpoint([]string{"unix://" + filepath.Join(dir, "missing.sock"), plain})
	require.ErrorIs(t, err, cri.ErrNoRuntime)
	assert.Contains(t, err.Error(), "missing.sock")
}

func TestNewMissingSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nothing.sock")
	start := time.Now()
	_, err := cri.New(context.Background(), cri.Config{Endpoint: path})
	require.ErrorIs(t, err, cri.ErrUnavailable)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Contains(t, err.Error(), path)
	assert.Less(t, time.Since(start), time.Second, "a missing socket fails at once")
}

func TestNewNotCRI(t *testing.T) {
	path := socketPath(t)
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	s := grpc.NewServer() // serves nothing: every CRI method is Unimplemented
	go func() { _ = s.Serve(l) }()
	defer s.Stop()

	_, err = cri.New(context.Background(), cri.Config{Endpoint: "unix://" + path})
	require.ErrorIs(t, err, cri.ErrNotSupported)
	assert.Equal(t, codes.Unimplemented, status.Code(err))
	assert.Contains(t, err.Error(), "does not serve CRI runtime.v1")
}

func TestNewConnectTimeout(t *testing.T) {
	f := startFake(t, cri.Config{})
	f.rt.SetDelay("Version", time.Second)
	start := time.Now()
	_, err := cri.New(context.Background(), cri.Config{Endpoint: f.srv.Endpoint(), ConnectTimeout: 100 * time.Millisecond})
	require.ErrorIs(t, err, cri.ErrTimeout)
	assert.Less(t, time.Since(start), 900*time.Millisecond)
}

func TestNewWithConnBufconn(t *testing.T) {
	rt := fakeruntime.New()
	l := bufconn.Listen(1 << 20)
	srv := rt.ServeListener(l)
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()

	c, err := cri.NewWithConn(context.Background(), conn, cri.Config{})
	require.NoError(t, err)
	assert.Equal(t, fakeruntime.RuntimeName, c.RuntimeVersion().GetRuntimeName())
	require.NoError(t, c.Close())
	_, err = c.Version(context.Background())
	require.NoError(t, err, "Close leaves a connection the client did not open alone")

	_, err = cri.NewWithConn(context.Background(), nil, cri.Config{})
	require.Error(t, err)
}

func TestPodLifecycle(t *testing.T) {
	f := startFake(t, cri.Config{})
	c, ctx := f.client, context.Background()

	v, err := c.Version(ctx)
	require.NoError(t, err)
	assert.Equal(t, "v1", v.GetRuntimeApiVersion())

	pod := testPod()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{})
	require.NoError(t, err)
	sandboxID, err := c.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	sb, err := c.PodSandboxStatus(ctx, sandboxID)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_READY, sb.GetState())
	assert.NotEmpty(t, sb.GetNetwork().GetIp())

	pods, err := c.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{cri.LabelPodName: "web"}})
	require.NoError(t, err)
	require.Len(t, pods, 1)
	assert.Equal(t, sandboxID, pods[0].GetId())

	present, err := c.ImagePresent(ctx, "docker.io/library/nginx:1.27")
	require.NoError(t, err)
	assert.False(t, present)
	ref, pulled, err := c.EnsureImage(ctx, "docker.io/library/nginx:1.27", nil, sbCfg)
	require.NoError(t, err)
	assert.True(t, pulled)
	ref2, pulled, err := c.EnsureImage(ctx, "docker.io/library/nginx:1.27", nil, sbCfg)
	require.NoError(t, err)
	assert.False(t, pulled, "a present image is not pulled again")
	assert.Equal(t, ref, ref2)

	ctrCfg, err := cri.ContainerConfig(pod, "nginx", 0, ref)
	require.NoError(t, err)
	id, err := c.CreateContainer(ctx, sandboxID, ctrCfg, sbCfg)
	require.NoError(t, err)
	require.NoError(t, c.StartContainer(ctx, id))
	st, err := c.ContainerStatus(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
	assert.Equal(t, "/var/log/pods/default_web_"+string(pod.UID)+"/nginx/0.log", st.GetLogPath())

	stdout, stderr, code, err := c.ExecSync(ctx, id, []string{"echo", "ok"}, time.Second)
	require.NoError(t, err)
	assert.Equal(t, "ok\n", string(stdout))
	assert.Empty(t, stderr)
	assert.Equal(t, 0, code)
	_, _, code, err = c.ExecSync(ctx, id, []string{"exit", "3"}, time.Second)
	require.NoError(t, err, "a non-zero exit is a result, not an error")
	assert.Equal(t, 3, code)

	ctrs, err := c.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: sandboxID})
	require.NoError(t, err)
	require.Len(t, ctrs, 1)
	assert.Equal(t, "nginx", ctrs[0].GetLabels()[cri.LabelContainerName])

	require.NoError(t, c.StopContainer(ctx, id, time.Second))
	st, err = c.ContainerStatus(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, st.GetState())
	require.NoError(t, c.RemoveContainer(ctx, id))
	require.NoError(t, c.StopPodSandbox(ctx, sandboxID))
	require.NoError(t, c.RemovePodSandbox(ctx, sandboxID))
	require.NoError(t, c.RemovePodSandbox(ctx, sandboxID), "RemovePodSandbox is idempotent")

	images, err := c.ListImages(ctx, nil)
	require.NoError(t, err)
	assert.Len(t, images, 2, "pause and the pulled image")
	require.NoError(t, c.RemoveImage(ctx, "docker.io/library/nginx:1.27"))
	present, err = c.ImagePresent(ctx, "docker.io/library/nginx:1.27")
	require.NoError(t, err)
	assert.False(t, present)

	assert.Equal(t, []string{
		"Version", "Version", "RunPodSandbox", "PodSandboxStatus", "ListPodSandbox",
		"ImageStatus", "ImageStatus", "PullImage", "ImageStatus",
		"CreateContainer", "StartContainer", "ContainerStatus", "ExecSync", "ExecSync", "ListContainers",
		"StopContainer", "ContainerStatus", "RemoveContainer", "StopPodSandbox", "RemovePodSandbox", "RemovePodSandbox",
		"ListImages", "RemoveImage", "ImageStatus",
	}, f.rt.CallNames())
	// The requests are recorded as sent.
	calls := f.rt.Calls()
	run := calls[2].Request.(*runtimeapi.RunPodSandboxRequest)
	assert.Equal(t, "web", run.GetConfig().GetMetadata().GetName())
}

func TestErrorMapping(t *testing.T) {
	tests := []struct {
		name     string
		injected error
		sentinel error
		code     codes.Code
	}{
		{"not found", status.Error(codes.NotFound, "no such container"), cri.ErrNotFound, codes.NotFound},
		{"unimplemented", status.Error(codes.Unimplemented, "unknown method"), cri.ErrNotSupported, codes.Unimplemented},
		{"unavailable", status.Error(codes.Unavailable, "shutting down"), cri.ErrUnavailable, codes.Unavailable},
		{"deadline", status.Error(codes.DeadlineExceeded, "slow"), cri.ErrTimeout, codes.DeadlineExceeded},
		{"other", status.Error(codes.FailedPrecondition, "container is paused"), nil, codes.FailedPrecondition},
	}
	f := startFake(t, cri.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f.rt.FailNext("StartContainer", tt.injected)
			err := f.client.StartContainer(context.Background(), "abc123")
			require.Error(t, err)
			if tt.sentinel != nil {
				assert.ErrorIs(t, err, tt.sentinel)
			}
			for _, other := range []error{cri.ErrNotFound, cri.ErrNotSupported, cri.ErrUnavailable, cri.ErrTimeout} {
				if other != tt.sentinel {
					assert.NotErrorIs(t, err, other)
				}
			}
			assert.Equal(t, tt.code, status.Code(err), "the gRPC status survives")
			var ce *cri.Error
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, "StartContainer", ce.Call)
			assert.Contains(t, err.Error(), `cri StartContainer container "abc123"`)
			assert.Contains(t, err.Error(), status.Convert(tt.injected).Message())
		})
	}

	// A real NotFound from the fake's state, naming the object.
	_, err := f.client.PodSandboxStatus(context.Background(), "nope")
	require.ErrorIs(t, err, cri.ErrNotFound)
	assert.Contains(t, err.Error(), `PodSandboxStatus pod sandbox "nope"`)
}

func TestCallTimeout(t *testing.T) {
	f := startFake(t, cri.Config{CallTimeout: 100 * time.Millisecond})
	f.rt.SetDelay("Status", 2*time.Second)
	start := time.Now()
	_, err := f.client.Status(context.Background())
	require.ErrorIs(t, err, cri.ErrTimeout)
	assert.Less(t, time.Since(start), time.Second)

	// RunPodSandbox gets twice the call timeout, as the kubelet's client.
	f.rt.SetDelay("RunPodSandbox", 150*time.Millisecond)
	cfg, err := cri.PodSandboxConfig(testPod(), cri.PodOptions{})
	require.NoError(t, err)
	_, err = f.client.RunPodSandbox(context.Background(), cfg, "")
	require.NoError(t, err)

	// The caller's context still bounds a call.
	f.rt.SetDelay("ListImages", 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = f.client.ListImages(ctx, nil)
	require.ErrorIs(t, err, cri.ErrTimeout)
}

// TestCallDeadline checks the deadline the runtime receives: the earlier of the
// caller's and CallTimeout (plus the command's timeout for ExecSync); PullImage gets
// the caller's alone.
func TestCallDeadline(t *testing.T) {
	rt := fakeruntime.New()
	var mu sync.Mutex
	deadlines := map[string]time.Duration{} // method -> time left when the call arrived; -1: none
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		left := time.Duration(-1)
		if dl, ok := ctx.Deadline(); ok {
			left = time.Until(dl)
		}
		mu.Lock()
		deadlines[info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]] = left
		mu.Unlock()
		return handler(ctx, req)
	}))
	rt.Register(s)
	l := bufconn.Listen(1 << 20)
	go func() { _ = s.Serve(l) }()
	defer s.Stop()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	c, err := cri.NewWithConn(context.Background(), conn, cri.Config{CallTimeout: time.Hour})
	require.NoError(t, err)
	left := func(method string) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return deadlines[method]
	}
	const slack = time.Minute

	_, err = c.Version(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, time.Hour, left("Version"), float64(slack), "no caller deadline: CallTimeout")

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.Status(ctx)
	require.NoError(t, err)
	assert.InDelta(t, 10*time.Second, left("Status"), float64(slack), "an earlier caller deadline wins")

	ctx2h, cancel2h := context.WithTimeout(context.Background(), 2*time.Hour)
	defer cancel2h()
	_, err = c.ListContainers(ctx2h, nil)
	require.NoError(t, err)
	assert.InDelta(t, time.Hour, left("ListContainers"), float64(slack), "a later caller deadline: CallTimeout")

	rt.AddImage("registry.example/app:1")
	_, err = c.PullImage(context.Background(), "registry.example/app:1", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, time.Duration(-1), left("PullImage"), "pulls are bounded by ctx alone")

	_, _, _, err = c.ExecSync(context.Background(), "nope", []string{"true"}, 30*time.Minute)
	require.ErrorIs(t, err, cri.ErrNotFound)
	assert.InDelta(t, 90*time.Minute, left("ExecSync"), float64(slack), "ExecSync: command timeout + CallTimeout")
}

// TestErrorNamesObject checks the object each failed call names.
func TestErrorNamesObject(t *testing.T) {
	f := startFake(t, cri.Config{})
	ctx := context.Background()
	pod := testPod()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{})
	require.NoError(t, err)
	ctrCfg, err := cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)

	f.rt.FailNext("RunPodSandbox", status.Error(codes.Internal, "boom"))
	_, err = f.client.RunPodSandbox(ctx, sbCfg, "")
	require.Error(t, err)
	assert.Equal(t, `cri RunPodSandbox pod "default/web": boom (Internal)`, err.Error())

	_, err = f.client.CreateContainer(ctx, "nosandbox", ctrCfg, sbCfg)
	require.ErrorIs(t, err, cri.ErrNotFound)
	assert.Contains(t, err.Error(), `cri CreateContainer container "nginx" in pod sandbox "nosandbox": `)

	_, _, _, err = f.client.ExecSync(ctx, "noctr", []string{"echo", "a b"}, 0)
	require.ErrorIs(t, err, cri.ErrNotFound)
	assert.Contains(t, err.Error(), `cri ExecSync container "noctr" command ["echo" "a b"]: `)

	f.rt.FailNext("Version", status.Error(codes.Internal, "boom"))
	_, err = f.client.Version(ctx)
	assert.EqualError(t, err, "cri Version: boom (Internal)")

	f.rt.FailNext("ImageStatus", status.Error(codes.Internal, "boom"))
	_, err = f.client.ImageStatus(ctx, "registry.example/app:1")
	assert.EqualError(t, err, `cri ImageStatus image "registry.example/app:1": boom (Internal)`)
}

func TestExecSyncTimeout(t *testing.T) {
	f := startFake(t, cri.Config{CallTimeout: 5 * time.Second})
	id := runContainer(t, f)
	start := time.Now()
	_, _, code, err := f.client.ExecSync(context.Background(), id, []string{"sleep", "10"}, 200*time.Millisecond)
	require.ErrorIs(t, err, cri.ErrTimeout)
	assert.Equal(t, -1, code)
	// 200ms rounds up to CRI's 1 s, never down to 0 ("no timeout").
	assert.Less(t, time.Since(start), 3*time.Second)
	req := f.rt.Calls()[len(f.rt.Calls())-1].Request.(*runtimeapi.ExecSyncRequest)
	assert.Equal(t, int64(1), req.GetTimeout())
}

func TestReconnectAfterRestart(t *testing.T) {
	f := startFake(t, cri.Config{CallTimeout: time.Second})
	ctx := context.Background()
	id := runContainer(t, f)

	f.srv.Stop()
	_, err := f.client.Version(ctx)
	require.ErrorIs(t, err, cri.ErrUnavailable, "a call while the runtime is down fails fast")

	srv, err := f.rt.Serve(f.path)
	require.NoError(t, err)
	defer srv.Stop()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, f.client.WaitReady(wctx, 20*time.Millisecond))
	t.Logf("client recovered %s after the restart", time.Since(start))
	st, err := f.client.ContainerStatus(ctx, id)
	require.NoError(t, err, "the same client works after the restart")
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
}

func TestWaitReadyHonoursContext(t *testing.T) {
	f := startFake(t, cri.Config{CallTimeout: time.Second})
	f.srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	err := f.client.WaitReady(ctx, 20*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, cri.ErrUnavailable, "the last call's error is kept")
}

type recordingMetrics struct {
	mu  sync.Mutex
	ops []string
}

func (m *recordingMetrics) RuntimeOperation(op string, d time.Duration, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	suffix := ""
	if err != nil {
		suffix = ":error"
	}
	m.ops = append(m.ops, op+suffix)
}

func TestMetrics(t *testing.T) {
	m := &recordingMetrics{}
	f := startFake(t, cri.Config{Metrics: m})
	ctx := context.Background()
	_, err := f.client.Status(ctx)
	require.NoError(t, err)
	_, _ = f.client.ContainerStatus(ctx, "missing")
	_, err = f.client.PullImage(ctx, "busybox:1.36", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"status", "container_status:error", "pull_image"}, m.ops,
		"the Version check at connect is not a user call and is not observed")
}

func TestPullImageAuth(t *testing.T) {
	f := startFake(t, cri.Config{})
	f.rt.RequireAuth("robot", "s3cret")
	ctx := context.Background()
	_, err := f.client.PullImage(ctx, "registry.example/app:1", nil, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cri PullImage image "registry.example/app:1"`)
	assert.Contains(t, err.Error(), "401 Unauthorized")
	ref, err := f.client.PullImage(ctx, "registry.example/app:1", &runtimeapi.AuthConfig{Username: "robot", Password: "s3cret"}, nil)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(ref, "sha256:"))
	req := f.rt.Calls()[len(f.rt.Calls())-1].Request.(*runtimeapi.PullImageRequest)
	assert.Equal(t, "robot", req.GetAuth().GetUsername(), "credentials reach the runtime")
}

func TestSetErrorIsSticky(t *testing.T) {
	f := startFake(t, cri.Config{})
	ctx := context.Background()
	f.rt.SetError("Status", status.Error(codes.Unavailable, "runtime is restarting"))
	for range 2 {
		_, err := f.client.Status(ctx)
		require.ErrorIs(t, err, cri.ErrUnavailable)
	}
	f.rt.SetError("Status", nil)
	_, err := f.client.Status(ctx)
	require.NoError(t, err)
}

func runContainer(t *testing.T, f *fixture) string {
	t.Helper()
	ctx := context.Background()
	pod := testPod()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{})
	require.NoError(t, err)
	sandboxID, err := f.client.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	f.rt.AddImage("docker.io/library/nginx:1.27")
	ctrCfg, err := cri.ContainerConfig(pod, "nginx", 0, "")
	require.NoError(t, err)
	id, err := f.client.CreateContainer(ctx, sandboxID, ctrCfg, sbCfg)
	require.NoError(t, err)
	require.NoError(t, f.client.StartContainer(ctx, id))
	return id
}

type failureSignal chan string

func (f failureSignal) RuntimeOperation(op string, _ time.Duration, err error) {
	if err != nil {
		select {
		case f <- op:
		default:
		}
	}
}

func TestWaitReadyUsesInjectedClock(t *testing.T) {
	fakeClock := testingclock.NewFakeClock(time.Now())
	failed := make(failureSignal, 1)
	f := startFake(t, cri.Config{CallTimeout: time.Second, Clock: fakeClock, Metrics: failed})
	f.srv.Stop()

	done := make(chan error, 1)
	go func() { done <- f.client.WaitReady(context.Background(), time.Minute) }()
	select {
	case op := <-failed:
		require.Equal(t, "version", op)
	case <-time.After(5 * time.Second):
		t.Fatal("WaitReady made no Version call")
	}

	srv, err := f.rt.Serve(f.path)
	require.NoError(t, err)
	defer srv.Stop()
	select {
	case err := <-done:
		t.Fatalf("WaitReady returned before the clock ticked: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Each step is one poll; the first may still meet the connection's backoff.
	for range 50 {
		fakeClock.Step(time.Minute)
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatal("WaitReady did not return after 50 ticks with the runtime back")
}
