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
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
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
