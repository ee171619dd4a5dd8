package cluster

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// startingRuntime answers like containerd while a container of a sandbox is still
// being started: RemovePodSandbox fails until it has been asked `busy` times.
type startingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu      sync.Mutex
	busy    int
	removed map[string]bool
	tries   int
}

func (r *startingRuntime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	return &runtimeapi.ListPodSandboxResponse{Items: []*runtimeapi.PodSandbox{
		{Id: "a", Metadata: &runtimeapi.PodSandboxMetadata{Name: "coredns"}},
		{Id: "b", Metadata: &runtimeapi.PodSandboxMetadata{Name: "web"}},
	}}, nil
}

func (r *startingRuntime) StopPodSandbox(context.Context, *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (r *startingRuntime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if req.PodSandboxId == "a" {
		r.tries++
		if r.tries <= r.busy {
			return nil, errors.New(`failed to set removing state for container "x": container is in starting state, can't be removed`)
		}
	}
	r.removed[req.PodSandboxId] = true
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func serveRuntime(t *testing.T, rt runtimeapi.RuntimeServiceServer) string {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return "unix://" + sock
}

// `down` right after `up` met a CoreDNS container containerd was still starting: the
// sandbox removal is tried again until containerd lets it go.
func TestRemoveSandboxesRetriesAStartingContainer(t *testing.T) {
	rt := &startingRuntime{busy: 3, removed: map[string]bool{}}
	require.NoError(t, removeSandboxes(context.Background(), serveRuntime(t, rt)))
	assert.Equal(t, map[string]bool{"a": true, "b": true}, rt.removed)
	assert.Equal(t, 4, rt.tries, "three refusals, then removed")
}

// A sandbox that never lets go ends the wait with the runtime's own words and the
// sandbox's name; the others are removed all the same.
func TestRemoveSandboxesGivesUpWithTheRuntimesError(t *testing.T) {
	rt := &startingRuntime{busy: 1 << 30, removed: map[string]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := removeSandboxes(ctx, serveRuntime(t, rt))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "remove sandbox coredns")
	assert.Contains(t, err.Error(), "container is in starting state")
	assert.Equal(t, map[string]bool{"b": true}, rt.removed)
}
