package servicemap

import (
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Topology modes reported in Selection.TopologyMode.
const (
	TopologyNone           = ""
	TopologyPreferSameZone = v1.ServiceTrafficDistributionPreferSameZone
	TopologyPreferSameNode = v1.ServiceTrafficDistributionPreferSameNode
)

// Selection is the result of endpoint selection for one service port on one node
// and IP family, matching kube-proxy's CategorizeEndpoints.
type Selection struct {
	// Cluster holds the endpoints for Cluster traffic policy; nil when the port never
	// uses Cluster policy.
	Cluster []Endpoint
	// Local holds this node's endpoints for Local traffic policy; nil when the port
	// never uses Local policy or there are no usable local endpoints.
	Local []Endpoint
	// AllReachable is the union of Cluster and Local, sorted by address and port.
	AllReachable []Endpoint
	// HasAnyEndpoints reports whether the port has a usable endpoint anywhere in
	// the cluster (even when AllReachable is empty).
	HasAnyEndpoints bool
	// TopologyMode is the topology filter applied to Cluster: TopologyNone,
	// TopologyPreferSameZone or TopologyPreferSameNode.
	TopologyMode string
	// UsedServingTerminatingCluster / UsedServingTerminatingLocal report the
	// fallback to serving-terminating endpoints.
	UsedServingTerminatingCluster bool
	UsedServingTerminatingLocal   bool
}

// Select chooses the endpoints that kube-proxy's proxier for family would program
// for sp on node. When sp has no cluster IP of that family the result is empty,
// as that proxier does not know the Service.
//
// The rules, in order (see docs/servicemap.md for the table):
//   - Cluster set (if the port uses Cluster policy): Ready endpoints, filtered by
//     topology hints when the hints apply; if none, Serving and Terminating endpoints.
//   - Topology: PreferSameNode when every Ready endpoint has a node hint and one
//     names this node; else PreferSameZone when every Ready endpoint has a zone hint
//     and one names this node's zone; else none.
//   - Local set (if the port uses Local policy): local Ready endpoints; if none,
//     local Serving and Terminating endpoints. Topology does not apply.
func Select(sp *ServicePort, family v1.IPFamily, node Node) Selection {
	var s Selection
	if sp == nil {
		return s
	}
	// Policies depend on external reachability, which kube-proxy judges per family
	// (an IPv6-only external IP does not make the IPv4 side externally accessible).
	sp, ok := sp.ForFamily(family)
	if !ok {
		return s
	}
	eps := sp.Endpoints
	if len(eps) == 0 {
		return s
	}
	zone := node.Zone()
	isLocal := func(ep *Endpoint) bool { return node.Name != "" && ep.NodeName() == node.Name }

	if sp.UsesClusterEndpoints() {
		s.TopologyMode = topologyMode(eps, node.Name, zone)
		s.Cluster = filter(eps, func(ep *Endpoint) bool {
			return ep.IsReady() && availableForTopology(ep, s.TopologyMode, node.Name, zone)
		})
		if len(s.Cluster) == 0 {
			s.Cluster = filter(eps, func(ep *Endpoint) bool { return ep.IsServing() && ep.IsTerminating() })
			s.UsedServingTerminatingCluster = len(s.Cluster) > 0
		}
		s.HasAnyEndpoints = len(s.Cluster) > 0
	}

	if !sp.UsesLocalEndpoints() {
		s.AllReachable = s.Cluster
		return s
	}

	var localReady, localServingTerminating bool
	for i := range eps {
		ep := &eps[i]
		switch {
		case ep.IsReady():
			s.HasAnyEndpoints = true
			localReady = localReady || isLocal(ep)
		case ep.IsServing() && ep.IsTerminating():
			s.HasAnyEndpoints = true
			localServingTerminating = localServingTerminating || isLocal(ep)
		}
	}
	switch {
	case localReady:
		s.Local = filter(eps, func(ep *Endpoint) bool { return isLocal(ep) && ep.IsReady() })
	case localServingTerminating:
		s.UsedServingTerminatingLocal = true
		s.Local = filter(eps, func(ep *Endpoint) bool {
			return isLocal(ep) && ep.IsServing() && ep.IsTerminating()
		})
	}

	if !sp.UsesClusterEndpoints() {
		s.AllReachable = s.Local
		return s
	}
	if s.TopologyMode == TopologyNone && !s.UsedServingTerminatingLocal {
		// Cluster then holds every Ready endpoint, a superset of the local Ready ones.
		s.AllReachable = s.Cluster
		return s
	}
	s.AllReachable = union(s.Cluster, s.Local)
	return s
}

// topologyMode decides which hints apply. Only Ready endpoints are looked at; a
// single Ready endpoint without a hint disables that kind of hint, and hints that
// name nobody on this node (or zone) are ignored rather than leaving it without endpoints.
func topologyMode(eps []Endpoint, nodeName, zone string) string {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for i := range eps {
		ep := &eps[i]
		if !ep.IsReady() {
			continue
		}
		anyReady = true
		if len(ep.nodeHints()) == 0 {
			allNode = false
		} else if ep.hasNodeHint(nodeName) {
			forNode = true
		}
		if len(ep.zoneHints()) == 0 {
			allZone = false
		} else if ep.hasZoneHint(zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return TopologyNone
	case allNode && forNode:
		return TopologyPreferSameNode
	case allZone && forZone:
		return TopologyPreferSameZone
	}
	return TopologyNone
}

func availableForTopology(ep *Endpoint, mode, nodeName, zone string) bool {
	switch mode {
	case TopologyNone:
		return true
	case TopologyPreferSameNode:
		return ep.hasNodeHint(nodeName)
	case TopologyPreferSameZone:
		return ep.hasZoneHint(zone)
	}
	return false
}

func filter(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for i := range eps {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}

// union merges two lists sorted by address and port, dropping duplicates.
func union(a, b []Endpoint) []Endpoint {
	out := make([]Endpoint, 0, len(a)+len(b))
	out = append(out, a...)
	out = append(out, b...)
	slices.SortStableFunc(out, compareEndpoints)
	return slices.CompactFunc(out, func(x, y Endpoint) bool { return x.AddrPort() == y.AddrPort() })
}

func compareEndpoints(x, y Endpoint) int {
	return x.AddrPort().Compare(y.AddrPort())
}
