package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/servicemap"
)

// ipFamily is the only family nodekit writes today (the rules package is IPv4).
const ipFamily = string(v1.IPv4Protocol)

// staleCleaner is the part of rules.ConntrackCleaner the loop needs.
type staleCleaner interface {
	CleanStaleUDP(ctx context.Context, st *rules.State) (int, error)
}

// proxierConfig wires a proxier. Zero durations are taken as given (a zero
// MinSyncPeriod means every change syncs at once, as upstream).
type proxierConfig struct {
	Tracker *servicemap.Tracker
	Syncer  rules.Syncer
	// Conntrack cleans stale UDP flows after each sync that touched a UDP port;
	// nil skips it.
	Conntrack staleCleaner
	// Do runs fn where the rules live (the node's network namespace); nil runs fn
	// directly.
	Do            func(fn func() error) error
	Clock         clock.WithTicker
	MinSyncPeriod time.Duration
	// SyncPeriod is the retry interval after a failed sync (upstream's syncPeriod).
	SyncPeriod time.Duration
	// FullSyncPeriod is the longest time without a sync, and the age after which
	// the next sync is full. Zero means an hour, as upstream.
	FullSyncPeriod time.Duration
	Node           servicemap.Node
	Health         *healthServer
	// ServiceHealth serves the healthCheckNodePorts; nil: none.
	ServiceHealth *serviceHealth
}

// proxier is the sync loop: upstream's BoundedFrequencyRunner around a sync that
// converts the changed service ports and hands the whole desired state to the
// rules writer, which writes only what changed (or everything on a full sync).
type proxier struct {
	cfg   proxierConfig
	runCh chan struct{}

	initialized atomic.Bool
	// changes counts the Service and EndpointSlice events received, so tests can
	// wait for an event to land instead of sleeping.
	changes atomic.Uint64

	mu              sync.Mutex // guards everything below
	node            servicemap.Node
	topologyChanged bool
	needFullSync    bool
	lastFullSync    time.Time
	conv            *converter
	skipped         map[servicemap.ServicePortName]string
	triggerTimes    map[types.NamespacedName][]time.Time
}

func newProxier(cfg proxierConfig) *proxier {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.FullSyncPeriod == 0 {
		cfg.FullSyncPeriod = fullSyncPeriod
	}
	if cfg.Do == nil {
		cfg.Do = func(fn func() error) error { return fn() }
	}
	return &proxier{
		cfg:          cfg,
		runCh:        make(chan struct{}, 1),
		node:         cfg.Node,
		needFullSync: true,
		conv:         newConverter(cfg.Node),
		skipped:      map[servicemap.ServicePortName]string{},
		triggerTimes: map[types.NamespacedName][]time.Time{},
	}
}

// The proxier is the watcher's handler: it forwards to the tracker, then queues
// a sync (once the initial lists are in).

func (p *proxier) OnServiceAdd(s *v1.Service) { p.cfg.Tracker.OnServiceAdd(s); p.changed() }
func (p *proxier) OnServiceUpdate(o, s *v1.Service) {
	p.cfg.Tracker.OnServiceUpdate(o, s)
	p.changed()
}
func (p *proxier) OnServiceDelete(s *v1.Service) { p.cfg.Tracker.OnServiceDelete(s); p.changed() }
func (p *proxier) OnEndpointSliceAdd(es *discovery.EndpointSlice) {
	p.recordTrigger(es)
	p.cfg.Tracker.OnEndpointSliceAdd(es)
	p.changed()
}
func (p *proxier) OnEndpointSliceUpdate(o, es *discovery.EndpointSlice) {
	p.recordTrigger(es)
	p.cfg.Tracker.OnEndpointSliceUpdate(o, es)
	p.changed()
}
func (p *proxier) OnEndpointSliceDelete(es *discovery.EndpointSlice) {
	p.cfg.Tracker.OnEndpointSliceDelete(es)
	p.changed()
}

// recordTrigger keeps the EndpointSlice's last-change-trigger-time for
// kubeproxy_network_programming_duration_seconds.
func (p *proxier) recordTrigger(es *discovery.EndpointSlice) {
	v, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return
	}
	svc := es.Labels[discovery.LabelServiceName]
	if svc == "" {
		return
	}
	p.mu.Lock()
	nn := types.NamespacedName{Namespace: es.Namespace, Name: svc}
	p.triggerTimes[nn] = append(p.triggerTimes[nn], t)
	p.mu.Unlock()
}

func (p *proxier) changed() {
	p.changes.Add(1)
	if p.initialized.Load() {
		p.queue()
	}
}

// OnSynced marks the initial lists received: syncs may start.
func (p *proxier) OnSynced() {
	p.initialized.Store(true)
	p.queue()
}

// OnNodeChange takes the node's current labels; a changed zone makes the next
// sync reconvert everything (upstream's OnTopologyChange).
func (p *proxier) OnNodeChange(n *v1.Node) {
	if n == nil {
		return
	}
	p.mu.Lock()
	changed := p.node.Zone() != n.Labels[v1.LabelTopologyZone]
	if changed {
		p.node = servicemap.Node{Name: p.node.Name, Labels: n.Labels}
		p.topologyChanged = true
		p.needFullSync = true
	}
	p.mu.Unlock()
	if changed {
		p.changed()
	}
}

// queue asks for a sync as soon as the rate limit allows.
func (p *proxier) queue() {
	if p.cfg.Health != nil {
		p.cfg.Health.QueuedUpdate(v1.IPv4Protocol)
	}
	syncProxyRulesLastQueuedTimestamp.WithLabelValues(ipFamily).SetToCurrentTime()
	select {
	case p.runCh <- struct{}{}:
	default:
	}
}

// Run is upstream's BoundedFrequencyRunner loop: a sync runs when one is queued,
// never sooner than MinSyncPeriod after the previous one ended; after a failure
// the next runs SyncPeriod later even if nothing is queued; and at least every
// FullSyncPeriod. It returns nil when ctx ends.
func (p *proxier) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	if p.cfg.Health != nil {
		p.cfg.Health.Updated(v1.IPv4Protocol)
	}
	syncProxyRulesLastQueuedTimestamp.WithLabelValues(ipFamily).SetToCurrentTime()
	logger.V(2).Info("Sync params", "minSyncPeriod", p.cfg.MinSyncPeriod, "syncPeriod", p.cfg.SyncPeriod, "maxSyncPeriod", p.cfg.FullSyncPeriod)

	next := p.cfg.Clock.NewTimer(p.cfg.FullSyncPeriod)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-next.C():
		case <-p.runCh:
		}
		next.Stop()
		interval := p.cfg.FullSyncPeriod
		if err := p.syncOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			interval = min(interval, p.cfg.SyncPeriod)
			logger.Error(err, "Sync failed", "retryingTime", interval)
		}
		next.Reset(interval)
		if p.cfg.MinSyncPeriod > 0 {
			wait := p.cfg.Clock.NewTimer(p.cfg.MinSyncPeriod)
			select {
			case <-ctx.Done():
				wait.Stop()
				return nil
			case <-wait.C():
			}
		}
	}
}

var errSyncFailed = errors.New("sync failed")

// syncOnce is one sync: consume the tracker's changes, convert them, write.
func (p *proxier) syncOnce(ctx context.Context) error {
	if !p.initialized.Load() {
		klog.FromContext(ctx).V(2).Info("Not syncing rules until Services and Endpoints have been received from master")
		return nil
	}
	logger := klog.FromContext(ctx)
	clk := p.cfg.Clock
	start := clk.Now()

	p.mu.Lock()
	full := p.needFullSync || start.Sub(p.lastFullSync) > p.cfg.FullSyncPeriod
	upd := p.cfg.Tracker.Consume()
	if p.topologyChanged {
		p.conv.node = p.node
		p.topologyChanged = false
	}
	// A full sync reconverts every port too, so nothing the converter kept can
	// outlive a failure or a topology change.
	p.conv.apply(upd, full)
	st, skips := p.conv.state()
	noLocalInternal, noLocalExternal := p.conv.noLocal()
	hcPorts, hcLocal := p.conv.healthChecks()
	triggers := p.triggerTimes
	p.triggerTimes = map[types.NamespacedName][]time.Time{}
	p.reportSkips(logger, skips)
	p.mu.Unlock()

	if full {
		p.cfg.Syncer.ForceFullSync()
	}
	logger.V(2).Info("Syncing rules", "fullSync", full, "servicePorts", len(st.Services), "changed", len(upd.Changed))
	err := p.cfg.Do(func() error { return p.cfg.Syncer.Sync(ctx, st) })
	took := clk.Since(start)
	syncProxyRulesLatency.WithLabelValues(ipFamily).Observe(took.Seconds())
	if full {
		syncFullProxyRulesLatency.WithLabelValues(ipFamily).Observe(took.Seconds())
	} else {
		syncPartialProxyRulesLatency.WithLabelValues(ipFamily).Observe(took.Seconds())
	}
	p.mu.Lock()
	if err != nil {
		// The changes are consumed: only a full sync can be trusted next.
		p.needFullSync = true
		p.mu.Unlock()
		return fmt.Errorf("%w: %w", errSyncFailed, err)
	}
	p.needFullSync = false
	if full {
		p.lastFullSync = start
	}
	p.mu.Unlock()
	logger.V(2).Info("SyncProxyRules complete", "elapsed", took, "fullSync", full)

	now := clk.Now()
	for nn, ts := range triggers {
		for _, t := range ts {
			latency := now.Sub(t).Seconds()
			networkProgrammingLatency.WithLabelValues(ipFamily).Observe(latency)
			logger.V(4).Info("Network programming", "endpoint", klog.KRef(nn.Namespace, nn.Name), "elapsed", latency)
		}
	}
	noLocalEndpointsTotal.WithLabelValues("internal", ipFamily).Set(float64(noLocalInternal))
	noLocalEndpointsTotal.WithLabelValues("external", ipFamily).Set(float64(noLocalExternal))
	if p.cfg.Health != nil {
		p.cfg.Health.Updated(v1.IPv4Protocol)
	}
	syncProxyRulesLastTimestamp.WithLabelValues(ipFamily).SetToCurrentTime()
	if p.cfg.ServiceHealth != nil {
		p.cfg.ServiceHealth.sync(logger, hcPorts, hcLocal)
	}

	if p.cfg.Conntrack != nil && (full || touchesUDP(upd)) {
		var n int
		cerr := p.cfg.Do(func() error {
			var err error
			n, err = p.cfg.Conntrack.CleanStaleUDP(ctx, st)
			return err
		})
		if cerr != nil {
			logger.Error(cerr, "Failed to clean stale UDP conntrack entries")
		}
		if n > 0 {
			conntrackDeletedTotal.WithLabelValues(ipFamily).Add(float64(n))
			logger.V(2).Info("Deleted stale UDP conntrack entries", "count", n)
		}
	}
	return nil
}

func touchesUDP(upd servicemap.Update) bool {
	for _, n := range upd.Changed {
		if n.Protocol == v1.ProtocolUDP {
			return true
		}
	}
	return false
}

// reportSkips logs each skipped port once (again only if its reason changes) and
// keeps the metrics. Called with p.mu held.
func (p *proxier) reportSkips(logger klog.Logger, skips []skipped) {
	now := make(map[servicemap.ServicePortName]string, len(skips))
	for _, s := range skips {
		reason := s.err.Error()
		now[s.name] = reason
		if p.skipped[s.name] != reason {
			logger.Error(s.err, "Skipping service port the rules cannot express; other services are unaffected",
				"service", klog.KRef(s.name.Namespace, s.name.Name), "port", s.name.Port, "protocol", s.name.Protocol)
			skippedServicePortsTotal.WithLabelValues(ipFamily).Inc()
		}
	}
	for n := range p.skipped {
		if _, still := now[n]; !still {
			logger.Info("Service port is written again", "service", klog.KRef(n.Namespace, n.Name), "port", n.Port)
		}
	}
	p.skipped = now
	skippedServicePorts.WithLabelValues(ipFamily).Set(float64(len(now)))
}
