package lease

import (
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
)

// Expiry returns when l stops being fresh by its own fields: spec.renewTime plus
// spec.leaseDurationSeconds. It fails with ErrIncompleteLease when either is
// missing.
//
// Clock skew: renewTime is written with the holder's clock and compared with the
// reader's. A holder whose clock runs ahead looks fresh for longer, one that runs
// behind looks stale early, by exactly the skew. Readers that must not trust the
// holder's clock use a Watcher, which, like the node lifecycle controller, only
// notices that renewTime changed and times the silence with its own clock.
func Expiry(l *coordinationv1.Lease) (time.Time, error) {
	if l == nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		name := "<nil>"
		if l != nil {
			name = l.Namespace + "/" + l.Name
		}
		return time.Time{}, fmt.Errorf("lease %s: %w", name, ErrIncompleteLease)
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second), nil
}

// Fresh reports whether l is still held at now: now is before Expiry(l). An
// incomplete lease is never fresh. See Expiry for the clock-skew caveat.
func Fresh(l *coordinationv1.Lease, now time.Time) bool {
	exp, err := Expiry(l)
	return err == nil && now.Before(exp)
}
