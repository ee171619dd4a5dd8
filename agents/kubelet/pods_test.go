package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"
)

func testConfig(t *testing.T) *kubeletv1beta1.KubeletConfiguration {
	t.Helper()
	cfg, _, err := loadConfig("")
	require.NoError(t, err)
	return cfg
}

const hostResolv = "# host\nnameserver 192.168.0.1\nnameserver 192.168.0.2\nsearch corp.example lab.example\noptions edns0 ndots:2\n"

func TestDNSConfigAsTheKubelet(t *testing.T) {
	cfg := testConfig(t)
	cfg.ClusterDNS = []string{"10.96.0.10"}
	cfg.ClusterDomain = "cluster.local"
	b := &configBuilder{cfg: cfg, hostResolv: hostResolv}
	pod := func(policy corev1.DNSPolicy, hostNet bool, dc *corev1.PodDNSConfig) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "team"},
			Spec: corev1.PodSpec{DNSPolicy: policy, HostNetwork: hostNet, DNSConfig: dc}}
	}
	two := "2"
	tests := map[string]struct {
		pod  *corev1.Pod
		want *runtimeapi.DNSConfig
	}{
		"ClusterFirst": {pod("", false, nil), &runtimeapi.DNSConfig{
			Servers:  []string{"10.96.0.10"},
			Searches: []string{"team.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"},
			Options:  []string{"ndots:5"},
		}},
		"ClusterFirst on the host network is Default": {pod(corev1.DNSClusterFirst, true, nil), &runtimeapi.DNSConfig{
			Servers: []string{"192.168.0.1", "192.168.0.2"}, Searches: []string{"corp.example", "lab.example"}, Options: []string{"edns0", "ndots:2"},
		}},
		"ClusterFirstWithHostNet": {pod(corev1.DNSClusterFirstWithHostNet, true, nil), &runtimeapi.DNSConfig{
			Servers:  []string{"10.96.0.10"},
			Searches: []string{"team.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"},
			Options:  []string{"ndots:5"},
		}},
		"None with dnsConfig": {pod(corev1.DNSNone, false, &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"x.example"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: &two}},
		}), &runtimeapi.DNSConfig{Servers: []string{"1.1.1.1"}, Searches: []string{"x.example"}, Options: []string{"ndots:2"}}},
		"dnsConfig options override": {pod(corev1.DNSClusterFirst, false, &corev1.PodDNSConfig{
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: &two}, {Name: "single-request"}},
		}), &runtimeapi.DNSConfig{
			Servers:  []string{"10.96.0.10"},
			Searches: []string{"team.svc.cluster.local", "svc.cluster.local", "cluster.local", "corp.example", "lab.example"},
			Options:  []string{"ndots:2", "single-request"},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := b.dnsConfig(tc.pod)
			require.NoError(t, err)
			assert.Equal(t, tc.want.Servers, got.Servers)
			assert.Equal(t, tc.want.Searches, got.Searches)
			assert.Equal(t, tc.want.Options, got.Options)
		})
	}
}

type recordedEvent struct{ reason, message string }

type eventList []recordedEvent

func (l *eventList) Eventf(_ *corev1.Pod, _, reason, format string, args ...any) {
	*l = append(*l, recordedEvent{reason, format})
}

// Without clusterDNS, ClusterFirst falls back to the host's resolv.conf with the
// kubelet's MissingClusterDNS warning.
func TestDNSMissingClusterDNS(t *testing.T) {
	var events eventList
	b := &configBuilder{cfg: testConfig(t), hostResolv: hostResolv, events: &events}
	got, err := b.dnsConfig(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"192.168.0.1", "192.168.0.2"}, got.Servers)
	require.Len(t, events, 1)
	assert.Equal(t, "MissingClusterDNS", events[0].reason)
}

func podWith(name string, cpu, mem string) *corev1.Pod {
	req := corev1.ResourceList{}
	if cpu != "" {
		req[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		req[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: k8stypes.UID("uid-" + name)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: req}}}}}
}

func TestPodRequests(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	p := podWith("p", "500m", "")
	p.Spec.InitContainers = []corev1.Container{
		{Name: "big-init", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")}}},
		{Name: "sidecar", RestartPolicy: &always, Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}},
	}
	assert.Equal(t, int64(2000), podRequests(p, corev1.ResourceCPU), "an init container larger than the app containers sets the request")
	p.Spec.InitContainers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("100m")
	assert.Equal(t, int64(600), podRequests(p, corev1.ResourceCPU), "app containers plus the sidecar")
	p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")}
	assert.Equal(t, int64(650), podRequests(p, corev1.ResourceCPU))
}

func TestAdmission(t *testing.T) {
	ns, _, _ := newTestNode(t, fake.NewClientset(), &fakeRuntime{networkReady: true})
	ns.cfg.MaxPods = 2
	m := &podManager{cfg: podManagerConfig{node: ns}, pods: map[k8stypes.UID]*podEntry{}}
	admitted := func(p *corev1.Pod) {
		m.pods[p.UID] = &podEntry{pod: p, admitted: true}
	}
	// Capacity: 3 CPUs (3000m), 4096000Ki memory less 100Mi and 8Mi huge pages.
	reason, msg, ok := m.admit(podWith("fits", "2", "1Gi"))
	assert.True(t, ok, msg)
	assert.Empty(t, reason)
	admitted(podWith("fits", "2", "1Gi"))

	reason, msg, ok = m.admit(podWith("too-much-cpu", "1500m", ""))
	assert.False(t, ok)
	assert.Equal(t, "OutOfcpu", reason)
	assert.Equal(t, "Node didn't have enough resource: cpu, requested: 1500, used: 2000, capacity: 3000", msg)

	reason, _, ok = m.admit(podWith("too-much-memory", "", "4Gi"))
	assert.False(t, ok)
	assert.Equal(t, "OutOfmemory", reason)

	admitted(podWith("second", "", ""))
	reason, msg, ok = m.admit(podWith("third", "", ""))
	assert.False(t, ok)
	assert.Equal(t, "OutOfpods", reason)
	assert.Equal(t, "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2", msg)

	// Finished pods free their share.
	m.pods["uid-second"].pod.Status.Phase = corev1.PodSucceeded
	_, _, ok = m.admit(podWith("third", "", ""))
	assert.True(t, ok)
}

func TestPodChangedIgnoresStatus(t *testing.T) {
	a := podWith("p", "1", "")
	b := a.DeepCopy()
	b.Status.Phase = corev1.PodRunning
	b.ResourceVersion = "42"
	assert.False(t, podChanged(a, b), "a status-only update does not resync the pod")
	b.Labels = map[string]string{"x": "y"}
	assert.True(t, podChanged(a, b))
	c := a.DeepCopy()
	now := metav1.Now()
	c.DeletionTimestamp = &now
	assert.True(t, podChanged(a, c), "deletion wakes the worker")
}

func TestStatusManagerWritesOnlyChanges(t *testing.T) {
	pod := podWith("web", "", "")
	client := fake.NewClientset(pod)
	sm := newStatusManager(client, clocktesting.NewFakeClock(time.Now()))
	store := cache.NewStore(cache.MetaNamespaceKeyFunc)
	require.NoError(t, store.Add(pod))
	sm.setLister(store)
	ctx := context.Background()
	st := &corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}
	sm.write(ctx, pod, false, st)
	patches := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "patch" && a.GetSubresource() == "status" {
			patches++
			patch := a.(interface{ GetPatch() []byte }).GetPatch()
			var body map[string]any
			require.NoError(t, json.Unmarshal(patch, &body))
			assert.Equal(t, string(pod.UID), body["metadata"].(map[string]any)["uid"], "UID precondition in the patch")
		}
	}
	assert.Equal(t, 1, patches)
	// The API server now has it; the same status again is not written.
	updated, err := client.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	require.NoError(t, err)
	require.NoError(t, store.Update(updated))
	client.ClearActions()
	sm.write(ctx, pod, false, st.DeepCopy())
	assert.Empty(t, client.Actions())
	// A static pod without a mirror pod is not written.
	sm.write(ctx, podWith("static-node", "", ""), true, st)
	assert.Empty(t, client.Actions())
}

func TestHealthz(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHealth(clk)
	get := func() (int, string) {
		rec := httptest.NewRecorder()
		h.serve(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		return rec.Code, rec.Body.String()
	}
	code, body := get()
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok", body)
	clk.Step(3 * time.Minute)
	code, body = get()
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Contains(t, body, "syncloop failed")
	h.tick()
	code, _ = get()
	assert.Equal(t, http.StatusOK, code)
}
