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

// TestNFTablesRealPackets runs real traffic against both appliers: netlink (the
// default) and the nft CLI.
func TestNFTablesRealPackets(t *testing.T) {
	for _, applier := range []rules.NFTablesApplier{rules.NFTablesNetlink, rules.NFTablesCLI} {
		t.Run(string(applier), func(t *testing.T) { testNFTablesRealPackets(t, applier) })
	}
}

func testNFTablesRealPackets(t *testing.T, applier rules.NFTablesApplier) {
	e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit", Applier: applier})
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
		assert.Contains(t, err.Error(), "hairpin-connections", "the error names the command the kernel refused")
		t.Logf("refused sync: %v", err)
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

// equivalenceState has every shape the writer emits: several endpoints, one
// endpoint, session affinity, no endpoints with reject and with drop, NodePorts,
// external and load-balancer IPs, a service with two ports, TCP and UDP.
func equivalenceState() *rules.State {
	ep := func(s string, port int) rules.Endpoint { return rules.Endpoint{IP: netip.MustParseAddr(s), Port: port} }
	addr := netip.MustParseAddr
	return &rules.State{Services: []rules.Service{
		{Namespace: "default", Name: "web", PortName: "http", Protocol: rules.TCP, ClusterIP: addr("10.96.0.10"), Port: 80,
			NodePort: 30080, ExternalIPs: []netip.Addr{addr("192.0.2.100")}, LoadBalancerIPs: []netip.Addr{addr("203.0.113.7")},
			Endpoints: []rules.Endpoint{ep("10.244.1.10", 8080), ep("10.244.1.11", 8080), ep("10.244.1.12", 8080)}},
		{Namespace: "default", Name: "web", PortName: "https", Protocol: rules.TCP, ClusterIP: addr("10.96.0.10"), Port: 443,
			Endpoints: []rules.Endpoint{ep("10.244.1.10", 8443)}},
		{Namespace: "default", Name: "sticky", Protocol: rules.TCP, ClusterIP: addr("10.96.0.11"), Port: 80, NodePort: 30081,
			AffinityTimeout: rules.DefaultAffinityTimeout,
			Endpoints:       []rules.Endpoint{ep("10.244.1.10", 8080), ep("10.244.1.11", 8080)}},
		{Namespace: "kube-system", Name: "dns", PortName: "dns", Protocol: rules.UDP, ClusterIP: addr("10.96.0.53"), Port: 53,
			Endpoints: []rules.Endpoint{ep("10.244.1.12", 9090), ep("10.244.1.11", 9090)}},
		{Namespace: "default", Name: "empty", Protocol: rules.TCP, ClusterIP: addr("10.96.0.12"), Port: 80, NodePort: 30082,
			ExternalIPs: []netip.Addr{addr("192.0.2.101")}},
		{Namespace: "default", Name: "local", Protocol: rules.UDP, ClusterIP: addr("10.96.0.13"), Port: 5000, NodePort: 30083,
			NoEndpoints: rules.Drop},
		{Namespace: "default", Name: "ext-local", Protocol: rules.TCP, ClusterIP: addr("10.96.0.14"), Port: 80, NodePort: 30084,
			LoadBalancerIPs: []netip.Addr{addr("203.0.113.8")}, ExternalLocal: true, AffinityTimeout: rules.DefaultAffinityTimeout,
			Endpoints:      []rules.Endpoint{ep("10.244.1.10", 8080), ep("10.244.1.11", 8080)},
			LocalEndpoints: []rules.Endpoint{ep("10.244.1.11", 8080)}},
		{Namespace: "default", Name: "ext-local-none", Protocol: rules.TCP, ClusterIP: addr("10.96.0.15"), Port: 80, NodePort: 30085,
			ExternalLocal: true, Endpoints: []rules.Endpoint{ep("10.244.1.12", 8080)}},
		{Namespace: "default", Name: "int-local", Protocol: rules.TCP, ClusterIP: addr("10.96.0.16"), Port: 80,
			InternalLocal: true, LocalEndpoints: []rules.Endpoint{ep("10.244.1.10", 8080)}},
		// LoadBalancerSourceRanges: several ranges (an anonymous interval set, with
		// ranges to merge and one reaching 255.255.255.255), one holding the node IP
		// of the first configuration (its load-balancer IPs then allowed too); and
		// one range on a port with no endpoints (a plain match).
		{Namespace: "default", Name: "lb-ranges", Protocol: rules.TCP, ClusterIP: addr("10.96.0.17"), Port: 80, NodePort: 30086,
			LoadBalancerIPs: []netip.Addr{addr("203.0.113.9"), addr("203.0.113.10")},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("198.51.100.128/25"),
				netip.MustParsePrefix("198.51.100.0/25"), netip.MustParsePrefix("255.255.255.0/24")},
			Endpoints: []rules.Endpoint{ep("10.244.1.10", 8080)}},
		{Namespace: "default", Name: "lb-one-range", Protocol: rules.UDP, ClusterIP: addr("10.96.0.18"), Port: 53,
			LoadBalancerIPs:          []netip.Addr{addr("203.0.113.11")},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}},
	}}
}

// TestNFTablesNetlinkMatchesCLI is the netlink applier's contract: the same state
// written through netlink in one namespace and through `nft -f` of the text payload
// in another lists identically (`nft list table`), after a full sync and after each
// of a sequence of partial syncs.
func TestNFTablesNetlinkMatchesCLI(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	testenv.LookPath(t, "nft")
	for _, tc := range []struct {
		name string
		cfg  rules.NFTablesConfig
	}{
		{"cluster CIDR, service CIDRs, node port addresses", rules.NFTablesConfig{Table: "equiv",
			ClusterCIDR:       netip.MustParsePrefix("10.244.0.0/16"),
			ServiceCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("172.30.0.0/16")},
			NodePortAddresses: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("10.0.0.1")},
			NodeIP:            netip.MustParseAddr("192.0.2.1")}},
		{"masquerade all, every node address, own mark", rules.NFTablesConfig{Table: "equiv", MasqueradeAll: true, MasqueradeMark: 0x8000}},
		{"cluster CIDR not byte aligned", rules.NFTablesConfig{Table: "equiv", ClusterCIDR: netip.MustParsePrefix("10.240.0.0/12")}},
	} {
		for _, family := range []rules.Family{rules.IPv4, rules.IPv6} {
			t.Run(string(family)+"/"+tc.name, func(t *testing.T) {
				testNetlinkMatchesCLI(t, family, tc.cfg)
			})
		}
	}
}

// testNetlinkMatchesCLI runs the equivalence for one family: the IPv6 run writes
// the same states with every address mapped by to6.
func testNetlinkMatchesCLI(t *testing.T, family rules.Family, cfg rules.NFTablesConfig) {
	conv := func(st *rules.State) *rules.State { return st }
	nftFamily := "ip"
	if family == rules.IPv6 {
		cfg = cfgTo6(cfg)
		conv = stateTo6
		nftFamily = "ip6"
	}
	env := netns.New(t, netns.Config{Pods: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	viaNetlink, viaCLI := env.Node, env.Client
	list := func(ns *netns.Namespace) string {
		out, err := ns.Run(ctx, "", "nft", "list", "table", nftFamily, "equiv")
		require.NoError(t, err)
		return out
	}
	st := equivalenceState()
	var w *rules.NFTables
	require.NoError(t, viaNetlink.Do(func() (err error) {
		w, err = rules.NewNFTables(cfg)
		if err != nil {
			return err
		}
		return w.Sync(ctx, conv(st))
	}))
	payload, err := rules.RenderNFTables(cfg, conv(st))
	require.NoError(t, err)
	_, err = viaCLI.Run(ctx, payload, "nft", "-f", "-")
	require.NoError(t, err)
	require.Equal(t, list(viaCLI), list(viaNetlink), "full sync")
	// The kernel's own view agrees too: the same expressions, registers, set
	// flags and element bytes (nft prints them with --debug=netlink). Lines are
	// compared as a multiset: a hash set lists its elements in a per-set
	// random order; the order of rules is checked by the listing above.
	bytecode := func(ns *netns.Namespace) []string {
		out, err := ns.Run(ctx, "", "nft", "--debug=netlink", "list", "table", nftFamily, "equiv")
		require.NoError(t, err)
		lines := strings.Split(out, "\n")
		slices.Sort(lines)
		return lines
	}
	require.Equal(t, bytecode(viaCLI), bytecode(viaNetlink), "full sync, bytecode")

	// The same partial syncs through both appliers, from the same start: a
	// writer's first sync into an empty namespace (listing order follows
	// creation order).
	_, err = viaCLI.Run(ctx, "", "nft", "delete", "table", nftFamily, "equiv")
	require.NoError(t, err)
	cliCfg := cfg
	cliCfg.Applier = rules.NFTablesCLI
	var cw *rules.NFTables
	require.NoError(t, viaCLI.Do(func() (err error) {
		cw, err = rules.NewNFTables(cliCfg)
		if err != nil {
			return err
		}
		return cw.Sync(ctx, conv(st))
	}))
	require.Equal(t, list(viaCLI), list(viaNetlink), "full sync through the CLI writer")
	for _, step := range []struct {
		name   string
		mutate func(*rules.State)
	}{
		{"endpoint removed", func(s *rules.State) { s.Services[0].Endpoints = s.Services[0].Endpoints[:2] }},
		{"affinity timeout changed", func(s *rules.State) { s.Services[2].AffinityTimeout = time.Minute }},
		{"affinity turned on", func(s *rules.State) { s.Services[0].AffinityTimeout = 30 * time.Second }},
		{"service lost its endpoints", func(s *rules.State) { s.Services[3].Endpoints = nil }},
		{"service got endpoints", func(s *rules.State) {
			s.Services[4].Endpoints = []rules.Endpoint{{IP: netip.MustParseAddr("10.244.1.10"), Port: 8080}}
		}},
		{"service deleted", func(s *rules.State) { s.Services = slices.Delete(s.Services, 2, 3) }},
		{"stale chains deleted, node port changed", func(s *rules.State) { s.Services[0].NodePort = 30090 }},
		{"affinity off, external IP gone", func(s *rules.State) {
			s.Services[0].AffinityTimeout = 0
			s.Services[0].ExternalIPs = nil
		}},
		{"source ranges changed (indexes after the deletion above)", func(s *rules.State) {
			s.Services[8].LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("0.0.0.0/8")}
			s.Services[9].LoadBalancerSourceRanges = append(s.Services[9].LoadBalancerSourceRanges, netip.MustParsePrefix("192.0.2.7/32"))
		}},
		{"source ranges removed, one range left", func(s *rules.State) {
			s.Services[8].LoadBalancerSourceRanges = nil
			s.Services[9].LoadBalancerSourceRanges = s.Services[9].LoadBalancerSourceRanges[1:]
		}},
		{"service added", func(s *rules.State) {
			s.Services = append(s.Services, rules.Service{Namespace: "other", Name: "new", Protocol: rules.UDP,
				ClusterIP: netip.MustParseAddr("10.96.0.99"), Port: 99, NodePort: 30099,
				Endpoints: []rules.Endpoint{{IP: netip.MustParseAddr("10.244.1.12"), Port: 99}}})
		}},
	} {
		step.mutate(st)
		require.NoError(t, viaNetlink.Do(func() error { return w.Sync(ctx, conv(st)) }), step.name)
		require.NoError(t, viaCLI.Do(func() error { return cw.Sync(ctx, conv(st)) }), step.name)
		require.Equal(t, list(viaCLI), list(viaNetlink), "after partial sync: %s", step.name)
		require.Equal(t, bytecode(viaCLI), bytecode(viaNetlink), "after partial sync, bytecode: %s", step.name)
	}
	// A forced full sync over the partial history still matches.
	w.ForceFullSync()
	cw.ForceFullSync()
	require.NoError(t, viaNetlink.Do(func() error { return w.Sync(ctx, conv(st)) }))
	require.NoError(t, viaCLI.Do(func() error { return cw.Sync(ctx, conv(st)) }))
	require.Equal(t, list(viaCLI), list(viaNetlink), "forced full sync")
	require.Equal(t, bytecode(viaCLI), bytecode(viaNetlink), "forced full sync, bytecode")
}

// to6 maps an IPv4 address into IPv6, keeping its place in the address space for
// the interval tests: 0.x.y.z to ::0.x.y.z (the start of the space), 255.x.y.z to
// ffff:...:ffff:ffxx:yyzz (its end), anything else to fd00::a.b.c.d.
func to6(a netip.Addr) netip.Addr {
	v4 := a.As4()
	var b [16]byte
	switch v4[0] {
	case 0:
	case 255:
		for i := range 12 {
			b[i] = 0xff
		}
	default:
		b[0] = 0xfd
	}
	copy(b[12:], v4[:])
	return netip.AddrFrom16(b)
}

func prefixTo6(p netip.Prefix) netip.Prefix { return netip.PrefixFrom(to6(p.Addr()), 96+p.Bits()) }

func stateTo6(st *rules.State) *rules.State {
	out := st.Clone()
	for i := range out.Services {
		s := &out.Services[i]
		s.ClusterIP = to6(s.ClusterIP)
		for j := range s.ExternalIPs {
			s.ExternalIPs[j] = to6(s.ExternalIPs[j])
		}
		for j := range s.LoadBalancerIPs {
			s.LoadBalancerIPs[j] = to6(s.LoadBalancerIPs[j])
		}
		for j := range s.LoadBalancerSourceRanges {
			s.LoadBalancerSourceRanges[j] = prefixTo6(s.LoadBalancerSourceRanges[j])
		}
		for j := range s.Endpoints {
			s.Endpoints[j].IP = to6(s.Endpoints[j].IP)
		}
		for j := range s.LocalEndpoints {
			s.LocalEndpoints[j].IP = to6(s.LocalEndpoints[j].IP)
		}
	}
	return out
}

func cfgTo6(cfg rules.NFTablesConfig) rules.NFTablesConfig {
	cfg.Family = rules.IPv6
	if cfg.ClusterCIDR.IsValid() {
		cfg.ClusterCIDR = prefixTo6(cfg.ClusterCIDR)
	}
	if cfg.NodeIP.IsValid() {
		cfg.NodeIP = to6(cfg.NodeIP)
	}
	cfg.ServiceCIDRs = slices.Clone(cfg.ServiceCIDRs)
	for i := range cfg.ServiceCIDRs {
		cfg.ServiceCIDRs[i] = prefixTo6(cfg.ServiceCIDRs[i])
	}
	cfg.NodePortAddresses = slices.Clone(cfg.NodePortAddresses)
	for i := range cfg.NodePortAddresses {
		cfg.NodePortAddresses[i] = to6(cfg.NodePortAddresses[i])
	}
	return cfg
}

// TestNFTablesNetlinkMatchesCLIAtScale: 1,200 service ports, so maps are written in
// many messages of one batch; the listing still equals `nft -f` of the text payload,
// and a partial sync on top leaves what a CLI writer would.
func TestNFTablesNetlinkMatchesCLIAtScale(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	testenv.LookPath(t, "nft")
	env := netns.New(t, netns.Config{Pods: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cfg := rules.NFTablesConfig{Table: "scale", ClusterCIDR: netip.MustParsePrefix("10.128.0.0/9")}
	st := benchState(1200)
	st.Services[7].AffinityTimeout = time.Minute
	st.Services[8].Endpoints = nil
	list := func(ns *netns.Namespace, what ...string) string {
		out, err := ns.Run(ctx, "", "nft", append([]string{"list"}, what...)...)
		require.NoError(t, err)
		return out
	}
	var w *rules.NFTables
	require.NoError(t, env.Node.Do(func() (err error) {
		if w, err = rules.NewNFTables(cfg); err != nil {
			return err
		}
		return w.Sync(ctx, st)
	}))
	payload, err := rules.RenderNFTables(cfg, st)
	require.NoError(t, err)
	_, err = env.Client.Run(ctx, payload, "nft", "-f", "-")
	require.NoError(t, err)
	got := list(env.Node, "table", "ip", "scale")
	require.Equal(t, list(env.Client, "table", "ip", "scale"), got)
	assert.Equal(t, 1200, strings.Count(list(env.Node, "map", "ip", "scale", "service-ips"), " : goto ")+
		strings.Count(list(env.Node, "map", "ip", "scale", "no-endpoint-services"), " : goto "),
		"every cluster IP is in service-ips or no-endpoint-services (one service has no endpoints)")

	// One partial sync through each writer, from the same start.
	_, err = env.Client.Run(ctx, "", "nft", "delete", "table", "ip", "scale")
	require.NoError(t, err)
	cliCfg := cfg
	cliCfg.Applier = rules.NFTablesCLI
	var cw *rules.NFTables
	require.NoError(t, env.Client.Do(func() (err error) {
		if cw, err = rules.NewNFTables(cliCfg); err != nil {
			return err
		}
		return cw.Sync(ctx, st)
	}))
	st.Services[100].Endpoints = st.Services[100].Endpoints[1:]
	st.Services = slices.Delete(st.Services, 200, 210)
	require.NoError(t, env.Node.Do(func() error { return w.Sync(ctx, st) }))
	require.NoError(t, env.Client.Do(func() error { return cw.Sync(ctx, st) }))
	assert.Equal(t, list(env.Client, "table", "ip", "scale"), list(env.Node, "table", "ip", "scale"))
}
