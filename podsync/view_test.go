package podsync_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// msgBuilder mounts a host file at the container's terminationMessagePath.
type msgBuilder struct {
	podsynctest.Builder
	dir string
}

func (b *msgBuilder) ContainerConfig(ctx context.Context, pod *corev1.Pod, c *corev1.Container, n int, ref string, ips []string) (*runtimeapi.ContainerConfig, error) {
	cfg, err := b.Builder.ContainerConfig(ctx, pod, c, n, ref, ips)
	if err == nil {
		cfg.Mounts = append(cfg.Mounts, &runtimeapi.Mount{HostPath: filepath.Join(b.dir, c.Name), ContainerPath: c.TerminationMessagePath})
	}
	return cfg, err
}

func TestLoadView(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	dir := t.TempDir()
	s, err := podsync.New(podsync.Config{Runtime: e.rt, Builder: &msgBuilder{dir: dir}, Clock: e.clk})
	require.NoError(t, err)
	pod := newPod(func(p *corev1.Pod) {
		p.Spec.RestartPolicy = corev1.RestartPolicyNever
		p.Spec.Containers[0].TerminationMessagePath = "/dev/termination-log"
		p.Spec.Containers[0].TerminationMessagePolicy = corev1.TerminationMessageReadFile
	})
	other := newPod(func(p *corev1.Pod) { p.Name, p.UID = "other", "uid-2" })
	require.NoError(t, s.SyncPod(ctx, pod, nil).Error())
	require.NoError(t, s.SyncPod(ctx, other, nil).Error())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "app"), []byte("bye"), 0o644))
	v, err := podsync.LoadView(ctx, e.rt, pod.UID, podsync.OSFiles{})
	require.NoError(t, err)
	assert.Equal(t, "web", v.Name)
	assert.Equal(t, "default", v.Namespace)
	require.Len(t, v.Sandboxes, 1)
	require.Len(t, v.Containers, 1, "only the pod's own containers")
	assert.Empty(t, v.TerminationMessages, "a running container has none")

	require.NoError(t, e.rt.Exit(v.Containers[0].Id, 0, "", ""))
	v, err = podsync.LoadView(ctx, e.rt, pod.UID, podsync.OSFiles{})
	require.NoError(t, err)
	assert.Equal(t, map[string]string{v.Containers[0].Id: "bye"}, v.TerminationMessages)
	assert.NotEmpty(t, v.IPs())
	st := s.PodStatus(pod, v, podsync.StatusInput{})
	assert.Equal(t, "bye", st.ContainerStatuses[0].State.Terminated.Message)

	e.rt.FailNext("ListContainers", errors.New("runtime down"))
	_, err = podsync.LoadView(ctx, e.rt, pod.UID, nil)
	assert.ErrorContains(t, err, "list containers of pod uid-1: runtime down")
}
