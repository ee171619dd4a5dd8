package stats

import (
	"context"
	"fmt"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
)

// Runtime is the part of the CRI the stats need. CRIRuntime adapts a *cri.Client;
// unit tests bring their own.
type Runtime interface {
	ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error)
	ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error)
	ListContainerStats(ctx context.Context, filter *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error)
	// ListPodSandboxStats may fail with gRPC code Unimplemented (containerd before
	// 1.7 on some setups); the provider then sums container stats per pod.
	ListPodSandboxStats(ctx context.Context, filter *runtimeapi.PodSandboxStatsFilter) ([]*runtimeapi.PodSandboxStats, error)
	ImageFsInfo(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error)
}

// CRIRuntime adapts c to Runtime. *cri.Client has no wrappers for the stats calls,
// so they go to its raw gRPC clients under ctx and callTimeout; their gRPC status
// stays wrapped for status.Code.
func CRIRuntime(c *cri.Client) Runtime { return criRuntime{c} }

// callTimeout bounds the raw stats calls as cri.Client bounds its own: the
// kubelet's default --runtime-request-timeout.
const callTimeout = 2 * time.Minute

type criRuntime struct{ c *cri.Client }

func (r criRuntime) ListPodSandbox(ctx context.Context, filter *runtimeapi.PodSandboxFilter) ([]*runtimeapi.PodSandbox, error) {
	return r.c.ListPodSandbox(ctx, filter)
}

func (r criRuntime) ListContainers(ctx context.Context, filter *runtimeapi.ContainerFilter) ([]*runtimeapi.Container, error) {
	return r.c.ListContainers(ctx, filter)
}

func (r criRuntime) ListContainerStats(ctx context.Context, filter *runtimeapi.ContainerStatsFilter) ([]*runtimeapi.ContainerStats, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := r.c.RuntimeService().ListContainerStats(ctx, &runtimeapi.ListContainerStatsRequest{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("cri ListContainerStats: %w", err)
	}
	return resp.GetStats(), nil
}

func (r criRuntime) ListPodSandboxStats(ctx context.Context, filter *runtimeapi.PodSandboxStatsFilter) ([]*runtimeapi.PodSandboxStats, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := r.c.RuntimeService().ListPodSandboxStats(ctx, &runtimeapi.ListPodSandboxStatsRequest{Filter: filter})
	if err != nil {
		return nil, fmt.Errorf("cri ListPodSandboxStats: %w", err)
	}
	return resp.GetStats(), nil
}

func (r criRuntime) ImageFsInfo(ctx context.Context) (*runtimeapi.ImageFsInfoResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := r.c.ImageService().ImageFsInfo(ctx, &runtimeapi.ImageFsInfoRequest{})
	if err != nil {
		return nil, fmt.Errorf("cri ImageFsInfo: %w", err)
	}
	return resp, nil
}
