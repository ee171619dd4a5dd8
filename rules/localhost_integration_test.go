package rules_test

import (
	"context"
	"errors"
	"net"
	"os"
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

// TestIPTablesLocalhostNodePorts: kube-proxy's iptables.localhostNodePorts with
// real packets, through both backends. With it on (and route_localnet=1 set in the
// node namespace, as the agent does), the node reaches a NodePort on 127.0.0.1 and
// the writer keeps PREFIX-FIREWALL, which drops packets to 127.0.0.0/8 that come
// from elsewhere: a packet the client routes to the node's 127.0.0.1 reaches a
// server there without the rule and not with it. With it off, 127.0.0.1 is left
// out of the NodePorts jump: refused, as nothing listens there.
func TestIPTablesLocalhostNodePorts(t *testing.T) {
	for _, mode := range []rules.IPTablesMode{rules.IPTablesNFT, rules.IPTablesLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			bin := "iptables-restore"
			if mode == rules.IPTablesLegacy {
				bin = "iptables-legacy-restore"
			}
			testenv.LookPath(t, bin)
			env := netns.New(t, netns.Config{Pods: 2})
			e := &nftEnv{Env: env}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			require.NoError(t, env.Node.Do(func() error {
				return os.WriteFile("/proc/sys/net/ipv4/conf/all/route_localnet", []byte("1"), 0o644)
			}))
			st := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, NodePort: 30080,
					Endpoints: e.endpoints(0, 1)},
			}}
			writer := func(localhost bool) {
				t.Helper()
				require.NoError(t, env.Node.Do(func() error {
					w, err := rules.NewIPTables(ctx, rules.IPTablesConfig{Mode: mode, Prefix: "NK", ClusterCIDR: env.PodCIDR,
						LocalhostNodePorts: localhost})
					if err != nil {
						return err
					}
					return w.Sync(ctx, st)
				}))
			}
			save := func() string {
				out, err := env.NodeRun(ctx, "", strings.TrimSuffix(bin, "-restore")+"-save", "-t", "filter")
				require.NoError(t, err)
				return out
			}
			localhost := "127.0.0.1:30080"

			t.Run("on: packets to 127.0.0.0/8 from elsewhere are dropped", func(t *testing.T) {
				testMartianDrop(ctx, t, env, func() {}, func() { writer(true) })
			})

			t.Run("on: the node reaches a NodePort on 127.0.0.1", func(t *testing.T) {
				writer(true)
				got := count(ctx, t, env.Node, localhost, 10)
				assert.Len(t, got, 2, "both endpoints serve: %v", got)
				f := save()
				assert.Contains(t, f, "-A INPUT -j NK-FIREWALL\n")
				assert.Contains(t, f, "-A OUTPUT -j NK-FIREWALL\n")
				assert.Contains(t, f, `-A NK-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`)
			})

			t.Run("off: 127.0.0.1 is not a NodePort address", func(t *testing.T) {
				writer(false)
				dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
				conn, err := env.Node.Dial(dctx, "tcp", localhost)
				if conn != nil {
					conn.Close()
				}
				assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "want refused, got %v", err)
				got := count(ctx, t, env.Client, net.JoinHostPort(env.NodeIP.String(), "30080"), 4)
				assert.NotEmpty(t, got, "the node's address still serves")
			})
		})
	}
}

// testMartianDrop sends UDP from the client to 127.0.0.2 on the node, which a
// server there listens on: the client routes that address to the node (its own
// loopback route for 127.0.0.0/8 taken away), and route_localnet=1 on the node
// lets the kernel accept it. before runs first, with no rule in the way, and the
// datagram must arrive; after syncs the writer, and then it must not.
func testMartianDrop(ctx context.Context, t *testing.T, env *netns.Env, before, after func()) {
	t.Helper()
	for _, args := range [][]string{
		{"route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"},
		{"route", "add", "127.0.0.2/32", "via", env.NodeIP.String()},
	} {
		_, err := env.Client.Run(ctx, "", "ip", args...)
		require.NoError(t, err, "ip %v in the client", args)
	}
	require.NoError(t, env.Client.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/route_localnet", []byte("1"), 0o644)
	}))
	var srv net.PacketConn
	require.NoError(t, env.Node.Do(func() (err error) {
		srv, err = net.ListenPacket("udp4", "127.0.0.2:39999")
		return err
	}))
	defer srv.Close()
	// arrives sends payload tries times and reports whether the server got it; the
	// baseline may need a few (ARP, a loaded machine), a drop never lets one by.
	arrives := func(payload string, tries int) bool {
		conn, err := env.Client.Dial(ctx, "udp", "127.0.0.2:39999")
		require.NoError(t, err)
		defer conn.Close()
		buf := make([]byte, 64)
		for range tries {
			_, err = conn.Write([]byte(payload))
			require.NoError(t, err)
			require.NoError(t, srv.SetReadDeadline(time.Now().Add(500*time.Millisecond)))
			for {
				n, _, err := srv.ReadFrom(buf)
				if err != nil {
					break
				}
				if string(buf[:n]) == payload {
					return true
				}
			}
		}
		return false
	}
	before()
	require.True(t, arrives("before", 20), "without the rule the client's datagram to the node's 127.0.0.2 arrives")
	after()
	assert.False(t, arrives("after", 3), "the block incoming localnet connections rule drops it")
}
