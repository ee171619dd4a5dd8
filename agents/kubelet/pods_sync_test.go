package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

// countCalls counts the recorded CRI calls by method.
func countCalls(rt *fakeruntime.Runtime) map[string]int {
	n := map[string]int{}
	for _, c := range rt.CallNames() {
		n[c]++
	}
	return n
}

// TestSyncPodReadsTheRuntimeOnce: a pod start reads the runtime's state of the pod
// once before and once after starting it, and a sync that has nothing to do reads it
// once, its status coming from that read, as the kubelet's pod worker syncs and
// reports from the one pod status it read.
func TestSyncPodReadsTheRuntimeOnce(t *testing.T) {
	rt := fakeruntime.New()
	rt.AddImage("busybox:latest")
	dir, err := os.MkdirTemp("", "nk-sync-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	l, err := net.Listen("unix", filepath.Join(dir, "cri.sock"))
	require.NoError(t, err)
	gs := grpc.NewServer()
	rt.Register(gs)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)
	client, err := cri.New(context.Background(), cri.Config{Endpoint: "unix://" + filepath.Join(dir, "cri.sock")})
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() })

	cfg := testConfig(t)
	// No pod cgroups: the test leaves the machine's cgroups alone.
	cfg.CgroupsPerQOS = new(bool)
	cfg.PodLogsDir = filepath.Join(dir, "logs")
	resolv := filepath.Join(dir, "resolv.conf")
	require.NoError(t, os.WriteFile(resolv, []byte(hostResolv), 0o644))
	cfg.ResolverConfig = &resolv
	m, err := newPodManager(podManagerConfig{cfg: cfg, rootDir: filepath.Join(dir, "root"), runtime: client,
		nodeName: testNodeName, nodeIP: net.ParseIP("192.0.2.1")})
	require.NoError(t, err)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "uid-web"},
		Spec: corev1.PodSpec{NodeName: testNodeName, RestartPolicy: corev1.RestartPolicyAlways, EnableServiceLinks: new(bool),
			Containers: []corev1.Container{{Name: "main", Image: "busybox:latest", ImagePullPolicy: corev1.PullIfNotPresent}}},
	}
	// Admitted already: admission needs the node's status, which this test has not.
	e := &podEntry{pod: pod, wake: make(chan struct{}, 1), done: make(chan struct{}), admitted: true}
	m.alloc.set(pod)
	ctx := context.Background()

	rt.ResetCalls()
	_, err = m.syncPod(ctx, e)
	require.NoError(t, err)
	calls := countCalls(rt)
	assert.Equal(t, 1, calls["RunPodSandbox"])
	assert.Equal(t, 1, calls["StartContainer"])
	assert.Equal(t, 2, calls["ListPodSandbox"], "the pod's state read before and after the start: %v", rt.CallNames())
	assert.Equal(t, 2, calls["ListContainers"], "the pod's state read before and after the start: %v", rt.CallNames())
	require.NotNil(t, e.status)
	assert.Equal(t, corev1.PodRunning, e.status.Phase, "the status after the start shows the container running")

	rt.ResetCalls()
	_, err = m.syncPod(ctx, e)
	require.NoError(t, err)
	calls = countCalls(rt)
	assert.Equal(t, 1, calls["ListPodSandbox"], "a sync with nothing to do reads the pod's state once: %v", rt.CallNames())
	assert.Equal(t, 1, calls["ListContainers"], "a sync with nothing to do reads the pod's state once: %v", rt.CallNames())
	assert.Equal(t, 1, calls["ContainerStatus"], "%v", rt.CallNames())
	assert.Zero(t, calls["RunPodSandbox"]+calls["CreateContainer"]+calls["StartContainer"])
	require.Len(t, e.status.ContainerStatuses, 1)
	assert.NotNil(t, e.status.ContainerStatuses[0].State.Running, "the status still comes from the runtime's state")

	// The container exits between two syncs: the next sync sees it in its one read,
	// restarts it and reads again for the status.
	id := e.status.ContainerStatuses[0].ContainerID
	require.NoError(t, client.StopContainer(ctx, id[len("fakeruntime://"):], 0))
	rt.ResetCalls()
	_, err = m.syncPod(ctx, e)
	require.NoError(t, err)
	calls = countCalls(rt)
	assert.Equal(t, 1, calls["StartContainer"], "%v", rt.CallNames())
	assert.Equal(t, 2, calls["ListPodSandbox"], "%v", rt.CallNames())
	assert.Equal(t, int32(1), e.status.ContainerStatuses[0].RestartCount)
	assert.NotNil(t, e.status.ContainerStatuses[0].State.Running)
	states := map[runtimeapi.ContainerState]int{}
	for _, c := range rt.Containers() {
		states[c.GetState()]++
	}
	assert.Equal(t, map[runtimeapi.ContainerState]int{runtimeapi.ContainerState_CONTAINER_EXITED: 1, runtimeapi.ContainerState_CONTAINER_RUNNING: 1}, states)
}
