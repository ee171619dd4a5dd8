package servicemap

import (
	"encoding/binary"
	"slices"
	"strings"
	"weak"

	discovery "k8s.io/api/discovery/v1"
)

// topologies interns Topology values, so the thousands of endpoints on one node
// (or in one zone with the same hints) share one Topology rather than each
// carrying its own strings and hint lists. Entries are held weakly: a Topology no
// snapshot uses any more is collected, and its entry is swept once the table has
// doubled since the last sweep. Not safe for concurrent use; the Tracker's lock
// guards it.
type topologies struct {
	m map[topologyKey]weak.Pointer[Topology]
	// sweepAt is the table size that triggers the next sweep.
	sweepAt int
}

// topologyKey identifies a Topology. hints encodes both hint lists (sorted,
// deduplicated) with length prefixes, so distinct lists never share a key; it is
// "" when the endpoint has no hints, the common case, which then costs no allocation.
type topologyKey struct {
	node, zone, hints string
}

const minSweep = 64

// get returns the shared Topology for an endpoint, nil when it has no node, zone or hints.
func (ts *topologies) get(e *discovery.Endpoint) *Topology {
	var k topologyKey
	if e.NodeName != nil {
		k.node = *e.NodeName
	}
	if e.Zone != nil {
		k.zone = *e.Zone
	}
	var zoneHints, nodeHints []string
	if h := e.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
		zoneHints = hintNames(h.ForZones, func(z discovery.ForZone) string { return z.Name })
		nodeHints = hintNames(h.ForNodes, func(n discovery.ForNode) string { return n.Name })
		k.hints = encodeHints(zoneHints, nodeHints)
	}
	if k == (topologyKey{}) {
		return nil
	}
	if ts.m == nil {
		ts.m = map[topologyKey]weak.Pointer[Topology]{}
		ts.sweepAt = minSweep
	}
	if t := ts.m[k].Value(); t != nil {
		return t
	}
	// Copies: the Topology outlives the object it came from.
	t := &Topology{NodeName: strings.Clone(k.node), Zone: strings.Clone(k.zone), ZoneHints: zoneHints, NodeHints: nodeHints}
	k.node, k.zone = t.NodeName, t.Zone
	if len(ts.m) >= ts.sweepAt {
		ts.sweep()
	}
	ts.m[k] = weak.Make(t)
	return t
}

// sweep drops the entries whose Topology has been collected.
func (ts *topologies) sweep() {
	for k, p := range ts.m {
		if p.Value() == nil {
			delete(ts.m, k)
		}
	}
	ts.sweepAt = max(minSweep, 2*len(ts.m))
}

func hintNames[T any](in []T, name func(T) string) []string {
	if len(in) == 0 {
		return nil
	}
	out := make([]string, len(in))
	for i, h := range in {
		out[i] = name(h)
	}
	slices.Sort(out)
	return slices.Clip(slices.Compact(out))
}

func encodeHints(zones, nodes []string) string {
	var b []byte
	for _, list := range [][]string{zones, nodes} {
		b = binary.AppendUvarint(b, uint64(len(list)))
		for _, s := range list {
			b = binary.AppendUvarint(b, uint64(len(s)))
			b = append(b, s...)
		}
	}
	return string(b)
}
