package rules

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/knftables"
)

// TestNFTablesSetServiceCIDRs: a running writer takes new service CIDRs; the next
// sync, even a partial one with no service change, rewrites cluster-ips-check and
// nothing else, and the result equals a fresh full sync with those CIDRs.
func TestNFTablesSetServiceCIDRs(t *testing.T) {
	ctx := context.Background()
	cfg := sampleConfig()
	cfg.ServiceCIDRs = nil
	fake := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	w, err := newNFTablesWith(cfg, fake)
	require.NoError(t, err)
	st := sampleState()
	require.NoError(t, w.Sync(ctx, st))
	assert.NotContains(t, fake.Dump(), "unallocated")

	cidrs := []netip.Prefix{netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("10.96.1.2/12"), netip.MustParsePrefix("172.30.0.0/16")}
	require.NoError(t, w.SetServiceCIDRs(cidrs))
	out, err := w.DryRun(ctx, st)
	require.NoError(t, err)
	assert.Equal(t, `flush chain ip kube-proxy cluster-ips-check
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 10.96.0.0/12 } drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr { 172.30.0.0/16 } drop comment "Drop traffic to unallocated ClusterIPs"
`, out, "only the chain is rewritten, the CIDRs masked, sorted and without duplicates")
	require.NoError(t, w.SyncChanges(ctx, &Changes{}))

	want := knftables.NewFake(knftables.IPv4Family, "kube-proxy")
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("172.30.0.0/16")}
	fresh, err := newNFTablesWith(cfg, want)
	require.NoError(t, err)
	require.NoError(t, fresh.Sync(ctx, st))
	assert.Equal(t, want.Dump(), fake.Dump())

	out, err = w.DryRun(ctx, st)
	require.NoError(t, err)
	assert.Empty(t, out, "applied: nothing left to write")
	require.NoError(t, w.SetServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("172.30.0.0/16"), netip.MustParsePrefix("10.96.0.0/12")}))
	out, err = w.DryRun(ctx, st)
	require.NoError(t, err)
	assert.Empty(t, out, "the same CIDRs in another order change nothing")

	require.NoError(t, w.SetServiceCIDRs(nil))
	require.NoError(t, w.Sync(ctx, st))
	assert.NotContains(t, fake.Dump(), "unallocated", "no CIDRs: no drop rule")
	assert.Equal(t, 1, strings.Count(fake.Dump(), "add rule ip kube-proxy cluster-ips-check "))

	err = w.SetServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("fd00::/108")})
	assert.True(t, errors.Is(err, ErrInvalidConfig), "an IPv6 CIDR for the IPv4 writer: %v", err)
	assert.ErrorContains(t, err, "fd00::/108")
}
