package lease

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"
)

// Controller keeps one Lease renewed. Build it with New; run it with Run.
type Controller struct {
	cfg    Config
	leases coordinationclient.LeaseInterface
	ref    string // namespace/name, for logs and errors

	// jitter returns the wait before the next round; a seam for tests.
	jitter func(time.Duration) time.Duration

	running atomic.Bool

	// Owned by the Run goroutine.
	latest   *coordinationv1.Lease // the lease as last written or read
	failures int                   // failed API calls since the last successful write
}

// New validates cfg, applies its defaults and returns a Controller. It never
// panics: a bad Config is an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Controller, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Controller{
		cfg:    cfg,
		leases: cfg.Client.CoordinationV1().Leases(cfg.Namespace),
		ref:    cfg.Namespace + "/" + cfg.Name,
		jitter: func(d time.Duration) time.Duration { return wait.Jitter(d, RenewJitter) },
	}, nil
}

// Duration returns the lease duration in effect (after defaults).
func (c *Controller) Duration() time.Duration { return c.cfg.Duration }

// RenewInterval returns the base renew interval in effect (after defaults).
func (c *Controller) RenewInterval() time.Duration { return c.cfg.RenewInterval }

// Run renews the lease until ctx ends, then returns nil. The first round starts at
// once; each later round starts a jittered RenewInterval after the previous round
// finished. Failures are logged, counted in Metrics and retried as the package
// comment describes; they never end Run. Run returns ErrAlreadyRunning if the
// Controller is already running.
func (c *Controller) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("lease controller for %s: %w", c.ref, ErrAlreadyRunning)
	}
	defer c.running.Store(false)
	log := logr.FromContextOrDiscard(ctx).WithValues("lease", c.ref)
	ctx = logr.NewContext(ctx, log)
	log.V(4).Info("Lease controller starting", "duration", c.cfg.Duration, "renewInterval", c.cfg.RenewInterval)
	for {
		if ctx.Err() != nil {
			return nil
		}
		c.sync(ctx)
		if !c.sleep(ctx, c.jitter(c.cfg.RenewInterval)) {
			return nil
		}
	}
}

// sleep waits d on the injected clock; false means ctx ended first.
func (c *Controller) sleep(ctx context.Context, d time.Duration) bool {
	t := c.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}

// sync is one renewal round, in the order the upstream controller uses.
func (c *Controller) sync(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	if c.latest != nil {
		// Optimistic path: assume nobody else wrote the lease since our last write
		// and update from the cached copy, saving a GET per round.
		err := c.retryUpdate(ctx, c.latest)
		if err == nil || ctx.Err() != nil {
			return
		}
		log.Info("Failed to renew the lease from the cached copy, reading it again", "err", err)
	}
	lease, created := c.ensureWithBackoff(ctx)
	c.latest = lease
	if lease != nil && !created {
		if err := c.retryUpdate(ctx, lease); err != nil && ctx.Err() == nil {
			log.Error(err, "Failed to renew the lease, will retry", "interval", c.cfg.RenewInterval)
		}
	}
}

// ensureWithBackoff reads the lease, creating it when it does not exist, and retries
// failures forever with a wait of 200ms doubling to 7s. It returns the lease (nil if
// ctx ended, or if the owner could not be resolved for a create) and whether this
// call created it.
func (c *Controller) ensureWithBackoff(ctx context.Context) (*coordinationv1.Lease, bool) {
	wait := InitialBackoff / 2
	for {
		lease, created, err := c.ensure(ctx)
		if err == nil {
			return lease, created
		}
		wait = min(2*wait, MaxBackoff)
		logr.FromContextOrDiscard(ctx).Error(err, "Failed to ensure the lease exists, will retry", "interval", wait)
		if !c.sleep(ctx, wait) {
			return nil, false
		}
	}
}

func (c *Controller) ensure(ctx context.Context) (*coordinationv1.Lease, bool, error) {
	lease, err := c.leases.Get(ctx, c.cfg.Name, metav1.GetOptions{})
	if err == nil {
		c.observe("get", nil)
		return lease, false, nil
	}
	if !apierrors.IsNotFound(err) {
		c.observe("get", err)
		return nil, false, fmt.Errorf("get lease %s: %w", c.ref, err)
	}
	toCreate, err := c.desired(ctx, nil)
	if err != nil {
		// Not worth a backoff: the next round tries again, as upstream does.
		logr.FromContextOrDiscard(ctx).Error(err, "Not creating the lease before its owner reference is known")
		return nil, false, nil
	}
	start := c.cfg.Clock.Now()
	lease, err = c.leases.Create(ctx, toCreate, metav1.CreateOptions{})
	if err != nil {
		c.observe("create", err)
		return nil, false, fmt.Errorf("create lease %s: %w", c.ref, err)
	}
	c.cfg.Metrics.RenewLatency(c.cfg.Clock.Since(start))
	c.observe("create", nil)
	logr.FromContextOrDiscard(ctx).Info("Created the lease", "holder", c.cfg.HolderIdentity)
	return lease, true, nil
}

// retryUpdate writes base with a fresh renewTime, trying up to MaxUpdateTries times.
// A Conflict re-reads the lease (through ensureWithBackoff) and tries again.
func (c *Controller) retryUpdate(ctx context.Context, base *coordinationv1.Lease) error {
	log := logr.FromContextOrDiscard(ctx)
	for i := range MaxUpdateTries {
		if err := ctx.Err(); err != nil {
			return err
		}
		toUpdate, err := c.desired(ctx, base)
		if err != nil {
			log.Error(err, "Failed to prepare the lease")
		} else {
			start := c.cfg.Clock.Now()
			updated, err := c.leases.Update(ctx, toUpdate, metav1.UpdateOptions{})
			if err == nil {
				c.cfg.Metrics.RenewLatency(c.cfg.Clock.Since(start))
				c.observe("update", nil)
				if len(base.OwnerReferences) == 0 && len(updated.OwnerReferences) > 0 {
					log.Info("Added the owner reference to the lease", "owner", updated.OwnerReferences[0].Kind+"/"+updated.OwnerReferences[0].Name)
				}
				log.V(4).Info("Renewed the lease", "renewTime", toUpdate.Spec.RenewTime.Time)
				c.latest = updated
				return nil
			}
			c.observe("update", err)
			log.Error(err, "Failed to update the lease", "try", i+1)
			if apierrors.IsConflict(err) {
				// Someone else wrote it: the cached copy is stale. Read it again.
				base, _ = c.ensureWithBackoff(ctx)
				continue
			}
		}
		if i > 0 && c.cfg.OnRepeatedFailure != nil {
			c.cfg.OnRepeatedFailure()
		}
	}
	return fmt.Errorf("renew lease %s: %d updates failed", c.ref, MaxUpdateTries)
}

// desired returns the lease to write: a new one when base is nil, else a copy of
// base, with the configured duration, renewTime now and, while it has none, the
// owner reference. An error from Owner means the write should be skipped.
func (c *Controller) desired(ctx context.Context, base *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	var lease *coordinationv1.Lease
	if base == nil {
		lease = &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: c.cfg.Namespace, Name: c.cfg.Name},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(c.cfg.HolderIdentity)},
		}
	} else {
		lease = base.DeepCopy()
	}
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(c.cfg.Duration / time.Second))
	lease.Spec.RenewTime = &metav1.MicroTime{Time: c.cfg.Clock.Now()}
	if c.cfg.Owner != nil && len(lease.OwnerReferences) == 0 {
		owner, err := c.cfg.Owner(ctx)
		if err != nil {
			c.observe("owner", err)
			return nil, fmt.Errorf("owner reference for lease %s: %w", c.ref, err)
		}
		lease.OwnerReferences = []metav1.OwnerReference{owner}
	}
	return lease, nil
}

// observe feeds one API call's outcome to Metrics.
func (c *Controller) observe(op string, err error) {
	if err != nil {
		c.failures++
		c.cfg.Metrics.RenewFailure(op)
	} else if op != "get" {
		c.failures = 0
	}
	c.cfg.Metrics.ConsecutiveFailures(c.failures)
}
