package explain

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/rules"
)

func service() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.12.7",
			Selector: map[string]string{"app": "web"},
			Ports:    []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

type ep struct {
	ip                          string
	ready, serving, terminating *bool
}

func slice(eps ...ep) discoveryv1.EndpointSlice {
	s := discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-abcde", Namespace: "default"}, AddressType: discoveryv1.AddressTypeIPv4}
	for i, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready, Serving: e.serving, Terminating: e.terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: "web-" + string(rune('a'+i))},
		})
	}
	return s
}

func endpoint(s string) rules.Endpoint {
	ap := netip.MustParseAddrPort(s)
	return rules.Endpoint{IP: ap.Addr(), Port: int(ap.Port())}
}

func TestDiagnoseService(t *testing.T) {
	healthyProxy := &ProxyHealth{URL: "http://127.0.0.1:10256/healthz", Status: 200, LastUpdated: now}
	inSync := &RulesCheck{Backend: "nftables table ip kube-proxy", Kernel: []rules.KernelService{{Dest: "10.96.12.7 . tcp . 80", Action: "dnat", Endpoints: []rules.Endpoint{endpoint("10.244.1.37:8080")}}}}
	// The seed's trap: kube-proxy died, pod 10.244.1.37 was replaced by 10.244.2.19, the
	// kernel still sends the ClusterIP to the old address.
	staleRules := &RulesCheck{Backend: "nftables table ip kube-proxy",
		Kernel: []rules.KernelService{{Dest: "10.96.12.7 . tcp . 80", Action: "dnat", Endpoints: []rules.Endpoint{endpoint("10.244.1.37:8080")}}},
		Drift: []rules.Drift{
			{Kind: rules.StaleEndpoint, Service: "default/web", Detail: "10.96.12.7 . tcp . 80 still goes to 10.244.1.37:8080"},
			{Kind: rules.MissingEndpoint, Service: "default/web", Detail: "10.96.12.7 . tcp . 80 never reaches 10.244.2.19:8080"},
		}}
	tests := []struct {
		name     string
		ev       ServiceEvidence
		verdict  Verdict
		healthy  bool
		contains []string
		evidence []string
	}{
		{
			name:    "healthy, rules fine",
			ev:      ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37", ready: ptr.To(true)})}, KubeProxy: healthyProxy, Rules: inSync},
			verdict: ServiceHealthy, healthy: true,
			contains: []string{"default/web has 1 ready endpoint(s) (10.244.1.37)", "send 10.96.12.7 to exactly those endpoints"},
			evidence: []string{"kernel rule (nftables table ip kube-proxy): 10.96.12.7 . tcp . 80 -> dnat 10.244.1.37:8080", "kube-proxy http://127.0.0.1:10256/healthz answered 200 (rules in sync)"},
		},
		{
			name:     "healthy from the API alone; nil ready means ready",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37"}, ep{ip: "10.244.2.19", ready: ptr.To(false)})}},
			verdict:  ServiceHealthy,
			healthy:  true,
			contains: []string{"1 ready endpoint(s) (10.244.1.37)", "not checked", "1 more endpoint(s) are not ready"},
			evidence: []string{"endpoint 10.244.2.19 (pod web-b) ready=false serving=false terminating=false"},
		},
		{
			name:     "no endpoints",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), KubeProxy: healthyProxy},
			verdict:  ServiceNoEndpoints,
			contains: []string{"no pod matches its selector app=web", "(REJECT)"},
		},
		{
			name:     "no endpoints and no selector",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: func() *corev1.Service { s := service(); s.Spec.Selector = nil; return s }()},
			verdict:  ServiceNoEndpoints,
			contains: []string{"and no selector"},
		},
		{
			name:     "endpoints not ready (one terminating but serving)",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37", ready: ptr.To(false)}, ep{ip: "10.244.2.19", ready: ptr.To(false), serving: ptr.To(true), terminating: ptr.To(true)})}, KubeProxy: healthyProxy},
			verdict:  ServiceEndpointsNotReady,
			contains: []string{"2 endpoint(s) (10.244.1.37, 10.244.2.19) but none is ready"},
			evidence: []string{"endpoint 10.244.2.19 (pod web-b) ready=false serving=true terminating=true"},
		},
		{
			name:    "kube-proxy dead, stale rules: the seed's blackhole",
			ev:      ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.2.19", ready: ptr.To(true)})}, KubeProxy: &ProxyHealth{URL: "http://127.0.0.1:10256/healthz", Err: "connection refused"}, Rules: staleRules},
			verdict: KubeProxyDown,
			contains: []string{
				"kube-proxy on this node is not running",
				"still send connections to 10.244.1.37, which no EndpointSlice lists any more",
				"the ready endpoint(s) 10.244.2.19 get no traffic through 10.96.12.7",
				"Every pod still reads Running",
			},
			evidence: []string{"drift: stale-endpoint default/web: 10.96.12.7 . tcp . 80 still goes to 10.244.1.37:8080", "kube-proxy http://127.0.0.1:10256/healthz does not answer: connection refused"},
		},
		{
			name:     "kube-proxy stale (503) with its last sync time",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.2.19"})}, KubeProxy: &ProxyHealth{URL: "u", Status: 503, LastUpdated: now.Add(-2 * time.Minute)}, Rules: staleRules},
			verdict:  KubeProxyStale,
			contains: []string{"answers 503), last in sync 2m0s ago", "10.244.1.37"},
		},
		{
			name:     "kube-proxy dead, rules not read",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.2.19"})}, KubeProxy: &ProxyHealth{URL: "u", Err: "refused"}},
			verdict:  KubeProxyDown,
			contains: []string{"any pod replaced since then is unreachable through 10.96.12.7"},
		},
		{
			name:     "kube-proxy dead, rules still right",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37"})}, KubeProxy: &ProxyHealth{URL: "u", Err: "refused"}, Rules: inSync},
			verdict:  KubeProxyDown,
			contains: []string{"still match the endpoints, so traffic flows for now"},
		},
		{
			name:     "no rule at all",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37"})}, KubeProxy: healthyProxy, Rules: &RulesCheck{Backend: "b", Drift: []rules.Drift{{Kind: rules.MissingService, Service: "default/web", Detail: "no rule for 10.96.12.7 . tcp . 80"}}}},
			verdict:  RulesDrift,
			contains: []string{"no rule at all for 10.96.12.7"},
			evidence: []string{"kernel rules (b): no rule for this Service"},
		},
		{
			name:     "rules reject although endpoints are ready",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37"})}, KubeProxy: healthyProxy, Rules: &RulesCheck{Backend: "b", Kernel: []rules.KernelService{{Dest: "10.96.12.7 . tcp . 80", Action: "reject"}}, Drift: []rules.Drift{{Kind: rules.WrongVerdict, Service: "default/web", Detail: `10.96.12.7 . tcp . 80 has endpoints but the kernel answers "goto reject-chain"`}}}},
			verdict:  RulesDrift,
			contains: []string{`10.96.12.7 . tcp . 80 has endpoints but the kernel answers "goto reject-chain"`},
		},
		{
			name:     "kube-proxy dead, service rejected although endpoints exist",
			ev:       ServiceEvidence{Namespace: "default", Name: "web", Service: service(), Slices: []discoveryv1.EndpointSlice{slice(ep{ip: "10.244.1.37"})}, KubeProxy: &ProxyHealth{URL: "u", Err: "refused"}, Rules: &RulesCheck{Backend: "b", Drift: []rules.Drift{{Kind: rules.WrongVerdict, Service: "default/web", Detail: "has endpoints but the kernel answers reject"}}}},
			verdict:  KubeProxyDown,
			contains: []string{"no longer match its endpoints: has endpoints but the kernel answers reject."},
		},
		{
			name:    "ExternalName",
			ev:      ServiceEvidence{Namespace: "default", Name: "web", Service: &corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.org"}}},
			verdict: ServiceHealthy, healthy: true,
			contains: []string{"CNAME for example.org"},
		},
		{
			name:     "not found",
			ev:       ServiceEvidence{Namespace: "default", Name: "nope"},
			verdict:  ServiceNotFound,
			contains: []string{"There is no Service default/nope."},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := DiagnoseService(tc.ev, now)
			assert.Equal(t, tc.verdict, d.Verdict, d.Summary)
			assert.Equal(t, tc.healthy, d.Healthy)
			for _, s := range tc.contains {
				assert.Contains(t, d.Summary, s)
			}
			for _, e := range tc.evidence {
				assert.Contains(t, d.Evidence, e)
			}
			assert.NotEmpty(t, d.Next)
		})
	}
}
