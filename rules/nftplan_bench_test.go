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
// service ports: compile, plan, encode the netlink batch; listed (the whole
// transaction first, as the nft CLI applier and DryRun do) or streamed (as Sync
// through netlink does).
func BenchmarkFullEncodeAt5k(b *testing.B) {
	b.Run("listed", func(b *testing.B) { benchFullEncode(b, false) })
	b.Run("streamed", func(b *testing.B) { benchFullEncode(b, true) })
}

func benchFullEncode(b *testing.B, stream bool) {
	ctx := context.Background()
	st := planBenchState(5000)
	for b.Loop() {
		w, err := newNFTablesWith(NFTablesConfig{Table: "bench"}, knftables.NewFake(knftables.IPv4Family, "bench"))
		if err != nil {
			b.Fatal(err)
		}
		a := newNetlinkApplier(IPv4, "bench")
		var nb *nlBatch
		var ops int
		if stream {
			tx := &nftTx{stream: a.newEncoder(0)}
			if _, _, err := w.transactionInto(ctx, st, nil, tx); err != nil || tx.err != nil {
				b.Fatal(err, tx.err)
			}
			nb, _ = tx.stream.(*nlEncoder).finish()
			ops = tx.n
		} else {
			tx, _, _, err := w.transaction(ctx, st, nil)
			if err != nil {
				b.Fatal(err)
			}
			if nb, _, err = a.encode(tx); err != nil {
				b.Fatal(err)
			}
			ops = len(tx.ops)
		}
		b.ReportMetric(float64(len(nb.buf))/float64(ops), "batch-bytes/op")
	}
}
