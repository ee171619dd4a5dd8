package explain

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
	"github.com/nodekit-dev/nodekit/rules"
)

func TestGatherNodeLocal(t *testing.T) {
	n := node("node-1", cond(corev1.NodeReady, corev1.ConditionFalse, "KubeletNotReady", cniMessage))
	client := fake.NewClientset(n, lease("node-1", time.Second))
	kubelet := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))
	defer kubelet.Close()
	rt := fakeruntime.New()
	rt.NetworkNotReady()
	srv, err := rt.Serve(filepath.Join(t.TempDir(), "cri.sock"))
	require.NoError(t, err)
	defer srv.Stop()
	cni := t.TempDir()

	ev := GatherNode(context.Background(), "node-1", NodeOptions{Client: client, KubeletHealthzURL: kubelet.URL + "/healthz", RuntimeEndpoint: srv.Endpoint(), CNIConfDir: cni})
	require.NotNil(t, ev.Node)
	require.NotNil(t, ev.Lease)
	require.NotNil(t, ev.Local)
	assert.True(t, ev.Local.Kubelet.OK())
	assert.True(t, ev.Local.Runtime.RuntimeReady)
	assert.False(t, ev.Local.Runtime.NetworkReady)
	assert.Equal(t, "NetworkPluginNotReady", ev.Local.Runtime.NetworkReason)
	assert.Empty(t, ev.Local.CNI.Files)
	assert.Equal(t, NetworkNotReady, DiagnoseNode(ev, now).Verdict)

	require.NoError(t, os.WriteFile(filepath.Join(cni, "10-bridge.conflist"), []byte("{}"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(cni, "README"), []byte("not a config"), 0o644))
	srv.Stop()
	kubelet.Close()
	ev = GatherNode(context.Background(), "node-1", NodeOptions{Client: client, KubeletHealthzURL: kubelet.URL + "/healthz", RuntimeEndpoint: srv.Endpoint(), CNIConfDir: cni})
	assert.NotEmpty(t, ev.Local.Kubelet.Err, "a closed kubelet must read as not answering")
	assert.NotEmpty(t, ev.Local.Runtime.Err, "a stopped runtime must read as not answering")
	assert.Equal(t, []string{"10-bridge.conflist"}, ev.Local.CNI.Files)
	// The kubelet not answering on its own node outranks what the runtime says.
	assert.Equal(t, KubeletSilent, DiagnoseNode(ev, now).Verdict)

	ev = GatherNode(context.Background(), "ghost", NodeOptions{Client: client})
	assert.Nil(t, ev.Node)
	assert.Nil(t, ev.Local)
	assert.Equal(t, NodeNotFound, DiagnoseNode(ev, now).Verdict)
}

type fakeRules struct {
	kernel  []rules.KernelService
	gotSt   *rules.State
	drift   []rules.Drift
	readErr error
}

func (f *fakeRules) ReadBack(context.Context) ([]rules.KernelService, error) {
	return f.kernel, f.readErr
}

func (f *fakeRules) Trace(_ context.Context, p rules.Packet) (*rules.TraceResult, error) {
	return &rules.TraceResult{Verdict: "DNAT", Candidates: []rules.Endpoint{endpoint("10.244.1.37:8080")}, Path: []string{"nat-prerouting", "services", p.Src.String()}}, nil
}

func (f *fakeRules) Drift(_ context.Context, st *rules.State) ([]rules.Drift, error) {
	f.gotSt = st
	return f.drift, nil
}

func TestGatherService(t *testing.T) {
	svc := service()
	svc.Spec.Ports[0].Name = "http"
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.2.19"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{"10.244.2.20"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
		},
	}
	other := sl.DeepCopy()
	other.Name, other.Labels = "other-1", map[string]string{discoveryv1.LabelServiceName: "other"}
	client := fake.NewClientset(svc, sl, other)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		// kube-proxy prints its times with time.Time.String, monotonic reading included.
		fmt.Fprint(w, `{"lastUpdated": "2026-12-03 05:58:00.5 +0000 UTC m=+12.000000001","currentTime": "2026-12-03 06:00:00 +0000 UTC", "nodeEligible": true}`)
	}))
	defer proxy.Close()
	fr := &fakeRules{
		kernel: []rules.KernelService{
			{Dest: "10.96.12.7 . tcp . 80", Action: "dnat", Endpoints: []rules.Endpoint{endpoint("10.244.1.37:8080")}},
			{Dest: "10.96.0.1 . tcp . 443", Action: "dnat"},
		},
		drift: []rules.Drift{
			{Kind: rules.StaleEndpoint, Service: "default/web:http", Detail: "10.96.12.7 . tcp . 80 still goes to 10.244.1.37:8080"},
			{Kind: rules.UnexpectedService, Service: "10.96.0.1 . tcp . 443", Detail: "the kernel answers goto x"},
		},
	}
	ev := GatherService(context.Background(), "default", "web", ServiceOptions{Client: client, KubeProxyHealthzURL: proxy.URL, Rules: fr, RulesBackend: "fake", TraceFrom: netip.MustParseAddr("10.244.2.5")})
	require.NotNil(t, ev.Service)
	require.Len(t, ev.Slices, 1, "only the Service's own slices")
	assert.Equal(t, 503, ev.KubeProxy.Status)
	assert.Equal(t, time.Date(2026, 12, 3, 5, 58, 0, 500_000_000, time.UTC), ev.KubeProxy.LastUpdated.UTC())
	require.NotNil(t, fr.gotSt)
	require.Len(t, fr.gotSt.Services, 1)
	assert.Equal(t, []rules.Endpoint{endpoint("10.244.2.19:8080")}, fr.gotSt.Services[0].Endpoints, "desired endpoints are the ready ones at the slice's port")
	assert.Equal(t, "http", fr.gotSt.Services[0].PortName)
	require.Len(t, ev.Rules.Kernel, 1, "only this Service's cluster IP")
	require.Len(t, ev.Rules.Drift, 1, "other Services' drift is left out")
	assert.Equal(t, []string{"trace 10.244.2.5 -> 10.96.12.7:80/TCP: DNAT to one of 10.244.1.37:8080 via nat-prerouting > services > 10.244.2.5"}, ev.Rules.Traces)
	d := DiagnoseService(ev, now)
	assert.Equal(t, KubeProxyStale, d.Verdict)
	assert.Contains(t, d.Summary, "last in sync 2m0s ago")
	assert.Contains(t, d.Summary, "10.244.1.37")

	fr.readErr = errors.New("nft: permission denied")
	ev = GatherService(context.Background(), "default", "web", ServiceOptions{Client: client, Rules: fr, RulesBackend: "fake"})
	assert.Equal(t, "nft: permission denied", ev.Rules.Err)
}

func TestParseGoTime(t *testing.T) {
	want := time.Date(2026, 12, 3, 5, 58, 0, 500_000_000, time.UTC)
	for _, s := range []string{"2026-12-03 05:58:00.5 +0000 UTC m=+12.000000001", "2026-12-03 05:58:00.5 +0000 UTC", "2026-12-03T05:58:00.5Z"} {
		assert.True(t, want.Equal(parseGoTime(s)), s)
	}
	assert.True(t, parseGoTime("yesterday").IsZero())
}

func TestDesiredStateFallsBackToServingTerminating(t *testing.T) {
	svc := service()
	sl := discoveryv1.EndpointSlice{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(""), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.244.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(true), Terminating: ptr.To(true)}},
			{Addresses: []string{"10.244.1.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(true)}},
		},
	}
	st, err := DesiredState(svc, []discoveryv1.EndpointSlice{sl})
	require.NoError(t, err)
	assert.Equal(t, []rules.Endpoint{endpoint("10.244.1.1:8080")}, st.Services[0].Endpoints)

	svc.Spec.ClusterIP = "None"
	_, err = DesiredState(svc, nil)
	assert.ErrorContains(t, err, `service default/web: cluster IP "None" is not an IPv4 address`)
}
