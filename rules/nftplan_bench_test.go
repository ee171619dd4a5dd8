package rules

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/knftables"
)

func planBenchState(n int) *State {
	st := &State{Services: make([]Service, 0, n)}
	for i := range n {
		svc := Service{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i), PortName: "http",
			Protocol: TCP, ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80}
		for j := range 2 + i%9 {
			k := i*10 + j
			svc.Endpoints = append(svc.Endpoints, Endpoint{IP: netip.AddrFrom4([4]byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
		st.Services = append(st.Services, svc)
	}
	return st
}

// BenchmarkPartialPlanAt10k plans a partial sync of one changed port among
// 10,000: from the whole state (Sync) or from the change alone (SyncChanges).
func BenchmarkPartialPlanAt10k(b *testing.B) {
	b.Run("state", func(b *testing.B) { benchPartialPlan(b, false) })
	b.Run("changes", func(b *testing.B) { benchPartialPlan(b, true) })
}

func benchPartialPlan(b *testing.B, changes bool) {
	ctx := context.Background()
	st := planBenchState(10000)
	w, err := newNFTablesWith(NFTablesConfig{Table: "bench"}, knftables.NewFake(knftables.IPv4Family, "bench"))
	if err != nil {
		b.Fatal(err)
	}
	_, commit, stale, err := w.transaction(ctx, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	commit()
	w.stale = stale
	i := 0
	for b.Loop() {
		i++
		s := &st.Services[i%len(st.Services)]
		s.Endpoints[0].Port = 9000 + i%1000
		var ch *Changes
		if changes {
			ch = &Changes{Set: []Service{*s}}
		}
		tx, commit, stale, err := w.transaction(ctx, st, ch)
		if err != nil {
			b.Fatal(err)
		}
		if len(tx.ops) == 0 {
			b.Fatal("no ops")
		}
		commit()
		w.stale = stale
	}
}

// BenchmarkFullEncodeAt5k is the user-space half of a first full sync at 5,000
// service ports: compile, build the transaction, encode the netlink batch.
func BenchmarkFullEncodeAt5k(b *testing.B) {
	ctx := context.Background()
	st := planBenchState(5000)
	for b.Loop() {
		w, err := newNFTablesWith(NFTablesConfig{Table: "bench"}, knftables.NewFake(knftables.IPv4Family, "bench"))
		if err != nil {
			b.Fatal(err)
		}
		tx, _, _, err := w.transaction(ctx, st, nil)
		if err != nil {
			b.Fatal(err)
		}
		nb, _, err := newNetlinkApplier(IPv4, "bench").encode(tx)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(len(nb.buf))/float64(len(tx.ops)), "batch-bytes/op")
	}
}
