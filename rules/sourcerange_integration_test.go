package rules_test

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

var (
	lbRangesVIP = netip.MustParseAddr("10.96.0.30")
	// lbRangesLB is routed (inside the netns service CIDR), so traffic the rules
	// leave undNATed is forwarded and meets the firewall rather than "no route".
	lbRangesLB = netip.MustParseAddr("10.96.100.1")
)

// TestNFTablesLoadBalancerSourceRanges: real packets through both appliers.
func TestNFTablesLoadBalancerSourceRanges(t *testing.T) {
	for _, applier := range []rules.NFTablesApplier{rules.NFTablesNetlink, rules.NFTablesCLI} {
		t.Run(string(applier), func(t *testing.T) {
			e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit", Applier: applier, NodeIP: netip.MustParseAddr("192.0.2.1")})
			testLoadBalancerSourceRanges(t, e.Env, e.sync, func(ctx context.Context, st *rules.State) (d []rules.Drift, err error) {
				err = e.Node.Do(func() error { d, err = e.w.Drift(ctx, st); return err })
				return d, err
			}, func(ctx context.Context, p rules.Packet) (r *rules.TraceResult, err error) {
				err = e.Node.Do(func() error { r, err = e.w.Trace(ctx, p); return err })
				return r, err
			})
		})
	}
}

// TestIPTablesLoadBalancerSourceRanges: the same through both iptables backends.
func TestIPTablesLoadBalancerSourceRanges(t *testing.T) {
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
				w, err = rules.NewIPTables(context.Background(), rules.IPTablesConfig{Mode: mode, Prefix: "NK",
					ClusterCIDR: env.PodCIDR, NodeIP: env.NodeIP})
				return err
			}))
			testLoadBalancerSourceRanges(t, env, func(ctx context.Context, st *rules.State) error {
				return env.Node.Do(func() error { return w.Sync(ctx, st) })
			}, func(ctx context.Context, st *rules.State) (d []rules.Drift, err error) {
				err = env.Node.Do(func() error { d, err = w.Drift(ctx, st); return err })
				return d, err
			}, func(ctx context.Context, p rules.Packet) (r *rules.TraceResult, err error) {
				err = env.Node.Do(func() error { r, err = w.Trace(ctx, p); return err })
				return r, err
			})
		})
	}
}

// testLoadBalancerSourceRanges has two clients: the external client (192.0.2.2)
// and a pod (10.244.1.12, not an endpoint of the service). The ranges admit one,
// then the other (a partial sync), then are removed. The one outside the ranges
// has its SYN to the load-balancer IP dropped; both always reach the cluster IP
// and the node port, which the ranges never restrict, as in kube-proxy.
func testLoadBalancerSourceRanges(t *testing.T, e *netns.Env, sync func(context.Context, *rules.State) error,
	drift func(context.Context, *rules.State) ([]rules.Drift, error), trace func(context.Context, rules.Packet) (*rules.TraceResult, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	eps := []rules.Endpoint{{IP: e.Pods[0].IP, Port: e.Pods[0].HTTPPort}, {IP: e.Pods[1].IP, Port: e.Pods[1].HTTPPort}}
	svc := rules.Service{Namespace: "default", Name: "lb", Protocol: rules.TCP, ClusterIP: lbRangesVIP, Port: 80, NodePort: 30095,
		LoadBalancerIPs: []netip.Addr{lbRangesLB}, Endpoints: eps,
		// The external link's /24 holds the node IP too: the load-balancer IP is
		// an allowed source as well, making this an anonymous set of two elements.
		LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}
	st := &rules.State{Services: []rules.Service{svc}}
	require.NoError(t, sync(ctx, st))

	client, pod := e.Client, e.Pods[2].Namespace
	lb := net.JoinHostPort(lbRangesLB.String(), "80")
	vip := net.JoinHostPort(lbRangesVIP.String(), "80")
	nodePort := net.JoinHostPort(e.NodeIP.String(), "30095")
	reaches := func(t *testing.T, ns *netns.Namespace, addr string) {
		t.Helper()
		got := count(ctx, t, ns, addr, 4)
		require.NotEmpty(t, got)
	}
	unrestricted := func(t *testing.T) {
		t.Helper()
		d, err := drift(ctx, st)
		require.NoError(t, err)
		require.Empty(t, d, "read-back follows the firewall chains to the endpoints")
		for _, ns := range []*netns.Namespace{client, pod} {
			reaches(t, ns, vip)
			reaches(t, ns, nodePort)
		}
	}

	traced := func(t *testing.T, src netip.Addr, want string) {
		t.Helper()
		r, err := trace(ctx, rules.Packet{Src: src, Dst: lbRangesLB, Protocol: rules.TCP, Port: 80})
		require.NoError(t, err)
		require.Equal(t, want, r.Verdict, "trace from %v: %v", src, r.Path)
	}

	t.Run("a client inside the range reaches the load-balancer IP, one outside is dropped", func(t *testing.T) {
		reaches(t, client, lb)
		requireDropped(ctx, t, pod, lb)
		unrestricted(t)
		traced(t, e.ClientIP, "DNAT")
		traced(t, e.Pods[2].IP, "DROP")
		traced(t, lbRangesLB, "DNAT") // the node IP is in the range: the LB IP is an allowed source
	})

	t.Run("ranges changed by a partial sync: the other client is admitted", func(t *testing.T) {
		st.Services[0].LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), e.PodCIDR}
		require.NoError(t, sync(ctx, st))
		reaches(t, pod, lb)
		requireDropped(ctx, t, client, lb)
		unrestricted(t)
		traced(t, e.ClientIP, "DROP")
		traced(t, e.Pods[2].IP, "DNAT")
	})

	t.Run("one range, a plain match", func(t *testing.T) {
		st.Services[0].LoadBalancerSourceRanges = []netip.Prefix{netip.PrefixFrom(e.ClientIP, 32)}
		require.NoError(t, sync(ctx, st))
		reaches(t, client, lb)
		requireDropped(ctx, t, pod, lb)
		unrestricted(t)
	})

	t.Run("ranges removed: everyone reaches the load-balancer IP", func(t *testing.T) {
		st.Services[0].LoadBalancerSourceRanges = nil
		require.NoError(t, sync(ctx, st))
		reaches(t, client, lb)
		reaches(t, pod, lb)
		unrestricted(t)
	})
}
