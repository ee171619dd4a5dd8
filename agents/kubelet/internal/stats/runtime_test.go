package stats

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

// statsRuntime adds ListContainerStats to fakeruntime, which has no stats calls;
// ListPodSandboxStats stays Unimplemented.
type statsRuntime struct {
	*fakeruntime.Runtime
}

func (r statsRuntime) ListContainerStats(ctx context.Context, req *runtimeapi.ListContainerStatsRequest) (*runtimeapi.ListContainerStatsResponse, error) {
	var out []*runtimeapi.ContainerStats
	for _, c := range r.Containers() {
		if c.GetState() != runtimeapi.ContainerState_CONTAINER_RUNNING {
			continue
		}
		out = append(out, &runtimeapi.ContainerStats{
			Attributes: &runtimeapi.ContainerAttributes{Id: c.GetId(), Metadata: c.GetMetadata()},
			Cpu:        &runtimeapi.CpuUsage{Timestamp: time.Now().UnixNano(), UsageCoreNanoSeconds: u64(uint64(3 * time.Second))},
			Memory:     &runtimeapi.MemoryUsage{Timestamp: time.Now().UnixNano(), WorkingSetBytes: u64(64 << 20)},
		})
	}
	return &runtimeapi.ListContainerStatsResponse{Stats: out}, nil
}

// TestCRIRuntime drives the adapter over gRPC: stats come through, and
// Unimplemented keeps its code so the provider falls back.
func TestCRIRuntime(t *testing.T) {
	dir, err := os.MkdirTemp("", "nkstats-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	fake := fakeruntime.New()
	l, err := net.Listen("unix", filepath.Join(dir, "cri.sock"))
	require.NoError(t, err)
	srv := grpc.NewServer()
	rs := statsRuntime{fake}
	runtimeapi.RegisterRuntimeServiceServer(srv, rs)
	runtimeapi.RegisterImageServiceServer(srv, fake)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Stop(); <-done })

	ctx := context.Background()
	c, err := cri.New(ctx, cri.Config{Endpoint: "unix://" + filepath.Join(dir, "cri.sock")})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	pod := newPodForCRI()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: dir})
	require.NoError(t, err)
	sbID, err := c.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	ctrCfg, err := cri.ContainerConfig(pod, "main", 0, fakeruntime.PauseImage)
	require.NoError(t, err)
	ctrID, err := c.CreateContainer(ctx, sbID, ctrCfg, sbCfg)
	require.NoError(t, err)
	require.NoError(t, c.StartContainer(ctx, ctrID))

	rt := CRIRuntime(c)
	_, err = rt.ListPodSandboxStats(ctx, nil)
	require.Error(t, err)
	assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	assert.Contains(t, err.Error(), "cri ListPodSandboxStats: ")

	p, err := New(Config{Runtime: rt, NodeName: "node-1", RootDir: dir, PodLogsDir: dir})
	require.NoError(t, err)
	p.host = newTestHost(t, false).host()
	s, err := p.Summary(ctx)
	require.NoError(t, err)
	require.Len(t, s.Pods, 1)
	ps := s.Pods[0]
	assert.Equal(t, "web", ps.PodRef.Name)
	assert.Equal(t, "default", ps.PodRef.Namespace)
	assert.Equal(t, "uid-web", ps.PodRef.UID)
	require.Len(t, ps.Containers, 1)
	assert.Equal(t, "main", ps.Containers[0].Name)
	assert.Equal(t, uint64(3*time.Second), *ps.CPU.UsageCoreNanoSeconds, "summed from the container")
	assert.Equal(t, uint64(64<<20), *ps.Memory.WorkingSetBytes)
	require.NotNil(t, s.Node.Runtime.ImageFs)
	assert.Greater(t, *s.Node.Runtime.ImageFs.UsedBytes, uint64(0), "the fake's pause image")

	// A stopped server: a 500 naming the call, and resource_scrape_error 1.
	srv.Stop()
	rec := get(t, p.SummaryHandler(), http.MethodGet, "/stats/summary")
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
	assert.Contains(t, rec.Body.String(), "Internal Error: ")
	assert.Contains(t, get(t, p.ResourceMetricsHandler(), http.MethodGet, "/metrics/resource").Body.String(), "\nresource_scrape_error 1\n")
}

func newPodForCRI() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: types.UID("uid-web")},
		Spec:       corev1.PodSpec{HostNetwork: true, Containers: []corev1.Container{{Name: "main", Image: fakeruntime.PauseImage}}},
	}
}
