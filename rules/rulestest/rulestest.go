// Package rulestest provides a fake rules.Syncer for the agents' unit tests: it
// records every state it is asked to sync, can fail on demand with the errors the
// real writers return, and renders dry runs with the real nftables renderer.
package rulestest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/nodekit-dev/nodekit/rules"
)

// Fake records syncs instead of writing rules. The zero value is ready to use.
type Fake struct {
	// Family is the IP family whose states Sync accepts, as a real writer of
	// that family does. Empty means IPv4.
	Family rules.Family

	mu sync.Mutex
	// Synced holds a copy of every state a successful Sync received, in order.
	Synced []*rules.State
	// Failed counts syncs that returned an error.
	Failed int
	// FullSyncs counts syncs that were full (the first, after a failure, or after
	// ForceFullSync), mirroring the real writers.
	FullSyncs int
	// PartialSyncs counts successful SyncChanges calls; each records in Synced the
	// whole state they leave, as a Sync of it would.
	PartialSyncs int

	failNext []error
	needFull bool
	started  bool
}

var _ rules.PartialSyncer = (*Fake)(nil)

// FailNext makes the next len(errs) syncs return these errors, one each. Pass
// errors wrapping rules.ErrApplyFailed to act like a refused transaction.
func (f *Fake) FailNext(errs ...error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext = append(f.failNext, errs...)
}

// Sync validates st like the real writers, then records it or returns the next
// injected error.
func (f *Fake) Sync(ctx context.Context, st *rules.State) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	family := f.Family
	if family == "" {
		family = rules.IPv4
	}
	if err := st.ValidateFamily(family); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	full := !f.started || f.needFull
	if len(f.failNext) > 0 {
		err := f.failNext[0]
		f.failNext = f.failNext[1:]
		f.Failed++
		f.needFull = true
		return fmt.Errorf("rulestest: %w", err)
	}
	if full {
		f.FullSyncs++
	}
	f.started, f.needFull = true, false
	f.Synced = append(f.Synced, st.Clone())
	return nil
}

// SyncChanges applies ch to the last synced state, validates the result like
// the real writers, then records it (service ports in name order) or returns the
// next injected error; without a synced state to apply ch to it returns
// rules.ErrFullSyncNeeded, as the nftables writer does.
func (f *Fake) SyncChanges(ctx context.Context, ch *rules.Changes) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.started || f.needFull || len(f.Synced) == 0 {
		return fmt.Errorf("rulestest: %w", rules.ErrFullSyncNeeded)
	}
	byID := map[rules.PortID]rules.Service{}
	for _, s := range f.Synced[len(f.Synced)-1].Clone().Services {
		byID[s.ID()] = s
	}
	seen := map[rules.PortID]bool{}
	for _, s := range ch.Set {
		if seen[s.ID()] {
			return fmt.Errorf("rulestest: %w: service port %q listed twice", rules.ErrInvalidState, s.PortNameString())
		}
		seen[s.ID()] = true
		byID[s.ID()] = s
	}
	for _, id := range ch.Remove {
		if seen[id] {
			return fmt.Errorf("rulestest: %w: service port %v both set and removed", rules.ErrInvalidState, id)
		}
		seen[id] = true
		delete(byID, id)
	}
	st := &rules.State{}
	for _, s := range byID {
		st.Services = append(st.Services, s)
	}
	slices.SortFunc(st.Services, func(a, b rules.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.PortName, b.PortName), cmp.Compare(a.Protocol, b.Protocol))
	})
	family := f.Family
	if family == "" {
		family = rules.IPv4
	}
	if err := st.ValidateFamily(family); err != nil {
		return err
	}
	if len(f.failNext) > 0 {
		err := f.failNext[0]
		f.failNext = f.failNext[1:]
		f.Failed++
		f.needFull = true
		return fmt.Errorf("rulestest: %w", err)
	}
	f.PartialSyncs++
	f.Synced = append(f.Synced, st.Clone())
	return nil
}

// DryRun returns the nftables payload of a full sync of st.
func (f *Fake) DryRun(_ context.Context, st *rules.State) (string, error) {
	return rules.RenderNFTables(rules.NFTablesConfig{Family: f.Family}, st)
}

// ForceFullSync makes the next successful Sync count as full.
func (f *Fake) ForceFullSync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.needFull = true
}

// Last returns the last successfully synced state, or nil.
func (f *Fake) Last() *rules.State {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.Synced) == 0 {
		return nil
	}
	return f.Synced[len(f.Synced)-1].Clone()
}
