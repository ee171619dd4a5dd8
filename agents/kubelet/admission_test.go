package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func withHostPort(name, ip string, proto corev1.Protocol, port int32) *corev1.Pod {
	p := podWith(name, "", "")
	p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: port, HostIP: ip, Protocol: proto}}
	return p
}

// The scheduler's predicates the kubelet runs again at admission, with the
// kubelet's reasons and messages (pkg/kubelet/lifecycle/predicate.go).
func TestAdmissionPredicates(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[k8stypes.UID]*podEntry{}}
	m.pods["uid-web"] = &podEntry{pod: withHostPort("web", "", "", 8080), admitted: true}
	m.pods["uid-dns"] = &podEntry{pod: withHostPort("dns", "10.0.0.1", corev1.ProtocolUDP, 53), admitted: true}

	const portsMsg = "Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports"
	for _, tc := range []struct {
		name   string
		pod    *corev1.Pod
		reason string
	}{
		{"same port, any IP, TCP by default", withHostPort("a", "", corev1.ProtocolTCP, 8080), "NodePorts"},
		{"same port on one IP meets the wildcard", withHostPort("b", "127.0.0.1", "", 8080), "NodePorts"},
		{"other protocol is free", withHostPort("c", "", corev1.ProtocolUDP, 8080), ""},
		{"wildcard meets a specific IP", withHostPort("d", "", corev1.ProtocolUDP, 53), "NodePorts"},
		{"other IP is free", withHostPort("e", "10.0.0.2", corev1.ProtocolUDP, 53), ""},
	} {
		reason, msg, ok := m.admit(tc.pod)
		assert.Equal(t, tc.reason, reason, tc.name)
		assert.Equal(t, tc.reason == "", ok, tc.name)
		if tc.reason == "NodePorts" {
			assert.Equal(t, portsMsg, msg, tc.name)
		}
	}

	// A finished pod frees its port.
	m.pods["uid-web"].pod.Status.Phase = corev1.PodSucceeded
	_, _, ok := m.admit(withHostPort("f", "", "", 8080))
	assert.True(t, ok, "the port of a finished pod is free")

	sel := podWith("selector", "", "")
	sel.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	reason, msg, ok := m.admit(sel)
	assert.False(t, ok)
	assert.Equal(t, "NodeAffinity", reason)
	assert.Equal(t, "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector", msg)
	ns.mu.Lock()
	ns.seen = &corev1.Node{}
	ns.seen.Name = ns.name
	ns.seen.Labels = map[string]string{"disk": "ssd"}
	ns.seen.Spec.Taints = []corev1.Taint{{Key: "maintenance", Effect: corev1.TaintEffectNoExecute}, {Key: "soft", Effect: corev1.TaintEffectNoSchedule}}
	ns.mu.Unlock()

	tainted := podWith("untolerated", "", "")
	tainted.Spec.NodeSelector = map[string]string{"disk": "ssd"}
	reason, msg, ok = m.admit(tainted)
	assert.False(t, ok, "the node's labels as last read decide; its NoExecute taint is not tolerated")
	assert.Equal(t, "TaintToleration", reason)
	assert.Equal(t, "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate", msg)
	tainted.Spec.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
	_, msg, ok = m.admit(tainted)
	assert.True(t, ok, "NoSchedule taints are the scheduler's, not the kubelet's: %s", msg)
	static := podWith("static", "", "")
	static.Annotations = map[string]string{"kubernetes.io/config.source": "file"}
	_, _, ok = m.admit(static)
	assert.True(t, ok, "static pods are not judged by taints")

	other := podWith("elsewhere", "", "")
	other.Spec.NodeName = "another-node"
	reason, _, _ = m.admit(other)
	assert.Equal(t, "NodeName", reason)

	osLabel := podWith("windows-label", "", "")
	osLabel.Labels = map[string]string{corev1.LabelOSStable: "windows"}
	reason, msg, _ = m.admit(osLabel)
	assert.Equal(t, "PodOSSelectorNodeLabelDoesNotMatch", reason)
	assert.Equal(t, "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label", msg)
	osField := podWith("windows-field", "", "")
	osField.Spec.OS = &corev1.PodOS{Name: corev1.Windows}
	reason, _, _ = m.admit(osField)
	assert.Equal(t, "PodOSNotSupported", reason)

	strict := corev1.SupplementalGroupsPolicyStrict
	sg := podWith("strict-groups", "", "")
	sg.Spec.SecurityContext = &corev1.PodSecurityContext{SupplementalGroupsPolicy: &strict}
	reason, msg, _ = m.admit(sg)
	assert.Equal(t, "SupplementalGroupsPolicyNotSupported", reason)
	assert.Equal(t, "SupplementalGroupsPolicy=Strict is not supported in this node", msg)
}
