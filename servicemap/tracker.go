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
//
// The tracker keeps no API object: a Service or EndpointSlice is converted when it
// arrives, into the few fields a proxy needs.
type Tracker struct {
	log     logr.Logger
	metrics Metrics
	clock   clock.PassiveClock

	mu sync.Mutex
	// applied is the state as of the last Consume, one immutable entry per service
	// that has a Service or a slice; snapshots share it.
	applied hamt
	// dirty holds private, changed copies of the entries of services changed since
	// the last Consume.
	dirty map[types.NamespacedName]*serviceEntry
	// sliceOwner remembers which service's name a slice (namespace/name) was
	// filed under, so a relabelled or label-less slice is still removed from it;
	// see ownerOf. It holds only slices not named "<service>-...", as the
	// endpointslice controller names them, so it stays small.
	sliceOwner map[types.NamespacedName]string
	gen        uint64 // hamt batch of the current Consume
	ports      int    // in applied
	services   int    // in applied with at least one port
	pending    chan struct{}
	topos      topologies
}

// serviceEntry is all the tracker keeps of one service. Entries in applied are
// shared with snapshots and never change; events change a copy held in dirty.
type serviceEntry struct {
	// ports, sorted by name, are the service's ports for snapshots, with their
	// endpoints. Between an event that converts the Service and the next Consume
	// they are the fresh conversion, without endpoints, owned by this entry.
	ports []*ServicePort
	fresh bool
	// hasService tells whether a Service is known; svc is its version.
	hasService bool
	svc        version
	// slices are sorted by name; most services have one or two, so a sorted
	// slice is smaller and as fast as a map.
	slices []*sliceInfo
}

func (e *serviceEntry) sliceIndex(name string) (int, bool) {
	return slices.BinarySearchFunc(e.slices, name, func(si *sliceInfo, n string) int {
		return cmpString(si.name, n)
	})
}

// version identifies one version of an API object, to recognise resyncs.
type version struct {
	uid types.UID
	rv  string
}

func versionOf(m interface {
	GetUID() types.UID
	GetResourceVersion() string
}) version {
	return version{uid: m.GetUID(), rv: m.GetResourceVersion()}
}

// same reports a resync of an object already held: same UID and resourceVersion.
func (v version) same(o version) bool { return v.rv != "" && v == o }

// sliceInfo is an EndpointSlice converted once, when it arrives. It never changes.
type sliceInfo struct {
	name    string
	version version
	ports   []slicePort // the usable ports
	// eps are the usable endpoints, sorted by address with duplicates merged.
	// Their Port is ports[0].num when the slice has exactly one port, so a service
	// port fed by this slice alone shares the list with every snapshot; else 0.
	eps []Endpoint
}

type slicePort struct {
	name  string
	proto v1.Protocol
	num   int32
}

// NewTracker returns an empty Tracker.
func NewTracker(cfg Config) *Tracker {
	t := &Tracker{
		log:        cfg.Logger,
		metrics:    cfg.Metrics,
		clock:      cfg.Clock,
		dirty:      map[types.NamespacedName]*serviceEntry{},
		sliceOwner: map[types.NamespacedName]string{},
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

// current returns the latest entry of a service, read-only (nil if none).
func (t *Tracker) current(nn types.NamespacedName) *serviceEntry {
	if e := t.dirty[nn]; e != nil {
		return e
	}
	e, _ := t.applied.get(nn)
	return e
}

// mutable returns the service's private entry, copying the applied one on first
// use, and signals a pending change.
func (t *Tracker) mutable(nn types.NamespacedName) *serviceEntry {
	e := t.dirty[nn]
	if e == nil {
		e = &serviceEntry{}
		if cur, ok := t.applied.get(nn); ok {
			*e = *cur
			e.slices = slices.Clone(cur.slices) // shared with snapshots: copy on write
		}
		t.dirty[nn] = e
		t.metrics.PendingServices(len(t.dirty))
	}
	select {
	case t.pending <- struct{}{}:
	default:
	}
	return e
}

// ownerOf returns the name of the service a slice is filed under. A slice is filed
// under one service at most, so for a slice named "<service>-..." it is enough to
// look for it in the services its name starts with; others are in sliceOwner.
func (t *Tracker) ownerOf(key types.NamespacedName) (string, bool) {
	if owner, ok := t.sliceOwner[key]; ok {
		return owner, true
	}
	for i := len(key.Name) - 1; i > 0; i-- {
		if key.Name[i] != '-' {
			continue
		}
		owner := key.Name[:i]
		if e := t.current(types.NamespacedName{Namespace: key.Namespace, Name: owner}); e != nil {
			if _, ok := e.sliceIndex(key.Name); ok {
				return owner, true
			}
		}
	}
	return "", false
}

// namedAfter reports whether slice is named "<service>-...".
func namedAfter(slice, service string) bool {
	return len(slice) > len(service) && slice[len(service)] == '-' && slice[:len(service)] == service
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
	if cur := t.current(nn); cur == nil || !cur.hasService {
		return
	}
	t.metrics.ServiceChange()
	e := t.mutable(nn)
	e.hasService, e.svc, e.ports, e.fresh = false, version{}, nil, false
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
	v := versionOf(svc)
	t.mu.Lock()
	defer t.mu.Unlock()
	if cur := t.current(nn); cur != nil && cur.hasService && cur.svc.same(v) {
		return
	}
	t.metrics.ServiceChange()
	e := t.mutable(nn)
	e.hasService, e.svc = true, v
	e.ports, e.fresh = servicePorts(t.log, svc), true
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
	owner, ok := t.ownerOf(key)
	if !ok {
		return
	}
	delete(t.sliceOwner, key)
	e := t.mutable(types.NamespacedName{Namespace: key.Namespace, Name: owner})
	if i, ok := e.sliceIndex(key.Name); ok {
		e.slices = slices.Delete(e.slices, i, i+1)
	}
	t.metrics.EndpointSliceChange()
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
	if prev, ok := t.ownerOf(key); ok && prev != svcName {
		t.log.Info("EndpointSlice moved to another Service", "endpointSlice", key.String(),
			"from", klogRef(key.Namespace, prev), "to", owner.String())
		t.removeSliceLocked(key)
	}
	v := versionOf(es)
	if cur := t.current(owner); cur != nil {
		if i, ok := cur.sliceIndex(es.Name); ok && cur.slices[i].version.same(v) {
			return
		}
	}
	e := t.mutable(owner)
	si := t.convertSlice(es, v)
	if i, ok := e.sliceIndex(es.Name); ok {
		e.slices[i] = si
	} else {
		e.slices = slices.Insert(e.slices, i, si)
	}
	if !namedAfter(es.Name, svcName) {
		t.sliceOwner[key] = svcName
	}
	if !e.hasService {
		t.log.V(4).Info("EndpointSlice for a Service not known yet; held until it arrives", "endpointSlice", key.String(), "service", owner.String())
	}
	t.metrics.EndpointSliceChange()
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
	t.gen++ // a new batch: nodes of earlier snapshots are never changed in place
	var changed []ServicePortName
	var changedSvcs []types.NamespacedName
	for nn, e := range t.dirty {
		prev, _ := t.applied.get(nn)
		var prevPorts []*ServicePort
		if prev != nil {
			prevPorts = prev.ports
		}
		e.ports = t.buildPorts(nn, e, prevPorts)
		e.fresh = false
		if diff := diffPorts(prevPorts, e.ports); len(diff) > 0 {
			changed = append(changed, diff...)
			changedSvcs = append(changedSvcs, nn)
		}
		t.ports += len(e.ports) - len(prevPorts)
		if len(prevPorts) > 0 {
			t.services--
		}
		if len(e.ports) > 0 {
			t.services++
		}
		if !e.hasService && len(e.slices) == 0 {
			t.applied = t.applied.del(nn)
		} else {
			t.applied = t.applied.setInBatch(nn, e, t.gen)
		}
	}
	rebuilt := len(t.dirty)
	// A fresh map rather than clear(): clear costs the map's capacity, which stays
	// at the size of the initial sync forever.
	t.dirty = map[types.NamespacedName]*serviceEntry{}
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
	return Update{Snapshot: &Snapshot{m: t.applied, ports: t.ports, services: t.services}, Changed: changed, ChangedServices: changedSvcs}
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

// buildPorts computes a service's ports with their endpoints from its entry. A
// port whose Service fields and endpoints are unchanged is reused from prev, so an
// endpoint change reallocates only the ports it touches.
func (t *Tracker) buildPorts(nn types.NamespacedName, e *serviceEntry, prev []*ServicePort) []*ServicePort {
	if !e.hasService || len(e.ports) == 0 {
		return nil
	}
	eps := t.endpointsFor(nn, e.ports, e.slices)
	if e.fresh {
		// Converted since the last Consume and seen by no snapshot: fill in place.
		for j, sp := range e.ports {
			sp.Endpoints = eps[j]
		}
		return e.ports
	}
	ports := make([]*ServicePort, len(e.ports))
	same := len(prev) == len(e.ports)
	for j, tp := range e.ports {
		if j < len(prev) && prev[j] == tp && sameArray(tp.Endpoints, eps[j]) {
			ports[j] = tp
			continue
		}
		same = false
		c := *tp
		c.Endpoints = eps[j]
		ports[j] = &c
	}
	if same {
		return prev
	}
	return ports
}

// endpointsFor merges the slices' endpoints into one list per port. Slices are
// visited in name order so the result does not depend on arrival order.
func (t *Tracker) endpointsFor(nn types.NamespacedName, ports []*ServicePort, bySlice []*sliceInfo) [][]Endpoint {
	out := make([][]Endpoint, len(ports))
	if len(bySlice) == 0 {
		return out
	}
	type use struct {
		port  int // index in ports
		num   int32
		slice *sliceInfo
	}
	var uses []use
	counts := make([]int, len(ports))
	for _, si := range bySlice {
		for _, p := range si.ports {
			spn := ServicePortName{NamespacedName: nn, Port: p.name, Protocol: p.proto}
			j := slices.IndexFunc(ports, func(sp *ServicePort) bool { return sp.Name == spn })
			if j < 0 {
				t.log.Info("EndpointSlice port matches no port of its Service (name or protocol differ)",
					"endpointSlice", klogRef(nn.Namespace, si.name), "portName", p.name, "protocol", p.proto, "service", nn.String())
				continue
			}
			uses = append(uses, use{port: j, num: p.num, slice: si})
			counts[j]++
		}
	}
	for j := range ports {
		if counts[j] != 1 {
			continue
		}
		// One slice feeds this port: its list is already sorted and merged.
		for _, u := range uses {
			if u.port != j {
				continue
			}
			if len(u.slice.ports) == 1 {
				out[j] = u.slice.eps // shared, never copied
			} else {
				out[j] = withPort(u.slice.eps, u.num)
			}
		}
	}
	for j := range ports {
		if counts[j] < 2 {
			continue
		}
		n := 0
		for _, u := range uses {
			if u.port == j {
				n += len(u.slice.eps)
			}
		}
		// Exact-size list: it lives as long as the snapshot, so no append slack.
		eps := make([]Endpoint, 0, n)
		for _, u := range uses {
			if u.port != j {
				continue
			}
			for _, ep := range u.slice.eps {
				ep.Port = u.num
				eps = append(eps, ep)
			}
		}
		out[j] = t.dedup("", ports[j].Name.String(), eps)
	}
	return out
}

// sameArray reports whether two lists are the same memory (or both empty).
func sameArray(a, b []Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func withPort(eps []Endpoint, num int32) []Endpoint {
	if len(eps) == 0 {
		return nil
	}
	out := make([]Endpoint, len(eps))
	for i, ep := range eps {
		ep.Port = num
		out[i] = ep
	}
	return out
}

// convertSlice keeps what the tracker needs of an EndpointSlice: its usable
// ports and endpoints.
func (t *Tracker) convertSlice(es *discovery.EndpointSlice, v version) *sliceInfo {
	si := &sliceInfo{name: es.Name, version: v}
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
		si.ports = append(si.ports, slicePort{name: *p.Name, proto: proto, num: *p.Port})
	}
	if len(si.ports) == 0 {
		return si
	}
	fam, _ := sliceFamily(es.AddressType)
	eps := t.dedup(es.Namespace, es.Name, sliceEndpoints(t.log, &t.topos, es, fam))
	if len(si.ports) == 1 {
		for i := range eps {
			eps[i].Port = si.ports[0].num
		}
	}
	if len(eps) == 0 {
		eps = nil
	} else if cap(eps) > len(eps) {
		// Invalid endpoints were dropped: do not pin the slack.
		eps = append(make([]Endpoint, 0, len(eps)), eps...)
	}
	si.eps = eps
	return si
}

// dedup sorts endpoints by address and port and keeps one per address and port:
// the first that is not terminating, else the first (kube-proxy prefers a
// non-terminating copy when an endpoint appears in two slices while it moves).
// The sort is stable, so "first" is in slice name order, then slice order.
// ns and name name the slice or service port for the log.
func (t *Tracker) dedup(ns, name string, eps []Endpoint) []Endpoint {
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
			t.log.V(4).Info("Merging duplicate endpoint", "in", klogRef(ns, name), "endpoint", eps[i].String(), "copies", j-i)
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
		return append(make([]Endpoint, 0, len(out)), out...)
	}
	return out
}

// diffPorts returns the names of ports that differ between two port lists sorted by name.
func diffPorts(a, b []*ServicePort) []ServicePortName {
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
	if a == b {
		return true
	}
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
		a.Terminating == b.Terminating && a.Topology.equal(b.Topology)
}

// Snapshot is an immutable view of the map at one Consume. Readers need no lock.
type Snapshot struct {
	m        hamt
	ports    int
	services int
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
	sortByName(out)
	return out
}

// Len returns the number of service ports.
func (s *Snapshot) Len() int { return s.ports }

// Services returns the number of services.
func (s *Snapshot) Services() int { return s.services }
