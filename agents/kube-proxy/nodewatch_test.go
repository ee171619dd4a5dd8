package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2"
)

func TestHostIPs(t *testing.T) {
	n := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		{Type: corev1.NodeInternalIP, Address: "fd00::5"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.5"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.6"},
	}}}
	assert.Equal(t, []string{"fd00::5", "192.0.2.5"}, hostIPs(n), "first InternalIP of each family, in order")
	n.Status.Addresses = n.Status.Addresses[:3]
	assert.Equal(t, []string{"fd00::5", "203.0.113.5"}, hostIPs(n), "the other family may come from an ExternalIP")
	n.Status.Addresses = n.Status.Addresses[:2]
	assert.Equal(t, []string{"203.0.113.5"}, hostIPs(n), "ExternalIP when no InternalIP")
	assert.Nil(t, hostIPs(&corev1.Node{}))
}

func TestNodeWatchReportsIPChange(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{corev1.LabelTopologyZone: "a"}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.5"}}}}
	client := fake.NewClientset(node)
	nw := newNodeWatch(client, "n1", 0)
	var mu sync.Mutex
	var changes [][]string
	var labels []string
	nw.onIPsChanged = func(old, new []string) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, old, new)
	}
	nw.onChange = func(n *corev1.Node) {
		mu.Lock()
		defer mu.Unlock()
		labels = append(labels, n.Labels[corev1.LabelTopologyZone])
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = nw.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	got := nw.waitForIPs(ctx, klog.Background(), time.Second)
	require.NotNil(t, got)
	assert.Equal(t, "n1", got.Name)

	node.Labels[corev1.LabelTopologyZone] = "b"
	_, err := client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(labels) >= 2 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.Empty(t, changes, "a label change is not an IP change")
	mu.Unlock()

	node.Status.Addresses[0].Address = "192.0.2.9"
	_, err = client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(changes) == 2 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	assert.Equal(t, [][]string{{"192.0.2.5"}, {"192.0.2.9"}}, changes)
	mu.Unlock()
}
