package main

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/kube-proxy/config/v1alpha1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/rules"
	"github.com/nodekit-dev/nodekit/rules/rulestest"
	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// TestDualStackLoop: one loop drives a writer per family (upstream's MetaProxier):
// each gets exactly its family's part of a dual-stack Service and of single-stack
// ones, and a failure of one family makes only that family's next sync full.
func TestDualStackLoop(t *testing.T) {
	registerMetrics()
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC))
	client := fake.NewClientset()
	// The fake clientset has no resourceVersions: a change made before the
	// Watcher's watch is registered never reaches it (a real API server replays it
	// from the list's resourceVersion). Note when the Services watch is registered;
	// the test deletes a Service only after that.
	servicesWatched := make(chan struct{})
	var watchedOnce sync.Once
	client.PrependWatchReactor("services", func(a k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := a.(k8stesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
		watchedOnce.Do(func() { close(servicesWatched) })
		return true, w, err
	})
	done := make(chan error, 20)
	v4 := &notifyingSyncer{Fake: &rulestest.Fake{Family: rules.IPv4}, done: done}
	v6 := &notifyingSyncer{Fake: &rulestest.Fake{Family: rules.IPv6}, done: done}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	health := newHealthServer(clk, 60*time.Second, func() *corev1.Node { return node })
	px := newProxier(proxierConfig{
		Tracker:  servicemap.NewTracker(servicemap.Config{Metrics: trackerMetrics{}}),
		Families: []familySyncer{{Family: corev1.IPv4Protocol, Syncer: v4}, {Family: corev1.IPv6Protocol, Syncer: v6}},
		Clock:    clk, MinSyncPeriod: time.Second, SyncPeriod: 30 * time.Second,
		Node: servicemap.Node{Name: "n1"}, Health: health,
	})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background()))
	create := func(objs ...any) {
		for _, o := range objs {
			var err error
			switch o := o.(type) {
			case *corev1.Service:
				_, err = client.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			case *discoveryv1.EndpointSlice:
				_, err = client.DiscoveryV1().EndpointSlices(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			}
			require.NoError(t, err)
		}
	}
	dual := smt.Service("default", "dual", smt.ClusterIPs("10.96.0.10", "fd00:10:96::10"), smt.Port("http", 80, corev1.ProtocolTCP),
		smt.Type(corev1.ServiceTypeNodePort), smt.NodePort("http", 30080))
	only6 := smt.Service("default", "only6", smt.ClusterIPs("fd00:10:96::20"), smt.Port("", 53, corev1.ProtocolUDP))
	create(dual, only6,
		smt.EndpointSlice("default", "dual-v4", "dual", discoveryv1.AddressTypeIPv4, smt.SlicePort("http", 8080, corev1.ProtocolTCP),
			smt.Endpoints(smt.Endpoint("10.244.1.10"), smt.Endpoint("10.244.1.11"))),
		smt.EndpointSlice("default", "dual-v6", "dual", discoveryv1.AddressTypeIPv6, smt.SlicePort("http", 8080, corev1.ProtocolTCP),
			smt.Endpoints(smt.Endpoint("fd00:10:244:1::10"))))
	w, err := servicemap.NewWatcher(servicemap.WatcherConfig{Client: client, Handler: px})
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	go func() { defer wg.Done(); _ = px.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
	<-w.Synced()
	select {
	case <-servicesWatched:
	case <-time.After(10 * time.Second):
		t.Fatal("the Watcher never watched Services")
	}
	px.OnSynced()
	wait := func() error {
		t.Helper()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no sync happened")
			return nil
		}
	}
	require.NoError(t, wait())
	require.NoError(t, wait())
	// The loop waits out MinSyncPeriod (two timers on the fake clock).
	waitMin := func() {
		t.Helper()
		require.Eventually(t, func() bool { return clk.Waiters() == 2 }, 5*time.Second, time.Millisecond)
	}

	st4, st6 := v4.Last(), v6.Last()
	require.Len(t, st4.Services, 1, "the IPv6-only service is not the IPv4 writer's")
	assert.Equal(t, netip.MustParseAddr("10.96.0.10"), st4.Services[0].ClusterIP)
	assert.Equal(t, []rules.Endpoint{{IP: netip.MustParseAddr("10.244.1.10"), Port: 8080}, {IP: netip.MustParseAddr("10.244.1.11"), Port: 8080}},
		st4.Services[0].Endpoints)
	require.Len(t, st6.Services, 2)
	assert.Equal(t, netip.MustParseAddr("fd00:10:96::10"), st6.Services[0].ClusterIP)
	assert.Equal(t, 30080, st6.Services[0].NodePort, "the node port serves both families")
	assert.Equal(t, []rules.Endpoint{{IP: netip.MustParseAddr("fd00:10:244:1::10"), Port: 8080}}, st6.Services[0].Endpoints)
	assert.Equal(t, "only6", st6.Services[1].Name)
	assert.True(t, health.health().Healthy)
	assert.Len(t, health.health().Status, 2, "healthz reports both families")

	// The IPv6 write fails: the IPv4 one still lands; only IPv6 is full next.
	v6.FailNext(rules.ErrApplyFailed)
	full4, full6 := v4.FullSyncs, v6.FullSyncs
	waitMin()
	require.NoError(t, client.CoreV1().Services("default").Delete(ctx, "only6", metav1.DeleteOptions{}))
	clk.Step(time.Second)
	require.NoError(t, wait())
	require.True(t, errors.Is(wait(), rules.ErrApplyFailed))
	waitMin()
	clk.Step(time.Second)
	clk.Step(29 * time.Second) // the retry after a failure
	require.NoError(t, wait())
	require.NoError(t, wait())
	assert.Equal(t, full4, v4.FullSyncs, "IPv4 stays partial")
	assert.Equal(t, full6+1, v6.FullSyncs, "IPv6 rewrites everything after its failure")
	assert.Len(t, v6.Last().Services, 1)
}

// TestFamilySelection: the primary family and each family's node IP, cluster CIDR
// and NodePort addresses, as upstream picks them.
func TestFamilySelection(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "fd00::5"}, {Type: corev1.NodeInternalIP, Address: "192.0.2.5"}}}}
	cfg := &v1alpha1.KubeProxyConfiguration{ClusterCIDR: "10.244.0.0/16,fd00:10:244::/56"}
	assert.Equal(t, corev1.IPv6Protocol, primaryFamily(cfg, node), "the Node's first address")
	assert.Equal(t, corev1.IPv4Protocol, primaryFamily(cfg, nil))
	cfg.BindAddress = "192.0.2.5"
	assert.Equal(t, corev1.IPv4Protocol, primaryFamily(cfg, node), "a specific bindAddress wins")
	cfg.BindAddress = "0.0.0.0"
	assert.Equal(t, netip.MustParseAddr("192.0.2.5"), nodeIPFor(cfg, node, corev1.IPv4Protocol))
	assert.Equal(t, netip.MustParseAddr("fd00::5"), nodeIPFor(cfg, node, corev1.IPv6Protocol))
	assert.Equal(t, "fd00:10:244::/56", clusterCIDRFor(cfg, corev1.IPv6Protocol).String())
	assert.Equal(t, "10.244.0.0/16", clusterCIDRFor(cfg, corev1.IPv4Protocol).String())

	logger := klog.Background()
	cfg.NodePortAddresses = []string{"primary"}
	addrs, err := nodePortAddresses(logger, cfg, node, corev1.IPv6Protocol)
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.MustParseAddr("fd00::5")}, addrs)
	cfg.NodePortAddresses = []string{"192.0.2.0/24"}
	addrs, err = nodePortAddresses(logger, cfg, node, corev1.IPv6Protocol)
	require.NoError(t, err)
	assert.Nil(t, addrs, "no entry of the family: every address of it, as upstream")
	cfg.NodePortAddresses = []string{"2001:db8:ffff::/48"}
	addrs, err = nodePortAddresses(logger, cfg, node, corev1.IPv6Protocol)
	require.NoError(t, err)
	assert.Equal(t, []netip.Addr{netip.IPv6Unspecified()}, addrs, "entries of the family matching nothing: NodePorts closed")
}
