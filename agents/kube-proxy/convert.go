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
type converter struct {
	node   servicemap.Node
	family v1.IPFamily
	ports  map[servicemap.ServicePortName]*converted
}

// newConverter converts for the IPv4 family; newFamilyConverter for either.
func newConverter(node servicemap.Node) *converter { return newFamilyConverter(node, v1.IPv4Protocol) }

func newFamilyConverter(node servicemap.Node, family v1.IPFamily) *converter {
	return &converter{node: node, family: family, ports: map[servicemap.ServicePortName]*converted{}}
}

// apply brings the converter up to date with upd. all redoes every port (after a
// topology change, or on the first sync).
func (c *converter) apply(upd servicemap.Update, all bool) {
	if all {
		clear(c.ports)
		upd.Snapshot.Range(func(sp *servicemap.ServicePort) bool {
			if cv, ok := convertPort(sp, c.node, c.family); ok {
				c.ports[sp.Name] = cv
			}
			return true
		})
		return
	}
	for _, name := range upd.Changed {
		sp, ok := upd.Snapshot.Get(name)
		if !ok {
			delete(c.ports, name)
			continue
		}
		if cv, ok := convertPort(sp, c.node, c.family); ok {
			c.ports[name] = cv
		} else {
			delete(c.ports, name)
		}
	}
}

// skipped is a service port left out of the state, with the reason.
type skipped struct {
	name servicemap.ServicePortName
	err  error
}

// state builds the desired rules from the converted ports. A port that cannot be
// expressed, or that claims a destination an earlier port (in name order)
// already claims, is left out and reported; the rest are written.
func (c *converter) state() (*rules.State, []skipped) {
	names := make([]servicemap.ServicePortName, 0, len(c.ports))
	for n := range c.ports {
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
	type dest struct {
		ip    netip.Addr
		proto rules.Protocol
		port  int
	}
	owner := make(map[dest]servicemap.ServicePortName, len(names))
	st := &rules.State{Services: make([]rules.Service, 0, len(names))}
	var skips []skipped
	for _, n := range names {
		cv := c.ports[n]
		if cv.err != nil {
			skips = append(skips, skipped{n, cv.err})
			continue
		}
		s := &cv.svc
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
		var clash error
		seen := map[dest]bool{}
		for _, d := range dests {
			if o, ok := owner[d]; ok && !seen[d] {
				what := fmt.Sprintf("%v %s/%d", d.ip, d.proto, d.port)
				if !d.ip.IsValid() {
					what = fmt.Sprintf("node port %s/%d", d.proto, d.port)
				}
				clash = fmt.Errorf("%w: %s is already claimed by %s", errNotExpressible, what, o)
				break
			}
			seen[d] = true
		}
		if clash != nil {
			skips = append(skips, skipped{n, clash})
			continue
		}
		for _, d := range dests {
			owner[d] = n
		}
		st.Services = append(st.Services, *s)
	}
	return st, skips
}

// noLocal counts the ports whose Local policy has no local endpoint.
func (c *converter) noLocal() (internal, external int) {
	for _, cv := range c.ports {
		if cv.err != nil {
			continue
		}
		if cv.noLocalInternal {
			internal++
		}
		if cv.noLocalExternal {
			external++
		}
	}
	return internal, external
}

// healthChecks returns, per Service with a healthCheckNodePort, that port and
// the number of distinct local ready endpoint addresses (upstream's
// HealthCheckNodePorts and LocalReadyEndpoints).
func (c *converter) healthChecks() (map[types.NamespacedName]uint16, map[types.NamespacedName]int) {
	ports := map[types.NamespacedName]uint16{}
	ips := map[types.NamespacedName]map[netip.Addr]bool{}
	for n, cv := range c.ports {
		if cv.healthCheckNodePort == 0 {
			continue
		}
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
