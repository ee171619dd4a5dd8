package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/internal/testenv/netns"
)

// agentBin is the kube-proxy binary TestMain builds.
var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "nodekit-kube-proxy-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "kube-proxy")
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", agentBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kube-proxy:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// writeKubeconfig turns a rest.Config into a kubeconfig file for the binary.
func writeKubeconfig(t testing.TB, rc *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: rc.Host, CertificateAuthority: rc.CAFile, CertificateAuthorityData: rc.CAData}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData, Token: rc.BearerToken}
	kc.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "x"
	p := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, p))
	return p
}

// cluster is one node's worth of real parts: a network-namespace node with pods,
// a Kubernetes namespace whose Pods carry those pods' addresses, and the agent.
type cluster struct {
	t          *testing.T
	mode       string
	cp         *controlplane.ControlPlane
	client     kubernetes.Interface
	env        *netns.Env
	node       string
	ns         string
	kubeconfig string
	healthz    string
	metrics    string
	agent      *testenv.Process
	starts     int
}

func newCluster(t *testing.T, cp *controlplane.ControlPlane, mode string, pods int) *cluster {
	t.Helper()
	return newClusterWith(t, cp, mode, netns.Config{Pods: pods})
}

// newClusterWith is newCluster with the netns node as configured: with IPv6 set,
// the Node gets its IPv6 address too and the Pods report both families.
func newClusterWith(t *testing.T, cp *controlplane.ControlPlane, mode string, cfg netns.Config) *cluster {
	t.Helper()
	c := &cluster{t: t, mode: mode, cp: cp, client: cp.AdminClient(), node: "node-" + mode, ns: "e2e-" + mode}
	c.env = netns.New(t, cfg)
	ctx := context.Background()
	cp.CreateNode(t, c.node)
	// The node's InternalIP is its address on the client link: upstream's
	// 'primary' NodePort address.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: c.env.NodeIP.String()}}
		if c.env.NodeIP6.IsValid() {
			n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: c.env.NodeIP6.String()})
		}
		_, err = c.client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}))
	_, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		// The test control plane runs no namespace controller: delete the Services
		// and Pods one by one so the next subtest's agent does not program them.
		ctx := context.Background()
		if list, err := c.client.CoreV1().Services(c.ns).List(ctx, metav1.ListOptions{}); err == nil {
			for _, s := range list.Items {
				_ = c.client.CoreV1().Services(c.ns).Delete(ctx, s.Name, metav1.DeleteOptions{})
			}
		}
		_ = c.client.CoreV1().Pods(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}, metav1.ListOptions{})
		_ = c.client.DiscoveryV1().EndpointSlices(c.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	})
	c.kubeconfig = writeKubeconfig(t, cp.AdminConfig())
	return c
}

// runPod registers env pod i as a Running, Ready Pod of app on this node, the
// way a kubelet reports it, so the endpointslice controller lists its address.
func (c *cluster) runPod(name string, i int, app string) {
	c.t.Helper()
	c.runPodOn(name, i, app, c.node)
}

// runPodOn is runPod with the Pod bound to node (which must exist).
func (c *cluster) runPodOn(name string, i int, app, node string) {
	c.t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns, Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "srv", Image: "busybox",
				Ports: []corev1.ContainerPort{{ContainerPort: int32(c.env.Pods[i].HTTPPort)}}}},
		},
	}
	var created *corev1.Pod
	require.Eventually(c.t, func() bool {
		var err error
		created, err = c.client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{})
		return err == nil // the namespace's default ServiceAccount may not exist yet
	}, 30*time.Second, 200*time.Millisecond)
	now := metav1.Now()
	ip := c.env.Pods[i].IP.String()
	podIPs := []corev1.PodIP{{IP: ip}}
	if ip6 := c.env.Pods[i].IP6; ip6.IsValid() {
		podIPs = append(podIPs, corev1.PodIP{IP: ip6.String()})
	}
	created.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: ip, PodIPs: podIPs, StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	_, err := c.client.CoreV1().Pods(c.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	require.NoError(c.t, err)
}

func (c *cluster) service(name, app string, typ corev1.ServiceType, proto corev1.Protocol, port int, extIPs ...string) *corev1.Service {
	c.t.Helper()
	target := c.env.Pods[0].HTTPPort
	if proto == corev1.ProtocolUDP {
		target = c.env.Pods[0].UDPPort
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: c.ns},
		Spec: corev1.ServiceSpec{
			Type: typ, Selector: map[string]string{"app": app}, ExternalIPs: extIPs,
			Ports: []corev1.ServicePort{{Name: "p", Port: int32(port), Protocol: proto, TargetPort: intstr.FromInt(target)}},
		},
	}
	out, err := c.client.CoreV1().Services(c.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	require.NoError(c.t, err)
	return out
}

// waitSlice waits until the Service's EndpointSlices list exactly ips as ready.
func (c *cluster) waitSlice(svc string, ips ...string) {
	c.t.Helper()
	require.Eventually(c.t, func() bool {
		return strings.Join(c.sliceIPs(svc), ",") == strings.Join(ips, ",")
	}, 30*time.Second, 20*time.Millisecond, "EndpointSlice of %s never listed %v (has %v)", svc, ips, c.sliceIPs(svc))
}

func (c *cluster) sliceIPs(svc string) []string {
	list, err := c.client.DiscoveryV1().EndpointSlices(c.ns).List(context.Background(),
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		return nil
	}
	var ips []string
	for _, es := range list.Items {
		for _, e := range es.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				ips = append(ips, e.Addresses...)
			}
		}
	}
	sortStrings(ips)
	return ips
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// startAgent starts the binary with --netns pointing at the node namespace and
// waits until /healthz says the first sync is done. It returns how long that took.
func (c *cluster) startAgent(extra ...string) time.Duration {
	c.t.Helper()
	ports, err := testenv.FreePorts(2)
	require.NoError(c.t, err)
	c.healthz = "127.0.0.1:" + strconv.Itoa(ports[0])
	c.metrics = "127.0.0.1:" + strconv.Itoa(ports[1])
	c.starts++
	args := append([]string{
		"--kubeconfig=" + c.kubeconfig, "--hostname-override=" + c.node, "--proxy-mode=" + c.mode,
		"--netns=" + c.env.Node.Path(), "--healthz-bind-address=" + c.healthz, "--metrics-bind-address=" + c.metrics,
		"--cluster-cidr=10.244.0.0/16", "-v=2",
	}, extra...)
	logPath := filepath.Join(c.t.TempDir(), fmt.Sprintf("kube-proxy-%d.log", c.starts))
	start := time.Now()
	p, err := testenv.StartProcess("kube-proxy", logPath, nil, agentBin, args...)
	require.NoError(c.t, err)
	c.agent = p
	c.t.Cleanup(func() { p.Stop(5 * time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(c.t, p.WaitFor(ctx, 20*time.Millisecond, func(ctx context.Context) error {
		m, err := c.scrape()
		if err != nil {
			return err
		}
		if m["kubeproxy_sync_full_proxy_rules_duration_seconds_count"] < 1 {
			return errors.New("no full sync yet")
		}
		return nil
	}))
	return time.Since(start)
}

// scrape reads the agent's metrics as name{labels} -> value, plus bare names
// summed over labels.
func (c *cluster) scrape() (map[string]float64, error) {
	resp, err := http.Get("http://" + c.metrics + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		key := line[:i]
		out[key] = v
		if j := strings.IndexByte(key, '{'); j >= 0 {
			out[key[:j]] += v
		}
	}
	return out, sc.Err()
}

// kernelRules lists the node namespace's rules as the mode writes them.
func (c *cluster) kernelRules() string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out string
	var err error
	if c.mode == modeNFTables {
		out, err = c.env.NodeRun(ctx, "", "nft", "list", "table", "ip", "kube-proxy")
	} else {
		out, err = c.env.NodeRun(ctx, "", "iptables-save", "-t", "nat")
	}
	require.NoError(c.t, err)
	return out
}

// waitKernel waits until cond holds for the kernel's rules and returns how long.
func (c *cluster) waitKernel(what string, cond func(rules string) bool) time.Duration {
	c.t.Helper()
	start := time.Now()
	deadline := start.Add(30 * time.Second)
	for {
		if cond(c.kernelRules()) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("kernel never got %s:\n%s", what, c.kernelRules())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// served sends n requests from ns to addr, each on a new connection, and counts
// the serving pods; failures are counted under "".
func served(ns *netns.Namespace, addr string, n int, timeout time.Duration) map[string]int {
	hc := ns.HTTPClient(timeout)
	defer hc.CloseIdleConnections()
	out := map[string]int{}
	for range n {
		pod, _, err := netns.Get(context.Background(), hc, addr)
		if err != nil {
			pod = ""
		}
		out[pod]++
	}
	return out
}

func TestAgentRealParts(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true})
	for _, mode := range []string{modeNFTables, modeIPTables} {
		t.Run(mode, func(t *testing.T) { testAgentMode(t, cp, mode) })
	}
}

func testAgentMode(t *testing.T, cp *controlplane.ControlPlane, mode string) {
	c := newCluster(t, cp, mode, 4)
	pods := c.env.Pods
	for i := range 3 {
		c.runPod(fmt.Sprintf("web-%d", i), i, "web")
	}
	web := c.service("web", "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP, 80)
	empty := c.service("empty", "nothing", corev1.ServiceTypeClusterIP, corev1.ProtocolTCP, 80)
	// Bad input: two Services claim the same external IP and port. The later
	// (clash-b) is skipped with its name logged; everything else works.
	c.service("clash-a", "web", corev1.ServiceTypeClusterIP, corev1.ProtocolTCP, 8081, "192.0.2.200")
	c.service("clash-b", "web", corev1.ServiceTypeClusterIP, corev1.ProtocolTCP, 8081, "192.0.2.200")
	c.waitSlice("web", pods[0].IP.String(), pods[1].IP.String(), pods[2].IP.String())

	firstSync := c.startAgent()
	t.Logf("%s: start to first full sync (healthz and metrics up): %v", mode, firstSync)

	clusterIP := net.JoinHostPort(web.Spec.ClusterIP, "80")
	nodePort := net.JoinHostPort(c.env.NodeIP.String(), strconv.Itoa(int(web.Spec.Ports[0].NodePort)))

	// ClusterIP from a pod and NodePort from outside reach the three pods.
	got := served(pods[3].Namespace, clusterIP, 30, 2*time.Second)
	assert.Zero(t, got[""], "ClusterIP failures: %v", got)
	assert.Len(t, got, 3, "ClusterIP spread over the pods: %v", got)
	got = served(c.env.Client, nodePort, 30, 2*time.Second)
	assert.Zero(t, got[""], "NodePort failures: %v", got)
	assert.Len(t, got, 3, "NodePort spread: %v", got)

	// Localhost NodePorts: iptables mode (localhostNodePorts, on by default)
	// answers on 127.0.0.1 from the node itself, having set route_localnet in the
	// node's namespace; nftables mode never does.
	localNodePort := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(web.Spec.Ports[0].NodePort)))
	if mode == modeIPTables {
		got = served(c.env.Node, localNodePort, 9, 2*time.Second)
		assert.Zero(t, got[""], "localhost NodePort failures: %v", got)
		out, err := c.env.NodeRun(context.Background(), "", "sysctl", "-n", "net.ipv4.conf.all.route_localnet")
		require.NoError(t, err)
		assert.Equal(t, "1", strings.TrimSpace(out), "route_localnet in the node's namespace")
	} else {
		conn, err := c.env.Node.Dial(context.Background(), "tcp", localNodePort)
		if conn != nil {
			conn.Close()
		}
		assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "nftables: no NodePort on 127.0.0.1, got %v", err)
	}

	var conn net.Conn
	// A LoadBalancer Service with externalTrafficPolicy Local gets a health check
	// server on its healthCheckNodePort, counting this node's ready endpoints.
	lb := c.service("lb", "web", corev1.ServiceTypeLoadBalancer, corev1.ProtocolTCP, 8082)
	lb.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	lb, err := c.client.CoreV1().Services(c.ns).Update(context.Background(), lb, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NotZero(t, lb.Spec.HealthCheckNodePort)
	hcURL := "http://" + net.JoinHostPort(c.env.NodeIP.String(), strconv.Itoa(int(lb.Spec.HealthCheckNodePort))) + "/"
	var hcBody string
	require.Eventually(t, func() bool {
		resp, err := c.env.Client.HTTPClient(time.Second).Get(hcURL)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		hcBody = string(b)
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond, "health check node port never answered 200: %s", hcBody)
	assert.Contains(t, hcBody, `"localEndpoints": 3,`)
	assert.Contains(t, hcBody, `"name": "lb"`)

	testEvents(t, c)
	testTrafficPolicyLocal(t, c)
	testLoadBalancerSourceRanges(t, c)
	if mode == modeNFTables {
		testUnallocatedClusterIPs(t, c)
	}

	// A Service without endpoints is rejected: connection refused, at once.
	t0 := time.Now()
	conn, err = pods[3].Dial(context.Background(), "tcp", net.JoinHostPort(empty.Spec.ClusterIP, "80"))
	if conn != nil {
		conn.Close()
	}
	assert.True(t, errors.Is(err, syscall.ECONNREFUSED), "no endpoints: want connection refused, got %v", err)
	assert.Less(t, time.Since(t0), time.Second, "the reject is fast")

	// Bad input: clash-b is skipped and named; clash-a is served.
	m, err := c.scrape()
	require.NoError(t, err)
	assert.Equal(t, 1.0, m["nodekit_kubeproxy_skipped_service_ports"], "one skipped port")
	assert.Contains(t, c.agent.Tail(1<<16), `service="`+c.ns+`/clash-b"`)
	got = served(pods[3].Namespace, "192.0.2.200:8081", 6, 2*time.Second)
	assert.Zero(t, got[""], "clash-a's external IP works: %v", got)

	// An endpoint change reaches the kernel: pod 3 joins web.
	t0 = time.Now()
	c.runPod("web-3", 3, "web")
	c.waitKernel("pod 3's address", func(r string) bool { return strings.Contains(r, pods[3].IP.String()) })
	t.Logf("%s: endpoint added (API write) to rule in the kernel: %v", mode, time.Since(t0))
	require.NoError(t, c.client.CoreV1().Pods(c.ns).Delete(context.Background(), "web-3", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	t0 = time.Now()
	c.waitKernel("pod 3 gone", func(r string) bool { return !strings.Contains(r, pods[3].IP.String()) })
	t.Logf("%s: endpoint removed (API delete) to rule gone from the kernel: %v", mode, time.Since(t0))

	// The seed's story. An open connection through the ClusterIP...
	keep, err := pods[3].Dial(context.Background(), "tcp", clusterIP)
	require.NoError(t, err)
	defer keep.Close()
	firstPod, err := keepAliveGet(keep)
	require.NoError(t, err)

	// ...survives the agent's death, and new connections keep flowing.
	t0 = time.Now()
	c.agent.Kill()
	pod, err := keepAliveGet(keep)
	require.NoError(t, err, "the existing connection keeps flowing with the agent dead")
	assert.Equal(t, firstPod, pod)
	got = served(pods[3].Namespace, clusterIP, 15, 2*time.Second)
	assert.Zero(t, got[""], "new connections with the agent dead: %v", got)
	t.Logf("%s: agent killed; existing and %d new connections served in %v", mode, 15, time.Since(t0))

	// Replace a pod while the agent is dead: web-2 goes (its address leaves the
	// node), web-3 comes up on pod 3's address. Every pod reads Running and the
	// EndpointSlice is right, but the kernel still aims at the gone address and
	// never at the new one: requests that pick it blackhole.
	t0 = time.Now()
	require.NoError(t, c.client.CoreV1().Pods(c.ns).Delete(context.Background(), "web-2", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	removeAddress(t, pods[2])
	c.runPod("web-3", 3, "web")
	c.waitSlice("web", pods[0].IP.String(), pods[1].IP.String(), pods[3].IP.String())
	list, err := c.client.CoreV1().Pods(c.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=web"})
	require.NoError(t, err)
	for _, p := range list.Items {
		assert.Equal(t, corev1.PodRunning, p.Status.Phase, "pod %s", p.Name)
	}
	got = served(c.env.Client, nodePort, 24, 500*time.Millisecond)
	assert.NotZero(t, got[""], "requests to the gone pod blackhole: %v", got)
	assert.Zero(t, got[pods[3].Name], "the new pod gets nothing: %v", got)
	assert.Contains(t, c.kernelRules(), pods[2].IP.String(), "stale rule still in the kernel")
	t.Logf("%s: pod replaced with the agent dead: %d of 24 requests blackholed, new pod served 0 (%v)", mode, got[""], time.Since(t0))

	// Restart the agent: a full sync heals it.
	t0 = time.Now()
	restart := c.startAgent()
	healed := c.waitKernel("healed rules", func(r string) bool {
		return strings.Contains(r, pods[3].IP.String()) && !strings.Contains(r, pods[2].IP.String())
	})
	t.Logf("%s: agent restarted: first full sync after %v, kernel healed %v after that (total %v)", mode, restart, healed, time.Since(t0))
	got = served(c.env.Client, nodePort, 30, 2*time.Second)
	assert.Zero(t, got[""], "healed: %v", got)
	assert.NotZero(t, got[pods[3].Name], "the new pod serves: %v", got)
	m, err = c.scrape()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, m["kubeproxy_sync_full_proxy_rules_duration_seconds_count"], 1.0)
	assert.InDelta(t, float64(time.Now().Unix()), m[`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}`], 60, "last sync timestamp")

	// healthz answers upstream's JSON.
	resp, err := http.Get("http://" + c.healthz + "/healthz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `"nodeEligible":true`)
	assert.Contains(t, string(body), `"status":{"IPv4":{"lastUpdated":`)
}

// testTrafficPolicyLocal: a NodePort Service with externalTrafficPolicy Local
// and two endpoints, one on this node (env pod 0) and one on another node
// (env pod 1, whose Pod is bound to a second Node). External traffic reaches only
// the local one and keeps the client's address; pods are short-circuited to both;
// with no local endpoint external traffic is dropped, not rejected.
func testTrafficPolicyLocal(t *testing.T, c *cluster) {
	t.Helper()
	pods := c.env.Pods
	remote := c.node + "-remote"
	c.cp.CreateNode(t, remote)
	c.runPodOn("etp-local", 0, "etp", c.node)
	c.runPodOn("etp-remote", 1, "etp", remote)
	svc := c.service("etp", "etp", corev1.ServiceTypeNodePort, corev1.ProtocolTCP, 80)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc, err := c.client.CoreV1().Services(c.ns).Update(context.Background(), svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	itp := c.service("itp", "etp", corev1.ServiceTypeClusterIP, corev1.ProtocolTCP, 80)
	itp.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	itp, err = c.client.CoreV1().Services(c.ns).Update(context.Background(), itp, metav1.UpdateOptions{})
	require.NoError(t, err)
	c.waitSlice("etp", pods[0].IP.String(), pods[1].IP.String())
	c.waitSlice("itp", pods[0].IP.String(), pods[1].IP.String())
	nodePort := net.JoinHostPort(c.env.NodeIP.String(), strconv.Itoa(int(svc.Spec.Ports[0].NodePort)))
	itpVIP := net.JoinHostPort(itp.Spec.ClusterIP, "80")

	hc := c.env.Client.HTTPClient(2 * time.Second)
	defer hc.CloseIdleConnections()
	require.Eventually(t, func() bool {
		pod, _, err := netns.Get(context.Background(), hc, nodePort)
		return err == nil && pod == pods[0].Name
	}, 30*time.Second, 50*time.Millisecond, "the Local NodePort never served")
	for range 20 {
		pod, remoteAddr, err := netns.Get(context.Background(), hc, nodePort)
		require.NoError(t, err)
		assert.Equal(t, pods[0].Name, pod, "externalTrafficPolicy Local: only the local endpoint")
		assert.True(t, strings.HasPrefix(remoteAddr, c.env.ClientIP.String()+":"), "the pod sees the client, got %s", remoteAddr)
	}
	got := served(pods[3].Namespace, nodePort, 40, 2*time.Second)
	assert.Zero(t, got[""], "pod traffic to the NodePort: %v", got)
	assert.Len(t, got, 2, "pod traffic is short-circuited to every endpoint: %v", got)
	require.Eventually(t, func() bool {
		pod, _, err := netns.Get(context.Background(), pods[3].HTTPClient(time.Second), itpVIP)
		return err == nil && pod == pods[0].Name
	}, 30*time.Second, 50*time.Millisecond, "the internalTrafficPolicy Local ClusterIP never served")
	got = served(pods[3].Namespace, itpVIP, 30, 2*time.Second)
	assert.Equal(t, map[string]int{pods[0].Name: 30}, got, "internalTrafficPolicy Local: a pod reaches only the local endpoint")

	require.NoError(t, c.client.CoreV1().Pods(c.ns).Delete(context.Background(), "etp-local", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	c.waitSlice("etp", pods[1].IP.String())
	dial := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		t0 := time.Now()
		conn, err := c.env.Client.Dial(ctx, "tcp", nodePort)
		if conn != nil {
			conn.Close()
		}
		return time.Since(t0), err
	}
	// Wait for the sync that removes the local endpoint (iptables-restore commits
	// nat and filter one after the other, so a SYN racing that sync may be refused
	// once), then every new external connection is dropped.
	require.Eventually(t, func() bool {
		_, err := dial()
		return err != nil && !errors.Is(err, syscall.ECONNREFUSED)
	}, 30*time.Second, 50*time.Millisecond, "external traffic is never dropped with no local endpoint")
	for range 3 {
		took, err := dial()
		require.Error(t, err, "connected with no local endpoint")
		assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "no local endpoint: want dropped, got %v", err)
		assert.GreaterOrEqual(t, took, 900*time.Millisecond, "dropped, so no answer: %v after %v", err, took)
	}
	got = served(pods[3].Namespace, nodePort, 10, 2*time.Second)
	assert.Equal(t, map[string]int{pods[1].Name: 10}, got, "pods still reach the remote endpoint")
	c.waitSlice("itp", pods[1].IP.String())
	dialITP := func() (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		t0 := time.Now()
		conn, err := pods[3].Dial(ctx, "tcp", itpVIP)
		if conn != nil {
			conn.Close()
		}
		return time.Since(t0), err
	}
	require.Eventually(t, func() bool {
		_, err := dialITP()
		return err != nil && !errors.Is(err, syscall.ECONNREFUSED)
	}, 30*time.Second, 50*time.Millisecond, "internalTrafficPolicy Local traffic is never dropped with no local endpoint")
	for range 2 {
		took, err := dialITP()
		require.Error(t, err, "internalTrafficPolicy Local with no local endpoint connected")
		assert.False(t, errors.Is(err, syscall.ECONNREFUSED), "internalTrafficPolicy Local, no local endpoint: want dropped, got %v", err)
		assert.GreaterOrEqual(t, took, 900*time.Millisecond, "dropped, so no answer: %v after %v", err, took)
	}
	require.NoError(t, c.client.CoreV1().Services(c.ns).Delete(context.Background(), "itp", metav1.DeleteOptions{}))
	require.NoError(t, c.client.CoreV1().Services(c.ns).Delete(context.Background(), "etp", metav1.DeleteOptions{}))
	require.NoError(t, c.client.CoreV1().Pods(c.ns).Delete(context.Background(), "etp-remote", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
}

// keepAliveGet sends one HTTP/1.1 request on conn and returns the serving pod.
func keepAliveGet(conn net.Conn) (string, error) {
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(conn, "GET / HTTP/1.1\r\nHost: svc\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// removeAddress takes the pod's address off its interface: the pod is gone as
// far as the network can tell.
func removeAddress(t *testing.T, p *netns.Pod) {
	t.Helper()
	h := p.Netlink()
	link, err := h.LinkByName("eth0")
	require.NoError(t, err)
	addrs, err := h.AddrList(link, syscall.AF_INET)
	require.NoError(t, err)
	for _, a := range addrs {
		require.NoError(t, h.AddrDel(link, &a))
	}
}

// setReady flips a Pod's Ready condition, as a kubelet's readiness probe would.
func (c *cluster) setReady(name string, ready bool) {
	c.t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	require.NoError(c.t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		p, err := c.client.CoreV1().Pods(c.ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodReady || p.Status.Conditions[i].Type == corev1.ContainersReady {
				p.Status.Conditions[i].Status = status
			}
		}
		_, err = c.client.CoreV1().Pods(c.ns).UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		return err
	}))
}

// TestAgentSyncsUnderTrafficAndAPIRestart: 100 syncs, each changing the
// endpoints of the Service being used, under non-stop traffic with no failed
// request; then the API server goes away (the rules stay and keep serving) and
// comes back (the agent resyncs and a new change reaches the kernel).
func TestAgentSyncsUnderTrafficAndAPIRestart(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true})
	c := newCluster(t, cp, modeNFTables, 5)
	pods := c.env.Pods
	for i := range 4 {
		c.runPod(fmt.Sprintf("web-%d", i), i, "web")
	}
	web := c.service("web", "web", corev1.ServiceTypeNodePort, corev1.ProtocolTCP, 80)
	c.waitSlice("web", pods[0].IP.String(), pods[1].IP.String(), pods[2].IP.String(), pods[3].IP.String())
	c.startAgent("--iptables-min-sync-period=50ms")
	clusterIP := net.JoinHostPort(web.Spec.ClusterIP, "80")
	nodePort := net.JoinHostPort(c.env.NodeIP.String(), strconv.Itoa(int(web.Spec.Ports[0].NodePort)))

	// Non-stop traffic from a pod (ClusterIP) and from outside (NodePort).
	type tally struct{ ok, failed int }
	stop := make(chan struct{})
	results := make(chan tally, 2)
	traffic := func(ns *netns.Namespace, addr string) {
		hc := ns.HTTPClient(2 * time.Second)
		var tl tally
		for {
			select {
			case <-stop:
				results <- tl
				return
			default:
			}
			if _, _, err := netns.Get(context.Background(), hc, addr); err != nil {
				tl.failed++
				t.Logf("request to %s failed: %v", addr, err)
			} else {
				tl.ok++
			}
		}
	}
	go traffic(pods[4].Namespace, clusterIP)
	go traffic(c.env.Client, nodePort)

	m0, err := c.scrape()
	require.NoError(t, err)
	t0 := time.Now()
	for i := range 100 {
		ready := i%2 == 1
		c.setReady("web-3", ready)
		c.waitKernel(fmt.Sprintf("change %d", i), func(r string) bool {
			return strings.Contains(r, pods[3].IP.String()) == ready
		})
	}
	m1, err := c.scrape()
	require.NoError(t, err)
	syncs := m1["kubeproxy_sync_proxy_rules_duration_seconds_count"] - m0["kubeproxy_sync_proxy_rules_duration_seconds_count"]
	t.Logf("100 endpoint changes reached the kernel in %v with %v syncs", time.Since(t0), syncs)
	assert.GreaterOrEqual(t, syncs, 100.0, "every change was its own sync")

	// The API server goes away: the rules stay and serve.
	t0 = time.Now()
	cp.StopAPIServer(t)
	t.Logf("API server stopped in %v", time.Since(t0))
	time.Sleep(2 * time.Second)
	got := served(c.env.Client, nodePort, 10, 2*time.Second)
	assert.Zero(t, got[""], "rules serve without an API server: %v", got)

	t0 = time.Now()
	cp.StartAPIServer(t)
	t.Logf("API server back in %v", time.Since(t0))
	t0 = time.Now()
	c.setReady("web-3", false)
	c.waitKernel("a change after the API server returned", func(r string) bool {
		return !strings.Contains(r, pods[3].IP.String())
	})
	t.Logf("first change after the API server returned reached the kernel in %v", time.Since(t0))

	close(stop)
	for range 2 {
		tl := <-results
		assert.Zero(t, tl.failed, "failed requests under churn and API restart (ok %d)", tl.ok)
		assert.NotZero(t, tl.ok)
		t.Logf("traffic: %d requests ok, %d failed", tl.ok, tl.failed)
	}
}
