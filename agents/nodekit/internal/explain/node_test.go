package explain

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var now = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

func lease(name string, renewedAgo time.Duration) *coordinationv1.Lease {
	t := metav1.NewMicroTime(now.Add(-renewedAgo))
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-node-lease"}, Spec: coordinationv1.LeaseSpec{RenewTime: &t}}
}

func node(name string, conds ...corev1.NodeCondition) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: conds}}
}

func cond(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
	return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}
}

const cniMessage = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"

func TestDiagnoseNode(t *testing.T) {
	readyTrue := cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status")
	unknown := cond(corev1.NodeReady, corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status.")
	silentNode := node("node-1", unknown)
	added := metav1.NewTime(now.Add(-20 * time.Second))
	silentNode.Spec.Taints = []corev1.Taint{{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute, TimeAdded: &added}}
	healthyLocal := &NodeLocal{
		Kubelet: &HTTPCheck{URL: "http://127.0.0.1:10248/healthz", Status: 200, Body: "ok"},
		Runtime: &RuntimeCheck{Endpoint: "unix:///run/containerd/containerd.sock", RuntimeReady: true, NetworkReady: true},
		CNI:     &CNICheck{Dir: "/etc/cni/net.d", Files: []string{"10-bridge.conflist"}},
	}

	tests := []struct {
		name     string
		ev       NodeEvidence
		verdict  Verdict
		healthy  bool
		contains []string
		evidence []string
	}{
		{
			name:    "healthy",
			ev:      NodeEvidence{Name: "node-1", Node: node("node-1", readyTrue), Lease: lease("node-1", 3*time.Second), Local: healthyLocal},
			verdict: NodeHealthy, healthy: true,
			contains: []string{"node-1 is Ready", "renewed its Lease 3s ago"},
			evidence: []string{"Lease kube-node-lease/node-1 renewed 3s ago (grace period 50s)", "kubelet http://127.0.0.1:10248/healthz answered ok"},
		},
		{
			name:    "kubelet silent past the grace period",
			ev:      NodeEvidence{Name: "node-1", Node: silentNode, Lease: lease("node-1", 75*time.Second), Events: []corev1.Event{{Type: "Normal", Reason: "NodeNotReady", Message: "Node node-1 status is now: NodeNotReady", LastTimestamp: metav1.NewTime(now.Add(-20 * time.Second))}}},
			verdict: KubeletSilent,
			contains: []string{
				"The kubelet on node-1 went quiet: its last heartbeat was 1m15s ago, longer than the 50s grace period",
				"marked the node Unknown",
				"containers may still be running and serving traffic",
				"evicted in 4m40s",
			},
			evidence: []string{
				"condition Ready=Unknown reason NodeStatusUnknown: \"Kubelet stopped posting node status.\" since 1m0s ago",
				"event Normal NodeNotReady: Node node-1 status is now: NodeNotReady (20s ago)",
			},
		},
		{
			name:     "custom grace period: 12s silent is already too long at 10s",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", readyTrue), Lease: lease("node-1", 12*time.Second), GracePeriod: 10 * time.Second},
			verdict:  KubeletSilent,
			contains: []string{"last heartbeat was 12s ago, longer than the 10s grace period"},
		},
		{
			name:     "kubelet dead on the node while the runtime still answers",
			ev:       NodeEvidence{Name: "node-1", Node: silentNode, Lease: lease("node-1", 90*time.Second), Local: &NodeLocal{Kubelet: &HTTPCheck{URL: "http://127.0.0.1:10248/healthz", Err: "connection refused"}, Runtime: healthyLocal.Runtime}},
			verdict:  KubeletSilent,
			contains: []string{"went quiet", "The container runtime on the node still answers, so they very likely are."},
			evidence: []string{"kubelet http://127.0.0.1:10248/healthz does not answer: connection refused"},
		},
		{
			name:     "lease a little late but the kubelet answers on the node: not silent, the network is the problem",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage)), Lease: lease("node-1", 12*time.Second), GracePeriod: 10 * time.Second, Local: &NodeLocal{Kubelet: healthyLocal.Kubelet}},
			verdict:  NetworkNotReady,
			evidence: []string{"Lease kube-node-lease/node-1 last renewed 12s ago (at 2026-12-03T05:59:48Z), longer than the 10s grace period"},
		},
		{
			name:     "kubelet up on the node but not reaching the API server",
			ev:       NodeEvidence{Name: "node-1", Node: silentNode, Lease: lease("node-1", 2*time.Minute), Local: &NodeLocal{Kubelet: healthyLocal.Kubelet}},
			verdict:  KubeletSilent,
			contains: []string{"is running (its /healthz answers) but its heartbeats do not reach the API server", "2m0s ago"},
		},
		{
			name:     "eviction already under way",
			ev:       NodeEvidence{Name: "node-1", Node: withTaintAge(silentNode, 400*time.Second), Lease: lease("node-1", 450*time.Second)},
			verdict:  KubeletSilent,
			contains: []string{"toleration ran out 1m40s ago"},
		},
		{
			name:     "kubelet back, status not yet updated",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", unknown), Lease: lease("node-1", time.Second)},
			verdict:  KubeletSilent,
			contains: []string{"has just come back"},
		},
		{
			name:     "CNI not ready, as the seed's kubelet reports it (API only)",
			ev:       NodeEvidence{Name: "k8s-worker-2", Node: node("k8s-worker-2", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage)), Lease: lease("k8s-worker-2", 4*time.Second)},
			verdict:  NetworkNotReady,
			contains: []string{"its network is not ready", "CNI plugin", "Fix the network plugin and the node turns Ready on its own"},
			evidence: []string{`condition Ready=False reason KubeletNotReady: "` + cniMessage + `" since 1m0s ago`},
		},
		{
			name: "CNI not ready, seen on the node",
			ev: NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage)), Lease: lease("node-1", 4*time.Second), Local: &NodeLocal{
				Kubelet: healthyLocal.Kubelet,
				Runtime: &RuntimeCheck{Endpoint: "unix:///c.sock", RuntimeReady: true, NetworkReady: false, NetworkReason: "NetworkPluginNotReady", NetworkMessage: "Network plugin returns error: cni plugin not initialized"},
				CNI:     &CNICheck{Dir: "/etc/cni/net.d"},
			}},
			verdict:  NetworkNotReady,
			contains: []string{`("Network plugin returns error: cni plugin not initialized")`, "/etc/cni/net.d holds no CNI config"},
			evidence: []string{"CNI config folder /etc/cni/net.d is empty"},
		},
		{
			name:     "runtime down (API only)",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", "container runtime is down")), Lease: lease("node-1", 2*time.Second)},
			verdict:  RuntimeDown,
			contains: []string{"The container runtime on node-1 is down"},
		},
		{
			name:     "runtime unreachable on the node wins over the network",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage)), Lease: lease("node-1", 2*time.Second), Local: &NodeLocal{Kubelet: healthyLocal.Kubelet, Runtime: &RuntimeCheck{Endpoint: "unix:///c.sock", Err: "connection refused"}}},
			verdict:  RuntimeDown,
			evidence: []string{"container runtime unix:///c.sock does not answer: connection refused"},
		},
		{
			name:     "disk pressure while Ready",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", readyTrue, cond(corev1.NodeDiskPressure, corev1.ConditionTrue, "KubeletHasDiskPressure", "kubelet has disk pressure")), Lease: lease("node-1", time.Second)},
			verdict:  NodePressure,
			contains: []string{"node-1 is under disk pressure"},
		},
		{
			name:     "memory and PID pressure",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", readyTrue, cond(corev1.NodeMemoryPressure, corev1.ConditionTrue, "", ""), cond(corev1.NodePIDPressure, corev1.ConditionTrue, "", "")), Lease: lease("node-1", time.Second)},
			verdict:  NodePressure,
			contains: []string{"under memory pressure and PID pressure"},
		},
		{
			name:     "not ready for another reason",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", "PLEG is not healthy: pleg was last seen active 3m0s ago")), Lease: lease("node-1", time.Second)},
			verdict:  NodeNotReady,
			contains: []string{`the kubelet says "PLEG is not healthy`},
		},
		{
			name:     "registered, no status yet",
			ev:       NodeEvidence{Name: "node-1", Node: node("node-1")},
			verdict:  NodeNotReady,
			contains: []string{"has not reported a Ready condition yet"},
			evidence: []string{"no Lease in kube-node-lease: the kubelet has never sent a heartbeat"},
		},
		{
			name:     "no such node",
			ev:       NodeEvidence{Name: "ghost", Problems: []string{`nodes "ghost" not found`}},
			verdict:  NodeNotFound,
			contains: []string{`There is no Node named "ghost"`},
			evidence: []string{`nodes "ghost" not found`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := DiagnoseNode(tc.ev, now)
			assert.Equal(t, tc.verdict, d.Verdict, d.Summary)
			assert.Equal(t, tc.healthy, d.Healthy)
			for _, s := range tc.contains {
				assert.Contains(t, d.Summary, s)
			}
			for _, e := range tc.evidence {
				assert.Contains(t, d.Evidence, e)
			}
			assert.NotEmpty(t, d.Next, "every diagnosis names a next command")
		})
	}
}

func withTaintAge(n *corev1.Node, age time.Duration) *corev1.Node {
	n = n.DeepCopy()
	added := metav1.NewTime(now.Add(-age))
	n.Spec.Taints[0].TimeAdded = &added
	return n
}

func TestDiagnosisOutput(t *testing.T) {
	d := DiagnoseNode(NodeEvidence{Name: "node-1", Node: node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage)), Lease: lease("node-1", time.Second)}, now)
	var text bytes.Buffer
	require.NoError(t, d.WriteText(&text))
	assert.Contains(t, text.String(), "node/node-1: NetworkNotReady (NOT healthy)\n\nThe container runtime on node-1 is up")
	assert.Contains(t, text.String(), "\nEvidence:\n  - Lease kube-node-lease/node-1 renewed 1s ago")
	assert.Contains(t, text.String(), "\nNext:\n  $ ls -l /etc/cni/net.d")

	var js bytes.Buffer
	require.NoError(t, d.WriteJSON(&js))
	var back map[string]any
	require.NoError(t, json.Unmarshal(js.Bytes(), &back))
	assert.Equal(t, "NetworkNotReady", back["verdict"])
	assert.Equal(t, false, back["healthy"])
	assert.Equal(t, "node/node-1", back["object"])
}
