package servicemap

import (
	"net/netip"
	"strings"
)

// Dump renders the snapshot as canonical text, one line per service port sorted by
// name, then one indented line per endpoint. Fields at their zero value are left
// out. Tests compare whole maps with it.
func (s *Snapshot) Dump() string {
	var b strings.Builder
	for _, sp := range s.Ports() {
		sp.dump(&b)
	}
	return b.String()
}

// Dump renders one service port as Snapshot.Dump does.
func (sp *ServicePort) Dump() string {
	var b strings.Builder
	sp.dump(&b)
	return b.String()
}

func (sp *ServicePort) dump(b *strings.Builder) {
	b.WriteString(sp.Name.String())
	b.WriteString(" ")
	b.WriteString(string(sp.Protocol))
	b.WriteString(" port=")
	b.WriteString(itoa(sp.Port))
	writeAddrs(b, "clusterIPs", sp.ClusterIPs)
	if sp.NodePort != 0 {
		b.WriteString(" nodePort=" + itoa(sp.NodePort))
	}
	writeAddrs(b, "externalIPs", sp.ExternalIPs)
	writeAddrs(b, "lbVIPs", sp.LoadBalancerVIPs)
	if len(sp.LoadBalancerSourceRanges) > 0 {
		parts := make([]string, len(sp.LoadBalancerSourceRanges))
		for i, p := range sp.LoadBalancerSourceRanges {
			parts[i] = p.String()
		}
		b.WriteString(" sourceRanges=" + strings.Join(parts, ","))
	}
	if sp.SessionAffinity != "" && sp.SessionAffinity != "None" {
		b.WriteString(" affinity=" + string(sp.SessionAffinity) + "/" + itoa(sp.StickyMaxAgeSeconds))
	}
	if sp.ExternalPolicyLocal {
		b.WriteString(" externalPolicy=Local")
	}
	if sp.InternalPolicyLocal {
		b.WriteString(" internalPolicy=Local")
	}
	if sp.HealthCheckNodePort != 0 {
		b.WriteString(" healthCheckNodePort=" + itoa(sp.HealthCheckNodePort))
	}
	b.WriteString("\n")
	for i := range sp.Endpoints {
		b.WriteString("  ")
		b.WriteString(sp.Endpoints[i].Dump())
		b.WriteString("\n")
	}
}

// Dump renders the endpoint on one line: address, then conditions that were set,
// node, zone and hints.
func (e *Endpoint) Dump() string {
	var b strings.Builder
	b.WriteString(e.String())
	if e.Ready != CondUnset {
		b.WriteString(" ready=" + e.Ready.String())
	}
	if e.Serving != CondUnset {
		b.WriteString(" serving=" + e.Serving.String())
	}
	if e.Terminating != CondUnset {
		b.WriteString(" terminating=" + e.Terminating.String())
	}
	if tp := e.Topology; tp != nil {
		if tp.NodeName != "" {
			b.WriteString(" node=" + tp.NodeName)
		}
		if tp.Zone != "" {
			b.WriteString(" zone=" + tp.Zone)
		}
		if len(tp.ZoneHints) > 0 {
			b.WriteString(" zoneHints=" + strings.Join(tp.ZoneHints, ","))
		}
		if len(tp.NodeHints) > 0 {
			b.WriteString(" nodeHints=" + strings.Join(tp.NodeHints, ","))
		}
	}
	return b.String()
}

func writeAddrs(b *strings.Builder, key string, addrs []netip.Addr) {
	if len(addrs) == 0 {
		return
	}
	b.WriteString(" " + key + "=")
	for i, a := range addrs {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(a.String())
	}
}
