// Package servicemap_test compares nodekit's servicemap.Tracker with kube-proxy's own
// change trackers (k8s.io/kubernetes/pkg/proxy ServiceChangeTracker +
// EndpointsChangeTracker) on the same objects, in the same run:
//
//	cd upstream/servicemap && go test -run '^$' -bench . -benchmem
//	NODEKIT_BENCH_SIZES=1000,10000,50000 go test -run TestCompare -v
//
// Memory is reported two ways (see result): "retained", what the tracker adds
// while an informer holds the objects, and "pinned", what stays alive once the
// caller drops them. kube-proxy's EndpointSliceCache keeps every EndpointSlice
// object (not the Services); nodekit keeps no API object.
package servicemap_test

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/kubernetes/pkg/proxy"

	"github.com/nodekit-dev/nodekit/servicemap"
)

const endpointsPerService = 10

func ptr[T any](v T) *T { return &v }

func addr4(base [2]byte, k int) string {
	return netip.AddrFrom4([4]byte{base[0], base[1] + byte(k>>16), byte(k >> 8), byte(k)}).String()
}

// world returns n ClusterIP Services with one port and one IPv4 EndpointSlice of
// endpointsPerService ready endpoints each, spread over 100 namespaces and 50 nodes.
func world(n int) ([]*v1.Service, []*discovery.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	slices := make([]*discovery.EndpointSlice, n)
	for i := 0; i < n; i++ {
		ns, name := names(i)
		ip := addr4([2]byte{10, 96}, i)
		svcs[i] = &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("s" + strconv.Itoa(i)), ResourceVersion: "1"},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip}, IPFamilies: []v1.IPFamily{v1.IPv4Protocol},
				SessionAffinity: v1.ServiceAffinityNone, InternalTrafficPolicy: ptr(v1.ServiceInternalTrafficPolicyCluster),
				Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			},
		}
		slices[i] = slice(ns, name, i, 0)
	}
	return svcs, slices
}

// names returns service i's namespace and name.
func names(i int) (ns, name string) {
	return "ns" + strconv.Itoa(i%100), "svc" + strconv.Itoa(i)
}

// slice builds service i's slice; version flips endpoint 0's readiness so that
// successive versions differ.
func slice(ns, svc string, i, version int) *discovery.EndpointSlice {
	es := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: svc + "-x7k2p", UID: types.UID("e" + strconv.Itoa(i)),
			ResourceVersion: strconv.Itoa(version + 1), Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Port: ptr[int32](8080), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for j := 0; j < endpointsPerService; j++ {
		ready := !(j == 0 && version%2 == 1)
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses:  []string{addr4([2]byte{100, 64}, i*endpointsPerService+j)},
			Conditions: discovery.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(false)},
			NodeName:   ptr("node-" + strconv.Itoa((i+j)%50)),
			Zone:       ptr("zone-" + strconv.Itoa(j%3)),
		})
	}
	return es
}

// impl is one tracker under test.
type impl interface {
	build(svcs []*v1.Service, slices []*discovery.EndpointSlice)
	// change feeds one slice update and returns once the change set (and, for
	// nodekit, the snapshot) is ready; it returns the number of changed services.
	change(es *discovery.EndpointSlice) int
}

type nodekitImpl struct{ t *servicemap.Tracker }

func (n *nodekitImpl) build(svcs []*v1.Service, slices []*discovery.EndpointSlice) {
	n.t = servicemap.NewTracker(servicemap.Config{})
	for _, s := range svcs {
		n.t.OnServiceAdd(s)
	}
	for _, es := range slices {
		n.t.OnEndpointSliceAdd(es)
	}
	u := n.t.Consume()
	if u.Snapshot.Len() != len(svcs) {
		panic(fmt.Sprintf("nodekit built %d ports, want %d", u.Snapshot.Len(), len(svcs)))
	}
}

func (n *nodekitImpl) change(es *discovery.EndpointSlice) int {
	n.t.OnEndpointSliceUpdate(nil, es)
	return len(n.t.Consume().ChangedServices)
}

type upstreamImpl struct {
	sct *proxy.ServiceChangeTracker
	ect *proxy.EndpointsChangeTracker
	spm proxy.ServicePortMap
	em  proxy.EndpointsMap
}

func (u *upstreamImpl) build(svcs []*v1.Service, slices []*discovery.EndpointSlice) {
	u.sct = proxy.NewServiceChangeTracker(v1.IPv4Protocol, nil, nil)
	u.ect = proxy.NewEndpointsChangeTracker(v1.IPv4Protocol, "node-1", nil, nil)
	u.spm = make(proxy.ServicePortMap)
	u.em = make(proxy.EndpointsMap)
	for _, s := range svcs {
		u.sct.Update(nil, s)
	}
	for _, es := range slices {
		u.ect.EndpointSliceUpdate(es, false)
	}
	u.spm.Update(u.sct)
	u.em.Update(u.ect)
	if len(u.spm) != len(svcs) || len(u.em) != len(svcs) {
		panic(fmt.Sprintf("upstream built %d ports / %d endpoint sets, want %d", len(u.spm), len(u.em), len(svcs)))
	}
}

func (u *upstreamImpl) change(es *discovery.EndpointSlice) int {
	u.ect.EndpointSliceUpdate(es, false)
	u.spm.Update(u.sct)
	return u.em.Update(u.ect).UpdatedServices.Len()
}

func newImpl(name string) impl {
	if name == "nodekit" {
		return &nodekitImpl{}
	}
	return &upstreamImpl{}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

type result struct {
	build time.Duration
	// retained is the heap the built tracker adds while the caller (an informer,
	// here the test) still holds the input objects: objects the tracker shares are
	// not counted, on either side. This is the cost in a real proxy.
	retained uint64
	// pinned is the heap still live once the caller has dropped the input
	// objects: the tracker's own state plus whatever input objects it keeps
	// (kube-proxy's EndpointSliceCache keeps every EndpointSlice).
	pinned uint64
	change time.Duration
}

// measureMemory builds one tracker of n services and returns its retained and
// pinned heap (see result).
func measureMemory(name string, n int) (im impl, retained, pinned uint64) {
	base := heapInUse()
	svcs, slices := world(n)
	im = newImpl(name)
	before := heapInUse()
	im.build(svcs, slices)
	retained = heapInUse() - before
	runtime.KeepAlive(svcs) // still held by the caller until here
	runtime.KeepAlive(slices)
	svcs, slices = nil, nil // now the caller lets go of its objects
	_, _ = svcs, slices
	pinned = heapInUse() - base
	return im, retained, pinned
}

// measure builds the tracker once (time, retained and pinned heap), then times
// `changes` single endpoint changes on services spread across the map.
func measure(name string, n, changes int) result {
	// Pre-build the change objects so their construction is neither timed nor counted.
	updates := make([]*discovery.EndpointSlice, changes)
	for c := range updates {
		i := (c * 7919) % n
		ns, svc := names(i)
		updates[c] = slice(ns, svc, i, 1)
	}
	var r result
	im, retained, pinned := measureMemory(name, n)
	r.retained, r.pinned = retained, pinned
	runtime.KeepAlive(im)
	im = nil
	svcs, slices := world(n)
	im = newImpl(name)
	runtime.GC()
	start := time.Now()
	im.build(svcs, slices)
	r.build = time.Since(start)
	start = time.Now()
	for _, es := range updates {
		if got := im.change(es); got != 1 {
			panic(fmt.Sprintf("%s: a change reported %d services", name, got))
		}
	}
	r.change = time.Since(start) / time.Duration(changes)
	runtime.KeepAlive(im)
	return r
}

// TestCompare prints a side-by-side table. NODEKIT_BENCH_SIZES (comma-separated service
// counts, e.g. 1000,10000,50000) picks the sizes; the default, 1000, keeps the test
// command quick.
func TestCompare(t *testing.T) {
	sizes := os.Getenv("NODEKIT_BENCH_SIZES")
	if sizes == "" {
		sizes = "1000"
	}
	var out strings.Builder
	fmt.Fprintf(&out, "\n%-8s %-9s %12s %14s %12s %16s\n", "services", "tracker", "build", "retained MiB", "pinned MiB", "one change")
	for _, f := range strings.Split(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			t.Fatalf("bad size %q", f)
		}
		for _, name := range []string{"upstream", "nodekit"} {
			r := measure(name, n, 200)
			fmt.Fprintf(&out, "%-8d %-9s %12s %14.1f %12.1f %16s\n", n, name, r.build.Round(time.Millisecond),
				float64(r.retained)/(1<<20), float64(r.pinned)/(1<<20), r.change.Round(100*time.Nanosecond))
		}
	}
	t.Log(out.String())
}

func BenchmarkInitialBuild(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		for _, name := range []string{"upstream", "nodekit"} {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				svcs, slices := world(n)
				b.ReportAllocs()
				for b.Loop() {
					im := newImpl(name)
					im.build(svcs, slices)
				}
				b.StopTimer()
				svcs, slices = nil, nil
				_, _ = svcs, slices
				_, retained, pinned := measureMemory(name, n)
				b.ReportMetric(float64(retained)/(1<<20), "retained-MiB")
				b.ReportMetric(float64(pinned)/(1<<20), "pinned-MiB")
			})
		}
	}
}

func BenchmarkOneChange(b *testing.B) {
	for _, n := range []int{1000, 10000, 50000} {
		for _, name := range []string{"upstream", "nodekit"} {
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				svcs, slices := world(n)
				im := newImpl(name)
				im.build(svcs, slices)
				updates := [2]*discovery.EndpointSlice{slice(svcs[n/2].Namespace, svcs[n/2].Name, n/2, 1), slice(svcs[n/2].Namespace, svcs[n/2].Name, n/2, 2)}
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					im.change(updates[i%2])
					i++
				}
			})
		}
	}
}
