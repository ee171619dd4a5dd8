package servicemap

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	discovery "k8s.io/api/discovery/v1"
)

func apiEndpoint(node, zone string, zoneHints ...string) *discovery.Endpoint {
	e := &discovery.Endpoint{}
	if node != "" {
		e.NodeName = &node
	}
	if zone != "" {
		e.Zone = &zone
	}
	if len(zoneHints) > 0 {
		e.Hints = &discovery.EndpointHints{}
		for _, z := range zoneHints {
			e.Hints.ForZones = append(e.Hints.ForZones, discovery.ForZone{Name: z})
		}
	}
	return e
}

func TestTopologiesShareEqualPlaces(t *testing.T) {
	var ts topologies
	a := ts.get(apiEndpoint("n1", "z1"))
	require.NotNil(t, a)
	assert.Same(t, a, ts.get(apiEndpoint("n1", "z1")), "same node and zone share one Topology")
	assert.NotSame(t, a, ts.get(apiEndpoint("n1", "z2")))
	assert.NotSame(t, a, ts.get(apiEndpoint("n1", "")))
	assert.Nil(t, ts.get(apiEndpoint("", "")), "nothing set: no Topology")

	h := ts.get(apiEndpoint("n1", "z1", "z2", "z1", "z2"))
	assert.NotSame(t, a, h, "hints make a different place")
	assert.Equal(t, []string{"z1", "z2"}, h.ZoneHints, "sorted, deduplicated")
	assert.Same(t, h, ts.get(apiEndpoint("n1", "z1", "z1", "z2")))
	// Length-prefixed keys: hint lists that would join to the same text stay apart.
	assert.NotSame(t, ts.get(apiEndpoint("n", "z", "a,b")), ts.get(apiEndpoint("n", "z", "a", "b")))
}

// Topologies no endpoint uses any more are collected and their entries swept,
// so node churn does not grow the table forever.
func TestTopologiesSweepCollected(t *testing.T) {
	var ts topologies
	keep := ts.get(apiEndpoint("kept", "z"))
	for i := range 1000 {
		ts.get(apiEndpoint(fmt.Sprintf("gone-%d", i), "z"))
		if i%100 == 0 {
			runtime.GC()
		}
	}
	runtime.GC()
	ts.sweep()
	assert.Less(t, len(ts.m), 100, "collected entries swept")
	assert.Same(t, keep, ts.get(apiEndpoint("kept", "z")), "a live Topology is still shared")
	runtime.KeepAlive(keep)
}
