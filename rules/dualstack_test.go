package rules

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables/expr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/knftables"
)

// sampleState6 is sampleState's shapes in IPv6, plus source ranges and a Local
// external policy: every family-specific statement the writers emit.
func sampleState6() *State {
	return &State{Services: []Service{
		{Namespace: "ns1", Name: "svc1", PortName: "p80", Protocol: TCP, ClusterIP: ip("fd00:30::41"), Port: 80,
			Endpoints: []Endpoint{ep("fd00:180::1", 80)}},
		{Namespace: "ns4", Name: "svc4", PortName: "p80", Protocol: TCP, ClusterIP: ip("fd00:30::44"), Port: 80,
			ExternalIPs: []netip.Addr{ip("2001:db8:99::33")}, NodePort: 3004,
			Endpoints: []Endpoint{ep("fd00:180::4", 80), ep("fd00:180::5", 80)}},
		{Namespace: "ns5", Name: "svc5", PortName: "p80", Protocol: TCP, ClusterIP: ip("fd00:30::45"), Port: 80,
			LoadBalancerIPs: []netip.Addr{ip("2001:db8:5::8")}, NodePort: 3002, AffinityTimeout: DefaultAffinityTimeout,
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("2001:db8:2::7/128")},
			Endpoints:                []Endpoint{ep("fd00:180::3", 80)}},
		{Namespace: "ns6", Name: "svc6", PortName: "p80", Protocol: TCP, ClusterIP: ip("fd00:30::46"), Port: 80},
		{Namespace: "ns7", Name: "dns", PortName: "dns", Protocol: UDP, ClusterIP: ip("fd00:30::10"), Port: 53,
			NodePort: 30053, NoEndpoints: Drop},
		{Namespace: "ns8", Name: "local", PortName: "p80", Protocol: TCP, ClusterIP: ip("fd00:30::48"), Port: 80,
			NodePort: 3008, ExternalLocal: true,
			Endpoints:      []Endpoint{ep("fd00:180::8", 80), ep("fd00:180::9", 80)},
			LocalEndpoints: []Endpoint{ep("fd00:180::8", 80)}},
	}}
}

func sampleConfig6() NFTablesConfig {
	return NFTablesConfig{
		Family:            IPv6,
		ClusterCIDR:       netip.MustParsePrefix("fd00:180::/64"),
		ServiceCIDRs:      []netip.Prefix{netip.MustParsePrefix("fd00:30::/108")},
		NodePortAddresses: []netip.Addr{ip("2001:db8::2")},
		NodeIP:            ip("2001:db8::2"),
	}
}

func TestRenderIPv6(t *testing.T) {
	t.Run("nftables", func(t *testing.T) {
		out, err := RenderNFTables(sampleConfig6(), sampleState6())
		require.NoError(t, err)
		golden(t, "nftables-full-ipv6.golden", out)
		assert.NotContains(t, out, " ip ", "no IPv4 statement in an ip6 table")
		assert.Contains(t, out, "add table ip6 kube-proxy")
		assert.Contains(t, out, "add set ip6 kube-proxy cluster-ips { type ipv6_addr ;")
		// Every node address: the loopback exception is ip6's.
		all, err := RenderNFTables(NFTablesConfig{Family: IPv6, Table: "nodekit", MasqueradeAll: true}, sampleState6())
		require.NoError(t, err)
		assert.Contains(t, all, "fib daddr type local ip6 daddr != ::1 meta l4proto . th dport vmap @service-nodeports")
		assert.Contains(t, all, "dnat to [fd00:180::1]:80")
	})
	t.Run("iptables", func(t *testing.T) {
		out, err := RenderIPTables(IPTablesConfig{Family: IPv6, ClusterCIDR: netip.MustParsePrefix("fd00:180::/64"),
			NodeIP: ip("2001:db8::2")}, sampleState6())
		require.NoError(t, err)
		golden(t, "iptables-full-ipv6.golden", out)
		assert.Contains(t, out, "-j DNAT --to-destination [fd00:180::1]:80")
	})
}

// TestEndpointNamesIPv6: chain names hold no colon; the hash is of the dotted form,
// as kube-proxy names them.
func TestEndpointNamesIPv6(t *testing.T) {
	s := &Service{Namespace: "ns1", Name: "svc1", PortName: "p80", Protocol: TCP}
	name := nftEndpointBase(s, ep("fd00:180::1", 80))
	assert.Equal(t, nftHashName("ns1/svc1/tcp/p80__fd00.180..1/80"), name)
	assert.NotContains(t, name, ":")
}

// TestFamilyMismatch: a writer refuses addresses of the other family, naming the
// service port, and configs of the other family.
func TestFamilyMismatch(t *testing.T) {
	ctx := context.Background()
	_, err := RenderNFTables(sampleConfig6(), sampleState())
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), `"ns1/svc1:p80"`)
	assert.Contains(t, err.Error(), "IPv6")
	_, err = RenderNFTables(sampleConfig(), sampleState6())
	require.ErrorIs(t, err, ErrInvalidState)
	_, err = RenderIPTables(IPTablesConfig{Family: IPv6}, sampleState())
	require.ErrorIs(t, err, ErrInvalidState)

	mixed := sampleState6()
	mixed.Services[1].Endpoints[1].IP = ip("10.180.0.5")
	_, err = RenderNFTables(sampleConfig6(), mixed)
	require.ErrorIs(t, err, ErrInvalidState)
	assert.Contains(t, err.Error(), "ns4/svc4:p80")
	mapped := sampleState6()
	mapped.Services[0].ClusterIP = ip("::ffff:10.0.0.1")
	_, err = RenderNFTables(sampleConfig6(), mapped)
	require.ErrorIs(t, err, ErrInvalidState, "an IPv4-mapped address is not an IPv6 service address")

	for _, cfg := range []NFTablesConfig{
		{Family: "IPv5"},
		{Family: IPv6, ClusterCIDR: netip.MustParsePrefix("10.0.0.0/8")},
		{Family: IPv6, ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}},
		{Family: IPv6, NodePortAddresses: []netip.Addr{ip("192.0.2.1")}},
		{Family: IPv6, NodeIP: ip("192.0.2.1")},
		{ClusterCIDR: netip.MustParsePrefix("fd00::/64")},
	} {
		_, err := RenderNFTables(cfg, &State{})
		assert.ErrorIs(t, err, ErrInvalidConfig, "%+v", cfg)
	}
	_, err = RenderIPTables(IPTablesConfig{Family: IPv6, NodeIP: ip("192.0.2.1")}, &State{})
	assert.ErrorIs(t, err, ErrInvalidConfig)

	// A partial sync validates the changed port for the writer's family too.
	w, err := newNFTablesWith(sampleConfig6(), knftables.NewFake(knftables.IPv6Family, "kube-proxy"))
	require.NoError(t, err)
	st := sampleState6()
	require.NoError(t, w.Sync(ctx, st))
	st.Services[0].Endpoints = []Endpoint{ep("10.180.0.1", 80)}
	require.ErrorIs(t, w.Sync(ctx, st), ErrInvalidState)
}

func TestIPTablesBinaries(t *testing.T) {
	for _, tc := range []struct {
		family Family
		mode   IPTablesMode
		tool   string
		want   string
	}{
		{IPv4, IPTablesNFT, "iptables-restore", "iptables-restore"},
		{IPv6, IPTablesNFT, "iptables-restore", "ip6tables-restore"},
		{IPv6, IPTablesNFT, "iptables-save", "ip6tables-save"},
		{IPv6, IPTablesNFT, "iptables", "ip6tables"},
		{IPv4, IPTablesLegacy, "iptables-save", "iptables-legacy-save"},
		{IPv4, IPTablesLegacy, "iptables", "iptables-legacy"},
		{IPv6, IPTablesLegacy, "iptables-restore", "ip6tables-legacy-restore"},
		{IPv6, IPTablesLegacy, "iptables", "ip6tables-legacy"},
	} {
		c := IPTablesConfig{Family: tc.family, Mode: tc.mode}
		assert.Equal(t, tc.want, c.binary(tc.tool), "%s %s %s", tc.family, tc.mode, tc.tool)
	}
}

// TestRuleExprsIPv6 pins the ip6 translations to nft 1.0.6's bytecode for the same
// text (nft --debug=netlink in an ip6 table).
func TestRuleExprsIPv6(t *testing.T) {
	fd := func(s string) []byte { return ip(s).AsSlice() }
	for _, tc := range []struct {
		rule string
		want []expr.Any
	}{
		{"ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: fd("::1")},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "no-endpoint-nodeports", IsDestRegSet: true}}},
		{"ip6 daddr . meta l4proto . th dport vmap @service-ips", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 12},
			&expr.Payload{DestRegister: 13, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "service-ips", IsDestRegSet: true}}},
		{"ip6 saddr fd00:180::/64 goto x", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 8},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: fd("fd00:180::")[:8]},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: "x"}}},
		{"ip6 daddr { fd00:30::/108 } drop", []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 16,
				Mask: fd("ffff:ffff:ffff:ffff:ffff:ffff:fff0:0"), Xor: make([]byte, 16)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: fd("fd00:30::")},
			&expr.Verdict{Kind: expr.VerdictDrop}}},
		{"meta l4proto tcp dnat to [fd00:180::4]:80", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6}},
			&expr.Immediate{Register: 1, Data: fd("fd00:180::4")},
			&expr.Immediate{Register: 2, Data: []byte{0, 80}},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: 1, RegProtoMin: 2, Specified: true}}},
		{"reject", []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 4}}},
	} {
		got, err := ruleExprs(IPv6, tc.rule)
		require.NoError(t, err, tc.rule)
		assert.Equal(t, tc.want, got, tc.rule)
	}
	for _, rule := range []string{"ip daddr 10.0.0.1 drop", "dnat to 10.0.0.1:80", "ip6 daddr 10.0.0.1 drop", "update @s { ip saddr }"} {
		_, err := ruleExprs(IPv6, rule)
		assert.ErrorIs(t, err, errUnsupportedRule, "%q", rule)
	}
}

// TestNetlinkEncodesIPv6: every transaction of the IPv6 sample encodes, with the
// ip6 family byte in every nf_tables message.
func TestNetlinkEncodesIPv6(t *testing.T) {
	ctx := context.Background()
	w, err := newNFTablesWith(sampleConfig6(), knftables.NewFake(knftables.IPv6Family, "kube-proxy"))
	require.NoError(t, err)
	a := newNetlinkApplier(IPv6, w.cfg.Table)
	st := sampleState6()
	for step, mutate := range []func(){
		func() {},
		func() { st.Services[1].Endpoints = st.Services[1].Endpoints[:1] },
		func() { st.Services[2].AffinityTimeout = time.Minute },
		func() { st.Services[2].LoadBalancerSourceRanges = st.Services[2].LoadBalancerSourceRanges[:1] },
		func() { st.Services = st.Services[1:] },
	} {
		mutate()
		w.applier = a
		tx, _, _, err := w.transaction(ctx, st, nil)
		require.NoError(t, err)
		w.applier = cliApplier{w.nft}
		b, keys, err := a.encode(tx)
		require.NoError(t, err, "step %d", step)
		for name, typ := range keys { // what apply remembers once the kernel took the batch
			if typ == nil {
				delete(a.keys, name)
			} else {
				a.keys[name] = typ
			}
		}
		assert.Greater(t, strings.Count(string(b.buf), "kube-proxy"), 0)
		require.NoError(t, w.Sync(ctx, st))
	}
}

func TestIntervalElementsIPv6(t *testing.T) {
	els := intervalElements([]netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("2001:db8:2::7/128"),
		netip.MustParsePrefix("2001:db8:1:5::/64")})
	var got []string
	for _, e := range els {
		s := e.key.String()
		if e.end {
			s += " end"
		}
		got = append(got, s)
	}
	assert.Equal(t, []string{":: end", "2001:db8:1::", "2001:db8:2:: end", "2001:db8:2::7", "2001:db8:2::8 end"}, got)
	open := intervalElements([]netip.Prefix{netip.MustParsePrefix("ff00::/8")})
	require.Len(t, open, 2)
	assert.True(t, open[1].open)
}
