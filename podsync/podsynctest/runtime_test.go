package podsynctest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

func sandboxConfig(name string, attempt uint32) *runtimeapi.PodSandboxConfig {
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: "uid-" + name, Attempt: attempt},
		Labels:   map[string]string{"io.kubernetes.pod.uid": "uid-" + name},
	}
}

func containerConfig(name, image string, attempt uint32) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name, Attempt: attempt},
		Image:    &runtimeapi.ImageSpec{Image: image},
		Labels:   map[string]string{"io.kubernetes.container.name": name, "io.kubernetes.pod.uid": "uid-web"},
	}
}

func TestRuntimeLifecycleLikeContainerd(t *testing.T) {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC))
	rt := podsynctest.New(clk)
	rt.AddImage("busybox:1.36")

	sb, err := rt.RunPodSandbox(ctx, sandboxConfig("web", 0), "")
	require.NoError(t, err)
	st, err := rt.PodSandboxStatus(ctx, sb)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.PodSandboxState_SANDBOX_READY, st.State)
	assert.NotEmpty(t, st.GetNetwork().GetIp())

	_, err = rt.CreateContainer(ctx, sb, containerConfig("app", "absent:1", 0), nil)
	assert.Equal(t, codes.NotFound, status.Code(err), "a missing image is refused")

	id, err := rt.CreateContainer(ctx, sb, containerConfig("app", "busybox:1.36", 0), nil)
	require.NoError(t, err)
	_, err = rt.CreateContainer(ctx, sb, containerConfig("app", "busybox:1.36", 0), nil)
	assert.ErrorContains(t, err, "is reserved", "a name+attempt is taken once")

	clk.Step(time.Second)
	require.NoError(t, rt.StartContainer(ctx, id))
	assert.Error(t, rt.StartContainer(ctx, id), "only a created container starts")
	c, err := rt.ContainerStatus(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, c.State)
	assert.Equal(t, clk.Now().UnixNano(), c.StartedAt)
	assert.Equal(t, podsynctest.ImageRef("busybox:1.36"), c.ImageRef)

	require.NoError(t, rt.Exit(id, 0, "", ""))
	c, _ = rt.ContainerStatus(ctx, id)
	assert.Equal(t, "Completed", c.Reason)
	id2, err := rt.CreateContainer(ctx, sb, containerConfig("app", "busybox:1.36", 1), nil)
	require.NoError(t, err)
	require.NoError(t, rt.StartContainer(ctx, id2))

	// Stopping the sandbox stops its containers (137, Error).
	require.NoError(t, rt.StopPodSandbox(ctx, sb))
	c, _ = rt.ContainerStatus(ctx, id2)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, c.State)
	assert.EqualValues(t, 137, c.ExitCode)
	assert.Equal(t, "Error", c.Reason)
	_, err = rt.CreateContainer(ctx, sb, containerConfig("late", "busybox:1.36", 0), nil)
	assert.Error(t, err, "no containers in a stopped sandbox")

	list, err := rt.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: map[string]string{"io.kubernetes.pod.uid": "uid-web"}})
	require.NoError(t, err)
	assert.Len(t, list, 2)

	require.NoError(t, rt.RemovePodSandbox(ctx, sb))
	assert.Empty(t, rt.Containers(), "removing the sandbox removes its containers")
	require.NoError(t, rt.RemovePodSandbox(ctx, sb), "removing twice is fine")
	_, err = rt.PodSandboxStatus(ctx, sb)
	assert.Equal(t, codes.NotFound, status.Code(err))
}

func TestRuntimeControls(t *testing.T) {
	ctx := context.Background()
	rt := podsynctest.New(nil)
	boom := errors.New("boom")
	rt.FailNext("RunPodSandbox", boom)
	_, err := rt.RunPodSandbox(ctx, sandboxConfig("web", 0), "")
	assert.ErrorIs(t, err, boom)
	sb, err := rt.RunPodSandbox(ctx, sandboxConfig("web", 0), "")
	require.NoError(t, err, "FailNext fails one call")

	_, pulled, err := rt.EnsureImage(ctx, "img:1", nil, nil)
	assert.Error(t, err, "not pullable")
	assert.False(t, pulled)
	rt.SetPullable("img:1", true)
	ref, pulled, err := rt.EnsureImage(ctx, "img:1", nil, nil)
	require.NoError(t, err)
	assert.True(t, pulled)
	assert.Equal(t, podsynctest.ImageRef("img:1"), ref)
	_, pulled, _ = rt.EnsureImage(ctx, "img:1", nil, nil)
	assert.False(t, pulled, "present now")

	id, err := rt.CreateContainer(ctx, sb, containerConfig("app", "img:1", 0), nil)
	require.NoError(t, err)
	_, _, _, err = rt.ExecSync(ctx, id, []string{"true"}, 0)
	assert.Error(t, err, "exec needs a running container")
	require.NoError(t, rt.StartContainer(ctx, id))
	rt.SetExec(func(string, []string, time.Duration) ([]byte, []byte, int, error) { return []byte("hi"), nil, 3, nil })
	out, _, code, err := rt.ExecSync(ctx, id, []string{"x"}, 0)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(out))
	assert.Equal(t, 3, code)

	rt.OnStop(func(string, time.Duration) int { return 0 })
	require.NoError(t, rt.StopContainer(ctx, id, 5*time.Second))
	c, _ := rt.ContainerStatus(ctx, id)
	assert.EqualValues(t, 0, c.ExitCode)
	assert.Contains(t, rt.CallNames(), "StopContainer("+id+",5s)")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = rt.ListContainers(cctx, nil)
	assert.Equal(t, codes.Canceled, status.Code(err), "a cancelled context fails the call")
}
