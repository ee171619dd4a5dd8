package netns

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The IPv6 plan of a dual-stack environment (Config.IPv6), fixed as each
// environment has namespaces of its own: the pods' /64 (bridge ::1, pod i
// ::10+i), the service range routed to the bridge, and the client link (node
// ::1, client ::2).
var (
	IPv6PodCIDR      = netip.MustParsePrefix("fd00:10:244:1::/64")
	IPv6ServiceCIDR  = netip.MustParsePrefix("fd00:10:96::/112")
	IPv6ExternalCIDR = netip.MustParsePrefix("fd00:192:0:2::/64")
)

// nthAddr6 is the n-th address of an IPv6 prefix.
func nthAddr6(p netip.Prefix, n int) netip.Addr {
	a := p.Masked().Addr().As16()
	a[15] += byte(n)
	return netip.AddrFrom16(a)
}

// addr6 is an IPv6 address without duplicate address detection, usable at once.
func addr6(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(bits, 128)}, Flags: unix.IFA_F_NODAD}
}

// setupIPv6 gives the node and the client their IPv6 side: forwarding, bridged
// IPv6 through netfilter, the bridge's and both client-link addresses, the
// service route and the client's default route.
func (e *Env) setupIPv6() error {
	e.PodCIDR6, e.ServiceCIDR6 = IPv6PodCIDR, IPv6ServiceCIDR
	e.GatewayIP6 = nthAddr6(IPv6PodCIDR, 1)
	e.NodeIP6 = nthAddr6(IPv6ExternalCIDR, 1)
	e.ClientIP6 = nthAddr6(IPv6ExternalCIDR, 2)
	n := e.Node
	for _, kv := range [][2]string{
		{"net.ipv6.conf.all.forwarding", "1"},
		{"net.ipv6.conf.default.forwarding", "1"},
		{"net.bridge.bridge-nf-call-ip6tables", "1"},
	} {
		if err := n.sysctl(kv[0], kv[1]); err != nil {
			return err
		}
	}
	br, err := n.nl.LinkByName(BridgeName)
	if err != nil {
		return fmt.Errorf("find bridge %s: %w", BridgeName, err)
	}
	if err := n.nl.AddrAdd(br, addr6(e.GatewayIP6, 64)); err != nil {
		return fmt.Errorf("IPv6 address on %s: %w", BridgeName, err)
	}
	svc := IPv6ServiceCIDR
	if err := n.nl.RouteAdd(&netlink.Route{LinkIndex: br.Attrs().Index, Scope: netlink.SCOPE_UNIVERSE,
		Dst: &net.IPNet{IP: svc.Addr().AsSlice(), Mask: net.CIDRMask(svc.Bits(), 128)}}); err != nil {
		return fmt.Errorf("route %s via %s in node: %w", svc, BridgeName, err)
	}
	ext, err := n.nl.LinkByName(ExternalLink)
	if err != nil {
		return fmt.Errorf("find %s: %w", ExternalLink, err)
	}
	if err := n.nl.AddrAdd(ext, addr6(e.NodeIP6, 64)); err != nil {
		return fmt.Errorf("IPv6 address on %s: %w", ExternalLink, err)
	}
	return e.peerIPv6(e.Client, e.ClientIP6, e.NodeIP6)
}

// addPodIPv6 gives pod i its IPv6 address and default route via the bridge.
func (e *Env) addPodIPv6(p *Pod, i int) error {
	p.IP6 = nthAddr6(IPv6PodCIDR, 0x10+i)
	return e.peerIPv6(p.Namespace, p.IP6, e.GatewayIP6)
}

func (e *Env) peerIPv6(peer *Namespace, ip, gw netip.Addr) error {
	l, err := peer.nl.LinkByName(podLinkName)
	if err != nil {
		return fmt.Errorf("find %s in %s: %w", podLinkName, peer.Name, err)
	}
	if err := peer.nl.AddrAdd(l, addr6(ip, 64)); err != nil {
		return fmt.Errorf("IPv6 address on %s in %s: %w", podLinkName, peer.Name, err)
	}
	if err := peer.nl.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice(),
		Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}}); err != nil {
		return fmt.Errorf("IPv6 default route via %s in %s: %w", gw, peer.Name, err)
	}
	return nil
}
