package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
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

// ipFamily is the ip_family label of a single-family proxier configured with
// Syncer alone (IPv4, the default).
const ipFamily = string(v1.IPv4Protocol)

// familySyncer is one IP family's writer. Upstream runs one proxier per family
// and joins them with a MetaProxier; here one sync loop drives every family's
// writer from the one tracker, each through its own converter, so each family
// sees exactly its part of every Service, as upstream's per-family trackers do.
type familySyncer struct {
	Family v1.IPFamily
	Syncer rules.Syncer
	// Conntrack cleans the family's stale UDP flows; nil skips it.
	Conntrack staleCleaner
	// ServiceHealth serves the family's healthCheckNodePorts, as each of
	// upstream's proxiers has its own; nil: none.
	ServiceHealth *serviceHealth
}

// staleCleaner is the part of rules.ConntrackCleaner the loop needs.
type staleCleaner interface {
	CleanStaleUDP(ctx context.Context, st *rules.State) (int, error)
}

// proxierConfig wires a proxier. Zero durations are taken as given (a zero
// MinSyncPeriod means every change syncs at once, as upstream).
type proxierConfig struct {
	Tracker *servicemap.Tracker
	// Families are the writers, primary family first. Empty means one IPv4
	// writer: Syncer with Conntrack.
	Families []familySyncer
	Syncer   rules.Syncer
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
	// FullSyncGCPercent, when > 0, is the GC target (debug.SetGCPercent) while a
	// full sync runs; the previous target is restored after it, and the memory the
	// sync used is collected and handed back to the OS right away (ReleaseMemory).
	// 0 leaves the collector alone.
	FullSyncGCPercent int
	// ReleaseMemory runs after a full sync under FullSyncGCPercent; nil means
	// debug.FreeOSMemory. A full sync's transient (at 10,000 services a 46 MB
	// netlink batch) is garbage once it is sent, but the partial syncs after it
	// allocate little, so without a collection it stays resident for minutes.
	ReleaseMemory func()
	Health        *healthServer
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
	families        []*familyState
	// triggerTimes are per family: an EndpointSlice's address type says whose
	// rules it changes, as each of upstream's proxiers sees its family's slices.
	triggerTimes map[v1.IPFamily]map[types.NamespacedName][]time.Time
}

// familyState is one family's writer with what the loop keeps for it.
type familyState struct {
	familySyncer
	label string // the ip_family metric label
	conv  *converter
	// needFull: this family's last sync failed, so its next one is full even
	// when the other family's is not.
	needFull bool
	skipped  map[servicemap.ServicePortName]string
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
	if len(cfg.Families) == 0 {
		cfg.Families = []familySyncer{{Family: v1.IPv4Protocol, Syncer: cfg.Syncer, Conntrack: cfg.Conntrack}}
	}
	p := &proxier{
		cfg:          cfg,
		runCh:        make(chan struct{}, 1),
		node:         cfg.Node,
		needFullSync: true,
		triggerTimes: map[v1.IPFamily]map[types.NamespacedName][]time.Time{},
	}
	for _, f := range cfg.Families {
		p.families = append(p.families, &familyState{familySyncer: f, label: string(f.Family),
			conv: newFamilyConverter(cfg.Node, f.Family), skipped: map[servicemap.ServicePortName]string{}})
	}
	return p
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
	family := v1.IPv4Protocol
	switch es.AddressType {
	case discovery.AddressTypeIPv4:
	case discovery.AddressTypeIPv6:
		family = v1.IPv6Protocol
	default:
		return // FQDN slices program nothing
	}
	nn := types.NamespacedName{Namespace: es.Namespace, Name: svc}
	p.mu.Lock()
	if p.triggerTimes[family] == nil {
		p.triggerTimes[family] = map[types.NamespacedName][]time.Time{}
	}
	p.triggerTimes[family][nn] = append(p.triggerTimes[family][nn], t)
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
	for _, f := range p.families {
		if p.cfg.Health != nil {
			p.cfg.Health.QueuedUpdate(f.Family)
		}
		syncProxyRulesLastQueuedTimestamp.WithLabelValues(f.label).SetToCurrentTime()
	}
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
	for _, f := range p.families {
		if p.cfg.Health != nil {
			p.cfg.Health.Updated(f.Family)
		}
		syncProxyRulesLastQueuedTimestamp.WithLabelValues(f.label).SetToCurrentTime()
	}
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

// familySync is what one sync computed for one family under the lock.
type familySync struct {
	f    *familyState
	full bool
	// st is the whole state, or ch the changes for a writer that takes them
	// (rules.PartialSyncer): a partial sync that needs the whole state for
	// nothing else costs in proportion to what changed.
	st                               *rules.State
	ch                               *rules.Changes
	noLocalInternal, noLocalExternal int
	// hcPorts and hcLocal are the family's health check ports and local ready
	// endpoint counts.
	hcPorts map[types.NamespacedName]uint16
	hcLocal map[types.NamespacedName]int
}

// syncOnce is one sync: consume the tracker's changes, convert them for every
// family, write each family's rules. A family whose write fails gets a full sync
// next; the others are unaffected.
func (p *proxier) syncOnce(ctx context.Context) error {
	if !p.initialized.Load() {
		klog.FromContext(ctx).V(2).Info("Not syncing rules until Services and Endpoints have been received from master")
		return nil
	}
	logger := klog.FromContext(ctx)
	clk := p.cfg.Clock
	start := clk.Now()

	p.mu.Lock()
	fullAll := p.needFullSync || start.Sub(p.lastFullSync) > p.cfg.FullSyncPeriod
	upd := p.cfg.Tracker.Consume()
	topology := p.topologyChanged
	p.topologyChanged = false
	syncs := make([]familySync, 0, len(p.families))
	for _, f := range p.families {
		if topology {
			f.conv.node = p.node
		}
		fs := familySync{f: f, full: fullAll || f.needFull}
		// A full sync reconverts every port too, so nothing the converter kept
		// can outlive a failure or a topology change.
		f.conv.apply(upd, fs.full)
		var skips []skipped
		ok := false
		// UDP changes need the whole state for the conntrack cleanup after.
		if _, partial := f.Syncer.(rules.PartialSyncer); partial && !fs.full && !touchesUDP(upd) {
			fs.ch, skips, ok = f.conv.changes()
		}
		if !ok {
			fs.ch = nil
			fs.st, skips = f.conv.state()
		}
		fs.noLocalInternal, fs.noLocalExternal = f.conv.noLocal()
		fs.hcPorts, fs.hcLocal = f.conv.healthChecks()
		p.reportSkips(logger, f, skips)
		syncs = append(syncs, fs)
	}
	triggers := p.triggerTimes
	p.triggerTimes = map[v1.IPFamily]map[types.NamespacedName][]time.Time{}
	p.mu.Unlock()
	logger.V(4).Info("Sync phases: changes converted", "changed", len(upd.Changed), "fullSync", fullAll, "elapsed", clk.Since(start))

	var errs []error
	for i := range syncs {
		fs := &syncs[i]
		if err := p.syncFamily(ctx, logger, fs, upd, triggers[fs.f.Family]); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fs.f.Family, err))
		}
	}
	// A family that failed has needFull set (syncFamily): only it is full next.
	p.mu.Lock()
	p.needFullSync = false
	if fullAll {
		p.lastFullSync = start
	}
	p.mu.Unlock()
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", errSyncFailed, errors.Join(errs...))
	}
	return nil
}

// syncFamily writes one family's state and does what follows a successful write:
// metrics, health, conntrack cleanup.
func (p *proxier) syncFamily(ctx context.Context, logger klog.Logger, fs *familySync, upd servicemap.Update,
	triggers map[types.NamespacedName][]time.Time) error {
	f := fs.f
	clk := p.cfg.Clock
	start := clk.Now()
	if fs.full {
		f.Syncer.ForceFullSync()
		if p.cfg.FullSyncGCPercent > 0 {
			prev := debug.SetGCPercent(p.cfg.FullSyncGCPercent)
			defer func() {
				debug.SetGCPercent(prev)
				release := p.cfg.ReleaseMemory
				if release == nil {
					release = debug.FreeOSMemory
				}
				release()
			}()
		}
	}
	logger.V(2).Info("Syncing rules", "ipFamily", f.Family, "fullSync", fs.full, "servicePorts", len(f.conv.ports), "changed", len(upd.Changed))
	var err error
	if fs.ch != nil {
		err = p.cfg.Do(func() error { return f.Syncer.(rules.PartialSyncer).SyncChanges(ctx, fs.ch) })
		if errors.Is(err, rules.ErrFullSyncNeeded) {
			// The writer lost its record (nothing was written): give it everything.
			p.mu.Lock()
			var skips []skipped
			fs.st, skips = f.conv.state()
			p.reportSkips(logger, f, skips)
			p.mu.Unlock()
			fs.ch = nil
		}
	}
	if fs.ch == nil {
		err = p.cfg.Do(func() error { return f.Syncer.Sync(ctx, fs.st) })
	}
	took := clk.Since(start)
	syncProxyRulesLatency.WithLabelValues(f.label).Observe(took.Seconds())
	if fs.full {
		syncFullProxyRulesLatency.WithLabelValues(f.label).Observe(took.Seconds())
	} else {
		syncPartialProxyRulesLatency.WithLabelValues(f.label).Observe(took.Seconds())
	}
	p.mu.Lock()
	// The changes are consumed: after a failure only a full sync can be trusted.
	f.needFull = err != nil
	p.mu.Unlock()
	if err != nil {
		return err
	}
	logger.V(2).Info("SyncProxyRules complete", "ipFamily", f.Family, "elapsed", took, "fullSync", fs.full)
	now := clk.Now()
	for nn, ts := range triggers {
		for _, t := range ts {
			latency := now.Sub(t).Seconds()
			networkProgrammingLatency.WithLabelValues(f.label).Observe(latency)
			logger.V(4).Info("Network programming", "ipFamily", f.Family, "endpoint", klog.KRef(nn.Namespace, nn.Name), "elapsed", latency)
		}
	}
	noLocalEndpointsTotal.WithLabelValues("internal", f.label).Set(float64(fs.noLocalInternal))
	noLocalEndpointsTotal.WithLabelValues("external", f.label).Set(float64(fs.noLocalExternal))
	if p.cfg.Health != nil {
		p.cfg.Health.Updated(f.Family)
	}
	syncProxyRulesLastTimestamp.WithLabelValues(f.label).SetToCurrentTime()
	if f.ServiceHealth != nil {
		f.ServiceHealth.sync(logger, fs.hcPorts, fs.hcLocal)
	}

	if f.Conntrack != nil && (fs.full || touchesUDP(upd)) {
		cstart := clk.Now()
		defer func() {
			logger.V(4).Info("Sync phases: conntrack cleaned", "ipFamily", f.Family, "elapsed", clk.Since(cstart))
		}()
		var n int
		cerr := p.cfg.Do(func() error {
			var err error
			n, err = f.Conntrack.CleanStaleUDP(ctx, fs.st)
			return err
		})
		if cerr != nil {
			logger.Error(cerr, "Failed to clean stale UDP conntrack entries", "ipFamily", f.Family)
		}
		if n > 0 {
			conntrackDeletedTotal.WithLabelValues(f.label).Add(float64(n))
			logger.V(2).Info("Deleted stale UDP conntrack entries", "ipFamily", f.Family, "count", n)
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
func (p *proxier) reportSkips(logger klog.Logger, f *familyState, skips []skipped) {
	now := make(map[servicemap.ServicePortName]string, len(skips))
	for _, s := range skips {
		reason := s.err.Error()
		now[s.name] = reason
		if f.skipped[s.name] != reason {
			logger.Error(s.err, "Skipping service port the rules cannot express; other services are unaffected",
				"service", klog.KRef(s.name.Namespace, s.name.Name), "port", s.name.Port, "protocol", s.name.Protocol, "ipFamily", f.Family)
			skippedServicePortsTotal.WithLabelValues(f.label).Inc()
		}
	}
	for n := range f.skipped {
		if _, still := now[n]; !still {
			logger.Info("Service port is written again", "service", klog.KRef(n.Namespace, n.Name), "port", n.Port, "ipFamily", f.Family)
		}
	}
	f.skipped = now
	skippedServicePorts.WithLabelValues(f.label).Set(float64(len(now)))
}
