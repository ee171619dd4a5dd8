package servicemap_test

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// event is one call into the tracker.
type event struct {
	svc    *v1.Service
	slice  *discovery.EndpointSlice
	delete bool
}

func apply(tr *servicemap.Tracker, e event) {
	switch {
	case e.svc != nil && e.delete:
		tr.OnServiceDelete(e.svc)
	case e.svc != nil:
		tr.OnServiceUpdate(nil, e.svc)
	case e.delete:
		tr.OnEndpointSliceDelete(e.slice)
	default:
		tr.OnEndpointSliceUpdate(nil, e.slice)
	}
}

// randomWorld makes services and slices with overlapping endpoints, duplicates,
// both families, mismatched ports and slices of unknown services.
func randomWorld(rng *rand.Rand) []event {
	var evs []event
	nsvc := 1 + rng.IntN(6)
	for s := 0; s < nsvc; s++ {
		name := fmt.Sprintf("svc%d", s)
		opts := []smt.ServiceOption{smt.ClusterIPs(fmt.Sprintf("10.96.0.%d", s+1), fmt.Sprintf("fd00::%d", s+1)),
			smt.Port("http", 80, v1.ProtocolTCP)}
		if rng.IntN(2) == 0 {
			opts = append(opts, smt.Port("dns", 53, v1.ProtocolUDP))
		}
		if rng.IntN(3) == 0 {
			opts = append(opts, smt.NodePort("http", int32(30000+s)), smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal))
		}
		if s != 0 || rng.IntN(2) == 0 { // sometimes svc0 never arrives: its slices are orphans
			evs = append(evs, event{svc: smt.Service("ns", name, opts...)})
		}
		nslices := rng.IntN(4)
		for i := 0; i < nslices; i++ {
			at := discovery.AddressTypeIPv4
			if rng.IntN(4) == 0 {
				at = discovery.AddressTypeIPv6
			}
			var eps []discovery.Endpoint
			for j := 0; j < rng.IntN(5); j++ {
				addr := fmt.Sprintf("10.0.%d.%d", s, rng.IntN(6)) // small range: duplicates across slices
				if at == discovery.AddressTypeIPv6 {
					addr = fmt.Sprintf("fd00::%d:%d", s, rng.IntN(6))
				}
				var epo []smt.EndpointOption
				switch rng.IntN(4) {
				case 0:
					epo = append(epo, smt.TerminatingServing())
				case 1:
					epo = append(epo, smt.Ready(false))
				}
				epo = append(epo, smt.OnNode(fmt.Sprintf("n%d", rng.IntN(3))))
				if rng.IntN(2) == 0 {
					epo = append(epo, smt.ZoneHints(fmt.Sprintf("z%d", rng.IntN(2))))
				}
				eps = append(eps, smt.Endpoint(addr, epo...))
			}
			proto := v1.ProtocolTCP
			if rng.IntN(5) == 0 {
				proto = v1.ProtocolUDP // mismatched on purpose
			}
			es := smt.EndpointSlice("ns", fmt.Sprintf("%s-%d", name, i), name, at,
				smt.SlicePort("http", int32(8080+rng.IntN(2)), proto), smt.SlicePort("dns", 5353, v1.ProtocolUDP), smt.Endpoints(eps...))
			evs = append(evs, event{slice: es})
		}
	}
	return evs
}

// TestAnyOrderSameMap feeds the same final objects in many orders, with noise that
// is later undone (earlier versions, deletions then re-adds) and Consume calls at
// random points, and requires the same final map every time.
func TestAnyOrderSameMap(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		world := randomWorld(rng)

		ref := servicemap.NewTracker(servicemap.Config{})
		for _, e := range world {
			apply(ref, e)
		}
		want := ref.Consume().Snapshot.Dump()

		for trial := 0; trial < 5; trial++ {
			tr := servicemap.NewTracker(servicemap.Config{})
			order := rng.Perm(len(world))
			for _, i := range order {
				e := world[i]
				// Noise: deliver a deletion first and re-add, or a stale version of
				// a slice with no endpoints, before the final object.
				switch rng.IntN(4) {
				case 0:
					apply(tr, event{svc: e.svc, slice: e.slice, delete: true})
				case 1:
					if e.slice != nil {
						stale := e.slice.DeepCopy()
						stale.Endpoints = nil
						apply(tr, event{slice: stale})
					}
				}
				if rng.IntN(3) == 0 {
					tr.Consume()
				}
				apply(tr, e)
			}
			got := tr.Consume().Snapshot.Dump()
			require.Equal(t, want, got, "seed %d trial %d: order %v", seed, trial, order)
		}
	}
}

// TestChangedSetIsExact checks that Changed lists exactly the ports whose dump
// differs between consecutive snapshots, across random event sequences.
func TestChangedSetIsExact(t *testing.T) {
	for seed := uint64(0); seed < 100; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		world := randomWorld(rng)
		tr := servicemap.NewTracker(servicemap.Config{})
		prev := map[servicemap.ServicePortName]string{}
		for step := 0; step < 40; step++ {
			e := world[rng.IntN(len(world))]
			if rng.IntN(4) == 0 {
				e.delete = true
			}
			apply(tr, e)
			if rng.IntN(2) == 0 {
				continue
			}
			u := tr.Consume()
			cur := map[servicemap.ServicePortName]string{}
			u.Snapshot.Range(func(sp *servicemap.ServicePort) bool { cur[sp.Name] = sp.Dump(); return true })
			var want []servicemap.ServicePortName
			for k, v := range cur {
				if prev[k] != v {
					want = append(want, k)
				}
			}
			for k := range prev {
				if _, ok := cur[k]; !ok {
					want = append(want, k)
				}
			}
			require.ElementsMatch(t, want, u.Changed, "seed %d step %d", seed, step)
			prev = cur
		}
	}
}
