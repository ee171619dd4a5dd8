package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
)

// TestNodekitNextOnHostNetwork: on a host-network node the next steps run on the
// machine itself, with no nsenter or ip netns exec in front.
func TestNodekitNextOnHostNetwork(t *testing.T) {
	generic := []string{"crictl pods", "nft list table ip kube-proxy   # the Service rules", "kubectl get pods"}
	host := &cluster.State{StateDir: "/s", HostNetwork: true, Nodes: []cluster.Node{{Name: "worker-7", NetNS: "", Dir: "/s/nodes/worker-7"}}}
	assert.Equal(t, []string{"crictl --config /s/nodes/worker-7/crictl.yaml pods", "nft list table ip kube-proxy", "kubectl get pods"},
		nodekitNext(generic, host, "worker-7"))
	ns := &cluster.State{StateDir: "/s", Nodes: []cluster.Node{{Name: "node-1", NetNS: "nk-a-node-1", Dir: "/s/nodes/node-1"}}}
	assert.Equal(t, []string{"nsenter --net=/var/run/netns/nk-a-node-1 crictl --config /s/nodes/node-1/crictl.yaml pods", "ip netns exec nk-a-node-1 nft list table ip kube-proxy", "kubectl get pods"},
		nodekitNext(generic, ns, "node-1"), "the namespaced cluster's next steps are unchanged")
}

// TestUpHostNetworkUsage: flag combinations --host-network cannot honour are refused
// before anything is looked at or made.
func TestUpHostNetworkUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--host-network", "--nodes", "2"}, "--host-network runs exactly one node (the machine itself): --nodes 2"},
		{[]string{"--node-ip", "192.0.2.1"}, "--node-ip is for --host-network only"},
	} {
		dir := filepath.Join(t.TempDir(), "state")
		_, stderr, code := nodekit(t, nil, append([]string{"up", "--state-dir", dir}, tc.args...)...)
		assert.Equal(t, exitError, code, stderr)
		if os.Geteuid() == 0 {
			assert.Contains(t, stderr, tc.want)
		}
		_, err := os.Stat(dir)
		assert.True(t, os.IsNotExist(err), "no state dir made: %v", err)
	}
}
