package rules_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

var (
	extLocalVIP = netip.MustParseAddr("10.96.0.20")
	intLocalVIP = netip.MustParseAddr("10.96.0.21")
)

// TestNFTablesTrafficPolicyLocal: externalTrafficPolicy and internalTrafficPolicy
// Local with real packets, through the nftables writer.
func TestNFTablesTrafficPolicyLocal(t *testing.T) {
	e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit"})
	testTrafficPolicyLocal(t, e, func(ctx context.Context, st *rules.State) error { return e.sync(ctx, st) },
		func(ctx context.Context, st *rules.State) (d []rules.Drift, err error) {
			err = e.Node.Do(func() error { d, err = e.w.Drift(ctx, st); return err })
			return d, err
		})
}

// TestIPTablesTrafficPolicyLocal: the same through both iptables backends.
func TestIPTablesTrafficPolicyLocal(t *testing.T) {
	for _, mode := range []rules.IPTablesMode{rules.IPTablesNFT, rules.IPTablesLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			bin := "iptables-restore"
			if mode == rules.IPTablesLegacy {
				bin = "iptables-legacy-restore"
			}
			testenv.LookPath(t, bin)
			env := netns.New(t, netns.Config{Pods: 3})
			var w *rules.IPTables
			require.NoError(t, env.Node.Do(func() error {
				var err error
				w, err = rules.NewIPTables(context.Background(), rules.IPTablesConfig{Mode: mode, Prefix: "NK", ClusterCIDR: env.PodCIDR})
				return err
			}))
			testTrafficPolicyLocal(t, &nftEnv{Env: env}, func(ctx context.Context, st *rules.State) error {
				return env.Node.Do(func() error { return w.Sync(ctx, st) })
			}, func(ctx context.Context, st *rules.State) (d []rules.Drift, err error) {
				err = env.Node.Do(func() error { d, err = w.Drift(ctx, st); return err })
				return d, err
			})
		})
	}
}

// testTrafficPolicyLocal plays a node holding pod-0 of a service whose other
// endpoints (pod-1, pod-2) count as on other nodes: the rules only see the lists.
func testTrafficPolicyLocal(t *testing.T, e *nftEnv, sync func(context.Context, *rules.State) error,
	drift func(context.Context, *rules.State) ([]rules.Drift, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ext := rules.Service{Namespace: "default", Name: "ext-local", Protocol: rules.TCP, ClusterIP: extLocalVIP, Port: 80,
		NodePort: 30090, ExternalIPs: []netip.Addr{netip.MustParseAddr("203.0.113.20")},
		Endpoints: e.endpoints(0, 1, 2), ExternalLocal: true, LocalEndpoints: e.endpoints(0)}
	in := rules.Service{Namespace: "default", Name: "int-local", Protocol: rules.TCP, ClusterIP: intLocalVIP, Port: 80,
		InternalLocal: true, LocalEndpoints: e.endpoints(0, 1)}
	st := &rules.State{Services: []rules.Service{ext, in}}
	require.NoError(t, sync(ctx, st))
	noDrift := func(t *testing.T) {
		t.Helper()
		d, err := drift(ctx, st)
		require.NoError(t, err)
		assert.Empty(t, d, "read-back of Local policies matches the state")
	}
	noDrift(t)
	nodePort := net.JoinHostPort(e.NodeIP.String(), "30090")

	t.Run("NodePort from outside reaches only the local endpoint and keeps the client address", func(t *testing.T) {
		c := e.Client.HTTPClient(2 * time.Second)
		defer c.CloseIdleConnections()
		for range 30 {
			pod, remote, err := netns.Get(ctx, c, nodePort)
			require.NoError(t, err)
			require.Equal(t, e.Pods[0].Name, pod, "external traffic with policy Local went to a remote endpoint")
			require.True(t, strings.HasPrefix(remote, e.ClientIP.String()+":"), "pod saw %s, want the client %s", remote, e.ClientIP)
		}
	})

	t.Run("ClusterIP traffic (policy Cluster) still reaches every endpoint", func(t *testing.T) {
		got := count(ctx, t, e.Pods[2].Namespace, net.JoinHostPort(extLocalVIP.String(), "80"), 60)
		assert.Len(t, got, 3, "%v", got)
	})

	t.Run("pod traffic to the NodePort is short-circuited to the Cluster endpoints", func(t *testing.T) {
		got := count(ctx, t, e.Pods[2].Namespace, nodePort, 60)
		assert.Greater(t, len(got), 1, "pods are not subject to the Local policy: %v", got)
	})

	t.Run("internalTrafficPolicy Local: a pod reaches only local endpoints", func(t *testing.T) {
		got := count(ctx, t, e.Pods[2].Namespace, net.JoinHostPort(intLocalVIP.String(), "80"), 60)
		assert.Len(t, got, 2, "%v", got)
		assert.Zero(t, got[e.Pods[2].Name], "pod-2 is not local: %v", got)
	})

	st.Services[0].LocalEndpoints = nil
	st.Services[1].LocalEndpoints = nil
	st.Services[1].NoEndpoints = rules.Drop // endpoints exist on other nodes
	require.NoError(t, sync(ctx, st))
	noDrift(t)

	t.Run("no local endpoint: external traffic is dropped, not rejected", func(t *testing.T) {
		requireDropped(ctx, t, e.Client, nodePort)
	})

	t.Run("no local endpoint: pods still reach the Cluster endpoints through the NodePort", func(t *testing.T) {
		got := count(ctx, t, e.Pods[1].Namespace, nodePort, 30)
		assert.NotEmpty(t, got)
	})

	t.Run("no local endpoint: internal traffic with policy Local is dropped", func(t *testing.T) {
		requireDropped(ctx, t, e.Pods[2].Namespace, net.JoinHostPort(intLocalVIP.String(), "80"))
	})

	t.Run("a local endpoint again: external traffic flows", func(t *testing.T) {
		st.Services[0].LocalEndpoints = e.endpoints(1)
		require.NoError(t, sync(ctx, st))
		got := count(ctx, t, e.Client, nodePort, 20)
		assert.Equal(t, map[string]int{e.Pods[1].Name: 20}, got)
	})
}

// requireDropped dials addr from ns and wants silence: no answer within a second,
// where a reject would answer at once.
func requireDropped(ctx context.Context, t *testing.T, ns *netns.Namespace, addr string) {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	t0 := time.Now()
	conn, err := ns.Dial(dctx, "tcp", addr)
	if err == nil {
		conn.Close()
		t.Fatalf("dial %s from %s connected; want the SYN dropped", addr, ns.Name)
	}
	assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "rejected (%v), want dropped", err)
	assert.GreaterOrEqual(t, time.Since(t0), 900*time.Millisecond, "answered in %s: %v", time.Since(t0), err)
}
