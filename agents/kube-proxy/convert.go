package main

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/servicemap"
)

// errNotExpressible marks a service port the rules cannot express; it is skipped
// and every other port is still written.
var errNotExpressible = errors.New("service port cannot be expressed in rules")

// converted is one service port as the rules package takes it, or why not.
type converted struct {
	svc rules.Service
	err error
	// noLocalInternal / noLocalExternal: a Local policy found no local endpoint while
	// the service has endpoints elsewhere (upstream's no_local_endpoints counts).
	noLocalInternal, noLocalExternal bool
	// healthCheckNodePort and localReady feed the service health servers.
	healthCheckNodePort uint16
	localReady          []netip.Addr
}

// converter keeps one IP family's rules of every service port and redoes only the
// ports an Update names, so a sync converts what changed, not the whole map. Each
// family's writer has its own (upstream's per-family proxiers each see only their
// family's part of a Service).
//
// It also keeps what a partial sync needs without looking at every port: how
// many expressible ports claim each destination, the ports converted since the
// last state or changes it handed out, the no-local-endpoint counts and the
// ports with a health check node port.
type converter struct {
	node   servicemap.Node
	family v1.IPFamily
	ports  map[servicemap.ServicePortName]*converted

	// claims counts the expressible ports claiming each destination; contested
	// counts the destinations claimed more than once.
	claims    map[dest]int
	contested int
	// touched are the ports converted since the last state or changes.
	touched map[servicemap.ServicePortName]bool
	// written are the ports in the state last handed out; clashed is how many
	// ports it left out for claiming a destination an earlier port claims.
	written map[servicemap.ServicePortName]bool
	clashed int
	// skips are the ports left out of the state last handed out, with why.
	skips                            map[servicemap.ServicePortName]error
	noLocalInternal, noLocalExternal int
	// hc are the ports with a healthCheckNodePort.
	hc map[servicemap.ServicePortName]*converted
}

// dest is a destination a service port claims: an IP, protocol and port, or
// (invalid IP) a node port.
type dest struct {
	ip    netip.Addr
	proto rules.Protocol
	port  int
}

func destsOf(s *rules.Service) []dest {
	dests := make([]dest, 0, 2+len(s.ExternalIPs)+len(s.LoadBalancerIPs))
	dests = append(dests, dest{s.ClusterIP, s.Protocol, s.Port})
	for _, ip := range s.ExternalIPs {
		dests = append(dests, dest{ip, s.Protocol, s.Port})
	}
	for _, ip := range s.LoadBalancerIPs {
		dests = append(dests, dest{ip, s.Protocol, s.Port})
	}
	if s.NodePort != 0 {
		dests = append(dests, dest{netip.Addr{}, s.Protocol, s.NodePort})
	}
	return dests
}

// newConverter converts for the IPv4 family; newFamilyConverter for either.
func newConverter(node servicemap.Node) *converter { return newFamilyConverter(node, v1.IPv4Protocol) }

func newFamilyConverter(node servicemap.Node, family v1.IPFamily) *converter {
	c := &converter{node: node, family: family}
	c.reset()
	return c
}

func (c *converter) reset() {
	c.ports = map[servicemap.ServicePortName]*converted{}
	c.claims = map[dest]int{}
	c.contested = 0
	c.touched = map[servicemap.ServicePortName]bool{}
	c.written = map[servicemap.ServicePortName]bool{}
	c.clashed = 0
	c.skips = map[servicemap.ServicePortName]error{}
	c.noLocalInternal, c.noLocalExternal = 0, 0
	c.hc = map[servicemap.ServicePortName]*converted{}
}

// apply brings the converter up to date with upd. all redoes every port (after a
// topology change, or on the first sync).
func (c *converter) apply(upd servicemap.Update, all bool) {
	if all {
		c.reset()
		upd.Snapshot.Range(func(sp *servicemap.ServicePort) bool {
			if cv, ok := convertPort(sp, c.node, c.family); ok {
				c.set(sp.Name, cv)
			}
			return true
		})
		return
	}
	for _, name := range upd.Changed {
		sp, ok := upd.Snapshot.Get(name)
		if !ok {
			c.set(name, nil)
			continue
		}
		if cv, ok := convertPort(sp, c.node, c.family); ok {
			c.set(name, cv)
		} else {
			c.set(name, nil)
		}
	}
}

// set replaces one port's conversion (nil: the family has no such port) and keeps
// the counts.
func (c *converter) set(name servicemap.ServicePortName, cv *converted) {
	c.touched[name] = true
	if old := c.ports[name]; old != nil {
		c.count(name, old, -1)
	}
	if cv == nil {
		delete(c.ports, name)
		return
	}
	c.ports[name] = cv
	c.count(name, cv, 1)
}

func (c *converter) count(name servicemap.ServicePortName, cv *converted, by int) {
	if cv.healthCheckNodePort != 0 {
		if by > 0 {
			c.hc[name] = cv
		} else {
			delete(c.hc, name)
		}
	}
	if cv.err != nil {
		return
	}
	if cv.noLocalInternal {
		c.noLocalInternal += by
	}
	if cv.noLocalExternal {
		c.noLocalExternal += by
	}
	// A port claiming one destination twice (its cluster IP also an external
	// IP) counts once for it, as state() does not see it clash with itself.
	ds := destsOf(&cv.svc)
	for i, d := range ds {
		if slices.Contains(ds[:i], d) {
			continue
		}
		n := c.claims[d]
		switch {
		case by > 0 && n == 1, by < 0 && n == 2:
			c.contested += by
		}
		if n += by; n == 0 {
			delete(c.claims, d)
		} else {
			c.claims[d] = n
		}
	}
}

// skipped is a service port left out of the state, with the reason.
type skipped struct {
	name servicemap.ServicePortName
	err  error
}

// changes returns what changed since the last state or changes, as the rules
// writers' partial update, with every port left out and why. ok is false when a
// destination is, or was at the last state, claimed by more than one port: which
// one wins depends on all of them in name order, so the caller takes state().
func (c *converter) changes() (ch *rules.Changes, skips []skipped, ok bool) {
	if c.contested > 0 || c.clashed > 0 {
		return nil, nil, false
	}
	ch = &rules.Changes{}
	for _, n := range sortedNames(c.touched) {
		cv := c.ports[n]
		if cv != nil && cv.err == nil {
			ch.Set = append(ch.Set, cv.svc)
			c.written[n] = true
			delete(c.skips, n)
			continue
		}
		if c.written[n] {
			ch.Remove = append(ch.Remove, rules.PortID{Namespace: n.Namespace, Name: n.Name, PortName: n.Port, Protocol: rules.Protocol(n.Protocol)})
			delete(c.written, n)
		}
		if cv != nil {
			c.skips[n] = cv.err
		} else {
			delete(c.skips, n)
		}
	}
	clear(c.touched)
	return ch, c.skipList(), true
}

func (c *converter) skipList() []skipped {
	out := make([]skipped, 0, len(c.skips))
	for _, n := range sortedNames(c.skips) {
		out = append(out, skipped{n, c.skips[n]})
	}
	return out
}

func sortedNames[V any](m map[servicemap.ServicePortName]V) []servicemap.ServicePortName {
	names := make([]servicemap.ServicePortName, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b servicemap.ServicePortName) int {
		switch {
		case a.Less(b):
			return -1
		case b.Less(a):
			return 1
		}
		return 0
	})
	return names
}

// state builds the desired rules from the converted ports. A port that cannot be
// expressed, or that claims a destination an earlier port (in name order)
// already claims, is left out and reported; the rest are written.
func (c *converter) state() (*rules.State, []skipped) {
	names := sortedNames(c.ports)
	owner := make(map[dest]servicemap.ServicePortName, len(names))
	st := &rules.State{Services: make([]rules.Service, 0, len(names))}
	clear(c.written)
	clear(c.skips)
	clear(c.touched)
	c.clashed = 0
	for _, n := range names {
		cv := c.ports[n]
		if cv.err != nil {
			c.skips[n] = cv.err
			continue
		}
		s := &cv.svc
		dests := destsOf(s)
		var clash error
		for i, d := range dests {
			if o, ok := owner[d]; ok && !slices.Contains(dests[:i], d) {
				what := fmt.Sprintf("%v %s/%d", d.ip, d.proto, d.port)
				if !d.ip.IsValid() {
					what = fmt.Sprintf("node port %s/%d", d.proto, d.port)
				}
				clash = fmt.Errorf("%w: %s is already claimed by %s", errNotExpressible, what, o)
				break
			}
		}
		if clash != nil {
			c.skips[n] = clash
			c.clashed++
			continue
		}
		for _, d := range dests {
			owner[d] = n
		}
		c.written[n] = true
		st.Services = append(st.Services, *s)
	}
	return st, c.skipList()
}

// noLocal counts the ports whose Local policy has no local endpoint.
func (c *converter) noLocal() (internal, external int) {
	return c.noLocalInternal, c.noLocalExternal
}

// healthChecks returns, per Service with a healthCheckNodePort, that port and
// the number of distinct local ready endpoint addresses (upstream's
// HealthCheckNodePorts and LocalReadyEndpoints).
func (c *converter) healthChecks() (map[types.NamespacedName]uint16, map[types.NamespacedName]int) {
	ports := map[types.NamespacedName]uint16{}
	ips := map[types.NamespacedName]map[netip.Addr]bool{}
	for n, cv := range c.hc {
		ports[n.NamespacedName] = cv.healthCheckNodePort
		set := ips[n.NamespacedName]
		if set == nil {
			set = map[netip.Addr]bool{}
			ips[n.NamespacedName] = set
		}
		for _, a := range cv.localReady {
			set[a] = true
		}
	}
	local := make(map[types.NamespacedName]int, len(ips))
	for nn, set := range ips {
		local[nn] = len(set)
	}
	return ports, local
}

// convertPort turns one service port into the rules of one family. ok is false
// when the Service has no cluster IP of that family (that family's proxier does
// not know it).
func convertPort(sp *servicemap.ServicePort, node servicemap.Node, family v1.IPFamily) (cv *converted, ok bool) {
	spf, ok := sp.ForFamily(family)
	if !ok {
		return nil, false
	}
	ip, _ := spf.ClusterIP(family)
	sel := servicemap.Select(sp, family, node)
	cv = &converted{svc: rules.Service{
		Namespace:       sp.Name.Namespace,
		Name:            sp.Name.Name,
		PortName:        sp.Name.Port,
		Protocol:        rules.Protocol(sp.Protocol),
		ClusterIP:       ip,
		Port:            int(sp.Port),
		NodePort:        int(sp.NodePort),
		ExternalIPs:     spf.ExternalIPs,
		LoadBalancerIPs: spf.LoadBalancerVIPs,
		// Already the family's proxier view: invalid entries dropped when the
		// Service was read, a zero-length prefix among them meaning no restriction.
		LoadBalancerSourceRanges: spf.LoadBalancerSourceRanges,
	}}
	if sp.SessionAffinity == v1.ServiceAffinityClientIP {
		cv.svc.AffinityTimeout = time.Duration(sp.StickyMaxAgeSeconds) * time.Second
	}
	cv.healthCheckNodePort = uint16(sp.HealthCheckNodePort)
	for i := range sp.Endpoints {
		e := &sp.Endpoints[i]
		if isFamily(e.Addr, family) && e.IsReady() && node.Name != "" && e.NodeName() == node.Name {
			cv.localReady = append(cv.localReady, e.Addr)
		}
	}
	external := sp.ExternallyAccessible()
	cv.noLocalInternal = sp.InternalPolicyLocal && sel.HasAnyEndpoints && len(sel.Local) == 0
	cv.noLocalExternal = sp.ExternalPolicyLocal && sel.HasAnyEndpoints && len(sel.Local) == 0

	// Upstream's CategorizeEndpoints result as the rules take it: the Cluster
	// endpoints, this node's endpoints, and which traffic uses which.
	cv.svc.InternalLocal = sp.InternalPolicyLocal
	cv.svc.ExternalLocal = sp.ExternalPolicyLocal && external
	cv.svc.Endpoints = familyEndpoints(sel.Cluster, family)
	if cv.svc.InternalLocal || cv.svc.ExternalLocal {
		cv.svc.LocalEndpoints = familyEndpoints(sel.Local, family)
	}
	if sel.HasAnyEndpoints {
		// Endpoints exist somewhere: traffic whose Local policy finds none here is
		// dropped, not rejected (only reachable when a policy is Local).
		cv.svc.NoEndpoints = rules.Drop
	}
	if err := cv.svc.ValidateFamily(rulesFamily(family)); err != nil {
		cv.err = fmt.Errorf("%w: %w", errNotExpressible, err)
	}
	return cv, true
}

// familyEndpoints converts the endpoints of one family of a selection; nil when
// there are none.
func familyEndpoints(eps []servicemap.Endpoint, family v1.IPFamily) []rules.Endpoint {
	var out []rules.Endpoint
	for _, e := range eps {
		if isFamily(e.Addr, family) {
			out = append(out, rules.Endpoint{IP: e.Addr, Port: int(e.Port)})
		}
	}
	return out
}

// isFamily reports whether a is an address of family.
func isFamily(a netip.Addr, family v1.IPFamily) bool {
	if family == v1.IPv6Protocol {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4()
}

// rulesFamily is the rules package's name for a Kubernetes IP family.
func rulesFamily(f v1.IPFamily) rules.Family {
	if f == v1.IPv6Protocol {
		return rules.IPv6
	}
	return rules.IPv4
}
