package rulestest_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/rules/rulestest"
)

func state(port int) *rules.State {
	return &rules.State{Services: []rules.Service{{Namespace: "default", Name: "web", Protocol: rules.TCP,
		ClusterIP: netip.MustParseAddr("10.96.0.10"), Port: port}}}
}

func TestFake(t *testing.T) {
	ctx := context.Background()
	var f rulestest.Fake
	st := state(80)
	require.NoError(t, f.Sync(ctx, st))
	st.Services[0].Port = 81 // the fake keeps its own copy
	assert.Equal(t, 80, f.Last().Services[0].Port)

	f.FailNext(fmt.Errorf("kernel says no: %w", rules.ErrApplyFailed))
	err := f.Sync(ctx, state(81))
	assert.ErrorIs(t, err, rules.ErrApplyFailed)
	require.NoError(t, f.Sync(ctx, state(81)))
	assert.Equal(t, 2, f.FullSyncs, "the first sync and the one after a failure are full")
	assert.Equal(t, 1, f.Failed)
	f.ForceFullSync()
	require.NoError(t, f.Sync(ctx, state(81)))
	assert.Equal(t, 3, f.FullSyncs)

	assert.ErrorIs(t, f.Sync(ctx, state(0)), rules.ErrInvalidState)
	out, err := f.DryRun(ctx, state(80))
	require.NoError(t, err)
	assert.Contains(t, out, "add element ip kube-proxy no-endpoint-services { 10.96.0.10 . tcp . 80")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	assert.ErrorIs(t, f.Sync(cancelled, state(80)), context.Canceled)
}
