package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	"k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"
)

// TestLocalhostNodePorts is upstream's choice: iptables mode, IPv4, the option on,
// and nodePortAddresses (none meaning all) taking in 127.0.0.1.
func TestLocalhostNodePorts(t *testing.T) {
	node := &v1.Node{Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}}}}
	for _, tc := range []struct {
		name   string
		mode   v1alpha1.ProxyMode
		family v1.IPFamily
		off    bool
		addrs  []string
		want   bool
	}{
		{"iptables default", modeIPTables, v1.IPv4Protocol, false, nil, true},
		{"option off", modeIPTables, v1.IPv4Protocol, true, nil, false},
		{"IPv6 never", modeIPTables, v1.IPv6Protocol, false, nil, false},
		{"nftables never", modeNFTables, v1.IPv4Protocol, false, nil, false},
		{"all", modeIPTables, v1.IPv4Protocol, false, []string{"all"}, true},
		{"localhost", modeIPTables, v1.IPv4Protocol, false, []string{"primary", "localhost"}, true},
		{"primary only", modeIPTables, v1.IPv4Protocol, false, []string{"primary"}, false},
		{"a CIDR holding 127.0.0.1", modeIPTables, v1.IPv4Protocol, false, []string{"192.0.2.0/24", "127.0.0.0/16"}, true},
		{"IPv4 CIDRs without it", modeIPTables, v1.IPv4Protocol, false, []string{"192.0.2.0/24"}, false},
		{"IPv6 CIDRs only: every IPv4 address", modeIPTables, v1.IPv4Protocol, false, []string{"fd00::/64"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &v1alpha1.KubeProxyConfiguration{Mode: tc.mode, NodePortAddresses: tc.addrs}
			setDefaults(c)
			c.IPTables.LocalhostNodePorts = ptr.To(!tc.off)
			assert.Equal(t, tc.want, localhostNodePorts(c, node, tc.family))
		})
	}
	// Without the Node's address 'primary' names no IPv4 address: all of them.
	c := &v1alpha1.KubeProxyConfiguration{Mode: modeIPTables, NodePortAddresses: []string{"primary"}}
	setDefaults(c)
	assert.True(t, localhostNodePorts(c, nil, v1.IPv4Protocol))
}

func TestEnsureSysctl(t *testing.T) {
	root := t.TempDir()
	old := sysctlRoot
	sysctlRoot = root
	t.Cleanup(func() { sysctlRoot = old })
	path := filepath.Join(root, sysctlRouteLocalnet)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte("0\n"), 0o644))
	require.NoError(t, ensureSysctl(logr.Discard(), sysctlRouteLocalnet, 1))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "1", string(b))
	require.NoError(t, os.Chmod(path, 0o444))
	require.NoError(t, ensureSysctl(logr.Discard(), sysctlRouteLocalnet, 1), "already set: nothing written")
	err = ensureSysctl(logr.Discard(), "net/no-such-dir/x", 1)
	assert.ErrorContains(t, err, "can't set sysctl net/no-such-dir/x to 1")
}
