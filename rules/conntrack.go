package rules

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// conntrackDeleter is the slice of netlink the cleaner needs; *netlink.Handle has it.
type conntrackDeleter interface {
	ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error)
}

// ConntrackCleaner deletes UDP conntrack entries that would keep sending a client's
// datagrams to an endpoint that no longer serves. UDP has no connection to break, so
// without this a client that keeps its source port (a DNS resolver, say) talks to a
// gone pod until the entry times out, however often it retries.
type ConntrackCleaner struct {
	nl conntrackDeleter
}

// NewConntrackCleaner returns a cleaner working through h, a netlink handle bound to
// the node's network namespace. A nil h means the calling thread's namespace.
func NewConntrackCleaner(h *netlink.Handle) *ConntrackCleaner {
	if h == nil {
		return &ConntrackCleaner{nl: netlinkDefault{}}
	}
	return &ConntrackCleaner{nl: h}
}

type netlinkDefault struct{}

func (netlinkDefault) ConntrackDeleteFilters(table netlink.ConntrackTableType, family netlink.InetFamily, filters ...netlink.CustomConntrackFilter) (uint, error) {
	return netlink.ConntrackDeleteFilters(table, family, filters...)
}

// staleUDPFilter matches UDP flows whose original destination is a UDP service
// destination of st and whose reply source (the endpoint the flow was DNATed to) is
// not one of that service's endpoints.
type staleUDPFilter struct {
	// byDest maps a service destination (VIP:port, or 0.0.0.0:nodePort) to the
	// endpoints serving it.
	byDest    map[netip.AddrPort]map[netip.AddrPort]bool
	nodePorts map[uint16]bool
	// unspecified keys the node ports: 0.0.0.0 or ::.
	unspecified netip.Addr
}

func newStaleUDPFilter(st *State, family Family) *staleUDPFilter {
	unspecified := netip.IPv4Unspecified()
	if family == IPv6 {
		unspecified = netip.IPv6Unspecified()
	}
	out := &staleUDPFilter{byDest: map[netip.AddrPort]map[netip.AddrPort]bool{}, nodePorts: map[uint16]bool{}, unspecified: unspecified}
	for i := range st.Services {
		s := &st.Services[i]
		if s.Protocol != UDP {
			continue
		}
		eps := map[netip.AddrPort]bool{}
		for _, ep := range slices.Concat(s.Endpoints, s.LocalEndpoints) {
			eps[netip.AddrPortFrom(ep.IP, uint16(ep.Port))] = true
		}
		for _, ip := range append([]netip.Addr{s.ClusterIP}, append(s.ExternalIPs, s.LoadBalancerIPs...)...) {
			out.byDest[netip.AddrPortFrom(ip, uint16(s.Port))] = eps
		}
		if s.NodePort != 0 {
			out.byDest[netip.AddrPortFrom(unspecified, uint16(s.NodePort))] = eps
			out.nodePorts[uint16(s.NodePort)] = true
		}
	}
	return out
}

func (f *staleUDPFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok1 := netip.AddrFromSlice(flow.Forward.DstIP)
	replySrc, ok2 := netip.AddrFromSlice(flow.Reverse.SrcIP)
	if !ok1 || !ok2 {
		return false
	}
	dst, replySrc = dst.Unmap(), replySrc.Unmap()
	eps, ok := f.byDest[netip.AddrPortFrom(dst, flow.Forward.DstPort)]
	if !ok && f.nodePorts[flow.Forward.DstPort] {
		eps, ok = f.byDest[netip.AddrPortFrom(f.unspecified, flow.Forward.DstPort)]
		// A flow to a node port that was not DNATed is the node's own traffic.
		if ok && replySrc == dst {
			return false
		}
	}
	if !ok {
		return false
	}
	return !eps[netip.AddrPortFrom(replySrc, flow.Reverse.SrcPort)]
}

// CleanStaleUDP deletes the UDP flows to st's service destinations (cluster,
// external and load-balancer IPs, node ports) whose reply source is not a current
// endpoint of that service. Call it after a successful Sync of st. It returns how
// many flows it deleted.
//
// The state is of one family (the family of its first service port's cluster IP;
// an empty state means IPv4), and only that family's conntrack table is cleaned.
func (c *ConntrackCleaner) CleanStaleUDP(ctx context.Context, st *State) (int, error) {
	family, af := IPv4, uint8(unix.AF_INET)
	if len(st.Services) > 0 && FamilyOf(st.Services[0].ClusterIP) == IPv6 {
		family, af = IPv6, unix.AF_INET6
	}
	if err := st.ValidateFamily(family); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if !slices.ContainsFunc(st.Services, func(s Service) bool { return s.Protocol == UDP }) {
		return 0, nil // no UDP destination: no flow can match, skip the table walk
	}
	n, err := c.nl.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.InetFamily(af), newStaleUDPFilter(st, family))
	if err != nil {
		return int(n), fmt.Errorf("delete stale UDP conntrack entries: %w", err)
	}
	logr.FromContextOrDiscard(ctx).V(4).Info("deleted stale UDP conntrack entries", "count", n)
	return int(n), nil
}
