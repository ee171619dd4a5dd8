package rules_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
	"github.com/nodekit-dev/nodekit/rules"
)

// unallocatedVIP is an address of the service CIDR no Service holds.
var unallocatedVIP = netip.MustParseAddr("10.96.0.77")

// TestNFTablesUnallocatedClusterIPs: real packets to an address of the service
// CIDR that no Service holds. So that such a packet has somewhere to go when the
// rules let it through, pod 1 also answers on that address. Without service CIDRs
// the client and a pod reach it; once SetServiceCIDRs gives the writer the CIDR, a
// partial sync with no service change drops their SYNs ("Drop traffic to
// unallocated ClusterIPs"), while the allocated ClusterIP keeps serving and its
// other ports are still rejected; with the CIDRs cleared the address is reachable
// again. Both appliers.
func TestNFTablesUnallocatedClusterIPs(t *testing.T) {
	for _, applier := range []rules.NFTablesApplier{rules.NFTablesNetlink, rules.NFTablesCLI} {
		t.Run(string(applier), func(t *testing.T) {
			e := newNFTEnv(t, 3, rules.NFTablesConfig{Table: "nodekit", Applier: applier})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			rogue := e.Pods[1]
			h := rogue.Netlink()
			link, err := h.LinkByName("eth0")
			require.NoError(t, err)
			require.NoError(t, h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: unallocatedVIP.AsSlice(), Mask: net.CIDRMask(32, 32)}}))

			st := &rules.State{Services: []rules.Service{
				{Namespace: "default", Name: "web", Protocol: rules.TCP, ClusterIP: webVIP, Port: 80, Endpoints: e.endpoints(0)},
			}}
			require.NoError(t, e.sync(ctx, st))
			partial := func() error {
				return e.Node.Do(func() error { return e.w.SyncChanges(ctx, &rules.Changes{}) })
			}
			unallocated := net.JoinHostPort(unallocatedVIP.String(), strconv.Itoa(rogue.HTTPPort))
			clients := []*netns.Namespace{e.Client, e.Pods[2].Namespace}
			reachable := func(t *testing.T) {
				t.Helper()
				for _, ns := range clients {
					assert.Equal(t, map[string]int{rogue.Name: 3}, count(ctx, t, ns, unallocated, 3), "from %s", ns.Name)
				}
			}
			allocatedServes := func(t *testing.T) {
				t.Helper()
				for _, ns := range clients {
					assert.Equal(t, map[string]int{e.Pods[0].Name: 3}, count(ctx, t, ns, net.JoinHostPort(webVIP.String(), "80"), 3))
					_, err := ns.Dial(ctx, "tcp", net.JoinHostPort(webVIP.String(), "81"))
					assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "a port the ClusterIP lacks is rejected, got %v", err)
				}
			}

			t.Run("no service CIDRs: the unallocated address is reached", func(t *testing.T) {
				reachable(t)
				allocatedServes(t)
			})
			t.Run("service CIDR set on the running writer: dropped after a partial sync", func(t *testing.T) {
				require.NoError(t, e.w.SetServiceCIDRs([]netip.Prefix{e.ServiceCIDR}))
				require.NoError(t, partial())
				for _, ns := range clients {
					requireDropped(ctx, t, ns, unallocated)
				}
				allocatedServes(t)
				var tr *rules.TraceResult
				require.NoError(t, e.Node.Do(func() (err error) {
					tr, err = e.w.Trace(ctx, rules.Packet{Src: e.ClientIP, Dst: unallocatedVIP, Protocol: rules.TCP, Port: 80})
					return err
				}))
				assert.Equal(t, "DROP", tr.Verdict, "%v", tr.Path)
				var drift []rules.Drift
				require.NoError(t, e.Node.Do(func() (err error) { drift, err = e.w.Drift(ctx, st); return err }))
				assert.Empty(t, drift)
			})
			t.Run("full sync keeps it", func(t *testing.T) {
				e.w.ForceFullSync()
				require.NoError(t, e.sync(ctx, st))
				requireDropped(ctx, t, e.Client, unallocated)
			})
			t.Run("service CIDRs cleared: reached again", func(t *testing.T) {
				require.NoError(t, e.w.SetServiceCIDRs(nil))
				require.NoError(t, partial())
				reachable(t)
				allocatedServes(t)
			})
		})
	}
}
