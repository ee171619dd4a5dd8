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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// lbSourceRangesIP is the load-balancer ingress IP the test writes into the
// Service's status. It is inside the node namespace's routed service range, so
// a packet the rules leave undNATed is forwarded and meets the firewall.
const lbSourceRangesIP = "10.96.250.250"

// testLoadBalancerSourceRanges: a LoadBalancer Service with
// spec.loadBalancerSourceRanges, through the agent. The external client
// (192.0.2.2) is inside the first range and reaches the load-balancer IP; a pod
// (outside) has its SYNs dropped. Changing the ranges to the pods' CIDR swaps
// them. The cluster IP and the node port stay open to both, as in kube-proxy.
func testLoadBalancerSourceRanges(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	pods := c.env.Pods
	svc := c.service("lbsr", "web", corev1.ServiceTypeLoadBalancer, corev1.ProtocolTCP, 8083)
	svc.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
	svc, err := c.client.CoreV1().Services(c.ns).Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbSourceRangesIP}}
	svc, err = c.client.CoreV1().Services(c.ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, c.client.CoreV1().Services(c.ns).Delete(ctx, "lbsr", metav1.DeleteOptions{}))
	}()

	lb := net.JoinHostPort(lbSourceRangesIP, "8083")
	vip := net.JoinHostPort(svc.Spec.ClusterIP, "8083")
	nodePort := net.JoinHostPort(c.env.NodeIP.String(), strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	client, pod := c.env.Client, pods[3].Namespace
	dial := func(ns *netns.Namespace) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		t0 := time.Now()
		conn, err := ns.Dial(ctx, "tcp", lb)
		if conn != nil {
			conn.Close()
		}
		return time.Since(t0), err
	}
	admitted := func(ns *netns.Namespace) {
		t.Helper()
		require.Eventually(t, func() bool {
			_, err := dial(ns)
			return err == nil
		}, 30*time.Second, 50*time.Millisecond, "%s never reached the load-balancer IP", ns.Name)
		got := served(ns, lb, 10, 2*time.Second)
		assert.Zero(t, got[""], "%s to the load-balancer IP: %v", ns.Name, got)
	}
	dropped := func(ns *netns.Namespace) {
		t.Helper()
		require.Eventually(t, func() bool {
			_, err := dial(ns)
			return err != nil && !errors.Is(err, syscall.ECONNREFUSED)
		}, 30*time.Second, 50*time.Millisecond, "%s is never dropped", ns.Name)
		for range 2 {
			took, err := dial(ns)
			require.Error(t, err, "%s outside the source ranges connected", ns.Name)
			assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "want dropped, got %v", err)
			assert.GreaterOrEqual(t, took, 900*time.Millisecond, "dropped, so no answer: %v after %v", err, took)
		}
	}
	unrestricted := func() {
		t.Helper()
		for _, ns := range []*netns.Namespace{client, pod} {
			for _, addr := range []string{vip, nodePort} {
				got := served(ns, addr, 6, 2*time.Second)
				assert.Zero(t, got[""], "%s to %s is not subject to the source ranges: %v", ns.Name, addr, got)
			}
		}
	}

	t0 := time.Now()
	admitted(client)
	t.Logf("%s: LoadBalancer Service with source ranges (API write) to traffic admitted: %v", c.mode, time.Since(t0))
	dropped(pod)
	unrestricted()

	svc, err = c.client.CoreV1().Services(c.ns).Get(ctx, "lbsr", metav1.GetOptions{})
	require.NoError(t, err)
	svc.Spec.LoadBalancerSourceRanges = []string{" 10.244.0.0/16 ", "198.51.100.0/24"}
	_, err = c.client.CoreV1().Services(c.ns).Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	admitted(pod)
	dropped(client)
	unrestricted()
}
