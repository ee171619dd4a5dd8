package servicemap_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

func TestNewWatcherValidates(t *testing.T) {
	_, err := servicemap.NewWatcher(servicemap.WatcherConfig{Handler: servicemap.NewTracker(servicemap.Config{})})
	assert.ErrorIs(t, err, servicemap.ErrInvalidConfig)
	_, err = servicemap.NewWatcher(servicemap.WatcherConfig{Client: &kubernetes.Clientset{}})
	assert.ErrorIs(t, err, servicemap.ErrInvalidConfig)
	_, err = servicemap.NewWatcher(servicemap.WatcherConfig{Client: &kubernetes.Clientset{}, Handler: &smt.Recorder{}, ResyncPeriod: -time.Second})
	assert.ErrorIs(t, err, servicemap.ErrInvalidConfig)
}

func TestSelectorsMatchKubeProxy(t *testing.T) {
	assert.Equal(t, "!service.kubernetes.io/service-proxy-name", servicemap.ServiceLabelSelector)
	assert.Equal(t, "spec.clusterIP!=None", servicemap.ServiceFieldSelector)
	assert.Equal(t, "!service.kubernetes.io/headless", servicemap.EndpointSliceLabelSelector)
}

// TestWatcherFeedsTracker runs the watcher against a fake clientset: the initial
// list arrives before Synced, later changes follow, labelled objects are filtered
// out by the list selector, and Run returns with every goroutine gone (goleak).
func TestWatcherFeedsTracker(t *testing.T) {
	web := smt.Service("ns", "web", smt.ClusterIPs("10.96.0.10"), smt.Port("http", 80, v1.ProtocolTCP))
	owned := smt.Service("ns", "owned", smt.ClusterIPs("10.96.0.11"), smt.Port("http", 80, v1.ProtocolTCP),
		smt.ServiceLabels(servicemap.LabelServiceProxyName, "someone-else"))
	es := smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
		smt.Endpoints(smt.Endpoint("10.0.0.1")))
	headlessES := smt.EndpointSlice("ns", "owned-a", "owned", discovery.AddressTypeIPv4, smt.SliceLabels(servicemap.LabelHeadless, ""),
		smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.0.0.2")))
	client := fake.NewClientset(web, owned, es, headlessES)

	tracker := servicemap.NewTracker(servicemap.Config{})
	rec := &smt.Recorder{Next: tracker}
	w, err := servicemap.NewWatcher(servicemap.WatcherConfig{Client: client, Handler: rec})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()

	select {
	case <-w.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher did not sync")
	}
	assert.ElementsMatch(t, []string{"ServiceAdd ns/web", "EndpointSliceAdd ns/web-a"}, rec.Calls(),
		"the list selectors leave out the proxy-name Service and the headless slice")
	assert.Equal(t, "ns/web:http TCP port=80 clusterIPs=10.96.0.10\n  10.0.0.1:8080\n", tracker.Consume().Snapshot.Dump())

	es2 := es.DeepCopy()
	es2.Endpoints[0].Conditions.Ready = smt.Ptr(false)
	_, err = client.DiscoveryV1().EndpointSlices("ns").Update(ctx, es2, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		select {
		case <-tracker.Pending():
		case <-time.After(100 * time.Millisecond):
		}
		u := tracker.Consume()
		return len(u.Changed) == 1 && u.Snapshot.Dump() == "ns/web:http TCP port=80 clusterIPs=10.96.0.10\n  10.0.0.1:8080 ready=false\n"
	}, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, client.CoreV1().Services("ns").Delete(ctx, "web", metav1.DeleteOptions{}))
	require.Eventually(t, func() bool { return tracker.Consume().Snapshot.Len() == 0 }, 10*time.Second, 10*time.Millisecond)

	assert.True(t, errors.Is(w.Run(ctx), servicemap.ErrAlreadyStarted))
}
