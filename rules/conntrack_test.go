package rules

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func flow(proto uint8, src, dst string, dport uint16, replySrc string, replySport uint16) *netlink.ConntrackFlow {
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(src), DstIP: net.ParseIP(dst), SrcPort: 40000, DstPort: dport},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: net.ParseIP(replySrc), SrcPort: replySport, DstIP: net.ParseIP(src), DstPort: 40000},
	}
}

func TestStaleUDPFilter(t *testing.T) {
	st := &State{Services: []Service{
		{Namespace: "kube-system", Name: "dns", Protocol: UDP, ClusterIP: ip("10.96.0.10"), Port: 53, NodePort: 30053,
			ExternalIPs: []netip.Addr{ip("192.0.2.50")}, Endpoints: []Endpoint{ep("10.244.1.10", 5353)}},
		{Namespace: "default", Name: "web", Protocol: TCP, ClusterIP: ip("10.96.0.20"), Port: 80},
	}}
	f := newStaleUDPFilter(st, IPv4)
	for _, tc := range []struct {
		name  string
		flow  *netlink.ConntrackFlow
		match bool
	}{
		{"to the VIP, DNATed to a gone endpoint", flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.12", 5353), true},
		{"to the VIP, DNATed to the serving endpoint", flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.10", 5353), false},
		{"right endpoint IP, old target port", flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.10", 53), true},
		{"to an external IP, gone endpoint", flow(unix.IPPROTO_UDP, "192.0.2.2", "192.0.2.50", 53, "10.244.1.12", 5353), true},
		{"to a node port, gone endpoint", flow(unix.IPPROTO_UDP, "192.0.2.2", "192.0.2.1", 30053, "10.244.1.12", 5353), true},
		{"to a node port, not DNATed", flow(unix.IPPROTO_UDP, "192.0.2.2", "192.0.2.1", 30053, "192.0.2.1", 30053), false},
		{"TCP is never touched", flow(unix.IPPROTO_TCP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.12", 5353), false},
		{"not a service destination", flow(unix.IPPROTO_UDP, "10.244.1.11", "10.244.1.12", 53, "10.244.1.12", 53), false},
		{"other port of the VIP", flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 54, "10.244.1.12", 54), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.match, f.MatchConntrackFlow(tc.flow))
		})
	}
}

type fakeConntrack struct {
	flows  []*netlink.ConntrackFlow
	err    error
	family netlink.InetFamily
}

func (f *fakeConntrack) ConntrackDeleteFilters(_ netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	f.family = family
	if f.err != nil {
		return 0, f.err
	}
	var kept []*netlink.ConntrackFlow
	var n uint
	for _, fl := range f.flows {
		if filters[0].MatchConntrackFlow(fl) {
			n++
			continue
		}
		kept = append(kept, fl)
	}
	f.flows = kept
	return n, nil
}

func TestCleanStaleUDP(t *testing.T) {
	st := &State{Services: []Service{{Namespace: "kube-system", Name: "dns", Protocol: UDP, ClusterIP: ip("10.96.0.10"), Port: 53,
		Endpoints: []Endpoint{ep("10.244.1.10", 53)}}}}
	fc := &fakeConntrack{flows: []*netlink.ConntrackFlow{
		flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.12", 53),
		flow(unix.IPPROTO_UDP, "10.244.1.11", "10.96.0.10", 53, "10.244.1.10", 53),
	}}
	c := &ConntrackCleaner{nl: fc}
	n, err := c.CleanStaleUDP(context.Background(), st)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Len(t, fc.flows, 1)

	fc.err = errors.New("netlink: operation not permitted")
	_, err = c.CleanStaleUDP(context.Background(), st)
	assert.ErrorContains(t, err, "conntrack")

	st.Services[0].Port = 0
	_, err = c.CleanStaleUDP(context.Background(), st)
	assert.ErrorIs(t, err, ErrInvalidState)
}

// TestCleanStaleUDPIPv6: an IPv6 state cleans the IPv6 table, node ports keyed by ::.
func TestCleanStaleUDPIPv6(t *testing.T) {
	st := &State{Services: []Service{{Namespace: "kube-system", Name: "dns", Protocol: UDP, ClusterIP: ip("fd00:96::10"), Port: 53,
		NodePort: 30053, Endpoints: []Endpoint{ep("fd00:244::10", 53)}}}}
	fc := &fakeConntrack{flows: []*netlink.ConntrackFlow{
		flow(unix.IPPROTO_UDP, "fd00:244::11", "fd00:96::10", 53, "fd00:244::12", 53),
		flow(unix.IPPROTO_UDP, "fd00:244::11", "fd00:96::10", 53, "fd00:244::10", 53),
		flow(unix.IPPROTO_UDP, "2001:db8::2", "2001:db8::1", 30053, "fd00:244::12", 53),
		flow(unix.IPPROTO_UDP, "2001:db8::2", "2001:db8::1", 30053, "2001:db8::1", 30053),
	}}
	c := &ConntrackCleaner{nl: fc}
	n, err := c.CleanStaleUDP(context.Background(), st)
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the gone endpoint, through the VIP and through the node port")
	assert.Equal(t, netlink.InetFamily(unix.AF_INET6), fc.family)

	fc.family = 0
	n, err = c.CleanStaleUDP(context.Background(), &State{Services: []Service{{Namespace: "a", Name: "b", Protocol: TCP,
		ClusterIP: ip("fd00:96::11"), Port: 80}}})
	require.NoError(t, err)
	assert.Zero(t, n)
	assert.Zero(t, fc.family, "no UDP service: the table is not walked")
}
