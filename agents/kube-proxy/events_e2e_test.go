package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testEvents: the agent's events, as upstream's: the birth cry on its Node, and
// FailedToStartServiceHealthcheck on a Service whose healthCheckNodePort is
// already taken in the node's namespace.
func testEvents(t *testing.T, c *cluster) {
	t.Helper()
	ctx := context.Background()
	find := func(ns, reason, name string) *eventsv1.Event {
		var got *eventsv1.Event
		require.Eventually(t, func() bool {
			list, err := c.client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for i := range list.Items {
				e := &list.Items[i]
				if e.Reason == reason && e.Regarding.Name == name && e.ReportingController == kubeProxyComponent {
					got = e
					return true
				}
			}
			return false
		}, 30*time.Second, 100*time.Millisecond, "no %s event about %s in %q", reason, name, ns)
		return got
	}
	start := find(metav1.NamespaceDefault, "Starting", c.node)
	assert.Equal(t, "Node", start.Regarding.Kind)
	assert.Equal(t, corev1.EventTypeNormal, start.Type)
	assert.Equal(t, "StartKubeProxy", start.Action)

	// Something else holds the port on every address of the node.
	const port = 31990
	var ln net.Listener
	require.NoError(t, c.env.Node.Do(func() (err error) {
		ln, err = net.Listen("tcp", ":31990")
		return err
	}))
	defer ln.Close()
	svc := c.service("hc-taken", "web", corev1.ServiceTypeLoadBalancer, corev1.ProtocolTCP, 8084)
	svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	svc.Spec.HealthCheckNodePort = port
	_, err := c.client.CoreV1().Services(c.ns).Update(ctx, svc, metav1.UpdateOptions{})
	require.NoError(t, err)
	defer func() {
		assert.NoError(t, c.client.CoreV1().Services(c.ns).Delete(ctx, "hc-taken", metav1.DeleteOptions{}))
	}()
	ev := find(c.ns, "FailedToStartServiceHealthcheck", "hc-taken")
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Equal(t, "Listen", ev.Action)
	assert.True(t, strings.HasPrefix(ev.Note, "node "+c.node+` failed to start healthcheck "`+c.ns+`/hc-taken" on port 31990: `), ev.Note)
	assert.Contains(t, ev.Note, "address already in use")
}
