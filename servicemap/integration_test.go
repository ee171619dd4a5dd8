package servicemap_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// TestIntegrationEndpointSliceController runs the Watcher and Tracker against a real
// kube-apiserver with kube-controller-manager's endpointslice controller: Pods bound
// to a Node, their status written through the status subresource as a kubelet
// would, and a Service selecting them. The map follows readiness changes,
// termination (a deleted Pod that still passes readiness becomes serving and
// terminating, and Select falls back to it) and deletion.
func TestIntegrationEndpointSliceController(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{ControllerManager: true})
	client := cp.AdminClient()
	const nodeName = "servicemap-node-1"
	cp.CreateNode(t, nodeName)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const ns = "default"

	// A Service the proxy must ignore, and a headless one, to exercise the filters.
	for _, svc := range []*v1.Service{
		{ObjectMeta: metav1.ObjectMeta{Name: "owned", Labels: map[string]string{servicemap.LabelServiceProxyName: "other"}},
			Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "headless"},
			Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone, Selector: map[string]string{"app": "web"}, Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
	} {
		_, err := client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
		require.NoError(t, err)
	}

	tracker := servicemap.NewTracker(servicemap.Config{Logger: testr.NewWithOptions(t, testr.Options{Verbosity: 2})})
	rec := &smt.Recorder{Next: tracker}
	w, err := servicemap.NewWatcher(servicemap.WatcherConfig{Client: client, Handler: rec})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	select {
	case <-w.Synced():
	case <-ctx.Done():
		t.Fatal("watcher did not sync")
	}

	web, err := client.CoreV1().Services(ns).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: v1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	httpPort := servicemap.ServicePortName{NamespacedName: types.NamespacedName{Namespace: ns, Name: "web"}, Port: "http", Protocol: v1.ProtocolTCP}

	for i, ip := range []string{"10.244.0.11", "10.244.0.12"} {
		createRunningPod(ctx, t, client, ns, fmt.Sprintf("web-%d", i+1), nodeName, ip)
	}

	// waitFor consumes updates until the web port's endpoint dump equals want.
	var last *servicemap.Snapshot
	waitFor := func(step, want string) *servicemap.ServicePort {
		t.Helper()
		begin := time.Now()
		for {
			u := tracker.Consume()
			last = u.Snapshot
			if sp, ok := u.Snapshot.Get(httpPort); ok && endpointsDump(sp) == want {
				t.Logf("%s: map matched %s after the API change", step, time.Since(begin).Round(time.Millisecond))
				return sp
			}
			select {
			case <-tracker.Pending():
			case <-time.After(200 * time.Millisecond):
			case <-ctx.Done():
				t.Fatalf("%s: timed out; want endpoints\n%s\nlast map:\n%s", step, want, last.Dump())
			}
		}
	}

	sp := waitFor("two ready pods",
		"10.244.0.11:8080 ready=true serving=true terminating=false node="+nodeName+"\n"+
			"10.244.0.12:8080 ready=true serving=true terminating=false node="+nodeName+"\n")
	require.Equal(t, []string{web.Spec.ClusterIP}, addrStrings(sp.ClusterIPs))
	sel := servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: nodeName})
	require.Equal(t, []string{"10.244.0.11:8080", "10.244.0.12:8080"}, endpointList(sel.Cluster))
	for _, name := range []string{"owned", "headless"} {
		require.Empty(t, last.Service(types.NamespacedName{Namespace: ns, Name: name}), "%s must not be in the map", name)
	}

	// Readiness lost on web-2.
	setPodReady(ctx, t, client, ns, "web-2", false)
	sp = waitFor("web-2 not ready",
		"10.244.0.11:8080 ready=true serving=true terminating=false node="+nodeName+"\n"+
			"10.244.0.12:8080 ready=false serving=false terminating=false node="+nodeName+"\n")
	require.Equal(t, []string{"10.244.0.11:8080"}, endpointList(servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: nodeName}).Cluster))

	// web-1 deleted with a grace period: no kubelet finishes it, so it stays
	// terminating while still passing readiness.
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: smt.Ptr[int64](300)}))
	sp = waitFor("web-1 terminating",
		"10.244.0.11:8080 ready=false serving=true terminating=true node="+nodeName+"\n"+
			"10.244.0.12:8080 ready=false serving=false terminating=false node="+nodeName+"\n")
	sel = servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: nodeName})
	require.True(t, sel.UsedServingTerminatingCluster)
	require.Equal(t, []string{"10.244.0.11:8080"}, endpointList(sel.Cluster))

	// Readiness back on web-2: ready endpoints win over the terminating one again.
	setPodReady(ctx, t, client, ns, "web-2", true)
	sp = waitFor("web-2 ready again",
		"10.244.0.11:8080 ready=false serving=true terminating=true node="+nodeName+"\n"+
			"10.244.0.12:8080 ready=true serving=true terminating=false node="+nodeName+"\n")
	require.Equal(t, []string{"10.244.0.12:8080"}, endpointList(servicemap.Select(sp, v1.IPv4Protocol, servicemap.Node{Name: nodeName}).Cluster))

	// web-1 gone for good.
	require.NoError(t, client.CoreV1().Pods(ns).Delete(ctx, "web-1", metav1.DeleteOptions{GracePeriodSeconds: smt.Ptr[int64](0)}))
	waitFor("web-1 deleted", "10.244.0.12:8080 ready=true serving=true terminating=false node="+nodeName+"\n")

	// The Service deleted: its port leaves the map.
	require.NoError(t, client.CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}))
	for {
		u := tracker.Consume()
		if _, ok := u.Snapshot.Get(httpPort); !ok {
			break
		}
		select {
		case <-tracker.Pending():
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("service deletion not seen; map:\n%s", u.Snapshot.Dump())
		}
	}
	// The Service filters keep both Services out; slices of the headless one carry
	// service.kubernetes.io/headless and stay out too. (Slices of "owned" do arrive,
	// as in kube-proxy, and are held without a Service.)
	for _, c := range rec.Calls() {
		require.NotContains(t, []string{"ServiceAdd default/owned", "ServiceAdd default/headless"}, c)
		require.False(t, strings.HasPrefix(c, "EndpointSlice") && strings.Contains(c, "/headless-"), "headless slice reached the handler: %s", c)
	}
}

func endpointsDump(sp *servicemap.ServicePort) string {
	var b strings.Builder
	for i := range sp.Endpoints {
		b.WriteString(sp.Endpoints[i].Dump())
		b.WriteString("\n")
	}
	return b.String()
}

func addrStrings[T fmt.Stringer](in []T) []string {
	out := make([]string, len(in))
	for i, a := range in {
		out[i] = a.String()
	}
	return out
}

func createRunningPod(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name, node, ip string) {
	t.Helper()
	pod, err := client.CoreV1().Pods(ns).Create(ctx, &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web"}},
		Spec: v1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: smt.Ptr(false),
			Containers: []v1.Container{{Name: "app", Image: "registry.invalid/app:1",
				Ports: []v1.ContainerPort{{ContainerPort: 8080}}}},
		},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	now := metav1.Now()
	pod.Status = v1.PodStatus{
		Phase:  v1.PodRunning,
		HostIP: "192.0.2.10", HostIPs: []v1.HostIP{{IP: "192.0.2.10"}},
		PodIP: ip, PodIPs: []v1.PodIP{{IP: ip}},
		StartTime: &now,
		Conditions: []v1.PodCondition{
			{Type: v1.PodScheduled, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.PodInitialized, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.ContainersReady, Status: v1.ConditionTrue, LastTransitionTime: now},
			{Type: v1.PodReady, Status: v1.ConditionTrue, LastTransitionTime: now},
		},
	}
	_, err = client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	require.NoError(t, err)
}

func setPodReady(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string, ready bool) {
	t.Helper()
	status := v1.ConditionFalse
	if ready {
		status = v1.ConditionTrue
	}
	for attempt := 0; ; attempt++ {
		pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		for i := range pod.Status.Conditions {
			if c := &pod.Status.Conditions[i]; c.Type == v1.PodReady || c.Type == v1.ContainersReady {
				c.Status = status
				c.LastTransitionTime = metav1.Now()
			}
		}
		_, err = client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			return
		}
		require.Less(t, attempt, 5, "update status of %s: %v", name, err)
	}
}
