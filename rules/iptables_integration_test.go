package rules_test

import (
	"context"
	"errors"
	"net"
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

// TestIPTablesRealPackets runs the same traffic checks through both iptables
// backends, each in its own throw-away node.
func TestIPTablesRealPackets(t *testing.T) {
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
			e := &nftEnv{Env: env}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var w *rules.IPTables
			require.NoError(t, env.Node.Do(func() error {
				var err error
				w, err = rules.NewIPTables(ctx, rules.IPTablesConfig{Mode: mode, Prefix: "NK", ClusterCIDR: env.PodCIDR})
				return err
			}))
			sync := func(st *rules.State) error { return env.Node.Do(func() error { return w.Sync(ctx, st) }) }

			st := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, NodePort: 30080,
					Endpoints: e.endpoints(0, 1, 2)},
				{Namespace: "kube-system", Name: "dns", Protocol: rules.UDP, ClusterIP: dnsVIP, Port: 53, Endpoints: e.udpEndpoints(0, 1)},
				{Namespace: "default", Name: "empty", Protocol: rules.TCP, ClusterIP: noneVIP, Port: 80},
			}}
			// Other tools' chains and rules, among them a real kube-proxy's with the
			// default prefix: no sync may change them.
			ipt := strings.TrimSuffix(bin, "-restore")
			foreign := [][]string{
				{"-t", "nat", "-N", "DOCKER"},
				{"-t", "nat", "-A", "DOCKER", "-d", "192.0.2.7/32", "-p", "tcp", "-m", "tcp", "--dport", "8443", "-j", "DNAT", "--to-destination", "10.244.9.9:443"},
				{"-t", "nat", "-A", "PREROUTING", "-m", "addrtype", "--dst-type", "LOCAL", "-j", "DOCKER"},
				{"-t", "nat", "-N", "KUBE-SERVICES"},
				{"-t", "nat", "-N", "KUBE-SVC-AAAAAAAAAAAAAAAA"},
				{"-t", "nat", "-A", "KUBE-SERVICES", "-d", "192.0.2.8/32", "-p", "tcp", "-m", "tcp", "--dport", "80", "-j", "KUBE-SVC-AAAAAAAAAAAAAAAA"},
				{"-t", "filter", "-N", "DOCKER-USER"},
				{"-t", "filter", "-A", "DOCKER-USER", "-s", "192.0.2.9/32", "-j", "RETURN"},
				{"-t", "filter", "-A", "FORWARD", "-j", "DOCKER-USER"},
			}
			for _, args := range foreign {
				_, err := env.NodeRun(ctx, "", ipt, append([]string{"-w"}, args...)...)
				require.NoError(t, err, "%v", args)
			}
			foreignLines := func(t *testing.T) []string {
				t.Helper()
				out, err := env.NodeRun(ctx, "", ipt+"-save")
				require.NoError(t, err)
				var lines []string
				for _, l := range strings.Split(out, "\n") {
					if strings.Contains(l, "DOCKER") || strings.Contains(l, "KUBE-") {
						lines = append(lines, l)
					}
				}
				return lines
			}
			wantForeign := foreignLines(t)
			require.Len(t, wantForeign, 9, "%q", wantForeign)

			t0 := time.Now()
			require.NoError(t, sync(st))
			t.Logf("first full sync (%s): %s", mode, time.Since(t0))
			assert.Equal(t, wantForeign, foreignLines(t), "a full sync leaves other tools' chains and rules alone")
			vip := net.JoinHostPort(webVIP.String(), "80")

			t.Run("ClusterIP reaches every endpoint roughly evenly", func(t *testing.T) {
				got := count(ctx, t, env.Client, vip, 150)
				require.Len(t, got, 3, "%v", got)
				for pod, n := range got {
					assert.Greater(t, n, 20, "pod %s served %d of 150", pod, n)
				}
			})
			t.Run("a second full sync is idempotent", func(t *testing.T) {
				save := strings.TrimSuffix(bin, "-restore") + "-save"
				before, err := env.NodeRun(ctx, "", save)
				require.NoError(t, err)
				w.ForceFullSync()
				require.NoError(t, sync(st))
				after, err := env.NodeRun(ctx, "", save)
				require.NoError(t, err)
				assert.Equal(t, 4, strings.Count(after, "kubernetes service portals"), "jump rules are not duplicated")
				strip := func(s string) string {
					var out []string
					for _, l := range strings.Split(s, "\n") {
						if strings.HasPrefix(l, "#") {
							continue
						}
						if i := strings.LastIndex(l, " ["); strings.HasPrefix(l, ":") && i > 0 {
							l = l[:i] // packet counters move with traffic
						}
						out = append(out, l)
					}
					return strings.Join(out, "\n")
				}
				assert.Equal(t, strip(before), strip(after))
			})
			t.Run("NodePort and UDP", func(t *testing.T) {
				got := count(ctx, t, env.Client, net.JoinHostPort(env.NodeIP.String(), "30080"), 30)
				assert.Greater(t, len(got), 1, "%v", got)
				pod, err := netns.EchoUDP(ctx, env.Client, net.JoinHostPort(dnsVIP.String(), "53"), "q", 0)
				require.NoError(t, err)
				assert.Contains(t, []string{env.Pods[0].Name, env.Pods[1].Name}, pod)
			})
			t.Run("no endpoints is refused at once", func(t *testing.T) {
				t0 := time.Now()
				_, err := env.Client.Dial(ctx, "tcp", net.JoinHostPort(noneVIP.String(), "80"))
				require.Error(t, err)
				assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "want connection refused, got %v", err)
				assert.Less(t, time.Since(t0), time.Second)
			})
			t.Run("removed endpoint gets nothing new", func(t *testing.T) {
				st.Services[0].Endpoints = e.endpoints(0, 1)
				require.NoError(t, sync(st))
				before := env.Pods[2].HTTPRequests()
				got := count(ctx, t, env.Client, vip, 60)
				assert.Equal(t, before, env.Pods[2].HTTPRequests(), "%v", got)
				assert.Len(t, got, 2)
				chains, err := env.NodeRun(ctx, "", strings.TrimSuffix(bin, "-restore")+"-save", "-t", "nat")
				require.NoError(t, err)
				assert.Equal(t, 4, strings.Count(chains, ":NK-SEP-"), "two web and two dns endpoints: the removed endpoint's chain is deleted")
			})
			t.Run("hairpin", func(t *testing.T) {
				st.Services[0].Endpoints = e.endpoints(1)
				require.NoError(t, sync(st))
				c := env.Pods[1].HTTPClient(2 * time.Second)
				defer c.CloseIdleConnections()
				pod, remote, err := netns.Get(ctx, c, vip)
				require.NoError(t, err)
				assert.Equal(t, env.Pods[1].Name, pod)
				assert.True(t, strings.HasPrefix(remote, env.GatewayIP.String()+":"), "masqueraded: %s", remote)
			})
			t.Run("session affinity pins a client", func(t *testing.T) {
				st.Services[0].Endpoints = e.endpoints(0, 1, 2)
				st.Services[0].AffinityTimeout = rules.DefaultAffinityTimeout
				require.NoError(t, sync(st))
				got := count(ctx, t, env.Client, vip, 30)
				assert.Len(t, got, 1, "%v", got)
				st.Services[0].AffinityTimeout = 0
				require.NoError(t, sync(st))
			})
			t.Run("drift and trace against hand-corrupted chains", func(t *testing.T) {
				inNode := func(fn func() error) { require.NoError(t, env.Node.Do(fn)) }
				var drift []rules.Drift
				inNode(func() (err error) { drift, err = w.Drift(ctx, st); return })
				require.Empty(t, drift)
				var tr *rules.TraceResult
				inNode(func() (err error) {
					tr, err = w.Trace(ctx, rules.Packet{Src: env.ClientIP, Dst: webVIP, Protocol: rules.TCP, Port: 80})
					return
				})
				assert.Equal(t, "DNAT", tr.Verdict)
				assert.ElementsMatch(t, e.endpoints(0, 1, 2), tr.Candidates)
				inNode(func() (err error) {
					tr, err = w.Trace(ctx, rules.Packet{Src: env.ClientIP, Dst: noneVIP, Protocol: rules.TCP, Port: 80})
					return
				})
				assert.Equal(t, "REJECT", tr.Verdict)

				var kernel []rules.KernelService
				inNode(func() (err error) { kernel, err = w.ReadBack(ctx); return })
				var svcChain string
				for _, k := range kernel {
					if k.Dest == webVIP.String()+" . tcp . 80" {
						svcChain = k.Verdict
					}
				}
				require.True(t, strings.HasPrefix(svcChain, "NK-SVC-"), svcChain)
				ipt := strings.TrimSuffix(bin, "-restore")
				for _, args := range [][]string{
					{"-t", "nat", "-N", "NK-SEP-AAAAAAAAAAAAAAAA"},
					{"-t", "nat", "-A", "NK-SEP-AAAAAAAAAAAAAAAA", "-p", "tcp", "-j", "DNAT", "--to-destination", "10.244.1.99:8080"},
					{"-t", "nat", "-I", svcChain, "1", "-j", "NK-SEP-AAAAAAAAAAAAAAAA"},
					{"-t", "filter", "-D", "NK-SERVICES", "-d", noneVIP.String() + "/32", "-p", "tcp", "-m", "comment", "--comment", "default/empty has no endpoints", "-m", "tcp", "--dport", "80", "-j", "REJECT"},
				} {
					_, err := env.NodeRun(ctx, "", ipt, append([]string{"-w"}, args...)...)
					require.NoError(t, err, "%v", args)
				}
				inNode(func() (err error) { drift, err = w.Drift(ctx, st); return })
				kinds := map[rules.DriftKind]int{}
				for _, d := range drift {
					kinds[d.Kind]++
					t.Log(d)
				}
				assert.Equal(t, map[rules.DriftKind]int{rules.StaleEndpoint: 1, rules.MissingService: 1}, kinds)
				w.ForceFullSync()
				require.NoError(t, sync(st))
				inNode(func() (err error) { drift, err = w.Drift(ctx, st); return })
				assert.Empty(t, drift, "a full sync repairs the chains")
				save, err := env.NodeRun(ctx, "", ipt+"-save", "-t", "nat")
				require.NoError(t, err)
				assert.NotContains(t, save, "NK-SEP-AAAAAAAAAAAAAAAA", "a full sync deletes chains of its prefix that it does not want")
			})
			t.Run("a refused sync leaves the previous rules serving", func(t *testing.T) {
				// Corrupt the kernel: a rule in a writer-owned chain from outside makes
				// the -X of the chain the next sync deletes fail.
				out, err := env.NodeRun(ctx, "", strings.TrimSuffix(bin, "-restore")+"-save", "-t", "nat")
				require.NoError(t, err)
				var sep string
				for _, line := range strings.Split(out, "\n") {
					if strings.HasPrefix(line, ":NK-SEP-") {
						sep = strings.Fields(line)[0][1:]
						break
					}
				}
				require.NotEmpty(t, sep)
				ipt := strings.TrimSuffix(bin, "-restore")
				_, err = env.NodeRun(ctx, "", ipt, "-w", "-t", "nat", "-N", "INTRUDER")
				require.NoError(t, err)
				_, err = env.NodeRun(ctx, "", ipt, "-w", "-t", "nat", "-A", "INTRUDER", "-j", sep)
				require.NoError(t, err)
				st.Services[0].Endpoints = nil
				err = sync(st)
				require.ErrorIs(t, err, rules.ErrApplyFailed)
				got := count(ctx, t, env.Client, vip, 30)
				assert.Len(t, got, 3, "the previous nat rules still serve: %v", got)
				filter, err := env.NodeRun(ctx, "", ipt+"-save", "-t", "filter")
				require.NoError(t, err)
				assert.NotContains(t, filter, "default/web has no endpoints", "nat is written first, so its failure leaves filter untouched too")
				_, err = env.NodeRun(ctx, "", ipt, "-w", "-t", "nat", "-F", "INTRUDER")
				require.NoError(t, err)
				require.NoError(t, sync(st))
				_, err = env.Client.Dial(ctx, "tcp", vip)
				assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "no endpoints now: %v", err)
			})
			t.Run("other tools' chains and rules survive every sync", func(t *testing.T) {
				w.ForceFullSync()
				require.NoError(t, sync(st))
				st.Services[1].Endpoints = e.udpEndpoints(1)
				require.NoError(t, sync(st))
				assert.Equal(t, wantForeign, foreignLines(t))
			})
		})
	}
}
