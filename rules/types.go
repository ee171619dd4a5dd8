package rules

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Sentinel errors. Every error the package returns wraps one of them with the object
// at fault, so callers can use errors.Is.
var (
	// ErrInvalidState marks desired state that cannot be written (bad address, port,
	// protocol, name, duplicate service port...).
	ErrInvalidState = errors.New("invalid desired state")
	// ErrInvalidConfig marks a Config that New rejects.
	ErrInvalidConfig = errors.New("invalid rules config")
	// ErrApplyFailed marks a sync the kernel refused. The transaction is atomic, so
	// the rules that were there before are still in force.
	ErrApplyFailed = errors.New("applying rules failed")
)

// Protocol is a service port's L4 protocol.
type Protocol string

// The protocols Kubernetes services carry.
const (
	TCP  Protocol = "TCP"
	UDP  Protocol = "UDP"
	SCTP Protocol = "SCTP"
)

// lower is the protocol as nftables and iptables spell it.
func (p Protocol) lower() string { return strings.ToLower(string(p)) }

// NoEndpointsAction is what happens to new connections to a service port with no
// usable endpoints.
type NoEndpointsAction string

const (
	// Reject answers at once (TCP RST / ICMP port unreachable), as kube-proxy does
	// for a service with no endpoints. It is the default.
	Reject NoEndpointsAction = "reject"
	// Drop discards silently, as kube-proxy does for external traffic to a
	// service whose Local traffic policy finds no local endpoint.
	Drop NoEndpointsAction = "drop"
)

// Family is the IP family a writer serves. Each writer writes one family, as each
// of upstream kube-proxy's proxiers does; a dual-stack node runs one writer per
// family (upstream's MetaProxier).
type Family string

// The two IP families, spelled as Kubernetes spells them (v1.IPFamily).
const (
	IPv4 Family = "IPv4"
	IPv6 Family = "IPv6"
)

// FamilyOf is the family of an address (an IPv4-mapped IPv6 address is IPv6).
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// has reports whether a is a valid address of the family.
func (f Family) has(a netip.Addr) bool {
	if f == IPv6 {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4()
}

// check returns an error unless f is IPv4 or IPv6; empty is defaulted to IPv4.
func (f *Family) check() error {
	switch *f {
	case "":
		*f = IPv4
	case IPv4, IPv6:
	default:
		return fmt.Errorf("%w: IP family %q is not %q or %q", ErrInvalidConfig, *f, IPv4, IPv6)
	}
	return nil
}

// DefaultAffinityTimeout is Kubernetes' default ClientIP session affinity timeout
// (sessionAffinityConfig.clientIP.timeoutSeconds = 10800).
const DefaultAffinityTimeout = 10800 * time.Second

// State is the desired set of service ports. The agents convert their service and
// endpoint caches into it; the package keeps no reference to it after a call returns.
type State struct {
	Services []Service
}

// Service is one service port: the unit kube-proxy writes rules for.
type Service struct {
	// Namespace, Name and PortName identify the port, as in the Service object; they
	// name the chains and fill the comments (`ns/name:port`). PortName may be empty
	// for a single-port service.
	Namespace string
	Name      string
	PortName  string

	Protocol  Protocol
	ClusterIP netip.Addr
	Port      int
	// NodePort is 0 when the service has none.
	NodePort int
	// ExternalIPs and LoadBalancerIPs are "external" destinations: traffic to them
	// is always masqueraded (Cluster traffic policy).
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// LoadBalancerSourceRanges restrict which clients reach the LoadBalancerIPs
	// (spec.loadBalancerSourceRanges, the caller having dropped invalid entries and
	// treated a zero-length prefix as no restriction, as kube-proxy does). Other
	// sources are dropped before DNAT. Empty, or no LoadBalancerIPs, means no
	// restriction. Like kube-proxy, the ranges never apply to the cluster IP, the
	// external IPs or the node port.
	LoadBalancerSourceRanges []netip.Prefix

	// Endpoints are the usable endpoints for the Cluster traffic policy, already
	// chosen by the caller (ready, else serving+terminating; upstream's
	// clusterEndpoints). Order matters only for the rendering: the payload lists
	// endpoints in the order given.
	Endpoints []Endpoint

	// InternalLocal and ExternalLocal are internalTrafficPolicy: Local and
	// externalTrafficPolicy: Local. Traffic to the cluster IP (internal) or to the
	// node ports, external and load-balancer IPs (external) whose policy is Local
	// goes to LocalEndpoints only; external traffic then keeps its source address,
	// except that traffic from the cluster CIDR (pods) and from the node itself is
	// short-circuited to Endpoints, as kube-proxy does. When a Local policy finds
	// LocalEndpoints empty while the port has endpoints elsewhere, that traffic is
	// dropped ("has no local endpoints").
	InternalLocal, ExternalLocal bool
	// LocalEndpoints are this node's usable endpoints (upstream's localEndpoints),
	// used only by the traffic whose policy is Local.
	LocalEndpoints []Endpoint

	// AffinityTimeout > 0 turns on ClientIP session affinity with that timeout.
	AffinityTimeout time.Duration
	// NoEndpoints is the verdict when Endpoints and LocalEndpoints are both empty.
	// Empty means Reject. A caller whose Local policy finds no local endpoint on a
	// ClusterIP-only port with endpoints on other nodes (so Endpoints is empty too)
	// sets Drop, as kube-proxy drops that traffic.
	NoEndpoints NoEndpointsAction
}

// Endpoint is one backend address and target port.
type Endpoint struct {
	IP   netip.Addr
	Port int
}

// String is "ip:port".
func (e Endpoint) String() string { return netip.AddrPortFrom(e.IP, uint16(e.Port)).String() }

// PortNameString is the service port's name as kube-proxy prints it: "ns/name:port", or
// "ns/name" when the port has no name.
func (s *Service) PortNameString() string {
	if s.PortName == "" {
		return s.Namespace + "/" + s.Name
	}
	return s.Namespace + "/" + s.Name + ":" + s.PortName
}

// dns1123Label is the syntax of namespace, service and port names.
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Validate checks one service port of the IPv4 family (ValidateFamily(IPv4)).
func (s *Service) Validate() error { return s.ValidateFamily(IPv4) }

// ValidateFamily checks one service port for a writer of family f: every address
// and prefix must be of that family, as each writer serves one family.
func (s *Service) ValidateFamily(f Family) error {
	if err := f.check(); err != nil {
		return err
	}
	name := s.PortNameString()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: service port %q: %s", ErrInvalidState, name, fmt.Sprintf(format, args...))
	}
	for _, f := range []struct{ what, v string }{{"namespace", s.Namespace}, {"name", s.Name}} {
		if len(f.v) > 63 || !dns1123Label.MatchString(f.v) {
			return fail("%s %q is not a DNS-1123 label", f.what, f.v)
		}
	}
	if s.PortName != "" && (len(s.PortName) > 63 || !dns1123Label.MatchString(s.PortName)) {
		return fail("port name %q is not a DNS-1123 label", s.PortName)
	}
	switch s.Protocol {
	case TCP, UDP, SCTP:
	default:
		return fail("protocol %q is not TCP, UDP or SCTP", s.Protocol)
	}
	if !f.has(s.ClusterIP) || s.ClusterIP.IsUnspecified() {
		return fail("cluster IP %v is not a usable %s address", s.ClusterIP, f)
	}
	if s.Port < 1 || s.Port > 65535 {
		return fail("port %d out of range", s.Port)
	}
	if s.NodePort < 0 || s.NodePort > 65535 {
		return fail("node port %d out of range", s.NodePort)
	}
	for _, ip := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
		if !f.has(ip) || ip.IsUnspecified() {
			return fail("external or load-balancer IP %v is not a usable %s address", ip, f)
		}
	}
	for _, p := range s.LoadBalancerSourceRanges {
		if !p.IsValid() || !f.has(p.Addr()) {
			return fail("load-balancer source range %v is not an %s prefix", p, f)
		}
	}
	for _, list := range []struct {
		what string
		eps  []Endpoint
	}{{"endpoint", s.Endpoints}, {"local endpoint", s.LocalEndpoints}} {
		seen := make(map[Endpoint]bool, len(list.eps))
		for _, ep := range list.eps {
			if !f.has(ep.IP) || ep.IP.IsUnspecified() {
				return fail("%s IP %v is not a usable %s address", list.what, ep.IP, f)
			}
			if ep.Port < 1 || ep.Port > 65535 {
				return fail("%s %v: port out of range", list.what, ep)
			}
			if seen[ep] {
				return fail("%s %v listed twice", list.what, ep)
			}
			seen[ep] = true
		}
	}
	if len(s.LocalEndpoints) > 0 && !s.InternalLocal && !s.ExternalLocal {
		return fail("local endpoints given but neither traffic policy is Local")
	}
	if s.AffinityTimeout < 0 {
		return fail("negative affinity timeout %v", s.AffinityTimeout)
	}
	if s.AffinityTimeout%time.Second != 0 {
		return fail("affinity timeout %v is not whole seconds", s.AffinityTimeout)
	}
	switch s.NoEndpoints {
	case "", Reject, Drop:
	default:
		return fail("no-endpoints action %q is not reject or drop", s.NoEndpoints)
	}
	return nil
}

// Validate checks an IPv4 state (ValidateFamily(IPv4)).
func (st *State) Validate() error { return st.ValidateFamily(IPv4) }

// ValidateFamily checks every service port for a writer of family f and that no two
// claim the same destination (cluster IP, external IP or load-balancer IP with
// protocol and port, or node port with protocol) or the same name.
func (st *State) ValidateFamily(f Family) error {
	type dest struct {
		ip    netip.Addr
		proto Protocol
		port  int
	}
	owner := map[dest]string{}
	names := map[string]bool{}
	for i := range st.Services {
		s := &st.Services[i]
		if err := s.ValidateFamily(f); err != nil {
			return err
		}
		key := s.PortNameString() + "/" + string(s.Protocol)
		if names[key] {
			return fmt.Errorf("%w: service port %q (%s) listed twice", ErrInvalidState, s.PortNameString(), s.Protocol)
		}
		names[key] = true
		dests := []dest{{s.ClusterIP, s.Protocol, s.Port}}
		for _, ip := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
			dests = append(dests, dest{ip, s.Protocol, s.Port})
		}
		if s.NodePort != 0 {
			dests = append(dests, dest{netip.Addr{}, s.Protocol, s.NodePort})
		}
		for _, d := range dests {
			if o, ok := owner[d]; ok && o != s.PortNameString() {
				return fmt.Errorf("%w: service ports %q and %q both claim %v %s/%d", ErrInvalidState, o, s.PortNameString(), d.ip, d.proto, d.port)
			}
			owner[d] = s.PortNameString()
		}
	}
	return nil
}

// Syncer is what the agents drive: both writers implement it, and rulestest.Fake
// stands in for them in the agents' unit tests.
type Syncer interface {
	// Sync makes the kernel match st atomically.
	Sync(ctx context.Context, st *State) error
	// DryRun returns the payload the next Sync of st would write.
	DryRun(ctx context.Context, st *State) (string, error)
	// ForceFullSync makes the next Sync rewrite everything.
	ForceFullSync()
}

var (
	_ Syncer        = (*NFTables)(nil)
	_ Syncer        = (*IPTables)(nil)
	_ PartialSyncer = (*NFTables)(nil)
)

// ErrFullSyncNeeded is what SyncChanges returns when the writer has no record of
// what is in the kernel (no successful sync yet, a failed one, or ForceFullSync):
// the caller must Sync the whole state instead. Nothing was written.
var ErrFullSyncNeeded = errors.New("a full sync is needed")

// PortID names a service port as the writers key it: namespace, name, port name
// and protocol.
type PortID struct {
	Namespace, Name, PortName string
	Protocol                  Protocol
}

// ID is the service port's PortID.
func (s *Service) ID() PortID { return PortID{s.Namespace, s.Name, s.PortName, s.Protocol} }

// Changes is a partial update of the desired state: the service ports that are
// new or may have changed, each in full, and the ones that are gone. Ports named
// in neither are as the last sync left them. A port may appear only once.
type Changes struct {
	Set    []Service
	Remove []PortID
}

// PartialSyncer is a Syncer that can also take only what changed, at a cost in
// proportion to the change rather than to the whole state.
type PartialSyncer interface {
	Syncer
	// SyncChanges makes the kernel match the last synced state with ch applied,
	// atomically, exactly as Sync of that whole state would; it returns
	// ErrFullSyncNeeded when there is no last state to apply ch to.
	SyncChanges(ctx context.Context, ch *Changes) error
}

// Clone returns a deep copy of st, so a caller may keep a state it handed over.
func (st *State) Clone() *State {
	out := &State{Services: make([]Service, len(st.Services))}
	for i, s := range st.Services {
		s.ExternalIPs = slices.Clone(s.ExternalIPs)
		s.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
		s.LoadBalancerSourceRanges = slices.Clone(s.LoadBalancerSourceRanges)
		s.Endpoints = slices.Clone(s.Endpoints)
		s.LocalEndpoints = slices.Clone(s.LocalEndpoints)
		out.Services[i] = s
	}
	return out
}

// usesFirewall reports whether the port's load-balancer IPs are restricted to its
// source ranges (upstream's usesFWChain, before its endpoint condition).
func (s *Service) usesFirewall() bool {
	return len(s.LoadBalancerIPs) > 0 && len(s.LoadBalancerSourceRanges) > 0
}

// allowsNode reports whether nodeIP falls in one of the source ranges: then the
// load-balancer IPs themselves are allowed as sources too, for the node's own
// requests to a VIP it holds as a local address (upstream's allowFromNode).
func (s *Service) allowsNode(nodeIP netip.Addr) bool {
	if !nodeIP.IsValid() {
		return false
	}
	for _, p := range s.LoadBalancerSourceRanges {
		if p.Contains(nodeIP) {
			return true
		}
	}
	return false
}

// externallyAccessible reports whether the port has external destinations (a node
// port, external IPs or load-balancer IPs), as upstream's ExternallyAccessible.
func (s *Service) externallyAccessible() bool {
	return s.NodePort != 0 || len(s.ExternalIPs) > 0 || len(s.LoadBalancerIPs) > 0
}

// policyPlan is what kube-proxy derives from a port's endpoints and policies:
// which endpoints each kind of traffic uses, and the verdict for a kind with none.
type policyPlan struct {
	// hasEndpoints: the port has endpoints (upstream's hasEndpoints).
	hasEndpoints bool
	// usesCluster / usesLocal: the Cluster / Local endpoint chain is written.
	usesCluster, usesLocal bool
	// internal / external are the endpoints of each kind of traffic.
	internal, external []Endpoint
	// internalVerdict / externalVerdict are empty when that traffic has endpoints,
	// else Reject or Drop.
	internalVerdict, externalVerdict NoEndpointsAction
	// all is every endpoint some chain of the port uses (cluster then local, no
	// duplicates): the endpoint chains and hairpin entries.
	all []Endpoint
}

func (s *Service) policy() policyPlan {
	var p policyPlan
	p.hasEndpoints = len(s.Endpoints) > 0 || len(s.LocalEndpoints) > 0
	ext := s.externallyAccessible()
	p.usesCluster = len(s.Endpoints) > 0 && (!s.InternalLocal || ext)
	p.usesLocal = len(s.LocalEndpoints) > 0
	p.internal, p.external = s.Endpoints, s.Endpoints
	if s.InternalLocal {
		p.internal = s.LocalEndpoints
	}
	if s.ExternalLocal {
		p.external = s.LocalEndpoints
	}
	none := s.NoEndpoints
	if none == "" {
		none = Reject
	}
	if p.hasEndpoints {
		none = Drop
	}
	if len(p.internal) == 0 {
		p.internalVerdict = none
	}
	if len(p.external) == 0 {
		p.externalVerdict = none
	}
	seen := make(map[Endpoint]bool, len(s.Endpoints)+len(s.LocalEndpoints))
	add := func(eps []Endpoint) {
		for _, ep := range eps {
			if !seen[ep] {
				seen[ep] = true
				p.all = append(p.all, ep)
			}
		}
	}
	if p.usesCluster {
		add(s.Endpoints)
	}
	add(s.LocalEndpoints)
	return p
}
