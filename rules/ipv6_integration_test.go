package rules_test

import (
	"context"
	"errors"
	"fmt"
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
	webVIP6  = netip.MustParseAddr("fd00:10:96::10")
	dnsVIP6  = netip.MustParseAddr("fd00:10:96::53")
	noneVIP6 = netip.MustParseAddr("fd00:10:96::99")
)

// TestIPv6RealPackets: on a dual-stack node, an IPv6 writer and an IPv4 writer of
// the same backend serve side by side (upstream's one proxier per family): IPv6
// ClusterIP, NodePort, UDP, no-endpoints REJECT and endpoint changes through every
// backend, while the IPv4 service keeps answering.
func TestIPv6RealPackets(t *testing.T) {
	type writer interface {
		Sync(context.Context, *rules.State) error
		Drift(context.Context, *rules.State) ([]rules.Drift, error)
		Trace(context.Context, rules.Packet) (*rules.TraceResult, error)
	}
	for _, tc := range []struct {
		name string
		bin  string
		make func(ctx context.Context, f rules.Family, env *netns.Env) (writer, error)
	}{
		{"nftables-netlink", "nft", func(_ context.Context, f rules.Family, env *netns.Env) (writer, error) {
			return nftWriter(f, env, rules.NFTablesNetlink)
		}},
		{"nftables-cli", "nft", func(_ context.Context, f rules.Family, env *netns.Env) (writer, error) {
			return nftWriter(f, env, rules.NFTablesCLI)
		}},
		{"iptables-nft", "ip6tables-restore", func(ctx context.Context, f rules.Family, env *netns.Env) (writer, error) {
			return iptWriter(ctx, f, env, rules.IPTablesNFT)
		}},
		{"iptables-legacy", "ip6tables-legacy-restore", func(ctx context.Context, f rules.Family, env *netns.Env) (writer, error) {
			return iptWriter(ctx, f, env, rules.IPTablesLegacy)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			testenv.LookPath(t, tc.bin)
			env := netns.New(t, netns.Config{Pods: 3, IPv6: true})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			var w6, w4 writer
			require.NoError(t, env.Node.Do(func() (err error) {
				if w6, err = tc.make(ctx, rules.IPv6, env); err != nil {
					return err
				}
				w4, err = tc.make(ctx, rules.IPv4, env)
				return err
			}))
			sync := func(w writer, st *rules.State) error { return env.Node.Do(func() error { return w.Sync(ctx, st) }) }
			eps6 := func(port func(*netns.Pod) int, pods ...int) []rules.Endpoint {
				var out []rules.Endpoint
				for _, i := range pods {
					out = append(out, rules.Endpoint{IP: env.Pods[i].IP6, Port: port(env.Pods[i])})
				}
				return out
			}
			http := func(p *netns.Pod) int { return p.HTTPPort }
			udp := func(p *netns.Pod) int { return p.UDPPort }
			st6 := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP6, Port: 80, NodePort: 30080,
					Endpoints: eps6(http, 0, 1, 2)},
				{Namespace: "kube-system", Name: "dns", Protocol: rules.UDP, ClusterIP: dnsVIP6, Port: 53, Endpoints: eps6(udp, 0, 1)},
				{Namespace: "default", Name: "empty", Protocol: rules.TCP, ClusterIP: noneVIP6, Port: 80},
			}}
			st4 := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, NodePort: 30080,
					Endpoints: []rules.Endpoint{{IP: env.Pods[0].IP, Port: env.Pods[0].HTTPPort}}},
			}}
			start := time.Now()
			require.NoError(t, sync(w6, st6))
			t.Logf("first IPv6 sync: %s", time.Since(start))
			require.NoError(t, sync(w4, st4))
			vip := net.JoinHostPort(webVIP6.String(), "80")

			t.Run("read-back: no drift, trace to the endpoints", func(t *testing.T) {
				var drift []rules.Drift
				require.NoError(t, env.Node.Do(func() (err error) { drift, err = w6.Drift(ctx, st6); return err }))
				assert.Empty(t, drift)
				// A changed endpoint list behind the writer's back is reported.
				other := st6.Clone()
				other.Services[0].Endpoints = other.Services[0].Endpoints[:1]
				require.NoError(t, env.Node.Do(func() (err error) { drift, err = w6.Drift(ctx, other); return err }))
				assert.NotEmpty(t, drift)
				t.Logf("drift against a state with one endpoint: %v", drift)
				var tr *rules.TraceResult
				require.NoError(t, env.Node.Do(func() (err error) {
					tr, err = w6.Trace(ctx, rules.Packet{Src: env.ClientIP6, Dst: webVIP6, Protocol: rules.TCP, Port: 80})
					return err
				}))
				assert.Equal(t, "DNAT", tr.Verdict)
				assert.ElementsMatch(t, st6.Services[0].Endpoints, tr.Candidates)
				require.NoError(t, env.Node.Do(func() (err error) {
					tr, err = w6.Trace(ctx, rules.Packet{Src: env.ClientIP6, Dst: noneVIP6, Protocol: rules.TCP, Port: 80})
					return err
				}))
				assert.Equal(t, "REJECT", tr.Verdict)
			})

			t.Run("ClusterIP from outside reaches every endpoint", func(t *testing.T) {
				got := count(ctx, t, env.Client, vip, 60)
				assert.Len(t, got, 3, "%v", got)
			})
			t.Run("ClusterIP from a pod", func(t *testing.T) {
				got := count(ctx, t, env.Pods[1].Namespace, vip, 30)
				assert.Greater(t, len(got), 1, "%v", got)
			})
			t.Run("NodePort on the node's IPv6 address", func(t *testing.T) {
				got := count(ctx, t, env.Client, net.JoinHostPort(env.NodeIP6.String(), "30080"), 30)
				assert.Greater(t, len(got), 1, "%v", got)
			})
			t.Run("UDP through the ClusterIP", func(t *testing.T) {
				seen := map[string]bool{}
				for i := range 20 {
					pod, err := netns.EchoUDP(ctx, env.Client, net.JoinHostPort(dnsVIP6.String(), "53"), fmt.Sprint("q", i), 0)
					require.NoError(t, err)
					seen[pod] = true
				}
				assert.Greater(t, len(seen), 1)
			})
			t.Run("no endpoints: refused, not dropped", func(t *testing.T) {
				// The REJECT answers the first SYN at once, but over IPv6 that
				// ICMPv6 error reaches the client's TCP while connect() still holds
				// the socket (the whole path runs in one softirq), and the kernel
				// drops it (LockDroppedIcmps in /proc/net/netstat counts it); the
				// SYN retransmitted after 1 s is refused. So: refused, within one
				// retransmission, where a DROP would time out.
				t0 := time.Now()
				_, err := env.Client.Dial(ctx, "tcp", net.JoinHostPort(noneVIP6.String(), "80"))
				require.Error(t, err)
				assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "want connection refused, got %v", err)
				assert.Less(t, time.Since(t0), 2*time.Second)
			})
			t.Run("IPv4 beside it", func(t *testing.T) {
				got := count(ctx, t, env.Client, net.JoinHostPort(webVIP.String(), "80"), 10)
				assert.Equal(t, map[string]int{env.Pods[0].Name: 10}, got)
			})
			t.Run("endpoint change", func(t *testing.T) {
				st6.Services[0].Endpoints = eps6(http, 2)
				require.NoError(t, sync(w6, st6))
				before := env.Pods[0].HTTPRequests() + env.Pods[1].HTTPRequests()
				got := count(ctx, t, env.Client, vip, 20)
				assert.Equal(t, map[string]int{env.Pods[2].Name: 20}, got)
				assert.Equal(t, before, env.Pods[0].HTTPRequests()+env.Pods[1].HTTPRequests(), "removed endpoints served")
				// The client is masqueraded (it is outside the cluster CIDR).
				c := env.Client.HTTPClient(2 * time.Second)
				defer c.CloseIdleConnections()
				_, remote, err := netns.Get(ctx, c, vip)
				require.NoError(t, err)
				assert.True(t, strings.HasPrefix(remote, "["+env.GatewayIP6.String()+"]:"), "masqueraded to the bridge address, pod saw %s", remote)
				// An IPv6 sync leaves the IPv4 family alone.
				got = count(ctx, t, env.Client, net.JoinHostPort(webVIP.String(), "80"), 5)
				assert.Equal(t, map[string]int{env.Pods[0].Name: 5}, got)
			})
		})
	}
}

func nftWriter(f rules.Family, env *netns.Env, a rules.NFTablesApplier) (*rules.NFTables, error) {
	cidr := env.PodCIDR
	if f == rules.IPv6 {
		cidr = env.PodCIDR6
	}
	return rules.NewNFTables(rules.NFTablesConfig{Family: f, Table: "nodekit", Applier: a, ClusterCIDR: cidr})
}

func iptWriter(ctx context.Context, f rules.Family, env *netns.Env, mode rules.IPTablesMode) (*rules.IPTables, error) {
	cidr := env.PodCIDR
	if f == rules.IPv6 {
		cidr = env.PodCIDR6
	}
	return rules.NewIPTables(ctx, rules.IPTablesConfig{Family: f, Mode: mode, Prefix: "NK", ClusterCIDR: cidr})
}
