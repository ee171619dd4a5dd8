package servicemap

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
)

// ErrInvalidObject is reported (through Config.OnInvalid and the logs) for an
// object the tracker cannot use at all, such as an EndpointSlice without the
// kubernetes.io/service-name label.
var ErrInvalidObject = errors.New("servicemap: invalid object")

// Metrics receives the tracker's counters. Implementations must be safe for
// concurrent use; agents adapt it to kube-proxy's metric names
// (kubeproxy_sync_proxy_rules_service_changes_total, ..._endpoint_changes_total, ...).
type Metrics interface {
	// ServiceChange counts a Service event that was accepted.
	ServiceChange()
	// EndpointSliceChange counts an EndpointSlice event that was accepted.
	EndpointSliceChange()
	// InvalidObject counts an object (kind "Service" or "EndpointSlice") skipped as unusable.
	InvalidObject(kind string)
	// PendingServices reports how many services have changes not yet consumed.
	PendingServices(n int)
	// Consumed reports one Consume: services rebuilt, ports changed, time taken.
	Consumed(services, ports int, took time.Duration)
}

type noMetrics struct{}

func (noMetrics) ServiceChange()                   {}
func (noMetrics) EndpointSliceChange()             {}
func (noMetrics) InvalidObject(string)             {}
func (noMetrics) PendingServices(int)              {}
func (noMetrics) Consumed(int, int, time.Duration) {}

// Config configures a Tracker. The zero value is usable.
type Config struct {
	// Logger receives the reasons objects or parts of them are skipped. Zero: discard.
	Logger logr.Logger
	// Metrics receives counters. Nil: no-op.
	Metrics Metrics
	// Clock times Consume for Metrics. Nil: the real clock.
	Clock clock.PassiveClock
}

// Tracker turns Service and EndpointSlice events into service ports with their
// endpoints. Feed it with the On* methods from any event source (Watcher does it
// from an informer); read it with Consume. All methods are safe for concurrent use.
type Tracker struct {
	log     logr.Logger
	metrics Metrics
	clock   clock.PassiveClock

	mu sync.Mutex
	// inputs holds the latest accepted objects per service; entries go away when
	// the Service and all its slices are gone.
	inputs map[types.NamespacedName]*serviceInputs
	// sliceOwner remembers which service each slice (namespace/name) was filed
	// under, so a relabelled or label-less slice is still removed from it.
	sliceOwner map[types.NamespacedName]types.NamespacedName
	dirty      map[types.NamespacedName]struct{}
	// applied is the state as of the last Consume; snapshots share it.
	applied hamt
	ports   int
	pending chan struct{}
}

type serviceInputs struct {
	svc *v1.Service
	// slices are sorted by name; most services have one or two, so a sorted
	// slice is smaller and as fast as a map.
	slices []*discovery.EndpointSlice
}

func (in *serviceInputs) sliceIndex(name string) (int, bool) {
	return slices.BinarySearchFunc(in.slices, name, func(es *discovery.EndpointSlice, n string) int {
		return cmpString(es.Name, n)
	})
}

// serviceEntry is what a snapshot holds per service: its ports sorted by name.
type serviceEntry struct {
	ports []*ServicePort
}

// NewTracker returns an empty Tracker.
func NewTracker(cfg Config) *Tracker {
	t := &Tracker{
		log:        cfg.Logger,
		metrics:    cfg.Metrics,
		clock:      cfg.Clock,
		inputs:     map[types.NamespacedName]*serviceInputs{},
		sliceOwner: map[types.NamespacedName]types.NamespacedName{},
		dirty:      map[types.NamespacedName]struct{}{},
		pending:    make(chan struct{}, 1),
	}
	if t.metrics == nil {
		t.metrics = noMetrics{}
	}
	if t.clock == nil {
		t.clock = clock.RealClock{}
	}
	return t
}

// Pending receives a value (coalesced) whenever a change arrives that the next
// Consume may report. A sync loop waits on it, rate-limits, then calls Consume.
func (t *Tracker) Pending() <-chan struct{} { return t.pending }

func (t *Tracker) markDirty(nn types.NamespacedName) {
	t.dirty[nn] = struct{}{}
	t.metrics.PendingServices(len(t.dirty))
	select {
	case t.pending <- struct{}{}:
	default:
	}
}

func (t *Tracker) inputsFor(nn types.NamespacedName) *serviceInputs {
	in := t.inputs[nn]
	if in == nil {
		in = &serviceInputs{}
		t.inputs[nn] = in
	}
	return in
}

// sameVersion reports a resync of an object already held: same UID and resourceVersion.
func sameVersion(a, b interface {
	GetUID() types.UID
	GetResourceVersion() string
}) bool {
	return a.GetResourceVersion() != "" && a.GetResourceVersion() == b.GetResourceVersion() && a.GetUID() == b.GetUID()
}

// OnServiceAdd records a new Service.
func (t *Tracker) OnServiceAdd(svc *v1.Service) { t.setService(svc) }

// OnServiceUpdate records a changed Service (old is not needed).
func (t *Tracker) OnServiceUpdate(_, svc *v1.Service) { t.setService(svc) }

// OnServiceDelete forgets a Service. Its slices are kept until they are deleted too,
// so a Service deleted and re-created keeps its endpoints.
func (t *Tracker) OnServiceDelete(svc *v1.Service) {
	if svc == nil {
		return
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.inputs[nn]
	if in == nil || in.svc == nil {
		return
	}
	t.metrics.ServiceChange()
	in.svc = nil
	t.markDirty(nn)
}

func (t *Tracker) setService(svc *v1.Service) {
	if svc == nil {
		return
	}
	if svc.Name == "" {
		t.invalid("Service", svc.Namespace, svc.Name, "Service has no name")
		return
	}
	nn := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	in := t.inputsFor(nn)
	if in.svc != nil && (in.svc == svc || sameVersion(in.svc, svc)) {
		return
	}
	t.metrics.ServiceChange()
	in.svc = svc
	t.markDirty(nn)
}

func (t *Tracker) invalid(kind, ns, name, reason string) {
	t.metrics.InvalidObject(kind)
	t.log.Error(ErrInvalidObject, "Skipping "+kind, "object", klogRef(ns, name), "reason", reason)
}

// OnEndpointSliceAdd records a new EndpointSlice.
func (t *Tracker) OnEndpointSliceAdd(es *discovery.EndpointSlice) { t.setSlice(es) }

// OnEndpointSliceUpdate records a changed EndpointSlice (old is not needed).
func (t *Tracker) OnEndpointSliceUpdate(_, es *discovery.EndpointSlice) { t.setSlice(es) }

// OnEndpointSliceDelete forgets an EndpointSlice.
func (t *Tracker) OnEndpointSliceDelete(es *discovery.EndpointSlice) {
	if es == nil {
		return
	}
	key := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeSliceLocked(key)
}

func (t *Tracker) removeSliceLocked(key types.NamespacedName) {
	owner, ok := t.sliceOwner[key]
	if !ok {
		return
	}
	delete(t.sliceOwner, key)
	if in := t.inputs[owner]; in != nil {
		if i, ok := in.sliceIndex(key.Name); ok {
			in.slices = slices.Delete(in.slices, i, i+1)
		}
	}
	t.metrics.EndpointSliceChange()
	t.markDirty(owner)
}

func (t *Tracker) setSlice(es *discovery.EndpointSlice) {
	if es == nil {
		return
	}
	key := types.NamespacedName{Namespace: es.Namespace, Name: es.Name}
	reason := ""
	svcName := es.Labels[discovery.LabelServiceName]
	switch {
	case es.Name == "" || es.Namespace == "":
		reason = "EndpointSlice needs a name and a namespace"
	case svcName == "":
		reason = "EndpointSlice has no " + discovery.LabelServiceName + " label"
	}
	if _, ok := sliceFamily(es.AddressType); reason == "" && !ok {
		t.log.V(4).Info("Ignoring EndpointSlice of an unsupported addressType", "endpointSlice", key.String(), "addressType", es.AddressType)
		reason = "-"
	}
	if _, headless := es.Labels[LabelHeadless]; reason == "" && headless {
		t.log.V(4).Info("Ignoring EndpointSlice of a headless Service", "endpointSlice", key.String())
		reason = "-"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if reason != "" {
		if reason != "-" {
			t.invalid("EndpointSlice", es.Namespace, es.Name, reason)
		}
		// A slice that was usable before and no longer is must not linger.
		t.removeSliceLocked(key)
		return
	}
	owner := types.NamespacedName{Namespace: es.Namespace, Name: svcName}
	if prev, ok := t.sliceOwner[key]; ok && prev != owner {
		t.log.Info("EndpointSlice moved to another Service", "endpointSlice", key.String(), "from", prev.String(), "to", owner.String())
		t.removeSliceLocked(key)
	}
	in := t.inputsFor(owner)
	if i, ok := in.sliceIndex(es.Name); ok {
		if old := in.slices[i]; old == es || sameVersion(old, es) {
			return
		}
		in.slices[i] = es
	} else {
		in.slices = slices.Insert(in.slices, i, es)
	}
	t.sliceOwner[key] = owner
	if in.svc == nil {
		t.log.V(4).Info("EndpointSlice for a Service not known yet; held until it arrives", "endpointSlice", key.String(), "service", owner.String())
	}
	t.metrics.EndpointSliceChange()
	t.markDirty(owner)
}

// Update is the result of Consume.
type Update struct {
	// Snapshot is the whole map after the consumed changes. It never changes and
	// may be read from any number of goroutines while the Tracker moves on.
	Snapshot *Snapshot
	// Changed lists, sorted, the service ports added, removed or modified since the
	// previous Consume (a port whose endpoints changed counts as modified).
	Changed []ServicePortName
	// ChangedServices lists, sorted, the services owning Changed.
	ChangedServices []types.NamespacedName
}

// Consume applies the changes received since the last Consume and returns the
// ports that changed and a snapshot of the whole map. It costs time proportional
// to the size of the changed services, not to the size of the map.
func (t *Tracker) Consume() Update {
	t.mu.Lock()
	defer t.mu.Unlock()
	start := t.clock.Now()
	var changed []ServicePortName
	var changedSvcs []types.NamespacedName
	for nn := range t.dirty {
		in := t.inputs[nn]
		var next *serviceEntry
		if in != nil {
			next = t.buildEntry(nn, in)
			if in.svc == nil && len(in.slices) == 0 {
				delete(t.inputs, nn)
			}
		}
		prev, _ := t.applied.get(nn)
		diff := diffEntries(prev, next)
		if len(diff) == 0 {
			continue
		}
		changed = append(changed, diff...)
		changedSvcs = append(changedSvcs, nn)
		if prev != nil {
			t.ports -= len(prev.ports)
		}
		if next == nil {
			t.applied = t.applied.del(nn)
		} else {
			t.ports += len(next.ports)
			t.applied = t.applied.set(nn, next)
		}
	}
	rebuilt := len(t.dirty)
	// A fresh map rather than clear(): clear costs the map's capacity, which stays
	// at the size of the initial sync forever.
	t.dirty = map[types.NamespacedName]struct{}{}
	t.metrics.PendingServices(0)
	slices.SortFunc(changed, func(a, b ServicePortName) int {
		switch {
		case a.Less(b):
			return -1
		case b.Less(a):
			return 1
		}
		return 0
	})
	slices.SortFunc(changedSvcs, func(a, b types.NamespacedName) int {
		switch {
		case a.Namespace != b.Namespace:
			return cmpString(a.Namespace, b.Namespace)
		}
		return cmpString(a.Name, b.Name)
	})
	t.metrics.Consumed(rebuilt, len(changed), t.clock.Since(start))
	return Update{Snapshot: &Snapshot{m: t.applied, ports: t.ports}, Changed: changed, ChangedServices: changedSvcs}
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// buildEntry computes a service's ports and endpoints from its Service and slices.
func (t *Tracker) buildEntry(nn types.NamespacedName, in *serviceInputs) *serviceEntry {
	if in.svc == nil {
		return nil
	}
	ports := servicePorts(t.log, in.svc)
	if len(ports) == 0 {
		return nil
	}
	if len(in.slices) > 0 {
		t.attachEndpoints(nn, ports, in.slices)
	}
	return &serviceEntry{ports: ports}
}

// attachEndpoints merges the slices' endpoints into the matching ports. Slices are
// visited in name order so the result does not depend on arrival order.
func (t *Tracker) attachEndpoints(nn types.NamespacedName, ports []*ServicePort, bySlice []*discovery.EndpointSlice) {
	type use struct {
		port int // index in ports
		num  int32
		eps  []Endpoint
	}
	var uses []use
	counts := make([]int, len(ports))
	for _, es := range bySlice {
		fam, _ := sliceFamily(es.AddressType)
		var base []Endpoint
		for i := range es.Ports {
			p := &es.Ports[i]
			if p.Name == nil {
				t.log.Info("Ignoring EndpointSlice port without a name", "endpointSlice", klogRef(es.Namespace, es.Name), "index", i)
				continue
			}
			if p.Port == nil || *p.Port == 0 {
				t.log.Info("Ignoring EndpointSlice port without a port number", "endpointSlice", klogRef(es.Namespace, es.Name), "portName", *p.Name)
				continue
			}
			proto := v1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			spn := ServicePortName{NamespacedName: nn, Port: *p.Name, Protocol: proto}
			j := slices.IndexFunc(ports, func(sp *ServicePort) bool { return sp.Name == spn })
			if j < 0 {
				t.log.Info("EndpointSlice port matches no port of its Service (name or protocol differ)",
					"endpointSlice", klogRef(es.Namespace, es.Name), "portName", *p.Name, "protocol", proto, "service", nn.String())
				continue
			}
			if base == nil {
				base = sliceEndpoints(t.log, es, fam)
			}
			uses = append(uses, use{port: j, num: *p.Port, eps: base})
			counts[j] += len(base)
		}
	}
	// Exact-size lists: they live as long as the snapshot, so no append slack.
	for j, n := range counts {
		if n > 0 {
			ports[j].Endpoints = make([]Endpoint, 0, n)
		}
	}
	for _, u := range uses {
		sp := ports[u.port]
		for _, ep := range u.eps {
			ep.Port = u.num
			sp.Endpoints = append(sp.Endpoints, ep)
		}
	}
	for _, sp := range ports {
		sp.Endpoints = t.dedup(sp.Name, sp.Endpoints)
	}
}

// dedup sorts endpoints by address and port and keeps one per address and port:
// the first that is not terminating, else the first (kube-proxy prefers a
// non-terminating copy when an endpoint appears in two slices while it moves).
func (t *Tracker) dedup(spn ServicePortName, eps []Endpoint) []Endpoint {
	if len(eps) < 2 {
		return eps
	}
	slices.SortStableFunc(eps, compareEndpoints)
	out := eps[:0]
	for i := 0; i < len(eps); {
		j := i + 1
		for j < len(eps) && eps[j].AddrPort() == eps[i].AddrPort() {
			j++
		}
		pick := i
		if j-i > 1 {
			t.log.V(4).Info("Merging duplicate endpoint", "servicePort", spn.String(), "endpoint", eps[i].String(), "copies", j-i)
			for k := i; k < j; k++ {
				if !eps[k].IsTerminating() {
					pick = k
					break
				}
			}
		}
		out = append(out, eps[pick])
		i = j
	}
	if len(out) < len(eps) {
		// Duplicates were dropped: copy so the snapshot does not pin the slack.
		return slices.Clone(out)
	}
	return out
}

// diffEntries returns the names of ports that differ between two entries.
func diffEntries(prev, next *serviceEntry) []ServicePortName {
	var a, b []*ServicePort
	if prev != nil {
		a = prev.ports
	}
	if next != nil {
		b = next.ports
	}
	var out []ServicePortName
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j >= len(b) || (i < len(a) && a[i].Name.Less(b[j].Name)):
			out = append(out, a[i].Name)
			i++
		case i >= len(a) || b[j].Name.Less(a[i].Name):
			out = append(out, b[j].Name)
			j++
		default:
			if !equalPorts(a[i], b[j]) {
				out = append(out, a[i].Name)
			}
			i++
			j++
		}
	}
	return out
}

func equalPorts(a, b *ServicePort) bool {
	return a.Name == b.Name && a.Port == b.Port && a.Protocol == b.Protocol && a.NodePort == b.NodePort &&
		a.SessionAffinity == b.SessionAffinity && a.StickyMaxAgeSeconds == b.StickyMaxAgeSeconds &&
		a.ExternalPolicyLocal == b.ExternalPolicyLocal && a.InternalPolicyLocal == b.InternalPolicyLocal &&
		a.HealthCheckNodePort == b.HealthCheckNodePort &&
		slices.Equal(a.ClusterIPs, b.ClusterIPs) && slices.Equal(a.ExternalIPs, b.ExternalIPs) &&
		slices.Equal(a.LoadBalancerVIPs, b.LoadBalancerVIPs) &&
		slices.Equal(a.LoadBalancerSourceRanges, b.LoadBalancerSourceRanges) &&
		slices.EqualFunc(a.Endpoints, b.Endpoints, equalEndpoints)
}

func equalEndpoints(a, b Endpoint) bool {
	return a.Addr == b.Addr && a.Port == b.Port && a.Ready == b.Ready && a.Serving == b.Serving &&
		a.Terminating == b.Terminating && a.NodeName == b.NodeName && a.Zone == b.Zone &&
		slices.Equal(a.ZoneHints, b.ZoneHints) && slices.Equal(a.NodeHints, b.NodeHints)
}

// Snapshot is an immutable view of the map at one Consume. Readers need no lock.
type Snapshot struct {
	m     hamt
	ports int
}

// Get returns one service port with its endpoints.
func (s *Snapshot) Get(name ServicePortName) (*ServicePort, bool) {
	e, ok := s.m.get(name.NamespacedName)
	if !ok {
		return nil, false
	}
	for _, sp := range e.ports {
		if sp.Name == name {
			return sp, true
		}
	}
	return nil, false
}

// Service returns the ports of one service, sorted by name (nil if unknown).
func (s *Snapshot) Service(nn types.NamespacedName) []*ServicePort {
	e, ok := s.m.get(nn)
	if !ok {
		return nil
	}
	return e.ports
}

// Range calls fn for every service port, in no particular order, until fn returns false.
func (s *Snapshot) Range(fn func(*ServicePort) bool) {
	s.m.each(func(_ types.NamespacedName, e *serviceEntry) bool {
		for _, sp := range e.ports {
			if !fn(sp) {
				return false
			}
		}
		return true
	})
}

// Ports returns every service port sorted by name.
func (s *Snapshot) Ports() []*ServicePort {
	out := make([]*ServicePort, 0, s.ports)
	s.Range(func(sp *ServicePort) bool { out = append(out, sp); return true })
	slices.SortFunc(out, func(a, b *ServicePort) int {
		switch {
		case a.Name.Less(b.Name):
			return -1
		case b.Name.Less(a.Name):
			return 1
		}
		return 0
	})
	return out
}

// Len returns the number of service ports.
func (s *Snapshot) Len() int { return s.ports }

// Services returns the number of services.
func (s *Snapshot) Services() int { return s.m.size }
