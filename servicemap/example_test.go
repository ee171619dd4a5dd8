package servicemap_test

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// A Service with one ready pod on this node, one ready pod elsewhere, and one pod
// that is shutting down: the map, the Cluster and Local choices, and what the next
// Consume reports after the pod elsewhere loses readiness.
func Example() {
	tracker := servicemap.NewTracker(servicemap.Config{})
	tracker.OnServiceAdd(smt.Service("default", "web",
		smt.ClusterIPs("10.104.12.7"),
		smt.Port("http", 80, v1.ProtocolTCP),
		smt.NodePort("http", 30080),
		smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal)))
	slice := func(otherReady bool) *discovery.EndpointSlice {
		return smt.EndpointSlice("default", "web-8kx2p", "web", discovery.AddressTypeIPv4,
			smt.SlicePort("http", 8080, v1.ProtocolTCP),
			smt.Endpoints(
				smt.Endpoint("10.244.1.37", smt.Ready(true), smt.OnNode("worker-1")),
				smt.Endpoint("10.244.2.19", smt.Ready(otherReady), smt.Serving(otherReady), smt.OnNode("worker-2")),
				smt.Endpoint("10.244.2.20", smt.TerminatingServing(), smt.OnNode("worker-2"))))
	}
	tracker.OnEndpointSliceAdd(slice(true))

	update := tracker.Consume()
	fmt.Print(update.Snapshot.Dump())

	http := update.Changed[0]
	sp, _ := update.Snapshot.Get(http)
	sel := servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: "worker-1"})
	fmt.Println("cluster:", endpointList(sel.Cluster))
	fmt.Println("local:", endpointList(sel.Local))

	tracker.OnEndpointSliceUpdate(nil, slice(false))
	update = tracker.Consume()
	fmt.Println("changed:", update.Changed)
	sp, _ = update.Snapshot.Get(http)
	sel = servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: "worker-2"})
	fmt.Println("on worker-2, cluster:", endpointList(sel.Cluster), "local:", endpointList(sel.Local))
	// Output:
	// default/web:http TCP port=80 clusterIPs=10.104.12.7 nodePort=30080 externalPolicy=Local
	//   10.244.1.37:8080 ready=true node=worker-1
	//   10.244.2.19:8080 ready=true serving=true node=worker-2
	//   10.244.2.20:8080 ready=false serving=true terminating=true node=worker-2
	// cluster: [10.244.1.37:8080 10.244.2.19:8080]
	// local: [10.244.1.37:8080]
	// changed: [default/web:http]
	// on worker-2, cluster: [10.244.1.37:8080] local: [10.244.2.20:8080]
}

func endpointList(eps []servicemap.Endpoint) []string {
	out := make([]string, len(eps))
	for i := range eps {
		out[i] = eps[i].String()
	}
	return out
}
