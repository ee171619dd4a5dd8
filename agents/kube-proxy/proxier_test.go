package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/component-base/metrics/testutil"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/rules/rulestest"
	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// notifyingSyncer wraps the fake writer and reports each Sync's outcome.
type notifyingSyncer struct {
	*rulestest.Fake
	done chan error
}

func (n *notifyingSyncer) Sync(ctx context.Context, st *rules.State) error {
	err := n.Fake.Sync(ctx, st)
	n.done <- err
	return err
}

func (n *notifyingSyncer) SyncChanges(ctx context.Context, ch *rules.Changes) error {
	err := n.Fake.SyncChanges(ctx, ch)
	n.done <- err
	return err
}

// recordingCleaner records the states conntrack cleanup was asked about.
type recordingCleaner struct {
	mu    sync.Mutex
	calls int
}

func (r *recordingCleaner) CleanStaleUDP(context.Context, *rules.State) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return 0, nil
}

func (r *recordingCleaner) n() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

type loopEnv struct {
	t       *testing.T
	clock   *clocktesting.FakeClock
	client  *fake.Clientset
	syncer  *notifyingSyncer
	px      *proxier
	health  *healthServer
	cleaner *recordingCleaner
}

func startLoop(t *testing.T, objs ...any) *loopEnv {
	t.Helper()
	registerMetrics()
	e := &loopEnv{
		t:       t,
		clock:   clocktesting.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)),
		client:  fake.NewClientset(),
		syncer:  &notifyingSyncer{Fake: &rulestest.Fake{}, done: make(chan error, 10)},
		cleaner: &recordingCleaner{},
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	e.health = newHealthServer(e.clock, 60*time.Second, func() *corev1.Node { return node })
	e.px = newProxier(proxierConfig{
		Tracker: servicemap.NewTracker(servicemap.Config{Metrics: trackerMetrics{}}),
		Syncer:  e.syncer, Conntrack: e.cleaner, Clock: e.clock,
		MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second,
		Node: servicemap.Node{Name: "n1"}, Health: e.health,
	})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	for _, o := range objs {
		e.create(o)
	}
	w, err := servicemap.NewWatcher(servicemap.WatcherConfig{Client: e.client, Handler: e.px})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	go func() { defer wg.Done(); _ = e.px.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-w.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher never synced")
	}
	return e
}

func (e *loopEnv) create(o any) {
	e.t.Helper()
	ctx := context.Background()
	var err error
	switch o := o.(type) {
	case *corev1.Service:
		_, err = e.client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	case *discoveryv1.EndpointSlice:
		_, err = e.client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
	}
	require.NoError(e.t, err)
}

func (e *loopEnv) updateSlice(es *discoveryv1.EndpointSlice) {
	e.t.Helper()
	_, err := e.client.DiscoveryV1().EndpointSlices(es.Namespace).Update(context.Background(), es, metav1.UpdateOptions{})
	require.NoError(e.t, err)
}

// waitSync waits for the next Sync and returns its error.
func (e *loopEnv) waitSync() error {
	e.t.Helper()
	select {
	case err := <-e.syncer.done:
		return err
	case <-time.After(10 * time.Second):
		e.t.Fatal("no sync happened")
		return nil
	}
}

// noSync checks that no Sync happens for a short while (the loop is waiting on
// the fake clock).
func (e *loopEnv) noSync(why string) {
	e.t.Helper()
	select {
	case err := <-e.syncer.done:
		e.t.Fatalf("unexpected sync (err %v): %s", err, why)
	case <-time.After(150 * time.Millisecond):
	}
}

// waitMinInterval waits until the loop sits in its minimum-interval wait (two
// timers: the next-run timer and the min-interval timer).
func (e *loopEnv) waitMinInterval() {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.clock.Waiters() == 2 }, 5*time.Second, time.Millisecond)
}

// waitIdle waits until the loop waits for work (only the next-run timer).
func (e *loopEnv) waitIdle() {
	e.t.Helper()
	require.Eventually(e.t, func() bool { return e.clock.Waiters() == 1 }, 5*time.Second, time.Millisecond)
}

func web(eps ...string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := smt.Service("default", "web", smt.ClusterIPs("10.96.0.10"), smt.Port("http", 80, corev1.ProtocolTCP))
	var list []discoveryv1.Endpoint
	for _, ip := range eps {
		list = append(list, smt.Endpoint(ip, smt.OnNode("n1")))
	}
	es := smt.EndpointSlice("default", "web-abc", "web", discoveryv1.AddressTypeIPv4,
		smt.SlicePort("http", 8080, corev1.ProtocolTCP), smt.Endpoints(list...))
	return svc, es
}

func endpointsOf(st *rules.State, name string) []string {
	for _, s := range st.Services {
		if s.Name == name {
			var out []string
			for _, e := range s.Endpoints {
				out = append(out, e.String())
			}
			return out
		}
	}
	return nil
}

func TestLoopWaitsForInitialListsThenSyncsFull(t *testing.T) {
	// Registered first, so it runs after startLoop's cleanup stopped everything.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.noSync("not initialized before OnSynced")
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	assert.Equal(t, 1, e.syncer.FullSyncs, "the first sync is full")
	assert.Equal(t, []string{"10.244.1.10:8080"}, endpointsOf(e.syncer.Last(), "web"))
	e.waitMinInterval() // conntrack cleanup runs after Sync returns
	assert.Equal(t, 1, e.cleaner.n(), "a full sync cleans UDP conntrack")
}

// TestLoopGivesTheWholeStateWhenTheWriterLostItsRecord: a writer that refuses
// changes with ErrFullSyncNeeded (here: ForceFullSync behind the loop's back)
// gets the whole state in the same sync.
func TestLoopGivesTheWholeStateWhenTheWriterLostItsRecord(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	e.waitMinInterval()
	e.syncer.ForceFullSync()

	es.Endpoints = append(es.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	e.updateSlice(es)
	e.clock.Step(time.Second)
	require.ErrorIs(t, e.waitSync(), rules.ErrFullSyncNeeded, "the changes are refused first")
	require.NoError(t, e.waitSync(), "then the whole state is synced")
	assert.Equal(t, 2, e.syncer.FullSyncs)
	assert.Equal(t, 0, e.syncer.PartialSyncs)
	assert.Equal(t, []string{"10.244.1.10:8080", "10.244.1.11:8080"}, endpointsOf(e.syncer.Last(), "web"))
	e.waitMinInterval()
	assert.Zero(t, e.syncer.Failed)
}

func TestLoopRateLimitsAndSyncsPartially(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	e.waitMinInterval()

	// A change inside minSyncPeriod waits for it.
	es.Endpoints = append(es.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	e.updateSlice(es)
	e.noSync("inside minSyncPeriod")
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	assert.Equal(t, 1, e.syncer.FullSyncs, "the second sync is partial")
	assert.Equal(t, 1, e.syncer.PartialSyncs, "and hands the writer only the changed port")
	assert.Equal(t, []string{"10.244.1.10:8080", "10.244.1.11:8080"}, endpointsOf(e.syncer.Last(), "web"))
	e.waitMinInterval()
	assert.Equal(t, 1, e.cleaner.n(), "a TCP-only partial sync leaves conntrack alone")

	// Two changes inside one interval make one sync.
	before := e.px.changes.Load()
	es.Endpoints = es.Endpoints[:1]
	e.updateSlice(es)
	svc2 := smt.Service("default", "dns", smt.ClusterIPs("10.96.0.53"), smt.Port("dns", 53, corev1.ProtocolUDP))
	e.create(svc2)
	require.Eventually(t, func() bool { return e.px.changes.Load() >= before+2 }, 5*time.Second, time.Millisecond,
		"both events reach the proxier")
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	e.noSync("both changes went into one sync")
	e.waitMinInterval()
	st := e.syncer.Last()
	assert.Equal(t, []string{"10.244.1.10:8080"}, endpointsOf(st, "web"))
	require.Len(t, st.Services, 2)
	assert.Empty(t, endpointsOf(st, "dns"), "a service without endpoints is written (to reject)")
	assert.Equal(t, 2, e.cleaner.n(), "a changed UDP port triggers conntrack cleanup")
}

func TestLoopRetriesFailureWithFullSyncAfterSyncPeriod(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	e.waitMinInterval()

	e.syncer.FailNext(fmt.Errorf("%w: injected", rules.ErrApplyFailed))
	es.Endpoints = append(es.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	e.updateSlice(es)
	e.clock.Step(time.Second)
	require.Error(t, e.waitSync())
	assert.Equal(t, []string{"10.244.1.10:8080"}, endpointsOf(e.syncer.Last(), "web"), "the previous rules stay")

	// No new change: the retry comes syncPeriod (30s) after the failure, not sooner.
	e.waitMinInterval()
	e.clock.Step(time.Second)
	e.waitIdle()
	e.clock.Step(28 * time.Second)
	e.noSync("retry before syncPeriod")
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	assert.Equal(t, 2, e.syncer.FullSyncs, "the retry is full")
	assert.Equal(t, []string{"10.244.1.10:8080", "10.244.1.11:8080"}, endpointsOf(e.syncer.Last(), "web"))
}

func TestLoopPeriodicFullSync(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	e.waitMinInterval()
	e.clock.Step(time.Second)
	e.waitIdle()
	e.clock.Step(fullSyncPeriod - 2*time.Second)
	e.noSync("before the hourly sync")
	e.clock.Step(2 * time.Second)
	require.NoError(t, e.waitSync())
	assert.Equal(t, 2, e.syncer.FullSyncs, "the hourly sync is full")
}

func TestLoopHealthGoesStaleWhileSyncsFail(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	assert.True(t, e.health.health().Healthy)
	e.waitMinInterval()

	errs := make([]error, 5)
	for i := range errs {
		errs[i] = fmt.Errorf("%w: injected", rules.ErrApplyFailed)
	}
	e.syncer.FailNext(errs...)
	es.Endpoints = append(es.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	e.updateSlice(es)
	e.clock.Step(time.Second)
	require.Error(t, e.waitSync())
	assert.True(t, e.health.health().Healthy, "a queued update younger than 2 x syncPeriod is fine")
	e.waitMinInterval()
	e.clock.Step(time.Second)
	e.waitIdle()
	e.clock.Step(29 * time.Second)
	require.Error(t, e.waitSync())
	e.waitMinInterval()
	e.clock.Step(time.Second)
	e.waitIdle()
	e.clock.Step(29 * time.Second) // 61s after the change was queued
	require.Error(t, e.waitSync())
	assert.False(t, e.health.health().Healthy, "queued for more than 2 x syncPeriod without a successful sync")
}

func TestLoopSkipsInexpressibleServicePort(t *testing.T) {
	registerMetrics()
	// Two Services claim the same external IP and port: the later (by name) is
	// skipped, the earlier and every other service keep working.
	a := smt.Service("default", "a", smt.ClusterIPs("10.96.0.20"), smt.Port("", 80, corev1.ProtocolTCP), smt.ExternalIPs("192.0.2.100"))
	b := smt.Service("default", "b", smt.ClusterIPs("10.96.0.21"), smt.Port("", 80, corev1.ProtocolTCP), smt.ExternalIPs("192.0.2.100"))
	svc, es := web("10.244.1.10")
	before, _ := testutil.GetCounterMetricValue(skippedServicePortsTotal.WithLabelValues(ipFamily))
	e := startLoop(t, a, b, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	st := e.syncer.Last()
	var names []string
	for _, s := range st.Services {
		names = append(names, s.Name)
	}
	assert.Equal(t, []string{"a", "web"}, names)
	after, _ := testutil.GetCounterMetricValue(skippedServicePortsTotal.WithLabelValues(ipFamily))
	assert.Equal(t, before+1, after, "the skipped port is counted")
	gauge, _ := testutil.GetGaugeMetricValue(skippedServicePorts.WithLabelValues(ipFamily))
	assert.Equal(t, 1.0, gauge)

	// Fixing the clash brings it back.
	e.waitMinInterval()
	b.Spec.ExternalIPs = []string{"192.0.2.101"}
	_, err := e.client.CoreV1().Services("default").Update(context.Background(), b, metav1.UpdateOptions{})
	require.NoError(t, err)
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	assert.Len(t, e.syncer.Last().Services, 3)
}

func TestLoopNetworkProgrammingLatency(t *testing.T) {
	svc, es := web("10.244.1.10")
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	e.waitMinInterval()
	before, _ := testutil.GetHistogramMetricCount(networkProgrammingLatency.WithLabelValues(ipFamily))
	es.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: e.clock.Now().Add(-2 * time.Second).Format(time.RFC3339Nano)}
	es.Endpoints = append(es.Endpoints, smt.Endpoint("10.244.1.11", smt.OnNode("n1")))
	e.updateSlice(es)
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	// Observed just after the write returns: wait for it rather than race it.
	assert.Eventually(t, func() bool {
		after, _ := testutil.GetHistogramMetricCount(networkProgrammingLatency.WithLabelValues(ipFamily))
		return after == before+1
	}, 5*time.Second, 10*time.Millisecond)
}

func TestLoopTopologyChangeReconvertsWithFullSync(t *testing.T) {
	svc := smt.Service("default", "web", smt.ClusterIPs("10.96.0.10"), smt.Port("http", 80, corev1.ProtocolTCP))
	es := smt.EndpointSlice("default", "web-abc", "web", discoveryv1.AddressTypeIPv4,
		smt.SlicePort("http", 8080, corev1.ProtocolTCP), smt.Endpoints(
			smt.Endpoint("10.244.1.10", smt.InZone("a"), smt.ZoneHints("a")),
			smt.Endpoint("10.244.2.10", smt.InZone("b"), smt.ZoneHints("b")),
		))
	e := startLoop(t, svc, es)
	e.px.OnSynced()
	require.NoError(t, e.waitSync())
	assert.Equal(t, []string{"10.244.1.10:8080", "10.244.2.10:8080"}, endpointsOf(e.syncer.Last(), "web"), "no zone: hints do not apply")
	e.waitMinInterval()
	e.px.OnNodeChange(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelTopologyZone: "b"}}})
	e.clock.Step(time.Second)
	require.NoError(t, e.waitSync())
	assert.Equal(t, []string{"10.244.2.10:8080"}, endpointsOf(e.syncer.Last(), "web"), "zone b: only b's endpoint")
	assert.Equal(t, 2, e.syncer.FullSyncs)
}

func TestConvertTrafficPolicies(t *testing.T) {
	node := servicemap.Node{Name: "n1"}
	tr := servicemap.NewTracker(servicemap.Config{})
	local := smt.Service("default", "local", smt.ClusterIPs("10.96.0.30"), smt.Port("", 80, corev1.ProtocolTCP),
		smt.InternalTrafficPolicy(corev1.ServiceInternalTrafficPolicyLocal))
	tr.OnServiceAdd(local)
	tr.OnEndpointSliceAdd(smt.EndpointSlice("default", "local-1", "local", discoveryv1.AddressTypeIPv4,
		smt.SlicePort("", 8080, corev1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.244.2.10", smt.OnNode("n2")))))
	empty := smt.Service("default", "empty", smt.ClusterIPs("10.96.0.31"), smt.Port("", 80, corev1.ProtocolTCP))
	tr.OnServiceAdd(empty)
	etp := smt.Service("default", "etp", smt.ClusterIPs("10.96.0.32"), smt.Port("", 80, corev1.ProtocolTCP),
		smt.Type(corev1.ServiceTypeNodePort), smt.NodePort("", 30080),
		smt.ExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal))
	tr.OnServiceAdd(etp)
	tr.OnEndpointSliceAdd(smt.EndpointSlice("default", "etp-1", "etp", discoveryv1.AddressTypeIPv4,
		smt.SlicePort("", 8080, corev1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.244.2.11", smt.OnNode("n2")))))
	// Both policies Local, one endpoint here and one elsewhere.
	both := smt.Service("default", "both", smt.ClusterIPs("10.96.0.33"), smt.Port("", 80, corev1.ProtocolTCP),
		smt.Type(corev1.ServiceTypeNodePort), smt.NodePort("", 30081),
		smt.ExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal),
		smt.InternalTrafficPolicy(corev1.ServiceInternalTrafficPolicyLocal))
	tr.OnServiceAdd(both)
	tr.OnEndpointSliceAdd(smt.EndpointSlice("default", "both-1", "both", discoveryv1.AddressTypeIPv4,
		smt.SlicePort("", 8080, corev1.ProtocolTCP), smt.Endpoints(
			smt.Endpoint("10.244.1.12", smt.OnNode("n1")), smt.Endpoint("10.244.2.12", smt.OnNode("n2")))))
	v6 := smt.Service("default", "v6", smt.ClusterIPs("fd00::10"), smt.Port("", 80, corev1.ProtocolTCP))
	tr.OnServiceAdd(v6)

	c := newConverter(node)
	c.apply(tr.Consume(), true)
	st, skips := c.state()
	require.Empty(t, skips)
	byName := map[string]rules.Service{}
	for _, s := range st.Services {
		byName[s.Name] = s
	}
	ep := func(s string) rules.Endpoint { return rules.Endpoint{IP: netip.MustParseAddr(s), Port: 8080} }
	assert.NotContains(t, byName, "v6", "an IPv6-only service is not the IPv4 writer's")
	assert.Equal(t, rules.Drop, byName["local"].NoEndpoints, "ITP Local, endpoints elsewhere only: drop")
	assert.True(t, byName["local"].InternalLocal)
	assert.Empty(t, byName["local"].Endpoints, "a ClusterIP-only ITP Local port uses no Cluster endpoints")
	assert.Empty(t, byName["local"].LocalEndpoints)
	assert.Empty(t, byName["empty"].Endpoints)
	assert.NotEqual(t, rules.Drop, byName["empty"].NoEndpoints, "no endpoints anywhere: reject")
	assert.True(t, byName["etp"].ExternalLocal)
	assert.False(t, byName["etp"].InternalLocal)
	assert.Equal(t, []rules.Endpoint{ep("10.244.2.11")}, byName["etp"].Endpoints, "Cluster endpoints for ClusterIP and short-circuited traffic")
	assert.Empty(t, byName["etp"].LocalEndpoints, "no local endpoint: external traffic is dropped")
	assert.True(t, byName["both"].ExternalLocal)
	assert.True(t, byName["both"].InternalLocal)
	assert.Equal(t, []rules.Endpoint{ep("10.244.1.12"), ep("10.244.2.12")}, byName["both"].Endpoints,
		"an externally accessible port keeps its Cluster endpoints for short-circuiting")
	assert.Equal(t, []rules.Endpoint{ep("10.244.1.12")}, byName["both"].LocalEndpoints)
	in, ex := c.noLocal()
	assert.Equal(t, 1, in)
	assert.Equal(t, 1, ex)
}

// TestConvertLoadBalancerSourceRanges: the IPv4 rules get the Service's IPv4
// source ranges, invalid entries ignored as kube-proxy ignores them, and none at
// all when 0.0.0.0/0 is among them (allow all).
func TestConvertLoadBalancerSourceRanges(t *testing.T) {
	tr := servicemap.NewTracker(servicemap.Config{})
	lb := func(name, ip string, ranges ...string) *corev1.Service {
		return smt.Service("default", name, smt.ClusterIPs(ip), smt.Port("", 80, corev1.ProtocolTCP),
			smt.Type(corev1.ServiceTypeLoadBalancer), smt.NodePort("", 30000+int32(len(name))),
			smt.LoadBalancer("203.0.113."+ip[len(ip)-2:], "2001:db8::"+ip[len(ip)-2:]), smt.SourceRanges(ranges...))
	}
	tr.OnServiceAdd(lb("ranged", "10.96.0.40", " 192.0.2.0/24 ", "bogus", "", "2001:db8::/32", "10.1.2.3/8"))
	tr.OnServiceAdd(lb("allow-all", "10.96.0.41", "192.0.2.0/24", "0.0.0.0/0"))
	tr.OnServiceAdd(lb("v6-only-ranges", "10.96.0.42", "2001:db8::/32"))
	tr.OnServiceAdd(lb("none", "10.96.0.43"))
	c := newConverter(servicemap.Node{Name: "n1"})
	c.apply(tr.Consume(), true)
	st, skips := c.state()
	require.Empty(t, skips)
	byName := map[string]rules.Service{}
	for _, s := range st.Services {
		byName[s.Name] = s
	}
	assert.Equal(t, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.0.0.0/8")},
		byName["ranged"].LoadBalancerSourceRanges, "IPv4 entries, masked; the invalid and IPv6 ones left out")
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("203.0.113.40")}, byName["ranged"].LoadBalancerIPs)
	assert.Empty(t, byName["allow-all"].LoadBalancerSourceRanges, "0.0.0.0/0 allows every source")
	assert.Empty(t, byName["v6-only-ranges"].LoadBalancerSourceRanges, "the IPv6 proxier's ranges do not restrict IPv4")
	assert.Empty(t, byName["none"].LoadBalancerSourceRanges)
	out, err := rules.RenderNFTables(rules.NFTablesConfig{}, st)
	require.NoError(t, err)
	assert.Contains(t, out, "ip saddr != { 192.0.2.0/24 , 10.0.0.0/8 } drop")
	assert.Equal(t, 1, strings.Count(out, " ip saddr != { "), "only the ranged port has a firewall")
}

// TestConverterChangesMatchState drives one converter through random Service and
// EndpointSlice changes, among them external IPs and node ports that clash, and
// checks after each that its partial changes, applied to the state it handed out
// before, give exactly the state (and the skipped ports) a converter built from
// scratch gives, and that it falls back to the whole state while a destination
// is contested.
func TestConverterChangesMatchState(t *testing.T) {
	rng := rand.New(rand.NewPCG(14, 1))
	tr := servicemap.NewTracker(servicemap.Config{})
	node := servicemap.Node{Name: "n1"}
	svc := func(i int) *corev1.Service {
		opts := []smt.ServiceOption{smt.ClusterIPs(fmt.Sprintf("10.96.0.%d", 10+i)), smt.Port("p", 80, corev1.ProtocolTCP)}
		switch rng.IntN(4) {
		case 0: // an external IP that another service may also claim
			opts = append(opts, smt.ExternalIPs(fmt.Sprintf("192.0.2.%d", rng.IntN(3))))
		case 1: // a node port that another service may also claim
			opts = append(opts, smt.Type(corev1.ServiceTypeNodePort), smt.NodePort("p", 30000+int32(rng.IntN(3))))
		case 2:
			opts = append(opts, smt.ExternalTrafficPolicy(corev1.ServiceExternalTrafficPolicyLocal),
				smt.Type(corev1.ServiceTypeNodePort), smt.NodePort("p", 31000+int32(i)), smt.HealthCheckNodePort(32000+int32(i)))
		}
		return smt.Service("default", fmt.Sprintf("s%d", i), opts...)
	}
	slice := func(i int) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for j := range rng.IntN(3) {
			eps = append(eps, smt.Endpoint(fmt.Sprintf("10.244.%d.%d", i, j), smt.OnNode(fmt.Sprintf("n%d", 1+rng.IntN(2)))))
		}
		return smt.EndpointSlice("default", fmt.Sprintf("s%d-1", i), fmt.Sprintf("s%d", i), discoveryv1.AddressTypeIPv4,
			smt.SlicePort("p", 8080, corev1.ProtocolTCP), smt.Endpoints(eps...))
	}
	const n = 12
	svcs, slcs := map[int]*corev1.Service{}, map[int]*discoveryv1.EndpointSlice{}
	for i := range n {
		svcs[i], slcs[i] = svc(i), slice(i)
		tr.OnServiceAdd(svcs[i])
		tr.OnEndpointSliceAdd(slcs[i])
	}
	c := newConverter(node)
	c.apply(tr.Consume(), true)
	last, _ := c.state()
	partial, whole := 0, 0
	for step := range 300 {
		for range 1 + rng.IntN(3) {
			i := rng.IntN(n)
			switch rng.IntN(4) {
			case 0:
				if old, ok := svcs[i]; ok {
					tr.OnServiceDelete(old)
					delete(svcs, i)
				} else {
					svcs[i] = svc(i)
					tr.OnServiceAdd(svcs[i])
				}
			case 1:
				if old, ok := svcs[i]; ok {
					svcs[i] = svc(i)
					tr.OnServiceUpdate(old, svcs[i])
				}
			default:
				old := slcs[i]
				slcs[i] = slice(i)
				tr.OnEndpointSliceUpdate(old, slcs[i])
			}
		}
		upd := tr.Consume()
		c.apply(upd, false)
		fresh := newConverter(node)
		fresh.apply(servicemap.Update{Snapshot: upd.Snapshot}, true)
		want, wantSkips := fresh.state()
		ch, skips, ok := c.changes()
		var got *rules.State
		if ok {
			partial++
			fake := &rulestest.Fake{}
			require.NoError(t, fake.Sync(context.Background(), last))
			require.NoError(t, fake.SyncChanges(context.Background(), ch), "step %d", step)
			got = fake.Last()
		} else {
			whole++
			got, skips = c.state()
		}
		require.Equal(t, want, got, "step %d", step)
		require.Equal(t, wantSkips, skips, "step %d", step)
		in, ex := c.noLocal()
		fin, fex := fresh.noLocal()
		require.Equal(t, []int{fin, fex}, []int{in, ex}, "step %d", step)
		hp, hl := c.healthChecks()
		fhp, fhl := fresh.healthChecks()
		require.Equal(t, fhp, hp, "step %d", step)
		require.Equal(t, fhl, hl, "step %d", step)
		last = got
	}
	t.Logf("%d partial, %d whole", partial, whole)
	assert.Positive(t, partial)
	assert.Positive(t, whole)
}

// BenchmarkConvertOneChangeAt10k converts one changed port among 10,000 and
// hands it out as the whole state or as changes.
func BenchmarkConvertOneChangeAt10k(b *testing.B) {
	for _, partial := range []bool{false, true} {
		b.Run(map[bool]string{false: "state", true: "changes"}[partial], func(b *testing.B) {
			tr := servicemap.NewTracker(servicemap.Config{})
			const n = 10000
			slcs := make([]*discoveryv1.EndpointSlice, n)
			for i := range n {
				tr.OnServiceAdd(smt.Service("bench", fmt.Sprintf("svc-%05d", i), smt.ClusterIPs(fmt.Sprintf("10.96.%d.%d", i/256, i%256)),
					smt.Port("p", 80, corev1.ProtocolTCP)))
				var eps []discoveryv1.Endpoint
				for j := range 10 {
					eps = append(eps, smt.Endpoint(fmt.Sprintf("10.%d.%d.%d", 100+j, i/256, i%256)))
				}
				slcs[i] = smt.EndpointSlice("bench", fmt.Sprintf("svc-%05d-1", i), fmt.Sprintf("svc-%05d", i), discoveryv1.AddressTypeIPv4,
					smt.SlicePort("p", 8080, corev1.ProtocolTCP), smt.Endpoints(eps...))
				tr.OnEndpointSliceAdd(slcs[i])
			}
			c := newConverter(servicemap.Node{Name: "n1"})
			c.apply(tr.Consume(), true)
			c.state()
			i := 0
			for b.Loop() {
				i++
				k := (i * 7919) % n
				es := slcs[k].DeepCopy()
				es.Endpoints[i%10].Addresses = []string{fmt.Sprintf("10.250.%d.%d", i/256%256, i%256)}
				tr.OnEndpointSliceUpdate(slcs[k], es)
				slcs[k] = es
				c.apply(tr.Consume(), false)
				if partial {
					if _, _, ok := c.changes(); !ok {
						b.Fatal("no changes")
					}
				} else {
					c.state()
				}
			}
		})
	}
}
