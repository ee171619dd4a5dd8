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

	// Endpoints are the usable endpoints, already chosen by the caller (ready, else
	// serving+terminating). Order matters only for the rendering: the payload lists
	// endpoints in the order given.
	Endpoints []Endpoint

	// AffinityTimeout > 0 turns on ClientIP session affinity with that timeout.
	AffinityTimeout time.Duration
	// NoEndpoints is the verdict when Endpoints is empty. Empty means Reject.
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

// Validate checks one service port. It accepts IPv4 only: the writers are per
// family and this package writes the IPv4 family.
func (s *Service) Validate() error {
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
	if !s.ClusterIP.Is4() || s.ClusterIP.IsUnspecified() {
		return fail("cluster IP %v is not a usable IPv4 address", s.ClusterIP)
	}
	if s.Port < 1 || s.Port > 65535 {
		return fail("port %d out of range", s.Port)
	}
	if s.NodePort < 0 || s.NodePort > 65535 {
		return fail("node port %d out of range", s.NodePort)
	}
	for _, ip := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
		if !ip.Is4() || ip.IsUnspecified() {
			return fail("external or load-balancer IP %v is not a usable IPv4 address", ip)
		}
	}
	seen := make(map[Endpoint]bool, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		if !ep.IP.Is4() || ep.IP.IsUnspecified() {
			return fail("endpoint IP %v is not a usable IPv4 address", ep.IP)
		}
		if ep.Port < 1 || ep.Port > 65535 {
			return fail("endpoint %v: port out of range", ep)
		}
		if seen[ep] {
			return fail("endpoint %v listed twice", ep)
		}
		seen[ep] = true
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

// Validate checks every service port and that no two claim the same destination
// (cluster IP, external IP or load-balancer IP with protocol and port, or node port
// with protocol) or the same name.
func (st *State) Validate() error {
	type dest struct {
		ip    netip.Addr
		proto Protocol
		port  int
	}
	owner := map[dest]string{}
	names := map[string]bool{}
	for i := range st.Services {
		s := &st.Services[i]
		if err := s.Validate(); err != nil {
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
	_ Syncer = (*NFTables)(nil)
	_ Syncer = (*IPTables)(nil)
)

// Clone returns a deep copy of st, so a caller may keep a state it handed over.
func (st *State) Clone() *State {
	out := &State{Services: make([]Service, len(st.Services))}
	for i, s := range st.Services {
		s.ExternalIPs = slices.Clone(s.ExternalIPs)
		s.LoadBalancerIPs = slices.Clone(s.LoadBalancerIPs)
		s.Endpoints = slices.Clone(s.Endpoints)
		out.Services[i] = s
	}
	return out
}
