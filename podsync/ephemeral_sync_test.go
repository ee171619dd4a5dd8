package podsync_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// ownPIDBuilder gives every container a PID namespace of its own, as the
// kubelet does for a pod without shareProcessNamespace or hostPID.
type ownPIDBuilder struct{ podsynctest.Builder }

func (b *ownPIDBuilder) ContainerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, restartCount int, imageRef string, podIPs []string) (*runtimeapi.ContainerConfig, error) {
	cfg, err := b.Builder.ContainerConfig(ctx, pod, c, restartCount, imageRef, podIPs)
	if err != nil {
		return nil, err
	}
	cfg.Linux = &runtimeapi.LinuxContainerConfig{SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
		NamespaceOptions: &runtimeapi.NamespaceOption{Pid: runtimeapi.NamespaceMode_CONTAINER},
	}}
	return cfg, nil
}

// configRecorder keeps the configs containers were created with.
type configRecorder struct {
	*podsynctest.Runtime
	mu      sync.Mutex
	configs map[string]*runtimeapi.ContainerConfig
}

func (r *configRecorder) CreateContainer(ctx context.Context, sandboxID string, cfg *runtimeapi.ContainerConfig, sbCfg *runtimeapi.PodSandboxConfig) (string, error) {
	r.mu.Lock()
	r.configs[cfg.GetMetadata().GetName()] = cfg
	r.mu.Unlock()
	return r.Runtime.CreateContainer(ctx, sandboxID, cfg, sbCfg)
}

func addEphemeral(pod *corev1.Pod, name, target string) {
	pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: name, Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent, Stdin: true, TTY: true,
		},
		TargetContainerName: target,
	})
}

func TestSyncPodEphemeralContainers(t *testing.T) {
	e := newEnv(t)
	rec := &configRecorder{Runtime: e.rt, configs: map[string]*runtimeapi.ContainerConfig{}}
	s, err := podsync.New(podsync.Config{Runtime: rec, Builder: &ownPIDBuilder{}, Events: e.events, Clock: e.clk, Metrics: e.metrics})
	require.NoError(t, err)
	e.syncer = s

	pod := newPod()
	require.NoError(t, e.sync(pod).Error())
	app := e.running("app")

	// kubectl debug --target=app: joins app's PID namespace.
	addEphemeral(pod, "debugger", "app")
	e.events.Reset()
	e.rt.ResetCalls()
	res := e.sync(pod)
	require.NoError(t, res.Error())
	dbg := e.running("debugger")
	assert.Equal(t, []string{"CreateContainer(debugger)", "StartContainer(" + dbg.Id + ")"}, e.rt.CallNames())
	ns := rec.configs["debugger"].GetLinux().GetSecurityContext().GetNamespaceOptions()
	assert.Equal(t, runtimeapi.NamespaceMode_TARGET, ns.GetPid())
	assert.Equal(t, app.Id, ns.GetTargetId())
	assert.Equal(t, runtimeapi.NamespaceMode_CONTAINER, rec.configs["app"].GetLinux().GetSecurityContext().GetNamespaceOptions().GetPid())
	assert.Equal(t, []string{
		`spec.ephemeralContainers{debugger}: Normal Pulled Container image "busybox:1.36" already present on machine`,
		"spec.ephemeralContainers{debugger}: Normal Created Container created",
		"spec.ephemeralContainers{debugger}: Normal Started Container started",
	}, e.events.WithFields())
	assert.Equal(t, 1, e.metrics.Counts()["started/ephemeral_container"])

	st := e.status(pod)
	require.Len(t, st.EphemeralContainerStatuses, 1)
	assert.NotNil(t, st.EphemeralContainerStatuses[0].State.Running)
	assert.Equal(t, "containerd://"+dbg.Id, st.EphemeralContainerStatuses[0].ContainerID)

	// It exits with an error: the pod (restartPolicy Always) does not restart it.
	e.exit("debugger", 1)
	e.rt.ResetCalls()
	require.NoError(t, e.sync(pod).Error())
	assert.Empty(t, e.rt.CallNames(), "an ephemeral container is never restarted")
	st = e.status(pod)
	require.NotNil(t, st.EphemeralContainerStatuses[0].State.Terminated)
	assert.Equal(t, int32(1), st.EphemeralContainerStatuses[0].State.Terminated.ExitCode)
	assert.Equal(t, corev1.PodRunning, st.Phase)

	// A target the runtime does not know: CreateContainerConfigError, no container.
	addEphemeral(pod, "lost", "nope")
	e.events.Reset()
	res = e.sync(pod)
	err = res.Error()
	require.ErrorIs(t, err, podsync.ErrCreateContainerConfig)
	assert.Nil(t, e.rt.ContainerByName("lost"))
	assert.Contains(t, e.events.WithFields(), "spec.ephemeralContainers{lost}: Warning Failed Error: unable to find target container nope")
	st = e.status(pod)
	lost := statusOf(t, st.EphemeralContainerStatuses, "lost")
	require.NotNil(t, lost.State.Waiting)
	assert.Equal(t, "CreateContainerConfigError", lost.State.Waiting.Reason)
	assert.Equal(t, "unable to find target container nope", lost.State.Waiting.Message)
	assert.Equal(t, 1, e.metrics.Counts()["errors/ephemeral_container/CreateContainerConfigError"])

	// One failing start does not keep the next ephemeral container out; deleting
	// the pod stops them with the rest.
	addEphemeral(pod, "third", "")
	assert.ErrorIs(t, e.sync(pod).Error(), podsync.ErrCreateContainerConfig, "lost fails again")
	third := e.running("third")
	require.NoError(t, e.syncer.KillPod(context.Background(), pod, nil, nil).Error())
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, e.rt.ContainerByName(third.Metadata.Name).State)
}
