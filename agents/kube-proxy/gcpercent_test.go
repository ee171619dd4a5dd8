package main

import (
	"context"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/rules/rulestest"
	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// gcPercent reads the GC target without changing it for longer than the call.
func gcPercent() int {
	v := debug.SetGCPercent(-1)
	debug.SetGCPercent(v)
	return v
}

// gcRecordingSyncer records the GC target each write ran under.
type gcRecordingSyncer struct {
	*rulestest.Fake
	full, partial []int
}

func (g *gcRecordingSyncer) Sync(ctx context.Context, st *rules.State) error {
	g.full = append(g.full, gcPercent())
	return g.Fake.Sync(ctx, st)
}

func (g *gcRecordingSyncer) SyncChanges(ctx context.Context, ch *rules.Changes) error {
	g.partial = append(g.partial, gcPercent())
	return g.Fake.SyncChanges(ctx, ch)
}

// TestFullSyncLowersGCTarget: a full sync writes under FullSyncGCPercent, the
// previous target is back afterwards and the sync's memory is released once; a
// partial sync leaves the target alone and releases nothing.
func TestFullSyncLowersGCTarget(t *testing.T) {
	registerMetrics()
	defer debug.SetGCPercent(debug.SetGCPercent(40))
	rec := &gcRecordingSyncer{Fake: &rulestest.Fake{}}
	tracker := servicemap.NewTracker(servicemap.Config{Metrics: trackerMetrics{}})
	var releasedAt []int
	px := newProxier(proxierConfig{
		Tracker: tracker, Syncer: rec, Clock: clocktesting.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)),
		Node: servicemap.Node{Name: "n1"}, FullSyncGCPercent: 7,
		ReleaseMemory: func() { releasedAt = append(releasedAt, gcPercent()) },
	})
	svc, es := web("10.244.1.10")
	px.OnServiceAdd(svc)
	px.OnEndpointSliceAdd(es)
	px.OnSynced()
	ctx := context.Background()
	require.NoError(t, px.syncOnce(ctx))
	assert.Equal(t, []int{7}, rec.full, "the full sync writes under the lower target")
	assert.Equal(t, 40, gcPercent(), "restored after the full sync")
	assert.Equal(t, []int{40}, releasedAt, "memory released once, after the target is restored")

	es2 := es.DeepCopy()
	es2.ResourceVersion = "2"
	es2.Endpoints = append(es2.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	px.OnEndpointSliceUpdate(es, es2)
	require.NoError(t, px.syncOnce(ctx))
	assert.Equal(t, []int{40}, rec.partial, "a partial sync keeps the target")
	assert.Equal(t, 40, gcPercent())
	assert.Len(t, releasedAt, 1, "a partial sync releases nothing")
}
