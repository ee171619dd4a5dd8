package rules

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/knftables"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// sourceRangeState has the LoadBalancerSourceRanges shapes kube-proxy's own tests
// use: one range, several ranges one of which holds the node's IP (so the
// load-balancer IPs are allowed as sources too), ranges on a port with no
// endpoints, and ranges on a port with no load-balancer IP (no firewall).
func sourceRangeState() *State {
	return &State{Services: []Service{
		{Namespace: "ns2", Name: "svc2", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.42"), Port: 80, NodePort: 3001,
			LoadBalancerIPs:          []netip.Addr{ip("1.2.3.4"), ip("1.2.3.5")},
			LoadBalancerSourceRanges: []netip.Prefix{pfx("192.168.0.0/24"), pfx("203.0.113.0/25")},
			Endpoints:                []Endpoint{ep("10.180.0.2", 80)}},
		{Namespace: "ns3", Name: "svc3", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.43"), Port: 80,
			LoadBalancerIPs: []netip.Addr{ip("5.6.7.9")}, LoadBalancerSourceRanges: []netip.Prefix{pfx("203.0.113.0/25")}},
		{Namespace: "ns5", Name: "svc5", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.45"), Port: 80, NodePort: 3002,
			LoadBalancerIPs: []netip.Addr{ip("5.6.7.8")}, LoadBalancerSourceRanges: []netip.Prefix{pfx("203.0.113.0/25")},
			Endpoints: []Endpoint{ep("10.180.0.3", 80)}},
		{Namespace: "ns6", Name: "svc6", PortName: "p80", Protocol: TCP, ClusterIP: ip("172.30.0.46"), Port: 80, NodePort: 3006,
			LoadBalancerSourceRanges: []netip.Prefix{pfx("203.0.113.0/25")}, Endpoints: []Endpoint{ep("10.180.0.6", 80)}},
	}}
}

func sourceRangeNFTConfig() NFTablesConfig {
	cfg := sampleConfig()
	cfg.NodeIP = ip("192.168.0.2")
	return cfg
}

func TestNFTablesSourceRanges(t *testing.T) {
	out, err := RenderNFTables(sourceRangeNFTConfig(), sourceRangeState())
	require.NoError(t, err)
	golden(t, "nftables-source-ranges.golden", out)
	for _, want := range []string{
		// kube-proxy's rule for one range, and for several with the node's IP in one.
		"add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop\n",
		"add rule ip kube-proxy firewall-42NFTM6N-ns2/svc2/tcp/p80 ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 1.2.3.5 } drop\n",
		"add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }\n",
		// No endpoints: the firewall is written all the same, as upstream does.
		"add element ip kube-proxy firewall-ips { 5.6.7.9 . tcp . 80 : goto firewall-",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "firewall-ips { 3006", "node ports are not subject to the ranges")
	assert.NotContains(t, out, "svc6/tcp/p80 ip saddr", "ranges without a load-balancer IP write no firewall")

	t.Run("without a node IP the load-balancer IPs are not allowed sources", func(t *testing.T) {
		out, err := RenderNFTables(sampleConfig(), sourceRangeState())
		require.NoError(t, err)
		assert.Contains(t, out, "firewall-42NFTM6N-ns2/svc2/tcp/p80 ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 } drop\n")
	})
}

func TestNFTablesSourceRangesPartialSync(t *testing.T) {
	ctx := context.Background()
	cfg := sourceRangeNFTConfig()
	fake := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	w, err := newNFTablesWith(cfg, fake)
	require.NoError(t, err)
	st := sourceRangeState()
	require.NoError(t, w.Sync(ctx, st))
	fresh := func(t *testing.T) {
		t.Helper()
		f := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
		w2, err := newNFTablesWith(cfg, f)
		require.NoError(t, err)
		require.NoError(t, w2.Sync(ctx, st))
		// Compared as sorted lines: the fake lists map elements in insertion order.
		lines := func(d string) []string {
			l := strings.Split(d, "\n")
			slices.Sort(l)
			return l
		}
		assert.Equal(t, lines(f.Dump()), lines(fake.Dump()), "the partial syncs leave what a full sync of the state writes")
	}

	t.Run("ranges changed: only that port's firewall chain is rewritten", func(t *testing.T) {
		st.Services[2].LoadBalancerSourceRanges = []netip.Prefix{pfx("198.51.100.0/24"), pfx("203.0.113.128/25")}
		out, err := w.DryRun(ctx, st)
		require.NoError(t, err)
		golden(t, "nftables-partial-source-ranges-changed.golden", out)
		require.NoError(t, w.Sync(ctx, st))
		fresh(t)
	})

	t.Run("ranges removed: the firewall chain goes stale and its map element goes", func(t *testing.T) {
		st.Services[2].LoadBalancerSourceRanges = nil
		out, err := w.DryRun(ctx, st)
		require.NoError(t, err)
		assert.Contains(t, out, "delete element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 }\n")
		assert.Contains(t, out, "flush chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80\n")
		require.NoError(t, w.Sync(ctx, st))
		require.NoError(t, w.Sync(ctx, st))
		assert.NotContains(t, fake.Table.Chains, "firewall-HVFWP5L3-ns5/svc5/tcp/p80", "deleted by the next sync")
		fresh(t)
	})

	t.Run("ranges added back", func(t *testing.T) {
		st.Services[2].LoadBalancerSourceRanges = []netip.Prefix{pfx("203.0.113.0/25")}
		require.NoError(t, w.Sync(ctx, st))
		assert.Contains(t, fake.Dump(), "firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop")
		fresh(t)
	})
}

func TestIPTablesSourceRanges(t *testing.T) {
	cfg := IPTablesConfig{NodeIP: ip("192.168.0.2")}
	out, err := RenderIPTables(cfg, sourceRangeState())
	require.NoError(t, err)
	golden(t, "iptables-source-ranges.golden", out)
	for _, want := range []string{
		// kube-proxy 1.37's lines for ns5/svc5 (from its own tests).
		"-A KUBE-SERVICES -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C\n",
		"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C\n",
		"-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment \"other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL\"\n",
		"-A KUBE-PROXY-FIREWALL -m comment --comment \"ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C\" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP\n",
		// The node's IP is in a range of ns2/svc2: its load-balancer IPs are allowed sources.
		"-A KUBE-FW-GNZBNJ2PO5MGZ6GT -m comment --comment \"ns2/svc2:p80 loadbalancer IP\" -s 1.2.3.5 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT\n",
		// Node ports go straight to the EXT chain.
		"-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C\n",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "ns3/svc3:p80 traffic not accepted", "a port with no endpoints has no firewall in iptables mode")
	assert.NotContains(t, out, "KUBE-FW-"+iptablesHash("ns6/svc6:p80", "tcp", ""), "ranges without a load-balancer IP write no firewall")
}

func TestIPTablesSourceRangesPartialSync(t *testing.T) {
	ctx := context.Background()
	cfg := IPTablesConfig{Mode: IPTablesLegacy, Prefix: "NK"}
	require.NoError(t, cfg.setDefaults())
	fr := &fakeRunner{save: "*nat\nCOMMIT\n"}
	w := &IPTables{cfg: cfg, run: fr.run}
	st := sourceRangeState()
	require.NoError(t, w.Sync(ctx, st))
	fw5, svc2 := "NK-FW-NUKIZ6OKUXPJNT4C", "NK-SVC-GNZBNJ2PO5MGZ6GT"

	fr.stdins = nil
	st.Services[2].LoadBalancerSourceRanges = []netip.Prefix{pfx("198.51.100.0/24")}
	require.NoError(t, w.Sync(ctx, st))
	partial := fr.stdins[0]
	assert.Contains(t, partial, ":"+fw5+" - [0:0]\n", "the changed firewall chain is rewritten")
	assert.Contains(t, partial, "-A "+fw5+" -m comment --comment \"ns5/svc5:p80 loadbalancer IP\" -s 198.51.100.0/24 -j NK-EXT-NUKIZ6OKUXPJNT4C\n")
	assert.NotContains(t, partial, ":"+svc2+" ", "an unchanged service is not")

	fr.stdins = nil
	st.Services[2].LoadBalancerSourceRanges = nil
	require.NoError(t, w.Sync(ctx, st))
	partial = fr.stdins[0]
	assert.Contains(t, partial, "-X "+fw5+"\n", "the firewall chain of a port without ranges is deleted")
	assert.Contains(t, partial, "-d 5.6.7.8 --dport 80 -j NK-EXT-NUKIZ6OKUXPJNT4C\n", "load-balancer traffic goes straight to EXT")
	assert.NotContains(t, partial, "traffic not accepted by "+fw5)
}

func TestSourceRangeValidation(t *testing.T) {
	st := sourceRangeState()
	st.Services[0].LoadBalancerSourceRanges = append(st.Services[0].LoadBalancerSourceRanges, pfx("2001:db8::/32"))
	err := st.Validate()
	require.ErrorIs(t, err, ErrInvalidState)
	assert.ErrorContains(t, err, `"ns2/svc2:p80"`)
	assert.ErrorContains(t, err, "2001:db8::/32")
	st.Services[0].LoadBalancerSourceRanges = []netip.Prefix{{}}
	assert.ErrorIs(t, st.Validate(), ErrInvalidState)
	_, err = RenderNFTables(NFTablesConfig{NodeIP: ip("fd00::1")}, &State{})
	assert.ErrorIs(t, err, ErrInvalidConfig)
	_, err = RenderIPTables(IPTablesConfig{NodeIP: ip("fd00::1")}, &State{})
	assert.ErrorIs(t, err, ErrInvalidConfig)
}

// TestAnonymousSetTranslation: a firewall rule of several ranges is a lookup in an
// anonymous interval set, as nft 1.0.6 prints it with --debug=netlink
// ("lookup reg 1 set __set%d 0x1"); one range is a plain match.
func TestAnonymousSetTranslation(t *testing.T) {
	got, err := ruleExprs(IPv4, "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 } drop")
	require.NoError(t, err)
	assert.Equal(t, []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: "__set%d", Invert: true},
		&expr.Verdict{Kind: expr.VerdictDrop}}, got)
	got, err = ruleExprs(IPv4, "ip saddr != { 203.0.113.0/25 } drop")
	require.NoError(t, err)
	want, err := ruleExprs(IPv4, "ip saddr != 203.0.113.0/25 drop")
	require.NoError(t, err)
	assert.Equal(t, want, got)
	for _, bad := range []string{
		"ip saddr != { 10.0.0.0/8 10.1.0.0/16 } drop",
		"ip saddr != { 10.0.0.0/8 , } drop",
		"ip saddr != { } drop",
		"ip daddr != { 10.0.0.0/8 , 11.0.0.0/8 } drop",
	} {
		_, err := ruleExprs(IPv4, bad)
		assert.ErrorIs(t, err, errUnsupportedRule, bad)
	}

	sets, err := anonSets(IPv4, "ip saddr != { 10.0.0.0/8 , 192.168.1.0/24 } drop")
	require.NoError(t, err)
	assert.Equal(t, [][]netip.Prefix{{pfx("10.0.0.0/8"), pfx("192.168.1.0/24")}}, sets)
	sets, err = anonSets(IPv4, "ip saddr != { 10.0.0.0/8 } drop")
	require.NoError(t, err)
	assert.Empty(t, sets, "a one-element set is a plain match, no set")
}

// TestIntervalElements pins the elements to those nft 1.0.6 sends (its
// --debug=netlink listing of the sets): a leading end at 0.0.0.0, ranges merged
// when they overlap or touch, no end after a range reaching 255.255.255.255.
func TestIntervalElements(t *testing.T) {
	str := func(els []intervalElement) string {
		var parts []string
		for _, e := range els {
			s := e.key.String()
			if e.end {
				s += " end"
			}
			if e.open {
				s += " open"
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ", ")
	}
	for _, tc := range []struct {
		in   []netip.Prefix
		want string
	}{
		{[]netip.Prefix{pfx("10.0.0.0/8"), pfx("192.168.1.0/24"), pfx("203.0.113.7/32")},
			"0.0.0.0 end, 10.0.0.0, 11.0.0.0 end, 192.168.1.0, 192.168.2.0 end, 203.0.113.7, 203.0.113.8 end"},
		{[]netip.Prefix{pfx("10.0.0.0/8"), pfx("10.1.0.0/16"), pfx("11.0.0.0/8"), pfx("10.0.0.0/8")},
			"0.0.0.0 end, 10.0.0.0, 12.0.0.0 end"},
		{[]netip.Prefix{pfx("255.255.255.0/24"), pfx("0.0.0.0/8")},
			"0.0.0.0, 1.0.0.0 end, 255.255.255.0 open"},
	} {
		assert.Equal(t, tc.want, str(intervalElements(tc.in)), "%v", tc.in)
	}
}

// TestIPTablesTraceThroughFirewall: read-back follows KUBE-FW- to the endpoints,
// and Trace knows load-balancer traffic through it is masqueraded (it goes on to
// KUBE-EXT-, which marks it).
func TestIPTablesTraceThroughFirewall(t *testing.T) {
	cfg := IPTablesConfig{Mode: IPTablesLegacy}
	payload, err := RenderIPTables(cfg, sourceRangeState())
	require.NoError(t, err)
	require.NoError(t, cfg.setDefaults())
	w := &IPTables{cfg: cfg, run: (&fakeRunner{save: payload}).run}
	r, err := w.Trace(context.Background(), Packet{Src: ip("203.0.113.5"), Dst: ip("5.6.7.8"), Protocol: TCP, Port: 80})
	require.NoError(t, err)
	assert.Equal(t, "DNAT", r.Verdict)
	assert.Equal(t, []Endpoint{ep("10.180.0.3", 80)}, r.Candidates)
	assert.Contains(t, r.Path, "KUBE-FW-NUKIZ6OKUXPJNT4C")
	assert.True(t, r.Masquerade)
}

// TestTraceSourceRanges: Trace reports a source outside the ranges as dropped.
func TestTraceSourceRanges(t *testing.T) {
	cfg := IPTablesConfig{Mode: IPTablesLegacy, NodeIP: ip("192.168.0.2")}
	payload, err := RenderIPTables(cfg, sourceRangeState())
	require.NoError(t, err)
	require.NoError(t, cfg.setDefaults())
	w := &IPTables{cfg: cfg, run: (&fakeRunner{save: payload}).run}
	for _, tc := range []struct {
		src, dst, want string
	}{
		{"203.0.113.5", "5.6.7.8", "DNAT"},
		{"203.0.113.200", "5.6.7.8", "DROP"},
		{"198.51.100.1", "1.2.3.4", "DROP"},
		{"1.2.3.5", "1.2.3.4", "DNAT"}, // an LB IP, allowed as the node IP is in a range
		{"192.168.0.77", "1.2.3.4", "DNAT"},
	} {
		r, err := w.Trace(context.Background(), Packet{Src: ip(tc.src), Dst: ip(tc.dst), Protocol: TCP, Port: 80})
		require.NoError(t, err)
		assert.Equal(t, tc.want, r.Verdict, "iptables %s -> %s: %v", tc.src, tc.dst, r.Path)
	}

	// nftables: the chain as `nft list chain` prints it.
	for _, tc := range []struct {
		chain string
		src   string
		want  bool
	}{
		{"\tchain x {\n\t\tip saddr != { 192.0.2.0/24, 10.96.100.1 } drop\n\t}\n", "192.0.2.9", true},
		{"\tchain x {\n\t\tip saddr != { 192.0.2.0/24, 10.96.100.1 } drop\n\t}\n", "10.96.100.1", true},
		{"\tchain x {\n\t\tip saddr != { 192.0.2.0/24, 10.96.100.1 } drop\n\t}\n", "10.96.100.2", false},
		{"\tchain x {\n\t\tip saddr != 192.0.2.2 drop\n\t}\n", "192.0.2.2", true},
		{"\tchain x {\n\t\tip saddr != 192.0.2.2 drop\n\t}\n", "192.0.2.3", false},
		{"\tchain x {\n\t\tip saddr != { 10.0.0.0-12.255.255.255 } drop\n\t}\n", "11.1.1.1", true},
		{"\tchain x {\n\t\tip saddr != { 10.0.0.0-12.255.255.255 } drop\n\t}\n", "13.0.0.0", false},
	} {
		assert.Equal(t, tc.want, nftFirewallAdmits(tc.chain, ip(tc.src)), "%s from %s", tc.chain, tc.src)
	}
}
