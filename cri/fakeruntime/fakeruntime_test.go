package fakeruntime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	rt   *fakeruntime.Runtime
	path string
	rs   runtimeapi.RuntimeServiceClient
	is   runtimeapi.ImageServiceClient
}

func serve(t *testing.T) *env {
	t.Helper()
	dir, err := os.MkdirTemp("", "nkfake-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &env{rt: fakeruntime.New(), path: filepath.Join(dir, "cri.sock")}
	srv, err := e.rt.Serve(e.path)
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix://"+e.path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	e.rs, e.is = runtimeapi.NewRuntimeServiceClient(conn), runtimeapi.NewImageServiceClient(conn)
	return e
}

func sandboxConfig(name string, hostNetwork bool) *runtimeapi.PodSandboxConfig {
	cfg := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name}}
	if hostNetwork {
		cfg.Linux = &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}}
	}
	return cfg
}

func TestNetworkNotReady(t *testing.T) {
	e := serve(t)
	ctx := context.Background()
	e.rt.NetworkNotReady()
	_, err := e.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("pod", false)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cni plugin not initialized")
	run, err := e.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("host", true)})
	require.NoError(t, err, "host-network sandboxes need no CNI")
	st, err := e.rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: run.PodSandboxId})
	require.NoError(t, err)
	assert.Empty(t, st.GetStatus().GetNetwork().GetIp())
}

func TestLifecycleRules(t *testing.T) {
	e := serve(t)
	ctx := context.Background()
	cfg := sandboxConfig("pod", false)
	run, err := e.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	require.NoError(t, err)
	_, err = e.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	require.Error(t, err, "the same name and attempt is reserved")

	ctrCfg := &runtimeapi.ContainerConfig{Metadata: &runtimeapi.ContainerMetadata{Name: "c"}, Image: &runtimeapi.ImageSpec{Image: "app:1"}}
	_, err = e.rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, Config: ctrCfg})
	assert.Equal(t, codes.NotFound, status.Code(err), "the image must be present")
	_, err = e.is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: "app:1"}})
	require.NoError(t, err)
	created, err := e.rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: run.PodSandboxId, Config: ctrCfg})
	require.NoError(t, err)
	_, err = e.rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.ContainerId, Cmd: []string{"true"}})
	require.Error(t, err, "exec needs a running container")
	_, err = e.rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
	require.NoError(t, err)
	_, err = e.rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId})
	require.Error(t, err, "a running container cannot start again")

	out, err := e.rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.ContainerId, Cmd: []string{"echo", "hi", "there"}})
	require.NoError(t, err)
	assert.Equal(t, "hi there\n", string(out.Stdout))
	out, err = e.rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.ContainerId, Cmd: []string{"wget", "-q", "localhost"}})
	require.NoError(t, err)
	assert.Equal(t, int32(127), out.ExitCode, "unknown commands are not found")
	e.rt.SetExec(func(ctx context.Context, id string, cmd []string) ([]byte, []byte, int32, error) {
		return []byte(id[:4]), []byte("custom"), 42, nil
	})
	out, err = e.rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.ContainerId, Cmd: []string{"anything"}})
	require.NoError(t, err)
	assert.Equal(t, created.ContainerId[:4], string(out.Stdout))
	assert.Equal(t, int32(42), out.ExitCode)

	_, err = e.rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: run.PodSandboxId})
	require.NoError(t, err)
	ctrs := e.rt.Containers()
	require.Len(t, ctrs, 1)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, ctrs[0].State)
	assert.Equal(t, int32(137), ctrs[0].ExitCode)
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_NOTREADY, e.rt.Sandboxes()[0].State)

	_, err = e.rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: run.PodSandboxId})
	require.NoError(t, err)
	assert.Empty(t, e.rt.Containers(), "removing a sandbox removes its containers")
	assert.Empty(t, e.rt.Sandboxes())
}

func TestInjection(t *testing.T) {
	e := serve(t)
	ctx := context.Background()
	first, second := status.Error(codes.Internal, "first"), errors.New("second")
	e.rt.FailNext("Version", first, second)
	_, err := e.rs.Version(ctx, &runtimeapi.VersionRequest{})
	assert.Equal(t, codes.Internal, status.Code(err))
	_, err = e.rs.Version(ctx, &runtimeapi.VersionRequest{})
	assert.Equal(t, codes.Unknown, status.Code(err), "a plain error reaches the client as Unknown")
	assert.Contains(t, err.Error(), "second")
	_, err = e.rs.Version(ctx, &runtimeapi.VersionRequest{})
	require.NoError(t, err, "the queue is spent")

	e.rt.SetDelay("Status", time.Second)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = e.rs.Status(cctx, &runtimeapi.StatusRequest{})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))

	assert.Equal(t, []string{"Version", "Version", "Version", "Status"}, e.rt.CallNames())
	e.rt.ResetCalls()
	assert.Empty(t, e.rt.Calls())
}

func TestStateSurvivesRestart(t *testing.T) {
	e := serve(t)
	ctx := context.Background()
	run, err := e.rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("pod", false)})
	require.NoError(t, err)

	dir, err := os.MkdirTemp("", "nkfake-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "second.sock")
	srv, err := e.rt.Serve(path)
	require.NoError(t, err)
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	require.NoError(t, err)
	require.Len(t, resp.Items, 1)
	assert.Equal(t, run.PodSandboxId, resp.Items[0].Id)
	srv.Stop()
	srv.Stop() // twice is fine
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err), "Stop removes the socket")
}
