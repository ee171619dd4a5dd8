package rules_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

// benchState builds n services, each with 2 to 10 endpoints.
func benchState(n int) *rules.State {
	st := &rules.State{Services: make([]rules.Service, 0, n)}
	for i := range n {
		svc := rules.Service{Namespace: fmt.Sprintf("ns%d", i%50), Name: fmt.Sprintf("svc%d", i), PortName: "http",
			Protocol: rules.TCP, ClusterIP: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80}
		for j := range 2 + i%9 {
			k := i*10 + j
			svc.Endpoints = append(svc.Endpoints, rules.Endpoint{IP: netip.AddrFrom4([4]byte{10, 128 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
		st.Services = append(st.Services, svc)
	}
	return st
}

// BenchmarkNFTables measures, in a throw-away node namespace: the first full sync
// into an empty table, a one-service partial sync on top of it, and loading the
// identical full payload with `nft -f` directly (the floor set by nft and the kernel).
func BenchmarkNFTables(b *testing.B) {
	testenv.RequireRoot(b)
	testenv.LookPath(b, "nft")
	for _, n := range []int{1000, 5000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			env := netns.New(b, netns.Config{Pods: 1})
			ctx := context.Background()
			st := benchState(n)
			cfg := rules.NFTablesConfig{Table: "bench"}
			payload, err := rules.RenderNFTables(cfg, st)
			require.NoError(b, err)
			dropTable := func() {
				_, _ = env.NodeRun(ctx, "", "nft", "delete", "table", "ip", "bench")
			}
			var w *rules.NFTables
			b.Run("first-full-sync", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					dropTable()
					require.NoError(b, env.Node.Do(func() error {
						w, err = rules.NewNFTables(cfg)
						return err
					}))
					b.StartTimer()
					require.NoError(b, env.Node.Do(func() error { return w.Sync(ctx, st) }))
				}
			})
			b.Run("partial-sync-one-service", func(b *testing.B) {
				i := 0
				for b.Loop() {
					i++
					// Every iteration changes one service port (8080 <-> 8081).
					svc := &st.Services[i%len(st.Services)]
					svc.Endpoints[0].Port ^= 1
					require.NoError(b, env.Node.Do(func() error { return w.Sync(ctx, st) }))
				}
			})
			b.Run("nft-f-same-payload", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					dropTable()
					b.StartTimer()
					_, err := env.NodeRun(ctx, payload, "nft", "-f", "-")
					require.NoError(b, err)
				}
			})
		})
	}
}

// BenchmarkIPTables is the same for the iptables writer in both modes, against
// iptables-restore of the identical payload.
func BenchmarkIPTables(b *testing.B) {
	testenv.RequireRoot(b)
	for _, mode := range []rules.IPTablesMode{rules.IPTablesNFT, rules.IPTablesLegacy} {
		for _, n := range []int{1000, 2000, 5000} {
			b.Run(fmt.Sprintf("%s/services=%d", mode, n), func(b *testing.B) {
				restore := "iptables-restore"
				if mode == rules.IPTablesLegacy {
					restore = "iptables-legacy-restore"
				}
				testenv.LookPath(b, restore)
				ctx := context.Background()
				st := benchState(n)
				cfg := rules.IPTablesConfig{Mode: mode}
				payload, err := rules.RenderIPTables(cfg, st)
				require.NoError(b, err)
				b.Run("first-full-sync", func(b *testing.B) {
					for b.Loop() {
						b.StopTimer()
						env := netns.New(b, netns.Config{Pods: 1})
						var w *rules.IPTables
						require.NoError(b, env.Node.Do(func() error {
							w, err = rules.NewIPTables(ctx, cfg)
							return err
						}))
						b.StartTimer()
						require.NoError(b, env.Node.Do(func() error { return w.Sync(ctx, st) }))
					}
				})
				b.Run("partial-sync-one-service", func(b *testing.B) {
					env := netns.New(b, netns.Config{Pods: 1})
					var w *rules.IPTables
					require.NoError(b, env.Node.Do(func() error {
						w, err = rules.NewIPTables(ctx, cfg)
						if err != nil {
							return err
						}
						return w.Sync(ctx, st)
					}))
					i := 0
					for b.Loop() {
						i++
						st.Services[i%len(st.Services)].Endpoints[0].Port = 8080 + i%2
						require.NoError(b, env.Node.Do(func() error { return w.Sync(ctx, st) }))
					}
				})
				// A restarted writer (or one after a failed apply) rewrites every
				// chain over its own previous chains: the iptables-nft restore then
				// reads the whole table back.
				b.Run("full-resync-over-own-chains", func(b *testing.B) {
					env := netns.New(b, netns.Config{Pods: 1})
					var w *rules.IPTables
					require.NoError(b, env.Node.Do(func() error {
						w, err = rules.NewIPTables(ctx, cfg)
						if err != nil {
							return err
						}
						return w.Sync(ctx, st)
					}))
					for b.Loop() {
						w.ForceFullSync()
						require.NoError(b, env.Node.Do(func() error { return w.Sync(ctx, st) }))
					}
				})
				b.Run("restore-same-payload", func(b *testing.B) {
					for b.Loop() {
						b.StopTimer()
						env := netns.New(b, netns.Config{Pods: 1})
						b.StartTimer()
						_, err := env.NodeRun(ctx, payload, restore, "-w", "--noflush")
						require.NoError(b, err)
					}
				})
			})
		}
	}
}
