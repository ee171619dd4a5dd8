package cluster

import "context"

// agents starts each node's kubelet and kube-proxy.
func (c *Cluster) agents(ctx context.Context) error {
	return nil
}
