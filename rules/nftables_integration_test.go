package rules_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
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

// nftEnv is a netns node with an nftables writer whose nft runs in the node namespace.
type nftEnv struct {
	*netns.Env
	w *rules.NFTables
}

func newNFTEnv(t *testing.T, pods int, cfg rules.NFTablesConfig) *nftEnv {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	testenv.LookPath(t, "nft")
	env := netns.New(t, netns.Config{Pods: pods})
	if !cfg.ClusterCIDR.IsValid() {
		cfg.ClusterCIDR = env.PodCIDR
	}
	var w *rules.NFTables
	require.NoError(t, env.Node.Do(func() error {
		var err error
		w, err = rules.NewNFTables(cfg)
		return err
	}))
	return &nftEnv{Env: env, w: w}
}

func (e *nftEnv) sync(ctx context.Context, st *rules.State) error {
	return e.Node.Do(func() error { return e.w.Sync(ctx, st) })
}

func (e *nftEnv) endpoints(pods ...int) []rules.Endpoint {
	var eps []rules.Endpoint
	for _, i := range pods {
		eps = append(eps, rules.Endpoint{IP: e.Pods[i].IP, Port: e.Pods[i].HTTPPort})
	}
	return eps
}

func (e *nftEnv) udpEndpoints(pods ...int) []rules.Endpoint {
	var eps []rules.Endpoint
	for _, i := range pods {
		eps = append(eps, rules.Endpoint{IP: e.Pods[i].IP, Port: e.Pods[i].UDPPort})
	}
	return eps
}

// count sends n requests to addr from ns and counts the serving pods.
func count(ctx context.Context, t *testing.T, ns *netns.Namespace, addr string, n int) map[string]int {
	t.Helper()
	c := ns.HTTPClient(2 * time.Second)
	defer c.CloseIdleConnections()
	got := map[string]int{}
	for range n {
		pod, _, err := netns.Get(ctx, c, addr)
		require.NoError(t, err, "GET %s from %s", addr, ns.Name)
		got[pod]++
	}
	return got
}

var (
	webVIP  = netip.MustParseAddr("10.96.0.10")
	dnsVIP  = netip.MustParseAddr("10.96.0.53")
	noneVIP = netip.MustParseAddr("10.96.0.99")
)

func TestNFTablesRealPackets(t *testing.T) {
	e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	web := rules.Service{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80,
		NodePort: 30080, Endpoints: e.endpoints(0, 1, 2)}
	dns := rules.Service{Namespace: "kube-system", Name: "dns", PortName: "dns", Protocol: rules.UDP, ClusterIP: dnsVIP,
		Port: 53, Endpoints: e.udpEndpoints(0, 1, 2)}
	none := rules.Service{Namespace: "default", Name: "empty", Protocol: rules.TCP, ClusterIP: noneVIP, Port: 80}
	st := &rules.State{Services: []rules.Service{web, dns, none}}
	start := time.Now()
	require.NoError(t, e.sync(ctx, st))
	t.Logf("first full sync of %d services: %s", len(st.Services), time.Since(start))
	vip := net.JoinHostPort(webVIP.String(), "80")

	t.Run("ClusterIP traffic reaches every endpoint roughly evenly", func(t *testing.T) {
		got := count(ctx, t, e.Client, vip, 150)
		require.Len(t, got, 3, "%v", got)
		for pod, n := range got {
			assert.Greater(t, n, 20, "pod %s served %d of 150", pod, n)
		}
	})

	t.Run("in-cluster traffic from a pod", func(t *testing.T) {
		got := count(ctx, t, e.Pods[1].Namespace, vip, 30)
		assert.Greater(t, len(got), 1, "%v", got)
	})

	t.Run("NodePort from outside", func(t *testing.T) {
		got := count(ctx, t, e.Client, net.JoinHostPort(e.NodeIP.String(), "30080"), 30)
		assert.Greater(t, len(got), 1, "%v", got)
	})

	t.Run("UDP through the ClusterIP", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 30 {
			pod, err := netns.EchoUDP(ctx, e.Client, net.JoinHostPort(dnsVIP.String(), "53"), fmt.Sprint("q", i), 0)
			require.NoError(t, err)
			seen[pod] = true
		}
		assert.Greater(t, len(seen), 1)
	})

	t.Run("a service with no endpoints is refused at once", func(t *testing.T) {
		t0 := time.Now()
		_, err := e.Client.Dial(ctx, "tcp", net.JoinHostPort(noneVIP.String(), "80"))
		require.Error(t, err)
		assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "want connection refused, got %v", err)
		assert.Less(t, time.Since(t0), time.Second)
	})

	t.Run("a removed endpoint gets nothing new", func(t *testing.T) {
		st.Services[0].Endpoints = e.endpoints(0, 1)
		require.NoError(t, e.sync(ctx, st))
		before := e.Pods[2].HTTPRequests()
		got := count(ctx, t, e.Client, vip, 60)
		assert.Equal(t, before, e.Pods[2].HTTPRequests(), "pod-2 was removed but served %v", got)
		assert.Len(t, got, 2)
	})

	t.Run("hairpin: a pod reaches itself through its service", func(t *testing.T) {
		st.Services[0].Endpoints = e.endpoints(2)
		require.NoError(t, e.sync(ctx, st))
		c := e.Pods[2].HTTPClient(2 * time.Second)
		defer c.CloseIdleConnections()
		pod, remote, err := netns.Get(ctx, c, vip)
		require.NoError(t, err)
		assert.Equal(t, e.Pods[2].Name, pod)
		assert.True(t, strings.HasPrefix(remote, e.GatewayIP.String()+":"), "hairpin traffic is masqueraded, pod saw %s", remote)
	})

	t.Run("session affinity pins a client", func(t *testing.T) {
		st.Services[0].Endpoints = e.endpoints(0, 1, 2)
		st.Services[0].AffinityTimeout = rules.DefaultAffinityTimeout
		require.NoError(t, e.sync(ctx, st))
		got := count(ctx, t, e.Client, vip, 30)
		assert.Len(t, got, 1, "one client, one endpoint: %v", got)
		// A new timeout re-creates the sets (a partial sync), and a forced full sync
		// keeps the affinity entries: the client stays where it was.
		st.Services[0].AffinityTimeout = time.Minute
		require.NoError(t, e.sync(ctx, st))
		got = count(ctx, t, e.Client, vip, 10)
		assert.Len(t, got, 1, "%v", got)
		e.w.ForceFullSync()
		require.NoError(t, e.sync(ctx, st))
		again := count(ctx, t, e.Client, vip, 10)
		assert.Equal(t, slices.Collect(maps.Keys(got)), slices.Collect(maps.Keys(again)), "a full sync keeps the pin")
		st.Services[0].AffinityTimeout = 0
		require.NoError(t, e.sync(ctx, st))
		got = count(ctx, t, e.Client, vip, 60)
		assert.Len(t, got, 3, "affinity off again: %v", got)
	})

	t.Run("a refused sync leaves the previous rules serving", func(t *testing.T) {
		// Corrupt the kernel behind the writer's back: the next partial sync deletes an
		// element that is no longer there, so the kernel refuses the whole transaction.
		_, err := e.NodeRun(ctx, "", "nft", "flush", "set", "ip", "nodekit", "hairpin-connections")
		require.NoError(t, err)
		st.Services[0].Endpoints = e.endpoints(0)
		err = e.sync(ctx, st)
		require.ErrorIs(t, err, rules.ErrApplyFailed)
		got := count(ctx, t, e.Client, vip, 45)
		assert.Len(t, got, 3, "the old rules (three endpoints) still serve: %v", got)
		// The next sync is full and repairs the table.
		require.NoError(t, e.sync(ctx, st))
		got = count(ctx, t, e.Client, vip, 20)
		assert.Equal(t, map[string]int{e.Pods[0].Name: 20}, got)
	})

	t.Run("the same state twice writes nothing", func(t *testing.T) {
		out, err := e.w.DryRun(ctx, st)
		require.NoError(t, err)
		assert.Empty(t, out)
	})
}

// TestWriterExits is the seed's story: the process that wrote the rules exits, and
// traffic keeps flowing on what it left in the kernel. For every backend.
func TestWriterExits(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			testenv.LookPath(t, backendTool(backend))
			env := netns.New(t, netns.Config{Pods: 2})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st := rules.State{Services: []rules.Service{{Namespace: "default", Name: "web", Protocol: rules.TCP,
				ClusterIP: webVIP, Port: 80, Endpoints: []rules.Endpoint{
					{IP: env.Pods[0].IP, Port: env.Pods[0].HTTPPort}, {IP: env.Pods[1].IP, Port: env.Pods[1].HTTPPort}}}}}
			payload, err := json.Marshal(st)
			require.NoError(t, err)
			self, err := os.Executable()
			require.NoError(t, err)
			cmd := exec.CommandContext(ctx, self)
			cmd.Env = append(os.Environ(), writerEnv+"="+backend, writerStateEnv+"="+string(payload), writerTableEnv+"="+backendName(backend))
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, env.Node.Start(cmd))
			require.NoError(t, cmd.Wait(), "writer process: %s", out.String())
			require.True(t, cmd.ProcessState.Exited())

			got := count(ctx, t, env.Client, net.JoinHostPort(webVIP.String(), "80"), 40)
			assert.Len(t, got, 2, "rules left by the exited writer balance over both pods: %v", got)
		})
	}
}

// TestSyncsUnderLoad: 100 consecutive syncs, alternating the endpoint set, while a
// client sends requests without pause: no request fails. For every backend.
func TestSyncsUnderLoad(t *testing.T) {
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			testenv.RequireRoot(t)
			testenv.RequireLong(t)
			testenv.LookPath(t, backendTool(backend))
			env := netns.New(t, netns.Config{Pods: 3})
			e := &nftEnv{Env: env}
			ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
			defer cancel()
			var w rules.Syncer
			require.NoError(t, env.Node.Do(func() (err error) {
				w, err = newSyncer(ctx, backend, backendName(backend))
				return err
			}))
			sync := func(st *rules.State) error { return env.Node.Do(func() error { return w.Sync(ctx, st) }) }
			svc := func(pods ...int) *rules.State {
				return &rules.State{Services: []rules.Service{{Namespace: "default", Name: "web", Protocol: rules.TCP,
					ClusterIP: webVIP, Port: 80, Endpoints: e.endpoints(pods...)}}}
			}
			require.NoError(t, sync(svc(0, 1, 2)))

			stop := make(chan struct{})
			type result struct {
				ok, failed int
				firstErr   error
			}
			done := make(chan result)
			go func() {
				var r result
				c := env.Client.HTTPClient(2 * time.Second)
				defer c.CloseIdleConnections()
				for {
					select {
					case <-stop:
						done <- r
						return
					default:
					}
					if _, _, err := netns.Get(ctx, c, net.JoinHostPort(webVIP.String(), "80")); err != nil {
						r.failed++
						if r.firstErr == nil {
							r.firstErr = err
						}
					} else {
						r.ok++
					}
				}
			}()
			var total time.Duration
			for i := range 100 {
				st := svc(0, 1, 2)
				if i%2 == 0 {
					st = svc(0, 1)
				}
				t0 := time.Now()
				require.NoError(t, sync(st))
				total += time.Since(t0)
				time.Sleep(5 * time.Millisecond)
			}
			close(stop)
			r := <-done
			t.Logf("%s: 100 partial syncs, mean %s; %d requests served, %d failed", backend, total/100, r.ok, r.failed)
			assert.Zero(t, r.failed, "first error: %v", r.firstErr)
			assert.Greater(t, r.ok, 50)
		})
	}
}

// TestNFTablesStaleChains: a deleted service's chains are flushed at once and gone
// from the kernel after the next sync.
func TestNFTablesStaleChains(t *testing.T) {
	e := newNFTEnv(t, 1, rules.NFTablesConfig{Table: "nodekit"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := rules.Service{Namespace: "default", Name: "a", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80,
		Endpoints: e.endpoints(0), AffinityTimeout: time.Minute}
	b := rules.Service{Namespace: "default", Name: "b", Protocol: rules.TCP, ClusterIP: noneVIP, Port: 80, Endpoints: e.endpoints(0)}
	require.NoError(t, e.sync(ctx, &rules.State{Services: []rules.Service{a, b}}))
	chains := func() string {
		out, err := e.NodeRun(ctx, "", "nft", "list", "chains", "ip")
		require.NoError(t, err)
		return out
	}
	require.Contains(t, chains(), "default/a/tcp/")
	require.NoError(t, e.sync(ctx, &rules.State{Services: []rules.Service{b}}))
	sets, err := e.NodeRun(ctx, "", "nft", "list", "sets", "ip")
	require.NoError(t, err)
	assert.NotContains(t, sets, "affinity-", "stale affinity sets go at once")
	require.NoError(t, e.sync(ctx, &rules.State{Services: []rules.Service{b}}))
	assert.NotContains(t, chains(), "default/a/tcp/")
	assert.Contains(t, chains(), "default/b/tcp/")
	_, err = e.Client.Dial(ctx, "tcp", net.JoinHostPort(webVIP.String(), "80"))
	assert.Error(t, err, "the deleted service no longer answers")
}

// TestConntrackStaleUDP: a client that keeps its UDP source port stays on its old
// endpoint after the endpoint is removed, until the stale flow is cleaned; then its
// next datagram reaches the new endpoint.
func TestConntrackStaleUDP(t *testing.T) {
	e := newNFTEnv(t, 2, rules.NFTablesConfig{Table: "nodekit"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dns := rules.Service{Namespace: "kube-system", Name: "dns", Protocol: rules.UDP, ClusterIP: dnsVIP, Port: 53,
		Endpoints: e.udpEndpoints(0)}
	st := &rules.State{Services: []rules.Service{dns}}
	require.NoError(t, e.sync(ctx, st))

	conn, err := e.Client.Dial(ctx, "udp4", net.JoinHostPort(dnsVIP.String(), "53"))
	require.NoError(t, err)
	defer conn.Close()
	ask := func() string {
		t.Helper()
		require.NoError(t, conn.SetDeadline(time.Now().Add(2*time.Second)))
		_, err := conn.Write([]byte("q"))
		require.NoError(t, err)
		buf := make([]byte, 512)
		n, err := conn.Read(buf)
		require.NoError(t, err)
		pod, _, _ := strings.Cut(string(buf[:n]), " ")
		return pod
	}
	require.Equal(t, e.Pods[0].Name, ask())

	st.Services[0].Endpoints = e.udpEndpoints(1)
	require.NoError(t, e.sync(ctx, st))
	assert.Equal(t, e.Pods[0].Name, ask(), "the conntrack entry still points at the removed endpoint")

	n, err := rules.NewConntrackCleaner(e.Node.Netlink()).CleanStaleUDP(ctx, st)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, e.Pods[1].Name, ask(), "after cleanup the flow moves to the serving endpoint")
	n, err = rules.NewConntrackCleaner(e.Node.Netlink()).CleanStaleUDP(ctx, st)
	require.NoError(t, err)
	assert.Zero(t, n, "nothing stale is left")
}

// TestNFTablesDriftAndTrace checks read-back, drift and trace against kernel state
// corrupted by hand behind the writer's back.
func TestNFTablesDriftAndTrace(t *testing.T) {
	e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st := &rules.State{Services: []rules.Service{
		{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, Endpoints: e.endpoints(0, 1, 2)},
		{Namespace: "default", Name: "empty", Protocol: rules.TCP, ClusterIP: noneVIP, Port: 80},
	}}
	require.NoError(t, e.sync(ctx, st))
	inNode := func(fn func() error) { require.NoError(t, e.Node.Do(fn)) }

	var drift []rules.Drift
	inNode(func() (err error) { drift, err = e.w.Drift(ctx, st); return })
	assert.Empty(t, drift, "freshly synced")

	var tr *rules.TraceResult
	inNode(func() (err error) {
		tr, err = e.w.Trace(ctx, rules.Packet{Src: e.ClientIP, Dst: webVIP, Protocol: rules.TCP, Port: 80})
		return
	})
	assert.Equal(t, "DNAT", tr.Verdict)
	assert.ElementsMatch(t, e.endpoints(0, 1, 2), tr.Candidates)
	assert.True(t, tr.Masquerade, "the client is outside the cluster CIDR")
	inNode(func() (err error) {
		tr, err = e.w.Trace(ctx, rules.Packet{Src: e.ClientIP, Dst: noneVIP, Protocol: rules.TCP, Port: 80})
		return
	})
	assert.Equal(t, "REJECT", tr.Verdict)
	inNode(func() (err error) {
		tr, err = e.w.Trace(ctx, rules.Packet{Src: e.ClientIP, Dst: webVIP, Protocol: rules.TCP, Port: 81})
		return
	})
	assert.Equal(t, "REJECT", tr.Verdict, "known ClusterIP, unknown port")

	// Hand corruption: the web chain now points at a pod that is gone, the empty
	// service's reject entry is deleted, and a stray VIP is steered.
	var kernel []rules.KernelService
	inNode(func() (err error) { kernel, err = e.w.ReadBack(ctx); return })
	var webChain string
	for _, k := range kernel {
		if k.Dest == webVIP.String()+" . tcp . 80" {
			webChain = strings.TrimPrefix(k.Verdict, "goto ")
		}
	}
	require.NotEmpty(t, webChain)
	script := fmt.Sprintf(`flush chain ip nodekit %[1]s
add rule ip nodekit %[1]s meta l4proto tcp dnat to 10.244.1.99:8080
delete element ip nodekit no-endpoint-services { %[2]s . tcp . 80 }
add element ip nodekit service-ips { 10.96.0.77 . tcp . 80 : goto %[1]s }
`, webChain, noneVIP)
	_, err := e.NodeRun(ctx, script, "nft", "-f", "-")
	require.NoError(t, err)

	inNode(func() (err error) { drift, err = e.w.Drift(ctx, st); return })
	kinds := map[rules.DriftKind]int{}
	for _, d := range drift {
		kinds[d.Kind]++
		t.Log(d)
	}
	assert.Equal(t, map[rules.DriftKind]int{
		rules.StaleEndpoint: 1, rules.MissingEndpoint: 3, rules.MissingService: 1, rules.UnexpectedService: 1,
	}, kinds)
	inNode(func() (err error) {
		tr, err = e.w.Trace(ctx, rules.Packet{Src: e.ClientIP, Dst: webVIP, Protocol: rules.TCP, Port: 80})
		return
	})
	assert.Equal(t, []rules.Endpoint{{IP: netip.MustParseAddr("10.244.1.99"), Port: 8080}}, tr.Candidates)

	// A partial sync writes only what changed in st, so it does not see the
	// corruption; a forced full sync repairs everything drift found.
	require.NoError(t, e.sync(ctx, st))
	inNode(func() (err error) { drift, err = e.w.Drift(ctx, st); return })
	assert.Len(t, drift, 6, "a no-op partial sync leaves the corruption")
	e.w.ForceFullSync()
	require.NoError(t, e.sync(ctx, st))
	inNode(func() (err error) { drift, err = e.w.Drift(ctx, st); return })
	assert.Empty(t, drift, "%v", drift)
}
