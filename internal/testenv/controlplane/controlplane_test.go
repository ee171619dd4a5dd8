package controlplane_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// TestSelf checks what every API-server test relies on: /readyz answers, and a node
// identity is judged as a kubelet's is: it may create its own Lease and is forbidden
// another node's.
func TestSelf(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	body, err := cp.AdminClient().Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	require.NoError(t, err)
	assert.Equal(t, "ok", string(body))

	version, err := cp.AdminClient().Discovery().ServerVersion()
	require.NoError(t, err)
	assert.Equal(t, "v1.37.2", version.GitVersion)

	cp.CreateNode(t, "node-a")
	nodeA := cp.NodeClient("node-a")

	own := lease("node-a")
	created, err := nodeA.CoordinationV1().Leases("kube-node-lease").Create(ctx, own, metav1.CreateOptions{})
	require.NoError(t, err, "a node must be allowed to create its own lease")
	assert.Equal(t, "node-a", *created.Spec.HolderIdentity)

	_, err = nodeA.CoordinationV1().Leases("kube-node-lease").Create(ctx, lease("node-b"), metav1.CreateOptions{})
	require.Error(t, err)
	assert.True(t, apierrors.IsForbidden(err), "creating another node's lease must be Forbidden, got %v", err)

	// The admin creates node-b's lease; node-a may still not change it.
	other, err := cp.AdminClient().CoordinationV1().Leases("kube-node-lease").Create(ctx, lease("node-b"), metav1.CreateOptions{})
	require.NoError(t, err)
	other.Spec.LeaseDurationSeconds = ptr.To[int32](1)
	_, err = nodeA.CoordinationV1().Leases("kube-node-lease").Update(ctx, other, metav1.UpdateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "updating another node's lease must be Forbidden, got %v", err)

	// NodeRestriction: node-a may not register a Node under another name.
	_, err = nodeA.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, metav1.CreateOptions{})
	assert.True(t, apierrors.IsForbidden(err), "creating another Node must be Forbidden, got %v", err)
}

// TestControllerManagerMarksSilentNodeUnknown checks the harness runs the node lifecycle
// controller at the short grace period: a node that posted Ready once and renewed its
// lease once goes Unknown (reason NodeStatusUnknown) soon after the grace period.
func TestControllerManagerMarksSilentNodeUnknown(t *testing.T) {
	const grace = 5 * time.Second
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true, NodeMonitorGracePeriod: grace})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cp.CreateNode(t, "silent")
	client := cp.NodeClient("silent")
	_, err := client.CoordinationV1().Leases("kube-node-lease").Create(ctx, lease("silent"), metav1.CreateOptions{})
	require.NoError(t, err)
	// A status patch, not Get+UpdateStatus: the node lifecycle controller may add the
	// not-ready taint in between, and NodeRestriction refuses a node's write that would
	// drop a taint it did not see.
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
	}}}})
	require.NoError(t, err)
	_, err = client.CoreV1().Nodes().PatchStatus(ctx, "silent", patch)
	require.NoError(t, err)
	silentSince := time.Now()

	var ready *corev1.NodeCondition
	require.Eventually(t, func() bool {
		node, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, "silent", metav1.GetOptions{})
		if err != nil {
			return false
		}
		for i := range node.Status.Conditions {
			if node.Status.Conditions[i].Type == corev1.NodeReady {
				ready = &node.Status.Conditions[i]
			}
		}
		return ready != nil && ready.Status == corev1.ConditionUnknown
	}, 3*grace+5*time.Second, 200*time.Millisecond, "Ready never went Unknown; last: %+v", ready)
	assert.Equal(t, "NodeStatusUnknown", ready.Reason)
	assert.Equal(t, "Kubelet stopped posting node status.", ready.Message)
	t.Logf("Ready went Unknown %s after the last heartbeat (grace %s)", time.Since(silentSince).Round(100*time.Millisecond), grace)
}

func lease(node string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: "kube-node-lease"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(node),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
}

// TestClusterEgress checks the "cluster" egress: kube-apiserver reaches a node's
// kubelet through the harness's CONNECT proxy, which dials with the test's function
// (here: to a local HTTPS server standing in for the kubelet), asking for the node's
// InternalIP and kubelet port as the Node says them.
func TestClusterEgress(t *testing.T) {
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "kubelet says "+r.URL.Path)
	}))
	defer kubelet.Close()
	var mu sync.Mutex
	var asked []string
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: func(ctx context.Context, address string) (net.Conn, error) {
		mu.Lock()
		asked = append(asked, address)
		mu.Unlock()
		var d net.Dialer
		return d.DialContext(ctx, "tcp", kubelet.Listener.Addr().String())
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	node := cp.CreateNode(t, "egress-node")
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.77"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = 10250
	_, err := cp.AdminClient().CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	body, err := cp.AdminClient().CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/egress-node/proxy/healthz").DoRaw(ctx)
	require.NoError(t, err, "%s", body)
	assert.Equal(t, "kubelet says /healthz", string(body))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"192.0.2.77:10250"}, asked)
}
