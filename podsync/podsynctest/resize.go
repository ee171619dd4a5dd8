package podsynctest

import (
	"context"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/podsync"
)

var (
	_ podsync.ResourceUpdater  = (*Runtime)(nil)
	_ podsync.ResourcesBuilder = (*Builder)(nil)
)

// UpdateContainerResources records the call (Arg: the container ID) and
// reports resources in the container's status from then on, as a CRI runtime
// that supports in-place resize does.
func (r *Runtime) UpdateContainerResources(ctx context.Context, id string, resources *runtimeapi.LinuxContainerResources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.begin(ctx, "UpdateContainerResources", id); err != nil {
		return err
	}
	c, ok := r.containers[id]
	if !ok {
		return notFound("container", id)
	}
	c.status.Resources = &runtimeapi.ContainerResources{Linux: proto.Clone(resources).(*runtimeapi.LinuxContainerResources)}
	return nil
}

// ContainerResources gives the cgroup values of c's resources with the
// kubelet's conversions: shares from the cpu request (2 at least), the CFS quota
// over a 100 ms period from the cpu limit, the memory limit in bytes.
func (b *Builder) ContainerResources(_ *corev1.Pod, c *corev1.Container) (*runtimeapi.LinuxContainerResources, error) {
	shares := c.Resources.Requests.Cpu().MilliValue() * 1024 / 1000
	var quota int64
	if lim := c.Resources.Limits.Cpu().MilliValue(); lim > 0 {
		quota = max(lim*100000/1000, 1000)
	}
	return &runtimeapi.LinuxContainerResources{
		CpuShares:          max(shares, 2),
		CpuQuota:           quota,
		CpuPeriod:          100000,
		MemoryLimitInBytes: c.Resources.Limits.Memory().Value(),
	}, nil
}
