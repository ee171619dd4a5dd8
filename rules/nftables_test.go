package rules

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/knftables"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites the file under -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "golden file missing: run go test ./rules -run %s -update", t.Name())
	assert.Equal(t, string(want), got, "differs from %s (rerun with -update if intended)", path)
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ep(s string, port int) Endpoint { return Endpoint{IP: ip(s), Port: port} }

// sampleState mirrors the service shapes of kube-proxy's own nftables tests:
// one endpoint, several endpoints with an external IP and a node port, session
// affinity, and no endpoints at all.
func sampleState() *State {
	return &State{Services: []Service{
		{Namespace: "ns1", Name: "svc1", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.41"), Port: 80,
			Endpoints: []Endpoint{ep("10.180.0.1", 80)}},
		{Namespace: "ns4", Name: "svc4", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.44"), Port: 80,
			ExternalIPs: []netip.Addr{ip("192.168.99.33")}, NodePort: 3004,
			Endpoints: []Endpoint{ep("10.180.0.4", 80), ep("10.180.0.5", 80)}},
		{Namespace: "ns5", Name: "svc5", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.45"), Port: 80,
			LoadBalancerIPs: []netip.Addr{ip("5.6.7.8")}, NodePort: 3002, AffinityTimeout: DefaultAffinityTimeout,
			Endpoints: []Endpoint{ep("10.180.0.3", 80)}},
		{Namespace: "ns6", Name: "svc6", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.46"), Port: 80},
		{Namespace: "ns7", Name: "dns", PortName: "dns", Protocol: UDP, ClusterIP: ip("172.30.0.10"), Port: 53,
			NodePort: 30053, NoEndpoints: Drop},
	}}
}

func sampleConfig() NFTablesConfig {
	return NFTablesConfig{
		ClusterCIDR:       netip.MustParsePrefix("10.0.0.0/8"),
		ServiceCIDRs:      []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16")},
		NodePortAddresses: []netip.Addr{ip("192.168.0.2")},
	}
}

func TestNames(t *testing.T) {
	// Expected names taken from kube-proxy's own tests, so tooling that knows them applies.
	s1 := &Service{Namespace: "ns1", Name: "svc1", PortName: "p80", Protocol: TCP}
	s5 := &Service{Namespace: "ns5", Name: "svc5", PortName: "p80", Protocol: TCP}
	assert.Equal(t, "ULMVA6XW-ns1/svc1/tcp/p80", nftServiceBase(s1))
	assert.Equal(t, "HVFWP5L3-ns5/svc5/tcp/p80", nftServiceBase(s5))
	assert.Equal(t, "GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80", nftEndpointBase(s5, ep("10.180.0.3", 80)))
	assert.Equal(t, "XPGD46QRK7WJZT7O", iptablesHash("ns1/svc1:p80", "tcp", ""))
	assert.Equal(t, "SXIVWICOYRO3J4NJ", iptablesHash("ns1/svc1:p80", "tcp", "10.180.0.1:80"))
	long := nftHashName(strings.Repeat("a", 300))
	assert.Len(t, long, nftNameBaseMax)
	assert.True(t, strings.HasSuffix(long, "..."))
}

func TestRenderNFTables(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    NFTablesConfig
		golden string
	}{
		{"kube-proxy defaults with cluster CIDR", sampleConfig(), "nftables-full.golden"},
		{"own table, masquerade all, all node addresses", NFTablesConfig{Table: "nodekit", MasqueradeAll: true, MasqueradeMark: 0x8000}, "nftables-full-nodekit.golden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := RenderNFTables(tc.cfg, sampleState())
			require.NoError(t, err)
			golden(t, tc.golden, out)
		})
	}
}

func TestNFTablesPartialSync(t *testing.T) {
	ctx := context.Background()
	cfg := sampleConfig()
	fake := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	seam := &refusingNFT{Interface: fake}
	w, err := newNFTablesWith(cfg, seam)
	require.NoError(t, err)
	st := sampleState()
	require.NoError(t, w.Sync(ctx, st))
	fullDump := fake.Dump()
	assert.Contains(t, fullDump, "meta l4proto tcp numgen random mod 2 0 dnat to 10.180.0.4:80\nadd rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 meta l4proto tcp dnat to 10.180.0.5:80\n")

	t.Run("same state writes nothing", func(t *testing.T) {
		out, err := w.DryRun(ctx, st)
		require.NoError(t, err)
		assert.Empty(t, out)
		require.NoError(t, w.Sync(ctx, st))
		assert.Equal(t, fullDump, fake.Dump())
	})

	t.Run("one endpoint removed rewrites one service", func(t *testing.T) {
		st.Services[1].Endpoints = st.Services[1].Endpoints[:1]
		out, err := w.DryRun(ctx, st)
		require.NoError(t, err)
		golden(t, "nftables-partial-endpoint-removed.golden", out)
		require.NoError(t, w.Sync(ctx, st))
		// The result equals a full sync of the new state from scratch.
		fresh := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
		w2, err := newNFTablesWith(cfg, fresh)
		require.NoError(t, err)
		require.NoError(t, w2.Sync(ctx, st))
		assert.Equal(t, fresh.Dump(), fake.Dump())
	})

	t.Run("service deleted: chains flushed, then deleted on the next sync", func(t *testing.T) {
		st.Services = st.Services[1:] // drop ns1/svc1
		require.NoError(t, w.Sync(ctx, st))
		chain := "service-ULMVA6XW-ns1/svc1/tcp/p80"
		require.Contains(t, fake.Table.Chains, chain)
		assert.Empty(t, fake.Table.Chains[chain].Rules)
		assert.NotContains(t, fake.Dump(), "172.30.0.41")
		require.NoError(t, w.Sync(ctx, st))
		assert.NotContains(t, fake.Table.Chains, chain)
	})

	t.Run("a refused transaction forces a full sync and keeps the old rules", func(t *testing.T) {
		before := fake.Dump()
		seam.err = errors.New("simulated kernel refusal")
		st.Services[0].Endpoints = nil
		err := w.Sync(ctx, st)
		require.ErrorIs(t, err, ErrApplyFailed)
		assert.Equal(t, before, fake.Dump())
		seam.err = nil
		out, err := w.DryRun(ctx, st)
		require.NoError(t, err)
		assert.Contains(t, out, "add table ip kube-proxy", "the sync after a failure is full")
		require.NoError(t, w.Sync(ctx, st))
		assert.Contains(t, fake.Dump(), `172.30.0.44 . tcp . 80 comment "ns4/svc4:p80" : goto reject-chain`)
	})
}

// refusingNFT fails Run with err when set, as the kernel refusing a transaction.
type refusingNFT struct {
	knftables.Interface
	err error
}

func (r *refusingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	if r.err != nil {
		return r.err
	}
	return r.Interface.Run(ctx, tx)
}

func TestValidation(t *testing.T) {
	good := func() Service {
		return Service{Namespace: "ns", Name: "web", Protocol: TCP, ClusterIP: ip("10.96.0.10"), Port: 80,
			Endpoints: []Endpoint{ep("10.244.1.10", 8080)}}
	}
	for _, tc := range []struct {
		name   string
		mutate func(*State)
		want   string
	}{
		{"bad namespace", func(s *State) { s.Services[0].Namespace = "Bad_NS" }, "namespace"},
		{"bad protocol", func(s *State) { s.Services[0].Protocol = "ICMP" }, "protocol"},
		{"IPv6 cluster IP", func(s *State) { s.Services[0].ClusterIP = ip("fd00::1") }, "cluster IP"},
		{"missing cluster IP", func(s *State) { s.Services[0].ClusterIP = netip.Addr{} }, "cluster IP"},
		{"port zero", func(s *State) { s.Services[0].Port = 0 }, "port 0"},
		{"endpoint port", func(s *State) { s.Services[0].Endpoints[0].Port = 70000 }, "port out of range"},
		{"duplicate endpoint", func(s *State) {
			s.Services[0].Endpoints = append(s.Services[0].Endpoints, s.Services[0].Endpoints[0])
		}, "twice"},
		{"fractional affinity", func(s *State) { s.Services[0].AffinityTimeout = 1500 * time.Millisecond }, "whole seconds"},
		{"bad no-endpoints action", func(s *State) { s.Services[0].NoEndpoints = "ignore" }, "reject or drop"},
		{"same destination twice", func(s *State) {
			other := good()
			other.Name = "other"
			s.Services = append(s.Services, other)
		}, "both claim"},
		{"same port listed twice", func(s *State) { s.Services = append(s.Services, good()) }, "listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Services: []Service{good()}}
			require.NoError(t, st.Validate())
			tc.mutate(st)
			err := st.Validate()
			require.ErrorIs(t, err, ErrInvalidState)
			assert.Contains(t, err.Error(), tc.want)
			assert.Contains(t, err.Error(), "service port", "the error names the service port")
			_, err = RenderNFTables(NFTablesConfig{}, st)
			assert.ErrorIs(t, err, ErrInvalidState)
		})
	}
}

func TestNFTablesConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  NFTablesConfig
	}{
		{"table name", NFTablesConfig{Table: "Kube Proxy"}},
		{"mark not one bit", NFTablesConfig{MasqueradeMark: 0x4001}},
		{"IPv6 cluster CIDR", NFTablesConfig{ClusterCIDR: netip.MustParsePrefix("fd00::/64")}},
		{"IPv6 node port address", NFTablesConfig{NodePortAddresses: []netip.Addr{ip("::1")}}},
		{"unknown applier", NFTablesConfig{Applier: "ebpf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderNFTables(tc.cfg, &State{})
			assert.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

func FuzzValidate(f *testing.F) {
	f.Add("ns", "web", "http", "TCP", "10.96.0.10", 80, 30080, "10.244.1.10", 8080, int64(0))
	f.Add("", "", "", "", "", 0, 0, "", 0, int64(-1))
	f.Fuzz(func(t *testing.T, ns, name, portName, proto, cip string, port, nodePort int, epIP string, epPort int, affinity int64) {
		c, _ := netip.ParseAddr(cip)
		e, _ := netip.ParseAddr(epIP)
		st := &State{Services: []Service{{Namespace: ns, Name: name, PortName: portName, Protocol: Protocol(proto),
			ClusterIP: c, Port: port, NodePort: nodePort, Endpoints: []Endpoint{{IP: e, Port: epPort}},
			AffinityTimeout: time.Duration(affinity)}}}
		out, err := RenderNFTables(NFTablesConfig{}, st)
		if err != nil {
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("error not wrapping ErrInvalidState: %v", err)
			}
			return
		}
		// Accepted input renders into names nft accepts: no spaces or quotes sneak in.
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "add chain") && strings.Count(line, " ") > 4 && !strings.Contains(line, "{") {
				t.Fatalf("chain name with spaces: %q", line)
			}
		}
	})
}

func TestRenderIPTables(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    IPTablesConfig
		golden string
	}{
		{"kube-proxy defaults with cluster CIDR", IPTablesConfig{ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8")}, "iptables-full.golden"},
		{"own prefix, masquerade all", IPTablesConfig{Prefix: "NODEKIT", MasqueradeAll: true}, "iptables-full-nodekit.golden"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := RenderIPTables(tc.cfg, sampleState())
			require.NoError(t, err)
			golden(t, tc.golden, out)
		})
	}
}

// TestIPTablesMatchesKubeProxy checks lines against kube-proxy 1.37's own expected
// iptables-restore output for the same services.
func TestIPTablesMatchesKubeProxy(t *testing.T) {
	// kube-proxy's default: localhost NodePorts on.
	out, err := RenderIPTables(IPTablesConfig{ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8"), LocalhostNodePorts: true}, sampleState())
	require.NoError(t, err)
	for _, line := range []string{
		`-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
		`-I INPUT -j KUBE-FIREWALL`,
		`-I OUTPUT -j KUBE-FIREWALL`,
		`-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O`,
		`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
		`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ`,
		`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ`,
		`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80`,
		`-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC`,
		`-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ`,
		`-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK`,
		`-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ`,
		`-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN`,
		`-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80`,
		`-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`,
		`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
	} {
		assert.Contains(t, out, line+"\n")
	}
}

// TestPickRules: the cascade that replaces kube-proxy's anonymous numgen vmap takes
// every verdict with probability 1/n and uses no set, so a packet evaluating the
// previous rules during a commit still finds a target.
func TestPickRules(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var verdicts []string
			for i := range n {
				verdicts = append(verdicts, fmt.Sprintf("dnat to 10.0.0.%d:80", i+1))
			}
			got := pickRules("meta l4proto tcp", verdicts)
			require.Len(t, got, n)
			reach := 1.0 // probability that a packet reaches rule i
			for i, r := range got {
				assert.NotContains(t, r, "{", "rule %d uses an anonymous set: %s", i, r)
				require.True(t, strings.HasPrefix(r, "meta l4proto tcp "), r)
				require.True(t, strings.HasSuffix(r, " "+verdicts[i]), r)
				take := 1.0
				if i < n-1 {
					var k int
					_, err := fmt.Sscanf(r, "meta l4proto tcp numgen random mod %d 0 ", &k)
					require.NoError(t, err, r)
					take = 1 / float64(k)
				} else {
					assert.NotContains(t, r, "numgen", "the last rule is unconditional")
				}
				assert.InDelta(t, 1/float64(n), reach*take, 1e-9, "verdict %d", i)
				reach *= 1 - take
			}
			assert.InDelta(t, 0, reach, 1e-9, "every packet is DNATed")
		})
	}
}

// TestLocalPolicyMatchesKubeProxy renders kube-proxy's own test service ns2/svc2
// (externalTrafficPolicy Local, its only endpoint on another node) and checks the
// lines kube-proxy's tests expect for it, in both writers. The nftables writer
// marks for masquerade inline where kube-proxy jumps to mark-for-masquerade.
func TestLocalPolicyMatchesKubeProxy(t *testing.T) {
	st := &State{Services: []Service{{Namespace: "ns2", Name: "svc2", PortName: "p80", Protocol: TCP,
		ClusterIP: ip("172.30.0.42"), Port: 80, NodePort: 3001, ExternalIPs: []netip.Addr{ip("192.168.99.22")},
		LoadBalancerIPs: []netip.Addr{ip("1.2.3.4")}, ExternalLocal: true, Endpoints: []Endpoint{ep("10.180.0.2", 80)}}}}
	cidr := netip.MustParsePrefix("10.0.0.0/8")
	nft, err := RenderNFTables(NFTablesConfig{ClusterCIDR: cidr}, st)
	require.NoError(t, err)
	for _, line := range []string{
		`add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"`,
		`add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"`,
		`add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"`,
		`add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }`,
		`add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }`,
		`add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }`,
		`add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment "ns2/svc2:p80" : drop }`,
	} {
		assert.Contains(t, nft, line+"\n")
	}
	assert.NotContains(t, nft, "goto local-", "no local endpoint: no local chain")

	ipt, err := RenderIPTables(IPTablesConfig{ClusterCIDR: cidr}, st)
	require.NoError(t, err)
	for _, line := range []string{
		`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT`,
		`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
		`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT`,
		`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP`,
		`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP`,
		`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP`,
	} {
		assert.Contains(t, ipt, line+"\n")
	}
	assert.NotContains(t, ipt, "KUBE-SVL-", "no local endpoint: no local chain")

	// With a local endpoint the external chain ends in the local chain.
	st.Services[0].LocalEndpoints = []Endpoint{ep("10.180.0.2", 80)}
	nft, err = RenderNFTables(NFTablesConfig{ClusterCIDR: cidr}, st)
	require.NoError(t, err)
	assert.Contains(t, nft, "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 goto local-42NFTM6N-ns2/svc2/tcp/p80\n")
	assert.Contains(t, nft, "add rule ip kube-proxy local-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80\n")
	assert.NotContains(t, nft, "add element ip kube-proxy no-endpoint")
	ipt, err = RenderIPTables(IPTablesConfig{ClusterCIDR: cidr}, st)
	require.NoError(t, err)
	assert.Contains(t, ipt, "-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT\n")
	assert.NotContains(t, ipt, "has no local endpoints")
}

// TestNFTablesSyncChanges checks that a partial update leaves the table exactly
// as Sync of the whole resulting state does, step after step, and that it
// refuses what Sync refuses.
func TestNFTablesSyncChanges(t *testing.T) {
	ctx := context.Background()
	cfg := sampleConfig()
	byChanges := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	byState := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	wc, err := newNFTablesWith(cfg, byChanges)
	require.NoError(t, err)
	ws, err := newNFTablesWith(cfg, byState)
	require.NoError(t, err)

	st := sampleState()
	require.ErrorIs(t, wc.SyncChanges(ctx, &Changes{Set: st.Services}), ErrFullSyncNeeded)
	assert.Empty(t, byChanges.Dump(), "nothing written without a synced state")
	require.NoError(t, wc.Sync(ctx, st))
	require.NoError(t, ws.Sync(ctx, st))

	steps := []struct {
		name  string
		apply func(st *State) *Changes
	}{
		{"endpoint removed", func(st *State) *Changes {
			st.Services[1].Endpoints = st.Services[1].Endpoints[:1]
			return &Changes{Set: []Service{st.Services[1]}}
		}},
		{"unchanged port listed", func(st *State) *Changes { return &Changes{Set: []Service{st.Services[0]}} }},
		{"port removed, another added", func(st *State) *Changes {
			gone := st.Services[0].ID()
			st.Services[0] = Service{Namespace: "ns9", Name: "svc9", PortName: "p", Protocol: TCP,
				ClusterIP: ip("172.30.0.49"), Port: 80, Endpoints: []Endpoint{ep("10.180.0.9", 8080)}}
			return &Changes{Set: []Service{st.Services[0]}, Remove: []PortID{gone}}
		}},
		{"affinity dropped and endpoints gone", func(st *State) *Changes {
			st.Services[2].AffinityTimeout = 0
			st.Services[3].Endpoints = []Endpoint{ep("10.180.0.6", 80)}
			return &Changes{Set: []Service{st.Services[2], st.Services[3]}}
		}},
		{"removing an unknown port is a no-op", func(*State) *Changes {
			return &Changes{Remove: []PortID{{Namespace: "nsx", Name: "x", Protocol: TCP}}}
		}},
	}
	for _, s := range steps {
		ch := s.apply(st)
		require.NoError(t, wc.SyncChanges(ctx, ch), s.name)
		require.NoError(t, ws.Sync(ctx, st), s.name)
		assert.Equal(t, byState.Dump(), byChanges.Dump(), s.name)
	}

	before := byChanges.Dump()
	clash := st.Services[1]
	clash.Name = "other"
	require.ErrorIs(t, wc.SyncChanges(ctx, &Changes{Set: []Service{clash}}), ErrInvalidState, "claims ns4/svc4's cluster IP")
	require.ErrorIs(t, wc.SyncChanges(ctx, &Changes{Set: []Service{st.Services[1], st.Services[1]}}), ErrInvalidState)
	require.ErrorIs(t, wc.SyncChanges(ctx, &Changes{Set: []Service{st.Services[1]}, Remove: []PortID{st.Services[1].ID()}}), ErrInvalidState)
	bad := st.Services[1]
	bad.Port = 0
	require.ErrorIs(t, wc.SyncChanges(ctx, &Changes{Set: []Service{bad}}), ErrInvalidState)
	assert.Equal(t, before, byChanges.Dump(), "refused changes write nothing")
	// Invalid input leaves the writer's record intact: the next change is partial.
	st.Services[1].Endpoints = append(st.Services[1].Endpoints, ep("10.180.0.7", 80))
	require.NoError(t, wc.SyncChanges(ctx, &Changes{Set: []Service{st.Services[1]}}))
	require.NoError(t, ws.Sync(ctx, st))
	assert.Equal(t, byState.Dump(), byChanges.Dump())
}
