package main

import (
	"context"
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
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// agentBinary returns nodekit's kubelet or kube-proxy agent: $NODEKIT_KUBELET_BINARY
// or $NODEKIT_KUBE_PROXY_BINARY when set, else built from agents/NAME in this
// repository, else the test is unavailable.
func agentBinary(t *testing.T, name string) string {
	t.Helper()
	env := "NODEKIT_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_BINARY"
	if p := os.Getenv(env); p != "" {
		return p
	}
	src := filepath.Join("..", name)
	if _, err := os.Stat(filepath.Join(src, "main.go")); err != nil {
		testenv.Unavailable(t, "agents/%s is not in this tree and %s is unset", name, env)
	}
	out := filepath.Join(filepath.Dir(nodekitBin), name)
	if _, err := os.Stat(out); err == nil {
		return out
	}
	b, err := exec.Command("go", "build", "-tags", "grpcnotrace", "-o", out, "./"+src).CombinedOutput()
	require.NoError(t, err, "build agents/%s: %s", name, b)
	return out
}

func processOf(st *cluster.State, name, node string) cluster.Process {
	for _, p := range st.Processes {
		if p.Name == name && p.Node == node {
			return p
		}
	}
	return cluster.Process{}
}

func readyCondition(ctx context.Context, client kubernetes.Interface, node string) corev1.NodeCondition {
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return corev1.NodeCondition{}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

// TestSeedStories plays the seed's on-call stories on the cluster `nodekit up` makes,
// with nodekit's own kubelet and kube-proxy, and checks that `nodekit explain` tells
// each apart: the CNI config removed (NotReady with the seed's message, healed when
// restored), kube-proxy killed while the endpoint moves (the kernel still aims at the
// old IP), the kubelet killed (Unknown after the grace period, the runtime still up).
func TestSeedStories(t *testing.T) {
	peers, images, _ := upEnv(t)
	kubelet := agentBinary(t, "kubelet")
	kubeProxy := agentBinary(t, "kube-proxy")
	testenv.LookPath(t, "nft")
	name := "s" + strconv.Itoa(os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	env := []string{"NODEKIT_PEERS_DIR=" + peers, "NODEKIT_IMAGES_DIR=" + images}
	begin := time.Now()
	out, stderr, code := nodekit(t, env, "up", "--detach", "--name", name, "--state-dir", stateDir, "--api-port", strconv.Itoa(freePort(t)),
		"--node-monitor-grace-period", "20s", "--kubelet-binary", kubelet, "--kube-proxy-binary", kubeProxy)
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			_, e, _ := nodekit(t, nil, "down", "--state-dir", stateDir)
			t.Logf("cleanup down: %s", e)
		}
	})
	require.Equal(t, 0, code, "up: %s\n%s", out, stderr)
	t.Logf("up --detach with agents, node Ready, in %s:\n%s", time.Since(begin).Round(time.Millisecond), stderr)
	kubeconfig := filepath.Join(stateDir, "kubeconfig")
	b, err := exec.Command(filepath.Join(peers, "kubectl"), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "wide").CombinedOutput()
	require.NoError(t, err, "%s", b)
	t.Logf("kubectl get nodes -o wide:\n%s", b)
	assert.Regexp(t, `(?m)^node-1\s+Ready\s`, string(b))

	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	require.NoError(t, err)
	client := kubernetes.NewForConfigOrDie(rc)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)
	n1 := st.Nodes[0]

	explain := func(args ...string) (string, int) {
		out, stderr, code := nodekit(t, nil, append(append([]string{"explain"}, args...), "--state-dir", stateDir)...)
		require.NotEqual(t, exitError, code, "explain %v: %s", args, stderr)
		return out, code
	}
	out, code = explain("node", "node-1")
	assert.Equal(t, exitOK, code, out)
	assert.Contains(t, out, "node/node-1: NodeHealthy (healthy)")
	assert.Contains(t, out, "kubelet http://127.0.0.1:10248/healthz answered ok")

	// Story 1: the CNI config disappears.
	conf := filepath.Join(n1.CNIConfig, "10-nodekit.conflist")
	saved, err := os.ReadFile(conf)
	require.NoError(t, err)
	require.NoError(t, os.Remove(conf))
	require.Eventually(t, func() bool {
		c := readyCondition(ctx, client, "node-1")
		return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "cni plugin not initialized")
	}, 45*time.Second, 250*time.Millisecond, "the kubelet must report NotReady with the runtime's network message")
	out, code = explain("node", "node-1")
	t.Logf("CNI removed:\n%s", out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "node/node-1: NetworkNotReady (NOT healthy)")
	assert.Contains(t, out, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized")
	assert.Contains(t, out, "CNI config folder "+n1.CNIConfig+" is empty")
	require.NoError(t, os.WriteFile(conf, saved, 0o644))
	require.Eventually(t, func() bool { return readyCondition(ctx, client, "node-1").Status == corev1.ConditionTrue },
		45*time.Second, 250*time.Millisecond, "the node must heal once the CNI config is back")
	// The kubelet's next status update and explain's own reading of the runtime may be
	// a moment apart; explain must agree within a few seconds.
	var healed string
	assert.Eventually(t, func() bool {
		var code int
		healed, code = explain("node", "node-1")
		return code == exitOK
	}, 15*time.Second, 500*time.Millisecond, "explain after the CNI config is back")
	if t.Failed() {
		t.Logf("explain after healing:\n%s", healed)
	}

	// Story 2: kube-proxy dies, then the Service's endpoint moves.
	svc, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo", Namespace: "default"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	slice, err := client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "echo-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "echo"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.37"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, code := explain("service", "default/echo"); return code == exitOK },
		30*time.Second, 250*time.Millisecond, "kube-proxy must write the Service's rules")
	out, _ = explain("service", "default/echo")
	assert.Contains(t, out, "kernel rule (nftables table ip kube-proxy): "+svc.Spec.ClusterIP+" . tcp . 80 -> dnat 10.244.1.37:8080")

	kp := processOf(st, "kube-proxy", "node-1")
	require.True(t, kp.Alive())
	require.NoError(t, syscall.Kill(kp.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool { return !kp.Alive() }, 10*time.Second, 50*time.Millisecond)
	slice.Endpoints[0].Addresses = []string{"10.244.1.99"}
	_, err = client.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{})
	require.NoError(t, err)
	out, code = explain("service", "default/echo")
	t.Logf("kube-proxy killed, endpoint moved:\n%s", out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "service/default/echo: KubeProxyDown (NOT healthy)")
	assert.Contains(t, out, "still send connections to 10.244.1.37, which no EndpointSlice lists any more")
	assert.Contains(t, out, "the ready endpoint(s) 10.244.1.99 get no traffic through "+svc.Spec.ClusterIP)
	assert.Contains(t, out, "$ nodekit restart kube-proxy --node node-1 --state-dir "+stateDir, "next steps fit a nodekit cluster")
	out, code = nodekit2(t, "status", "--state-dir", stateDir)
	assert.Equal(t, exitUnhealthy, code)
	assert.Regexp(t, `(?m)^kube-proxy\s+node-1\s+\d+\s+NOT RUNNING`, out)

	// Healed when kube-proxy runs again: the rules follow the endpoint.
	_, stderr, code = nodekit(t, nil, "restart", "kube-proxy", "--node", "node-1", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool { _, code := explain("service", "default/echo"); return code == exitOK },
		30*time.Second, 250*time.Millisecond, "kube-proxy restarted must bring the rules back to the endpoint")
	out, _ = explain("service", "default/echo")
	assert.Contains(t, out, "kernel rule (nftables table ip kube-proxy): "+svc.Spec.ClusterIP+" . tcp . 80 -> dnat 10.244.1.99:8080")
	out, _ = explain("service", "default/echo", "--trace-from", "10.244.2.5")
	assert.Contains(t, out, "trace 10.244.2.5 -> "+svc.Spec.ClusterIP+":80/TCP: DNAT to one of 10.244.1.99:8080")
	st, err = cluster.LoadState(stateDir)
	require.NoError(t, err)

	// Story 3: the kubelet dies; its node goes Unknown while the runtime lives on.
	kl := processOf(st, "kubelet", "node-1")
	require.True(t, kl.Alive())
	require.NoError(t, syscall.Kill(kl.PID, syscall.SIGKILL))
	require.Eventually(t, func() bool { return readyCondition(ctx, client, "node-1").Status == corev1.ConditionUnknown },
		45*time.Second, 250*time.Millisecond, "the node lifecycle controller must mark the node Unknown after the 20s grace period")
	out, code = explain("node", "node-1")
	t.Logf("kubelet killed:\n%s", out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "node/node-1: KubeletSilent (NOT healthy)")
	assert.Contains(t, out, "The kubelet on node-1 went quiet: its last heartbeat was")
	assert.Contains(t, out, "kubelet http://127.0.0.1:10248/healthz does not answer")
	assert.Contains(t, out, "The container runtime on the node still answers, so they very likely are.")
	assert.Contains(t, out, "$ tail -n 50 "+filepath.Join(stateDir, "logs", "node-1-kubelet.log"))

	// Healed when the kubelet runs again.
	_, stderr, code = nodekit(t, nil, "restart", "kubelet", "--node", "node-1", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool { return readyCondition(ctx, client, "node-1").Status == corev1.ConditionTrue },
		45*time.Second, 250*time.Millisecond, "the node must be Ready again once the kubelet runs")
	require.Eventually(t, func() bool { _, code := explain("node", "node-1"); return code == exitOK },
		15*time.Second, 500*time.Millisecond, "explain must say healthy once the kubelet is back")
	_, stderr, code = nodekit(t, nil, "restart", "kubelet", "--node", "node-9", "--state-dir", stateDir)
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "no such part: kubelet on node node-9")
	st, err = cluster.LoadState(stateDir)
	require.NoError(t, err)

	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	for _, p := range st.Processes {
		assert.False(t, p.Alive(), "%s still runs", p.Name)
	}
	assert.Empty(t, mountsUnder(t, stateDir))
	assert.Empty(t, netnsWithPrefix(t, "nk-"+name+"-"))
}

func nodekit2(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, _, code := nodekit(t, nil, args...)
	return out, code
}
