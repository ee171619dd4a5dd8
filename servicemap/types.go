package servicemap

import (
	"net/netip"
	"slices"
	"strconv"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ServicePortName identifies one load-balanced port of a Service: namespace, name,
// the port's name ("" for a single unnamed port) and its protocol. It is the key
// kube-proxy uses to join a Service's ports with its EndpointSlices' ports.
type ServicePortName struct {
	types.NamespacedName
	Port     string
	Protocol v1.Protocol
}

// String renders the name as kube-proxy does: "namespace/name" followed by
// ":port" when the port has a name. The protocol is not part of the text.
func (n ServicePortName) String() string {
	if n.Port == "" {
		return n.NamespacedName.String()
	}
	return n.NamespacedName.String() + ":" + n.Port
}

// Less orders names by namespace, name, port name and protocol.
func (n ServicePortName) Less(o ServicePortName) bool {
	if n.Namespace != o.Namespace {
		return n.Namespace < o.Namespace
	}
	if n.Name != o.Name {
		return n.Name < o.Name
	}
	if n.Port != o.Port {
		return n.Port < o.Port
	}
	return n.Protocol < o.Protocol
}

// ServicePort is everything a proxy needs to program one port of one Service,
// with the Service's endpoints for that port merged across all its EndpointSlices.
//
// Values handed out by a Snapshot are shared by every reader and must not be
// modified, including the slices they hold.
type ServicePort struct {
	Name ServicePortName

	// ClusterIPs holds the Service's cluster IPs in spec order (primary family
	// first). A Service is tracked only if it has at least one valid cluster IP.
	ClusterIPs []netip.Addr
	Port       int32
	// NodePort is 0 when the port has none.
	NodePort int32
	Protocol v1.Protocol
	// ExternalIPs are the valid entries of spec.externalIPs, both families.
	ExternalIPs []netip.Addr
	// LoadBalancerVIPs are status.loadBalancer.ingress IPs whose ipMode is VIP
	// (or unset), both families. Proxy-mode ingresses are left out, as kube-proxy does.
	LoadBalancerVIPs []netip.Addr
	// LoadBalancerSourceRanges are the valid, whitespace-trimmed entries of
	// spec.loadBalancerSourceRanges, both families, as written. Use SourceRanges
	// for the per-family value a proxy programs.
	LoadBalancerSourceRanges []netip.Prefix

	SessionAffinity v1.ServiceAffinity
	// StickyMaxAgeSeconds is the ClientIP affinity timeout (default 10800), 0 without affinity.
	StickyMaxAgeSeconds int32
	// HealthCheckNodePort is set only for type LoadBalancer with externalTrafficPolicy Local.
	HealthCheckNodePort int32

	// ExternalPolicyLocal: externalTrafficPolicy Local on an externally accessible Service.
	ExternalPolicyLocal bool
	// InternalPolicyLocal: internalTrafficPolicy Local.
	InternalPolicyLocal bool

	// Endpoints for this port from every EndpointSlice of the Service (IPv4 and
	// IPv6 slices), deduplicated by address and port, sorted by address then port.
	Endpoints []Endpoint
}

// ExternallyAccessible reports whether the port is reachable other than through
// its cluster IP: a NodePort, an external IP or a load-balancer VIP.
func (sp *ServicePort) ExternallyAccessible() bool {
	return sp.NodePort != 0 || len(sp.ExternalIPs) != 0 || len(sp.LoadBalancerVIPs) != 0
}

// UsesClusterEndpoints reports whether traffic to this port is ever sent to
// endpoints chosen by the Cluster traffic policy: internal policy Cluster, or any
// external access (external Local still short-circuits in-cluster sources to Cluster endpoints).
func (sp *ServicePort) UsesClusterEndpoints() bool {
	return !sp.InternalPolicyLocal || sp.ExternallyAccessible()
}

// UsesLocalEndpoints reports whether traffic to this port is ever restricted to
// endpoints on this node.
func (sp *ServicePort) UsesLocalEndpoints() bool {
	return sp.InternalPolicyLocal || (sp.ExternalPolicyLocal && sp.ExternallyAccessible())
}

// ClusterIP returns the cluster IP of the given family, if the Service has one.
func (sp *ServicePort) ClusterIP(family v1.IPFamily) (netip.Addr, bool) {
	for _, ip := range sp.ClusterIPs {
		if familyOf(ip) == family {
			return ip, true
		}
	}
	return netip.Addr{}, false
}

// SourceRanges returns the load-balancer source ranges of one family as kube-proxy's
// proxier for that family uses them: a zero-length prefix among them means "allow
// all", which is returned as no ranges.
func (sp *ServicePort) SourceRanges(family v1.IPFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range sp.LoadBalancerSourceRanges {
		if familyOf(p.Addr()) != family {
			continue
		}
		if p.Bits() == 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}

// ForFamily returns the port as kube-proxy's proxier for one IP family sees it:
// only that family's cluster IP, external IPs, load-balancer VIPs, source ranges
// (zero prefix meaning none) and endpoints. ok is false when the Service has no
// cluster IP of that family; such a proxier ignores the Service.
func (sp *ServicePort) ForFamily(family v1.IPFamily) (out *ServicePort, ok bool) {
	ip, ok := sp.ClusterIP(family)
	if !ok {
		return nil, false
	}
	c := *sp
	c.ClusterIPs = []netip.Addr{ip}
	c.ExternalIPs = filterAddrs(sp.ExternalIPs, family)
	c.LoadBalancerVIPs = filterAddrs(sp.LoadBalancerVIPs, family)
	c.LoadBalancerSourceRanges = sp.SourceRanges(family)
	c.Endpoints = endpointsOfFamily(sp.Endpoints, family)
	return &c, true
}

func filterAddrs(in []netip.Addr, family v1.IPFamily) []netip.Addr {
	var out []netip.Addr
	for _, a := range in {
		if familyOf(a) == family {
			out = append(out, a)
		}
	}
	return out
}

func endpointsOfFamily(in []Endpoint, family v1.IPFamily) []Endpoint {
	n := 0
	for i := range in {
		if familyOf(in[i].Addr) == family {
			n++
		}
	}
	if n == len(in) {
		return in
	}
	out := make([]Endpoint, 0, n)
	for i := range in {
		if familyOf(in[i].Addr) == family {
			out = append(out, in[i])
		}
	}
	return out
}

func familyOf(a netip.Addr) v1.IPFamily {
	switch {
	case a.Is4():
		return v1.IPv4Protocol
	case a.Is6():
		return v1.IPv6Protocol
	}
	return v1.IPFamilyUnknown
}

// Cond is an EndpointSlice endpoint condition exactly as the API object carried it:
// unset (a nil pointer) or explicitly true or false. Unset means the API's default,
// which differs per condition (ready and serving default to true, terminating to false).
type Cond uint8

const (
	// CondUnset is a nil condition pointer.
	CondUnset Cond = iota
	// CondTrue is a condition pointing at true.
	CondTrue
	// CondFalse is a condition pointing at false.
	CondFalse
)

// CondOf converts an API condition pointer.
func CondOf(p *bool) Cond {
	switch {
	case p == nil:
		return CondUnset
	case *p:
		return CondTrue
	}
	return CondFalse
}

// Or returns the condition's value, or def when it is unset.
func (c Cond) Or(def bool) bool {
	switch c {
	case CondTrue:
		return true
	case CondFalse:
		return false
	}
	return def
}

// Ptr converts back to the API's representation (nil when unset).
func (c Cond) Ptr() *bool {
	if c == CondUnset {
		return nil
	}
	v := c == CondTrue
	return &v
}

func (c Cond) String() string {
	switch c {
	case CondTrue:
		return "true"
	case CondFalse:
		return "false"
	}
	return "unset"
}

// Endpoint is one backend of a service port. It is a small value (40 bytes on
// 64-bit platforms): where the endpoint runs lives in a shared Topology.
type Endpoint struct {
	// Addr is the endpoint's first address (kube-proxy ignores the others).
	Addr netip.Addr
	// Port is the endpoint port for this service port (from the slice's ports).
	Port int32
	// Ready, Serving and Terminating are the slice's conditions as sent.
	Ready, Serving, Terminating Cond
	// Topology holds the endpoint's node, zone and hints; nil when the slice set
	// none of them. Endpoints handed out by a Snapshot share Topology values with
	// every endpoint in the same place, so they must not be modified.
	Topology *Topology
}

// Topology says where an endpoint runs and which topology hints it carries.
type Topology struct {
	// NodeName and Zone are empty when the slice left them unset.
	NodeName string
	Zone     string
	// ZoneHints and NodeHints are the hints' names, sorted and deduplicated; nil without hints.
	ZoneHints []string
	NodeHints []string
}

func (t *Topology) equal(o *Topology) bool {
	if t == o {
		return true
	}
	if t == nil || o == nil {
		return false
	}
	return t.NodeName == o.NodeName && t.Zone == o.Zone &&
		slices.Equal(t.ZoneHints, o.ZoneHints) && slices.Equal(t.NodeHints, o.NodeHints)
}

// NodeName is the endpoint's node name, "" when unset.
func (e *Endpoint) NodeName() string {
	if e.Topology == nil {
		return ""
	}
	return e.Topology.NodeName
}

// Zone is the endpoint's zone, "" when unset.
func (e *Endpoint) Zone() string {
	if e.Topology == nil {
		return ""
	}
	return e.Topology.Zone
}

func (e *Endpoint) zoneHints() []string {
	if e.Topology == nil {
		return nil
	}
	return e.Topology.ZoneHints
}

func (e *Endpoint) nodeHints() []string {
	if e.Topology == nil {
		return nil
	}
	return e.Topology.NodeHints
}

// IsReady applies the API default: an unset ready condition means ready.
func (e *Endpoint) IsReady() bool { return e.Ready.Or(true) }

// IsServing applies the API default: an unset serving condition means serving.
func (e *Endpoint) IsServing() bool { return e.Serving.Or(true) }

// IsTerminating applies the API default: an unset terminating condition means not terminating.
func (e *Endpoint) IsTerminating() bool { return e.Terminating.Or(false) }

// AddrPort is the endpoint's address and port.
func (e *Endpoint) AddrPort() netip.AddrPort {
	return netip.AddrPortFrom(e.Addr, uint16(e.Port))
}

// String is "ip:port" ("[ip6]:port" for IPv6), kube-proxy's endpoint key.
func (e *Endpoint) String() string {
	return e.AddrPort().String()
}

func (e *Endpoint) hasZoneHint(zone string) bool { return slices.Contains(e.zoneHints(), zone) }
func (e *Endpoint) hasNodeHint(node string) bool { return slices.Contains(e.nodeHints(), node) }

// Node describes the node the proxy runs on, the input to endpoint selection.
type Node struct {
	// Name is the node's name; endpoints whose nodeName equals it are local.
	// An empty name makes no endpoint local.
	Name string
	// Labels are the node's labels; topology.kubernetes.io/zone gives its zone.
	Labels map[string]string
}

// Zone returns the node's topology.kubernetes.io/zone label.
func (n Node) Zone() string { return n.Labels[v1.LabelTopologyZone] }

func itoa(i int32) string { return strconv.Itoa(int(i)) }
