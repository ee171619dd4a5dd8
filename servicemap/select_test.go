package servicemap_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	v1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/servicemap"
)

// ep builds an endpoint from "ip" plus flags: r/R ready false/true, s/S serving,
// t/T terminating, and node, zone, hints.
type epSpec struct {
	ip                          string
	ready, serving, terminating servicemap.Cond
	node                        string
	zoneHints, nodeHints        []string
}

func mkEP(s epSpec) servicemap.Endpoint {
	ep := servicemap.Endpoint{
		Addr: netip.MustParseAddr(s.ip), Port: 80,
		Ready: s.ready, Serving: s.serving, Terminating: s.terminating,
	}
	if s.node != "" || s.zoneHints != nil || s.nodeHints != nil {
		ep.Topology = &servicemap.Topology{NodeName: s.node, ZoneHints: s.zoneHints, NodeHints: s.nodeHints}
	}
	return ep
}

var (
	readyEP    = func(ip, node string) epSpec { return epSpec{ip: ip, node: node} }
	notReadyEP = func(ip, node string) epSpec {
		return epSpec{ip: ip, node: node, ready: servicemap.CondFalse, serving: servicemap.CondFalse}
	}
	servingTermEP = func(ip, node string) epSpec {
		return epSpec{ip: ip, node: node, ready: servicemap.CondFalse, serving: servicemap.CondTrue, terminating: servicemap.CondTrue}
	}
	notServingTermEP = func(ip, node string) epSpec {
		return epSpec{ip: ip, node: node, ready: servicemap.CondFalse, serving: servicemap.CondFalse, terminating: servicemap.CondTrue}
	}
	zoned = func(s epSpec, zones ...string) epSpec { s.zoneHints = zones; return s }
	noded = func(s epSpec, nodes ...string) epSpec { s.nodeHints = nodes; return s }
)

func addrs(eps []servicemap.Endpoint) []string {
	if eps == nil {
		return nil
	}
	out := make([]string, 0, len(eps))
	for _, e := range eps {
		out = append(out, e.Addr.String())
	}
	return out
}

func TestSelect(t *testing.T) {
	const me = "node-a"
	node := servicemap.Node{Name: me, Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}
	clusterIP := []netip.Addr{netip.MustParseAddr("10.96.0.1")}

	type policy struct {
		internalLocal, externalLocal bool
		nodePort                     int32
	}
	tests := []struct {
		name            string
		policy          policy
		node            *servicemap.Node
		eps             []epSpec
		wantCluster     []string
		wantLocal       []string
		wantAll         []string
		wantAny         bool
		wantTopology    string
		wantClusterTerm bool
		wantLocalTerm   bool
	}{
		{
			name:        "no endpoints",
			wantCluster: nil, wantLocal: nil, wantAll: nil, wantAny: false,
		},
		{
			name:        "cluster: ready endpoints only, unset conditions count as ready",
			eps:         []epSpec{readyEP("10.0.0.1", "n1"), notReadyEP("10.0.0.2", "n1"), servingTermEP("10.0.0.3", me)},
			wantCluster: []string{"10.0.0.1"}, wantAll: []string{"10.0.0.1"}, wantAny: true,
		},
		{
			name: "cluster: no ready endpoint falls back to serving+terminating",
			eps: []epSpec{notReadyEP("10.0.0.1", "n1"), servingTermEP("10.0.0.2", "n1"), notServingTermEP("10.0.0.3", "n1"),
				{ip: "10.0.0.4", ready: servicemap.CondFalse, serving: servicemap.CondTrue}}, // serving but not terminating: not a fallback
			wantCluster:     []string{"10.0.0.2"},
			wantAll:         []string{"10.0.0.2"},
			wantAny:         true,
			wantClusterTerm: true,
		},
		{
			name:        "cluster: nothing usable",
			eps:         []epSpec{notReadyEP("10.0.0.1", "n1"), notServingTermEP("10.0.0.3", "n1")},
			wantCluster: []string{}, wantAll: []string{}, wantAny: false,
		},
		{
			name:         "zone hints used when every ready endpoint has one and one names my zone",
			eps:          []epSpec{zoned(readyEP("10.0.0.1", "n1"), "zone-a"), zoned(readyEP("10.0.0.2", "n2"), "zone-b"), notReadyEP("10.0.0.3", "n3")},
			wantCluster:  []string{"10.0.0.1"},
			wantAll:      []string{"10.0.0.1"},
			wantAny:      true,
			wantTopology: servicemap.TopologyPreferSameZone,
		},
		{
			name:        "zone hints ignored when one ready endpoint lacks a hint",
			eps:         []epSpec{zoned(readyEP("10.0.0.1", "n1"), "zone-a"), readyEP("10.0.0.2", "n2")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantAll: []string{"10.0.0.1", "10.0.0.2"}, wantAny: true,
		},
		{
			name:        "zone hints ignored when none names my zone",
			eps:         []epSpec{zoned(readyEP("10.0.0.1", "n1"), "zone-b"), zoned(readyEP("10.0.0.2", "n2"), "zone-c")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantAll: []string{"10.0.0.1", "10.0.0.2"}, wantAny: true,
		},
		{
			name:        "zone hints ignored when the node has no zone label",
			node:        &servicemap.Node{Name: me},
			eps:         []epSpec{zoned(readyEP("10.0.0.1", "n1"), "zone-a"), zoned(readyEP("10.0.0.2", "n2"), "zone-b")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantAll: []string{"10.0.0.1", "10.0.0.2"}, wantAny: true,
		},
		{
			name:         "hints on non-ready endpoints do not matter",
			eps:          []epSpec{zoned(readyEP("10.0.0.1", "n1"), "zone-a"), zoned(readyEP("10.0.0.2", "n2"), "zone-b"), notReadyEP("10.0.0.3", "n3")},
			wantCluster:  []string{"10.0.0.1"},
			wantAll:      []string{"10.0.0.1"},
			wantAny:      true,
			wantTopology: servicemap.TopologyPreferSameZone,
		},
		{
			name:         "node hints win over zone hints",
			eps:          []epSpec{noded(zoned(readyEP("10.0.0.1", "n1"), "zone-a"), me), noded(zoned(readyEP("10.0.0.2", "n2"), "zone-a"), "n2")},
			wantCluster:  []string{"10.0.0.1"},
			wantAll:      []string{"10.0.0.1"},
			wantAny:      true,
			wantTopology: servicemap.TopologyPreferSameNode,
		},
		{
			name:         "node hints naming other nodes fall through to zone hints",
			eps:          []epSpec{noded(zoned(readyEP("10.0.0.1", "n1"), "zone-a"), "n1"), noded(zoned(readyEP("10.0.0.2", "n2"), "zone-b"), "n2")},
			wantCluster:  []string{"10.0.0.1"},
			wantAll:      []string{"10.0.0.1"},
			wantAny:      true,
			wantTopology: servicemap.TopologyPreferSameZone,
		},
		{
			name:            "topology is ignored when falling back to terminating endpoints",
			eps:             []epSpec{zoned(servingTermEP("10.0.0.1", "n1"), "zone-b"), zoned(servingTermEP("10.0.0.2", "n2"), "zone-a")},
			wantCluster:     []string{"10.0.0.1", "10.0.0.2"},
			wantAll:         []string{"10.0.0.1", "10.0.0.2"},
			wantAny:         true,
			wantClusterTerm: true,
		},
		{
			name:      "internal Local: only local ready endpoints, no cluster set",
			policy:    policy{internalLocal: true},
			eps:       []epSpec{readyEP("10.0.0.1", me), readyEP("10.0.0.2", "n2"), servingTermEP("10.0.0.3", me)},
			wantLocal: []string{"10.0.0.1"}, wantAll: []string{"10.0.0.1"}, wantAny: true,
		},
		{
			name:          "internal Local: falls back to local serving+terminating",
			policy:        policy{internalLocal: true},
			eps:           []epSpec{servingTermEP("10.0.0.1", me), readyEP("10.0.0.2", "n2"), notServingTermEP("10.0.0.3", me)},
			wantLocal:     []string{"10.0.0.1"},
			wantAll:       []string{"10.0.0.1"},
			wantAny:       true,
			wantLocalTerm: true,
		},
		{
			name:      "internal Local: no local endpoints but remote ones exist",
			policy:    policy{internalLocal: true},
			eps:       []epSpec{readyEP("10.0.0.2", "n2")},
			wantLocal: nil, wantAll: nil, wantAny: true,
		},
		{
			name:      "internal Local: empty node name makes nothing local",
			policy:    policy{internalLocal: true},
			node:      &servicemap.Node{},
			eps:       []epSpec{{ip: "10.0.0.1"}},
			wantLocal: nil, wantAll: nil, wantAny: true,
		},
		{
			name:        "external Local with NodePort: cluster and local sets, all = cluster",
			policy:      policy{externalLocal: true, nodePort: 30000},
			eps:         []epSpec{readyEP("10.0.0.1", me), readyEP("10.0.0.2", "n2")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"},
			wantLocal:   []string{"10.0.0.1"},
			wantAll:     []string{"10.0.0.1", "10.0.0.2"},
			wantAny:     true,
		},
		{
			name:          "external Local: local terminating merged with remote ready",
			policy:        policy{externalLocal: true, nodePort: 30000},
			eps:           []epSpec{servingTermEP("10.0.0.1", me), readyEP("10.0.0.2", "n2")},
			wantCluster:   []string{"10.0.0.2"},
			wantLocal:     []string{"10.0.0.1"},
			wantAll:       []string{"10.0.0.1", "10.0.0.2"},
			wantAny:       true,
			wantLocalTerm: true,
		},
		{
			name:         "external Local with topology: local endpoint outside the hinted zone is still reachable",
			policy:       policy{externalLocal: true, nodePort: 30000},
			eps:          []epSpec{zoned(readyEP("10.0.0.1", me), "zone-b"), zoned(readyEP("10.0.0.2", "n2"), "zone-a")},
			wantCluster:  []string{"10.0.0.2"},
			wantLocal:    []string{"10.0.0.1"},
			wantAll:      []string{"10.0.0.1", "10.0.0.2"},
			wantAny:      true,
			wantTopology: servicemap.TopologyPreferSameZone,
		},
		{
			name:        "external Local without external access behaves as Cluster",
			policy:      policy{externalLocal: true},
			eps:         []epSpec{readyEP("10.0.0.1", me), readyEP("10.0.0.2", "n2")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"}, wantAll: []string{"10.0.0.1", "10.0.0.2"}, wantAny: true,
		},
		{
			name:        "internal Local with NodePort also needs cluster endpoints",
			policy:      policy{internalLocal: true, nodePort: 30000},
			eps:         []epSpec{readyEP("10.0.0.1", me), readyEP("10.0.0.2", "n2")},
			wantCluster: []string{"10.0.0.1", "10.0.0.2"},
			wantLocal:   []string{"10.0.0.1"},
			wantAll:     []string{"10.0.0.1", "10.0.0.2"},
			wantAny:     true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := &servicemap.ServicePort{
				ClusterIPs: clusterIP, Port: 80, Protocol: v1.ProtocolTCP,
				NodePort: tt.policy.nodePort, InternalPolicyLocal: tt.policy.internalLocal,
				ExternalPolicyLocal: tt.policy.externalLocal && tt.policy.nodePort != 0,
			}
			for _, s := range tt.eps {
				sp.Endpoints = append(sp.Endpoints, mkEP(s))
			}
			n := node
			if tt.node != nil {
				n = *tt.node
			}
			sel := servicemap.Select(sp, v1.IPv4Protocol, n)
			assert.Equal(t, tt.wantCluster, addrs(sel.Cluster), "cluster")
			assert.Equal(t, tt.wantLocal, addrs(sel.Local), "local")
			assert.Equal(t, tt.wantAll, addrs(sel.AllReachable), "all reachable")
			assert.Equal(t, tt.wantAny, sel.HasAnyEndpoints, "has any")
			assert.Equal(t, tt.wantTopology, sel.TopologyMode, "topology")
			assert.Equal(t, tt.wantClusterTerm, sel.UsedServingTerminatingCluster, "cluster fallback")
			assert.Equal(t, tt.wantLocalTerm, sel.UsedServingTerminatingLocal, "local fallback")
		})
	}
}

func TestSelectFamily(t *testing.T) {
	sp := &servicemap.ServicePort{
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.1")}, Port: 80, Protocol: v1.ProtocolTCP,
		Endpoints: []servicemap.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80},
			{Addr: netip.MustParseAddr("fd00::1"), Port: 80},
		},
	}
	t.Run("IPv4 proxier sees IPv4 endpoints only", func(t *testing.T) {
		assert.Equal(t, []string{"10.0.0.1"}, addrs(servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{}).Cluster))
	})
	t.Run("IPv6 proxier does not know a single-stack IPv4 Service", func(t *testing.T) {
		sel := servicemap.Select(sp, v1.IPv6Protocol, servicemap.Node{})
		assert.Nil(t, sel.Cluster)
		assert.False(t, sel.HasAnyEndpoints)
	})
	t.Run("dual-stack Service: IPv6 proxier sees IPv6 endpoints", func(t *testing.T) {
		dual := *sp
		dual.ClusterIPs = append(dual.ClusterIPs, netip.MustParseAddr("fd00:96::1"))
		assert.Equal(t, []string{"fd00::1"}, addrs(servicemap.Select(&dual, v1.IPv6Protocol, servicemap.Node{}).Cluster))
	})
	t.Run("nil port", func(t *testing.T) {
		assert.Equal(t, servicemap.Selection{}, servicemap.Select(nil, v1.IPv4Protocol, servicemap.Node{}))
	})
}

// External reachability is judged per family, as each kube-proxy proxier only sees
// its own family's external IPs.
func TestSelectPolicyPerFamily(t *testing.T) {
	sp := &servicemap.ServicePort{
		ClusterIPs:          []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("fd00:96::1")},
		Port:                80,
		Protocol:            v1.ProtocolTCP,
		ExternalIPs:         []netip.Addr{netip.MustParseAddr("2001:db8::5")},
		InternalPolicyLocal: true,
		Endpoints: []servicemap.Endpoint{
			{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Topology: &servicemap.Topology{NodeName: "other"}},
			{Addr: netip.MustParseAddr("fd00::1"), Port: 80, Topology: &servicemap.Topology{NodeName: "other"}},
		},
	}
	node := servicemap.Node{Name: "me"}
	v4 := servicemap.Select(sp, v1.IPv4Protocol, node)
	assert.Nil(t, v4.Cluster, "IPv4 side has no external IP: internal Local only")
	assert.Nil(t, v4.Local)
	v6 := servicemap.Select(sp, v1.IPv6Protocol, node)
	assert.Equal(t, []string{"fd00::1"}, addrs(v6.Cluster), "IPv6 side is externally accessible: Cluster endpoints too")
}
