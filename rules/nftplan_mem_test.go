package rules

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/knftables"
)

// TestPlanRetainedHeapAt10k measures what a writer keeps for partial syncs
// after a full sync of 10,000 service ports of 10 endpoints each (the size of
// issue 14's benchmark), with the input still held as the caller holds it: the
// plan must keep inputs and element records, not the compiled rules (about 7 KiB
// a port before; see nftPlan).
func TestPlanRetainedHeapAt10k(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 10,000 service ports")
	}
	ctx := context.Background()
	const n = 10000
	st := memState(n)
	w, err := newNFTablesWith(NFTablesConfig{Table: "mem"}, knftables.NewFake(knftables.IPv4Family, "mem"))
	require.NoError(t, err)
	before := heap()
	tx, commit, stale, err := w.transaction(ctx, st, nil)
	require.NoError(t, err)
	require.NotEmpty(t, tx.ops)
	commit()
	w.stale = stale
	tx = nil
	retained := heap() - before
	runtime.KeepAlive(st)
	t.Logf("retained after a full sync of %d ports: %.1f MiB (%d bytes a port)", n, float64(retained)/(1<<20), retained/n)
	require.Less(t, retained, uint64(25<<20), "the plan keeps more than inputs and element records")

	// The plan still drives partial syncs: one changed endpoint is one chain
	// rewritten and one hairpin element replaced.
	st.Services[7].Endpoints[3].Port = 9090
	tx, _, _, err = w.transaction(ctx, st, &Changes{Set: []Service{st.Services[7]}})
	require.NoError(t, err)
	require.Contains(t, tx.render(w.nft).String(), "delete element ip mem hairpin-connections { 10.128.0.73 . 10.128.0.73 . tcp . 8080 }")
	require.Contains(t, tx.render(w.nft).String(), "add element ip mem hairpin-connections { 10.128.0.73 . 10.128.0.73 . tcp . 9090 }")
}

// memState is issue 14's benchmark state: n service ports of 10 endpoints each.
func memState(n int) *State {
	st := &State{Services: make([]Service, 0, n)}
	for i := range n {
		svc := Service{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i), PortName: "http",
			Protocol: TCP, ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80}
		for j := range 10 {
			k := i*10 + j
			svc.Endpoints = append(svc.Endpoints, Endpoint{IP: netip.AddrFrom4([4]byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
		st.Services = append(st.Services, svc)
	}
	return st
}

// heap is the live heap after a collection.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestFullSyncLiveHeapAt10k measures what is alive when the first full sync of
// issue 14's 10,000 ports is ready to send, besides its input: listed (the
// transaction's commands and the objects they point to, then the batch encoded
// from them, as the nft CLI applier and DryRun still work) and streamed (Sync
// through netlink: only the batch and the plan). This moment is the writer's
// high-water mark in a full sync: every other moment holds less of the batch.
func TestFullSyncLiveHeapAt10k(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 10,000 service ports")
	}
	ctx := context.Background()
	const n = 10000
	st := memState(n)
	newWriter := func() *NFTables {
		w, err := newNFTablesWith(NFTablesConfig{Table: "mem"}, knftables.NewFake(knftables.IPv4Family, "mem"))
		require.NoError(t, err)
		return w
	}
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }

	w := newWriter()
	before := heap()
	tx, commit, _, err := w.transaction(ctx, st, nil)
	require.NoError(t, err)
	b, _, err := newNetlinkApplier(IPv4, "mem").encode(tx)
	require.NoError(t, err)
	listed := heap() - before
	listedBatch := cap(b.buf)
	ops := len(tx.ops)
	runtime.KeepAlive(tx)
	runtime.KeepAlive(b)
	runtime.KeepAlive(commit) // the plan, as below
	tx, b, commit = nil, nil, nil

	w = newWriter()
	before = heap()
	streamed := &nftTx{stream: newNetlinkApplier(IPv4, "mem").newEncoder(0)}
	commit, _, err = w.transactionInto(ctx, st, nil, streamed)
	require.NoError(t, err)
	require.NoError(t, streamed.err)
	b, _ = streamed.stream.(*nlEncoder).finish()
	live := heap() - before
	runtime.KeepAlive(b)
	runtime.KeepAlive(commit)
	runtime.KeepAlive(st)
	t.Logf("full sync of %d ports (%d commands), live at the send: listed %.1f MiB (batch %.1f MiB), streamed %.1f MiB (batch %.1f MiB, used %.1f MiB)",
		n, ops, mib(listed), mib(uint64(listedBatch)), mib(live), mib(uint64(cap(b.buf))), mib(uint64(len(b.buf))))
	require.Equal(t, ops, streamed.n)
	// The plan (TestPlanRetainedHeapAt10k: under 25 MiB) and the batch, with a
	// little room; the list and the objects it points to are about 50 MiB more.
	require.Less(t, live-uint64(cap(b.buf)), uint64(30<<20), "a streamed full sync holds more than the batch and the plan")
	require.Less(t, live+(30<<20), listed, "streaming saves less than the transaction's list")
}
