package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestExplainNodeOnRealControlPlane plays the seed's first story against a real
// kube-apiserver and node lifecycle controller: a node heartbeats and is explained as
// healthy; its heartbeat stops; the controller marks it Unknown after the grace period
// and explain says the kubelet went quiet, how long ago, and that its containers may
// still serve.
func TestExplainNodeOnRealControlPlane(t *testing.T) {
	const grace = 10 * time.Second
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, NodeMonitorGracePeriod: grace})
	kubeconfig := filepath.Join(cp.Dir(), "admin.kubeconfig")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	const name = "explain-node-1"
	cp.CreateNode(t, name)
	nodeClient := cp.NodeClient(name)
	renew := startHeartbeat(ctx, t, nodeClient, name)
	setReady(ctx, t, nodeClient, name)

	out, stderr, code := nodekit(t, nil, "explain", "node", name, "--kubeconfig", kubeconfig, "--node-monitor-grace-period", grace.String())
	require.Equal(t, exitOK, code, "healthy node: stdout %s stderr %s", out, stderr)
	assert.Contains(t, out, "node/"+name+": NodeHealthy (healthy)")
	assert.Contains(t, out, "Lease kube-node-lease/"+name+" renewed")

	renew() // the kubelet goes quiet
	stopped := time.Now()
	require.Eventually(t, func() bool {
		n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
				return true
			}
		}
		return false
	}, 30*time.Second, 250*time.Millisecond, "the node lifecycle controller must mark the silent node Unknown")
	t.Logf("node Unknown %s after the last renewal", time.Since(stopped).Round(100*time.Millisecond))

	out, _, code = nodekit(t, nil, "explain", "node", name, "--kubeconfig", kubeconfig, "--node-monitor-grace-period", grace.String())
	t.Logf("explain node %s:\n%s", name, out)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "node/"+name+": KubeletSilent (NOT healthy)")
	assert.Contains(t, out, "The kubelet on "+name+" went quiet: its last heartbeat was")
	assert.Contains(t, out, "longer than the 10s grace period, so the node controller marked the node Unknown")
	assert.Contains(t, out, "containers may still be running and serving traffic")
	assert.Contains(t, out, `reason NodeStatusUnknown: "Kubelet stopped posting node status."`)

	js, _, code := nodekit(t, nil, "explain", "node", name, "--kubeconfig", kubeconfig, "--node-monitor-grace-period", grace.String(), "-o", "json")
	assert.Equal(t, exitUnhealthy, code)
	d := decodeDiagnosis(t, js)
	assert.Equal(t, "KubeletSilent", d["verdict"])
	assert.Equal(t, false, d["healthy"])

	out, _, code = nodekit(t, nil, "explain", "node", "no-such-node", "--kubeconfig", kubeconfig)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, `There is no Node named "no-such-node"`)
}

// TestExplainServiceOnRealControlPlane: a Service with no endpoints, then one whose only
// endpoint is not ready, then a ready one, read from a real API server.
func TestExplainServiceOnRealControlPlane(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	kubeconfig := filepath.Join(cp.Dir(), "admin.kubeconfig")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := cp.AdminClient()

	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	svc, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	require.NoError(t, err)

	out, _, code := nodekit(t, nil, "explain", "service", "default/web", "--kubeconfig", kubeconfig)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "service/default/web: NoEndpoints (NOT healthy)")
	assert.Contains(t, out, "has no endpoints, and no selector")
	assert.Contains(t, out, "connections to "+svc.Spec.ClusterIP+" fail at once (REJECT)")

	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.244.1.37"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}}},
	}
	slice, err = admin.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{})
	require.NoError(t, err)
	out, _, code = nodekit(t, nil, "explain", "svc", "default/web", "--kubeconfig", kubeconfig)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "EndpointsNotReady")
	assert.Contains(t, out, "1 endpoint(s) (10.244.1.37) but none is ready")

	slice.Endpoints[0].Conditions.Ready = ptr.To(true)
	_, err = admin.DiscoveryV1().EndpointSlices("default").Update(ctx, slice, metav1.UpdateOptions{})
	require.NoError(t, err)
	js, _, code := nodekit(t, nil, "explain", "service", "default/web", "--kubeconfig", kubeconfig, "-o", "json")
	assert.Equal(t, exitOK, code, js)
	d := decodeDiagnosis(t, js)
	assert.Equal(t, "ServiceHealthy", d["verdict"])
	assert.True(t, strings.Contains(d["summary"].(string), "1 ready endpoint(s) (10.244.1.37)"), d["summary"])

	out, _, code = nodekit(t, nil, "explain", "service", "default/nope", "--kubeconfig", kubeconfig)
	assert.Equal(t, exitUnhealthy, code)
	assert.Contains(t, out, "There is no Service default/nope.")
}

// startHeartbeat renews the node's Lease every second, as a kubelet would (faster than
// its 10s, so the test's grace period of 10s is a clear margin); the returned function
// stops it and waits.
func startHeartbeat(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) func() {
	t.Helper()
	leases := c.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: ptr.To(metav1.NewMicroTime(time.Now()))},
	}
	_, err := leases.Create(ctx, l, metav1.CreateOptions{})
	require.NoError(t, err)
	hbCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-hbCtx.Done():
				return
			case <-tick.C:
			}
			_ = retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := leases.Get(hbCtx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				cur.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
				_, err = leases.Update(hbCtx, cur, metav1.UpdateOptions{})
				return err
			})
		}
	}()
	var once bool
	t.Cleanup(func() {
		if !once {
			stop()
			<-done
		}
	})
	return func() { once = true; stop(); <-done }
}

// setReady writes the Ready=True condition a healthy kubelet posts.
func setReady(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		_, err = c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	require.NoError(t, err)
}
