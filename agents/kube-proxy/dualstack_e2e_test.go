package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// TestAgentDualStack: a real API server with a dual-stack service range, the
// endpointslice controller, and the agent binary on a dual-stack netns node. A
// RequireDualStack NodePort Service answers over both families, on its two
// cluster IPs and on the node's two addresses, through one agent (a writer per
// family), in both modes; endpoint changes reach both families.
func TestAgentDualStack(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, ServiceCIDR6: netns.IPv6ServiceCIDR.String()})
	for _, mode := range []string{modeNFTables, modeIPTables} {
		t.Run(mode, func(t *testing.T) { testAgentDualStack(t, cp, mode) })
	}
}

func testAgentDualStack(t *testing.T, cp *controlplane.ControlPlane, mode string) {
	c := newClusterWith(t, cp, mode, netns.Config{Pods: 3, IPv6: true})
	pods := c.env.Pods
	for i := range 2 {
		c.runPod(fmt.Sprintf("web-%d", i), i, "web")
	}
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: c.ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"},
			IPFamilyPolicy: &policy, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(pods[0].HTTPPort)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Len(t, svc.Spec.ClusterIPs, 2, "a dual-stack Service has a cluster IP per family")
	ip4, ip6 := svc.Spec.ClusterIPs[0], svc.Spec.ClusterIPs[1]
	nodePort := strconv.Itoa(int(svc.Spec.Ports[0].NodePort))
	want := func(idx ...int) []string {
		var ips []string
		for _, i := range idx {
			ips = append(ips, pods[i].IP.String(), pods[i].IP6.String())
		}
		sortStrings(ips)
		return ips
	}
	c.waitSlice("web", want(0, 1)...)
	took := c.startAgent("--cluster-cidr=" + c.env.PodCIDR.String() + "," + c.env.PodCIDR6.String())
	t.Logf("%s: agent up with both families synced in %s", mode, took)

	// startAgent returns at the first full sync; the families sync one after the
	// other in the same loop iteration.
	for _, f := range []string{"IPv4", "IPv6"} {
		assert.Eventually(t, func() bool {
			m, err := c.scrape()
			return err == nil && m[`kubeproxy_sync_full_proxy_rules_duration_seconds_count{ip_family="`+f+`"}`] > 0
		}, 10*time.Second, 10*time.Millisecond, "a full sync of the %s writer", f)
	}

	dests := map[string]string{
		"IPv4 cluster IP": net.JoinHostPort(ip4, "80"), "IPv6 cluster IP": net.JoinHostPort(ip6, "80"),
		"IPv4 node port": net.JoinHostPort(c.env.NodeIP.String(), nodePort), "IPv6 node port": net.JoinHostPort(c.env.NodeIP6.String(), nodePort),
	}
	// expect waits until every destination is served by exactly the given pods.
	expect := func(what string, idx ...int) time.Duration {
		t.Helper()
		var names []string
		for _, i := range idx {
			names = append(names, pods[i].Name)
		}
		start := time.Now()
		for _, name := range slices.Sorted(maps.Keys(dests)) {
			addr := dests[name]
			var got map[string]int
			ok := assert.Eventually(t, func() bool {
				got = served(c.env.Client, addr, 20, 2*time.Second)
				return slices.Equal(slices.Sorted(maps.Keys(got)), names)
			}, 30*time.Second, 50*time.Millisecond, "%s: %s (%s) should be served by %v", what, name, addr, names)
			if ok {
				t.Logf("%s: %s served by %v", what, name, got)
			}
		}
		return time.Since(start)
	}
	expect("both families after the first sync", 0, 1)

	// The kernel holds each family in its own table (or ip6tables).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rules6 string
	if mode == modeNFTables {
		rules6, err = c.env.NodeRun(ctx, "", "nft", "list", "table", "ip6", "kube-proxy")
	} else {
		rules6, err = c.env.NodeRun(ctx, "", "ip6tables-save", "-t", "nat")
	}
	require.NoError(t, err)
	assert.Contains(t, rules6, ip6)
	assert.Contains(t, rules6, "["+pods[1].IP6.String()+"]:")
	assert.NotContains(t, c.kernelRules(), ip6, "no IPv6 address in the IPv4 rules")

	// Endpoint changes reach both families: a pod goes, another comes.
	require.NoError(t, c.client.CoreV1().Pods(c.ns).Delete(context.Background(), "web-1", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	c.waitSlice("web", want(0)...)
	t.Logf("pod removed: every destination follows in %s", expect("after web-1 was deleted", 0))
	c.runPod("web-2", 2, "web")
	c.waitSlice("web", want(0, 2)...)
	t.Logf("pod added: every destination follows in %s", expect("after web-2 was added", 0, 2))

	testHealthCheckPerFamily(t, c)
	testSourceRangesPerFamily(t, c)

	// Both families report to /healthz and the metrics.
	m, err := c.scrape()
	require.NoError(t, err)
	for _, f := range []string{"IPv4", "IPv6"} {
		assert.Positive(t, m[`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="`+f+`"}`], f)
	}
	assert.True(t, strings.Contains(healthzBody(t, c), `"IPv6"`), "healthz lists the IPv6 proxier")
}

// healthzBody is the agent's /healthz answer.
func healthzBody(t *testing.T, c *cluster) string {
	t.Helper()
	resp, err := http.Get("http://" + c.healthz + "/healthz")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// testHealthCheckPerFamily: each family's health check servers, as upstream's
// one per proxier: a dual-stack LoadBalancer Service with externalTrafficPolicy
// Local answers on the node's IPv4 and IPv6 addresses, each with its family's
// local endpoints (pods web-0 and web-2, both on this node); an IPv4-only one
// answers on the IPv4 address and has no server on the IPv6 one.
func testHealthCheckPerFamily(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	lb := func(name string, families ...corev1.IPFamily) *corev1.Service {
		policy := corev1.IPFamilyPolicySingleStack
		if len(families) > 1 {
			policy = corev1.IPFamilyPolicyRequireDualStack
		}
		svc, err := c.client.CoreV1().Services(c.ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
			Spec: corev1.ServiceSpec{
				Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
				ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
				IPFamilyPolicy:        &policy, IPFamilies: families,
				Ports: []corev1.ServicePort{{Name: "p", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(c.env.Pods[0].HTTPPort)}},
			},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		require.NotZero(t, svc.Spec.HealthCheckNodePort)
		return svc
	}
	dual := lb("lb-dual", corev1.IPv4Protocol, corev1.IPv6Protocol)
	only4 := lb("lb-ipv4", corev1.IPv4Protocol)
	hc := c.env.Client.HTTPClient(2 * time.Second)
	defer hc.CloseIdleConnections()
	answers := func(ip string, svc *corev1.Service) {
		t.Helper()
		url := "http://" + net.JoinHostPort(ip, strconv.Itoa(int(svc.Spec.HealthCheckNodePort))) + "/"
		var body string
		require.Eventually(t, func() bool {
			resp, err := hc.Get(url)
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			body = string(b)
			return resp.StatusCode == http.StatusOK && strings.Contains(body, `"localEndpoints": 2,`)
		}, 30*time.Second, 50*time.Millisecond, "%s (%s) never answered 200 with 2 local endpoints: %s", url, svc.Name, body)
		assert.Contains(t, body, `"name": "`+svc.Name+`"`)
	}
	answers(c.env.NodeIP.String(), dual)
	answers(c.env.NodeIP6.String(), dual)
	answers(c.env.NodeIP.String(), only4)
	_, err := hc.Get("http://" + net.JoinHostPort(c.env.NodeIP6.String(), strconv.Itoa(int(only4.Spec.HealthCheckNodePort))) + "/")
	assert.Error(t, err, "the IPv4-only Service has no IPv6 health check server")
	t.Logf("%s: health check servers per family: dual-stack Service on both node addresses, IPv4-only Service on IPv4 only", c.mode)
}

// testSourceRangesPerFamily: a dual-stack LoadBalancer Service whose
// loadBalancerSourceRanges hold an IPv6 range for the external client and an IPv4
// range for the pods. Each family's rules take only their family's ranges, as
// upstream's per-family proxiers: over IPv6 the client reaches the load-balancer
// IP and a pod is dropped, over IPv4 the other way round.
func testSourceRangesPerFamily(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	const lb4, lb6 = "10.96.250.251", "fd00:10:96::fb"
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := c.client.CoreV1().Services(c.ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "lbsr", Namespace: c.ns},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": "web"},
			IPFamilyPolicy: &policy, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			LoadBalancerSourceRanges: []string{netns.IPv6ExternalCIDR.String(), c.env.PodCIDR.String()},
			Ports:                    []corev1.ServicePort{{Name: "p", Port: 8083, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt(c.env.Pods[0].HTTPPort)}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lb4}, {IP: lb6}}
	_, err = c.client.CoreV1().Services(c.ns).UpdateStatus(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)

	client, pod := c.env.Client, c.env.Pods[1].Namespace
	dial := func(ns *netns.Namespace, ip string) (time.Duration, error) {
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		t0 := time.Now()
		conn, err := ns.Dial(dctx, "tcp", net.JoinHostPort(ip, "8083"))
		if conn != nil {
			conn.Close()
		}
		return time.Since(t0), err
	}
	admitted := func(ns *netns.Namespace, ip string) {
		t.Helper()
		require.Eventually(t, func() bool { _, err := dial(ns, ip); return err == nil }, 30*time.Second, 50*time.Millisecond,
			"%s never reached %s", ns.Name, ip)
	}
	dropped := func(ns *netns.Namespace, ip string) {
		t.Helper()
		took, err := dial(ns, ip)
		require.Error(t, err, "%s outside %s's source ranges connected", ns.Name, ip)
		assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "want dropped, got %v", err)
		assert.GreaterOrEqual(t, took, 900*time.Millisecond, "dropped, so no answer: %v after %v", err, took)
	}
	admitted(client, lb6)
	admitted(pod, lb4)
	dropped(pod, lb6)
	dropped(client, lb4)
	t.Logf("%s: loadBalancerSourceRanges per family: IPv6 range admits the client, IPv4 range the pods", c.mode)
}
