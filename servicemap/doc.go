// Package servicemap answers the question a service proxy asks for every service
// port: which endpoints should traffic go to right now? It turns Services and
// EndpointSlices into service ports with their endpoints, chooses endpoints with
// kube-proxy's rules, and tracks what changed so a proxy re-programs only that.
//
// # What it does
//
// A Tracker is fed Service and EndpointSlice events through plain method calls
// (OnServiceAdd, OnEndpointSliceUpdate, ...), so any event source works; Watcher
// feeds it from the API server with kube-proxy's list filters. Consume returns the
// service ports changed since the previous Consume and an immutable Snapshot of the
// whole map. For each ServicePort the snapshot holds its cluster IPs (both families),
// protocol and port, NodePort, external IPs, load-balancer VIPs and source ranges,
// session affinity, traffic policies and healthCheckNodePort, plus the endpoints of
// all the Service's EndpointSlices merged and deduplicated. Select picks the
// endpoints a proxy programs on one node for one IP family.
//
// # Semantics matched upstream
//
// The conversions and Select follow kube-proxy v1.37 (pkg/proxy: serviceport.go,
// servicechangetracker.go, endpointslicecache.go, endpointschangetracker.go,
// topology.go; cmd/kube-proxy/app for the informer filters):
//
//   - Services with clusterIP None or empty, ExternalName Services and Services
//     labelled service.kubernetes.io/service-proxy-name are not proxied. EndpointSlices
//     labelled service.kubernetes.io/headless are ignored.
//   - ServicePortName is namespace/name:port-name plus protocol; an EndpointSlice port
//     joins the Service port with the same name and protocol.
//   - An endpoint condition that is unset means the API default: ready and serving
//     true, terminating false. Endpoints keep the raw value (Cond) and apply the
//     default in IsReady, IsServing and IsTerminating.
//   - An endpoint listed twice (in one slice or across slices, as when it moves) is
//     kept once, preferring a copy that is not terminating.
//   - ClientIP session affinity without a timeout means 10800 seconds. A zero-length
//     source range in a family means "allow all" for that family. Load-balancer
//     ingresses in Proxy ipMode are not VIPs.
//   - Select: Cluster policy uses Ready endpoints, narrowed by topology hints only when
//     every Ready endpoint carries a hint of that kind and one names this node (node
//     hints) or zone (zone hints); with no Ready endpoint it falls back to endpoints
//     that are Serving and Terminating. Local policy uses this node's Ready endpoints,
//     else its Serving and Terminating ones. The node's name and its
//     topology.kubernetes.io/zone label are the inputs.
//
// kube-proxy runs one proxier per IP family, each seeing only its family's cluster
// IP, addresses and EndpointSlices. The tracker keeps both families in one map;
// ServicePort.ForFamily and Select(sp, family, node) give the per-family view.
//
// Deliberate differences, all for bad input the API server would not produce: an
// unset protocol means TCP (kube-proxy would dereference nil); endpoints whose first
// address is not an IP or does not match the slice's addressType are skipped with a
// log line; duplicate endpoints are resolved by slice name order rather than map
// order, so the result never depends on the order events arrived in; endpoint lists
// are sorted by address numerically (kube-proxy sorts the "ip:port" text).
//
// # Bad input
//
// Nothing panics. An object that cannot be used at all (an EndpointSlice without the
// kubernetes.io/service-name label or without a name) is logged with ErrInvalidObject
// and counted in Metrics.InvalidObject; parts that cannot be used (a port without a
// name or number, a port whose name or protocol matches no Service port, an endpoint
// without a valid address, an invalid external IP or source range) are skipped with a
// log line naming the object. Slices that arrive before their Service are held and
// used once it arrives. Every other service is unaffected.
//
// # Change tracking and cost
//
// An event converts its object at once into the few fields a proxy needs and marks
// its service dirty (Pending fires); the Tracker keeps no API object. Consume
// rebuilds the dirty services from their converted Service and slices, compares
// them with the previous state and reports the ports that differ. The map is a
// persistent hash trie: a changed service costs O(size of that service + log32 of
// the number of services), and a Snapshot is a pointer to a trie root that later
// changes never touch, so any number of goroutines can read it without locks while
// the Tracker moves on.
//
// Memory is shared wherever nothing changed: a port fed by a single one-port slice
// uses that slice's endpoint list as is, a service's converted ports are the
// snapshot's ports, an unchanged service keeps its very ports from one snapshot to
// the next, and endpoints in the same place share one Topology (node, zone, hints).
//
// # Concurrency and cancellation
//
// Tracker methods are safe for concurrent use. Snapshot and everything it returns
// are immutable and must not be modified. Watcher.Run blocks until its context ends,
// then stops its reflectors and waits for them; Synced is closed once the initial
// lists reached the Handler. The Watcher keeps no copy of the objects (see
// Watcher): the Handler's own form is the only one.
//
// # Requirements
//
// Pure Go; no root or kernel access. Watcher needs list and watch on services and
// discovery.k8s.io endpointslices.
package servicemap
