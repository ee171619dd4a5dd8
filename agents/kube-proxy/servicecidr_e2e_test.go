package main

import (
	"context"
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// testUnallocatedClusterIPs (nftables): traffic to an address of a service CIDR
// that no Service holds is dropped, for the API server's default ServiceCIDR and
// for one created while the agent runs, until it is deleted. So that such traffic
// has somewhere to go when the rules let it through, pod 3 answers on one
// unallocated address of each range, and the node routes the second range to the
// bridge as it does the first.
func testUnallocatedClusterIPs(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	pod := c.env.Pods[3]
	const extraCIDR = "10.97.0.0/24"
	inDefault, inExtra := "10.96.200.77", "10.97.0.77"

	h := pod.Netlink()
	link, err := h.LinkByName("eth0")
	require.NoError(t, err)
	for _, ip := range []string{inDefault, inExtra} {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(ip).To4(), Mask: net.CIDRMask(32, 32)}}
		require.NoError(t, h.AddrAdd(link, a))
		defer func() { assert.NoError(t, h.AddrDel(link, a)) }()
	}
	nh := c.env.Node.Netlink()
	br, err := nh.LinkByName(netns.BridgeName)
	require.NoError(t, err)
	_, dst, err := net.ParseCIDR(extraCIDR)
	require.NoError(t, err)
	route := &netlink.Route{LinkIndex: br.Attrs().Index, Dst: dst}
	require.NoError(t, nh.RouteAdd(route))
	defer func() { assert.NoError(t, nh.RouteDel(route)) }()

	port := strconv.Itoa(pod.HTTPPort)
	dial := func(addr string) (time.Duration, error) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		t0 := time.Now()
		conn, err := c.env.Client.Dial(dctx, "tcp", net.JoinHostPort(addr, port))
		if conn != nil {
			conn.Close()
		}
		return time.Since(t0), err
	}
	reached := func(addr string) time.Duration {
		t.Helper()
		t0 := time.Now()
		require.Eventually(t, func() bool { _, err := dial(addr); return err == nil }, 60*time.Second, 50*time.Millisecond,
			"%s is never reached", addr)
		took := time.Since(t0)
		got := served(c.env.Client, net.JoinHostPort(addr, port), 3, 2*time.Second)
		assert.Equal(t, map[string]int{pod.Name: 3}, got, "%s answers", addr)
		return took
	}
	dropped := func(addr string) time.Duration {
		t.Helper()
		t0 := time.Now()
		require.Eventually(t, func() bool {
			_, err := dial(addr)
			return err != nil && !errors.Is(err, syscall.ECONNREFUSED)
		}, 60*time.Second, 50*time.Millisecond, "%s is never dropped", addr)
		took := time.Since(t0)
		d, err := dial(addr)
		require.Error(t, err, "%s connected", addr)
		assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "want dropped, got %v", err)
		assert.GreaterOrEqual(t, d, 900*time.Millisecond, "dropped, so no answer: %v after %v", err, d)
		return took
	}

	dropped(inDefault)
	reached(inExtra)
	assert.Contains(t, c.kernelRules(), `ip daddr 10.96.0.0/16 drop comment "Drop traffic to unallocated ClusterIPs"`)

	sc := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra-" + c.mode},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{extraCIDR}}}
	_, err = c.client.NetworkingV1().ServiceCIDRs().Create(ctx, sc, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Logf("%s: ServiceCIDR created (API write) to its unallocated address dropped: %v", c.mode, dropped(inExtra))
	dropped(inDefault)

	require.NoError(t, c.client.NetworkingV1().ServiceCIDRs().Delete(ctx, sc.Name, metav1.DeleteOptions{}))
	t.Logf("%s: ServiceCIDR deleted (API delete, finalizer removed by kube-controller-manager) to its address reached: %v", c.mode, reached(inExtra))
	dropped(inDefault)
}
