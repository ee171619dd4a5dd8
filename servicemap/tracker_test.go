package servicemap_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/servicemap"
	smt "github.com/nodekit-dev/nodekit/servicemap/servicemaptest"
)

// logSink collects log lines so tests can assert that a reason was logged.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (l *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		l.lines = append(l.lines, args)
		l.mu.Unlock()
	}, funcr.Options{Verbosity: 4})
}

func (l *logSink) has(parts ...string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		return true
	}
	return false
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func nn(ns, name string) types.NamespacedName { return types.NamespacedName{Namespace: ns, Name: name} }

func TestServiceConversion(t *testing.T) {
	base := []smt.ServiceOption{smt.ClusterIPs("10.96.0.10"), smt.Port("http", 80, v1.ProtocolTCP)}
	with := func(extra ...smt.ServiceOption) []smt.ServiceOption {
		return append(append([]smt.ServiceOption(nil), base...), extra...)
	}
	tests := []struct {
		name string
		opts []smt.ServiceOption
		want string // Dump of the whole snapshot; "" when the Service is not proxied
	}{
		{"ClusterIP", base, "ns/svc:http TCP port=80 clusterIPs=10.96.0.10\n"},
		{"dual-stack keeps both families in spec order",
			[]smt.ServiceOption{smt.ClusterIPs("fd00::10", "10.96.0.10"), smt.Port("http", 80, v1.ProtocolTCP)},
			"ns/svc:http TCP port=80 clusterIPs=fd00::10,10.96.0.10\n"},
		{"unnamed port and empty protocol defaults to TCP",
			[]smt.ServiceOption{smt.ClusterIPs("10.96.0.10"), smt.Port("", 53, "")},
			"ns/svc TCP port=53 clusterIPs=10.96.0.10\n"},
		{"two protocols on one port name are two service ports",
			[]smt.ServiceOption{smt.ClusterIPs("10.96.0.10"), smt.Port("dns", 53, v1.ProtocolUDP), smt.Port("dns", 53, v1.ProtocolTCP)},
			"ns/svc:dns TCP port=53 clusterIPs=10.96.0.10\nns/svc:dns UDP port=53 clusterIPs=10.96.0.10\n"},
		{"NodePort", with(smt.NodePort("http", 30080)), "ns/svc:http TCP port=80 clusterIPs=10.96.0.10 nodePort=30080\n"},
		{"LoadBalancer VIPs, Proxy-mode ingress left out",
			with(smt.LoadBalancer("192.0.2.1", "2001:db8::1"), smt.ProxyIngress("192.0.2.9")),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 lbVIPs=192.0.2.1,2001:db8::1\n"},
		{"source ranges trimmed, invalid dropped",
			with(smt.LoadBalancer(), smt.SourceRanges(" 192.0.2.0/24 ", "bogus", "", "10.1.2.3/8")),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 sourceRanges=192.0.2.0/24,10.0.0.0/8\n"},
		{"external IPs, invalid dropped", with(smt.ExternalIPs("192.0.2.5", "nope", "", "010.0.0.1")),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 externalIPs=192.0.2.5,10.0.0.1\n"},
		{"ClientIP affinity defaults to 10800", with(smt.ClientIPAffinity(nil)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 affinity=ClientIP/10800\n"},
		{"ClientIP affinity timeout", with(smt.ClientIPAffinity(smt.Ptr[int32](60))),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 affinity=ClientIP/60\n"},
		{"external Local on NodePort: no health check port",
			with(smt.NodePort("http", 30080), smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal), smt.HealthCheckNodePort(31000)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 nodePort=30080 externalPolicy=Local\n"},
		{"external Local on LoadBalancer: health check port",
			with(smt.LoadBalancer("192.0.2.1"), smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal), smt.HealthCheckNodePort(31000)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 lbVIPs=192.0.2.1 externalPolicy=Local healthCheckNodePort=31000\n"},
		{"external Local on a ClusterIP Service without external IPs is ignored",
			with(smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10\n"},
		{"external Local on a ClusterIP Service with external IPs",
			with(smt.ExternalIPs("192.0.2.5"), smt.ExternalTrafficPolicy(v1.ServiceExternalTrafficPolicyLocal)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 externalIPs=192.0.2.5 externalPolicy=Local\n"},
		{"internal Local", with(smt.InternalTrafficPolicy(v1.ServiceInternalTrafficPolicyLocal)),
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10 internalPolicy=Local\n"},
		{"legacy Service without ipFamilies", []smt.ServiceOption{func(s *v1.Service) { s.Spec.ClusterIP = "10.96.0.11" }, smt.Port("http", 80, v1.ProtocolTCP)},
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.11\n"},
		{"headless Service skipped", []smt.ServiceOption{smt.ClusterIPs("None"), smt.Port("http", 80, v1.ProtocolTCP)}, ""},
		{"Service without cluster IP skipped", []smt.ServiceOption{smt.Port("http", 80, v1.ProtocolTCP)}, ""},
		{"ExternalName skipped", with(smt.Type(v1.ServiceTypeExternalName)), ""},
		{"service-proxy-name label skipped", with(smt.ServiceLabels(servicemap.LabelServiceProxyName, "other")), ""},
		{"invalid cluster IP skipped", []smt.ServiceOption{smt.ClusterIPs("10.96.0.300"), func(s *v1.Service) { s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol} }, smt.Port("http", 80, v1.ProtocolTCP)}, ""},
		{"cluster IP of the wrong family dropped",
			[]smt.ServiceOption{smt.ClusterIPs("10.96.0.10", "fd00::10"), func(s *v1.Service) { s.Spec.IPFamilies[1] = v1.IPv4Protocol }, smt.Port("http", 80, v1.ProtocolTCP)},
			"ns/svc:http TCP port=80 clusterIPs=10.96.0.10\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := servicemap.NewTracker(servicemap.Config{})
			tr.OnServiceAdd(smt.Service("ns", "svc", tt.opts...))
			assert.Equal(t, tt.want, tr.Consume().Snapshot.Dump())
		})
	}
}

func TestSourceRangesPerFamily(t *testing.T) {
	tr := servicemap.NewTracker(servicemap.Config{})
	tr.OnServiceAdd(smt.Service("ns", "svc", smt.ClusterIPs("10.96.0.10", "fd00::10"), smt.Port("", 80, v1.ProtocolTCP),
		smt.LoadBalancer("192.0.2.1", "2001:db8::1"), smt.SourceRanges("0.0.0.0/0", "2001:db8::/32", "192.0.2.0/24"), smt.ExternalIPs("2001:db8::5")))
	sp, ok := tr.Consume().Snapshot.Get(servicemap.ServicePortName{NamespacedName: nn("ns", "svc"), Protocol: v1.ProtocolTCP})
	require.True(t, ok)
	assert.Empty(t, sp.SourceRanges(v1.IPv4Protocol), "a zero prefix allows all in its family")
	assert.Equal(t, "[2001:db8::/32]", fmt.Sprint(sp.SourceRanges(v1.IPv6Protocol)))

	v6, ok := sp.ForFamily(v1.IPv6Protocol)
	require.True(t, ok)
	assert.Equal(t, "ns/svc TCP port=80 clusterIPs=fd00::10 externalIPs=2001:db8::5 lbVIPs=2001:db8::1 sourceRanges=2001:db8::/32\n", v6.Dump())
	v4, ok := sp.ForFamily(v1.IPv4Protocol)
	require.True(t, ok)
	assert.Equal(t, "ns/svc TCP port=80 clusterIPs=10.96.0.10 lbVIPs=192.0.2.1\n", v4.Dump())
	assert.True(t, v4.ExternallyAccessible())
}

func webService(opts ...smt.ServiceOption) *v1.Service {
	return smt.Service("ns", "web", append([]smt.ServiceOption{smt.ClusterIPs("10.96.0.10", "fd00::10"),
		smt.Port("http", 80, v1.ProtocolTCP), smt.Port("dns", 53, v1.ProtocolUDP)}, opts...)...)
}

func TestEndpointMerging(t *testing.T) {
	tests := []struct {
		name   string
		slices []*discovery.EndpointSlice
		want   string
		logged []string // substrings of one log line
	}{
		{
			name: "endpoints merged across slices and families, sorted",
			slices: []*discovery.EndpointSlice{
				smt.EndpointSlice("ns", "web-b", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.9", smt.OnNode("n1"), smt.InZone("z1"), smt.ZoneHints("z2", "z1")))),
				smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.10", smt.Ready(true)), smt.Endpoint("10.0.0.2,10.0.0.3", smt.TerminatingServing()))),
				smt.EndpointSlice("ns", "web-6", "web", discovery.AddressTypeIPv6, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("fd00::1", smt.NodeHints("n1")))),
			},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n" +
				"  10.0.0.2:8080 ready=false serving=true terminating=true\n" +
				"  10.0.0.9:8080 node=n1 zone=z1 zoneHints=z1,z2\n" +
				"  10.0.0.10:8080 ready=true\n" +
				"  [fd00::1]:8080 nodeHints=n1\n",
		},
		{
			name: "duplicate endpoint across slices: the non-terminating copy wins",
			slices: []*discovery.EndpointSlice{
				smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.1", smt.TerminatingServing(), smt.OnNode("old")))),
				smt.EndpointSlice("ns", "web-b", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.1", smt.OnNode("new")), smt.Endpoint("10.0.0.1", smt.OnNode("dup")))),
			},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n" +
				"  10.0.0.1:8080 node=new\n",
			logged: []string{"Merging duplicate endpoint", "ns/web:http", "10.0.0.1:8080"},
		},
		{
			name: "same address on two ports is not a duplicate",
			slices: []*discovery.EndpointSlice{
				smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.1"))),
				smt.EndpointSlice("ns", "web-b", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 9090, v1.ProtocolTCP),
					smt.Endpoints(smt.Endpoint("10.0.0.1"))),
			},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n" +
				"  10.0.0.1:8080\n  10.0.0.1:9090\n",
		},
		{
			name: "port with mismatched protocol is ignored",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4,
				smt.SlicePort("http", 8080, v1.ProtocolUDP), smt.SlicePort("dns", 5353, v1.ProtocolUDP), smt.Endpoints(smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n  10.0.0.1:5353\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n",
			logged: []string{"matches no port of its Service", "ns/web-a", `"portName"="http"`, `"protocol"="UDP"`},
		},
		{
			name: "port without a name is ignored",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4,
				smt.RawSlicePort(discovery.EndpointPort{Port: smt.Ptr[int32](8080), Protocol: smt.Ptr(v1.ProtocolTCP)}),
				smt.SlicePort("dns", 5353, v1.ProtocolUDP), smt.Endpoints(smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n  10.0.0.1:5353\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n",
			logged: []string{"port without a name", "ns/web-a"},
		},
		{
			name: "port without a number is ignored; nil protocol means TCP",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4,
				smt.RawSlicePort(discovery.EndpointPort{Name: smt.Ptr("http"), Port: smt.Ptr[int32](0)}),
				smt.RawSlicePort(discovery.EndpointPort{Name: smt.Ptr("http"), Port: smt.Ptr[int32](8081)}),
				smt.Endpoints(smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n  10.0.0.1:8081\n",
			logged: []string{"without a port number", "ns/web-a"},
		},
		{
			name: "bad addresses are skipped",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4,
				smt.SlicePort("http", 8080, v1.ProtocolTCP),
				smt.Endpoints(smt.Endpoint(""), smt.Endpoint("not-an-ip"), smt.Endpoint("10.0.0.256"), smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n  10.0.0.1:8080\n",
			logged: []string{"invalid address", "ns/web-a", "not-an-ip"},
		},
		{
			name: "mixed families in one slice: the wrong-family endpoint is skipped",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4,
				smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("fd00::1"), smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n  10.0.0.1:8080\n",
			logged: []string{"does not match the slice's addressType", "ns/web-a", "fd00::1"},
		},
		{
			name: "slice without the service-name label is skipped",
			slices: []*discovery.EndpointSlice{smt.EndpointSlice("ns", "orphan", "", discovery.AddressTypeIPv4,
				smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.0.0.1")))},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n",
			logged: []string{"Skipping EndpointSlice", "ns/orphan", "kubernetes.io/service-name", "invalid object"},
		},
		{
			name: "FQDN and headless slices are ignored",
			slices: []*discovery.EndpointSlice{
				smt.EndpointSlice("ns", "web-f", "web", discovery.AddressTypeFQDN, smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("example.com"))),
				smt.EndpointSlice("ns", "web-h", "web", discovery.AddressTypeIPv4, smt.SliceLabels(servicemap.LabelHeadless, ""),
					smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.0.0.1"))),
			},
			want: "ns/web:dns UDP port=53 clusterIPs=10.96.0.10,fd00::10\n" +
				"ns/web:http TCP port=80 clusterIPs=10.96.0.10,fd00::10\n",
			logged: []string{"unsupported addressType", "ns/web-f"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs logSink
			tr := servicemap.NewTracker(servicemap.Config{Logger: logs.logger()})
			// An unrelated Service must stay intact whatever happens to web.
			other := smt.Service("ns", "other", smt.ClusterIPs("10.96.0.99"), smt.Port("", 80, v1.ProtocolTCP))
			otherES := smt.EndpointSlice("ns", "other-1", "other", discovery.AddressTypeIPv4, smt.SlicePort("", 80, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint("10.1.0.1")))
			tr.OnServiceAdd(other)
			tr.OnEndpointSliceAdd(otherES)
			tr.OnServiceAdd(webService())
			for _, es := range tt.slices {
				tr.OnEndpointSliceAdd(es)
			}
			snap := tr.Consume().Snapshot
			var got strings.Builder
			for _, sp := range snap.Service(nn("ns", "web")) {
				got.WriteString(sp.Dump())
			}
			assert.Equal(t, tt.want, got.String())
			assert.Equal(t, "ns/other TCP port=80 clusterIPs=10.96.0.99\n  10.1.0.1:80\n", snap.Service(nn("ns", "other"))[0].Dump())
			if tt.logged != nil {
				assert.True(t, logs.has(tt.logged...), "want a log line with %q, got:\n%s", tt.logged, &logs)
			}
		})
	}
}

func TestChangeTracking(t *testing.T) {
	tr := servicemap.NewTracker(servicemap.Config{})
	http := servicemap.ServicePortName{NamespacedName: nn("ns", "web"), Port: "http", Protocol: v1.ProtocolTCP}
	dns := servicemap.ServicePortName{NamespacedName: nn("ns", "web"), Port: "dns", Protocol: v1.ProtocolUDP}
	slice := func(rv string, eps ...discovery.Endpoint) *discovery.EndpointSlice {
		return smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SliceResourceVersion(rv),
			smt.SlicePort("http", 8080, v1.ProtocolTCP), smt.Endpoints(eps...))
	}

	t.Run("slice before its Service is held, then reported with it", func(t *testing.T) {
		tr.OnEndpointSliceAdd(slice("1", smt.Endpoint("10.0.0.1")))
		u := tr.Consume()
		assert.Empty(t, u.Changed)
		assert.Equal(t, 0, u.Snapshot.Len())
		select {
		case <-tr.Pending():
		default:
			t.Fatal("Pending did not fire")
		}

		tr.OnServiceAdd(webService(smt.ServiceResourceVersion("1")))
		u = tr.Consume()
		assert.Equal(t, []servicemap.ServicePortName{dns, http}, u.Changed)
		assert.Equal(t, []types.NamespacedName{nn("ns", "web")}, u.ChangedServices)
		sp, ok := u.Snapshot.Get(http)
		require.True(t, ok)
		assert.Equal(t, "10.0.0.1:8080", sp.Endpoints[0].String())
	})

	var before *servicemap.Snapshot
	t.Run("an endpoint change reports only that port; old snapshots do not change", func(t *testing.T) {
		before = tr.Consume().Snapshot
		beforeDump := before.Dump()
		tr.OnEndpointSliceUpdate(nil, slice("2", smt.Endpoint("10.0.0.1", smt.Ready(false))))
		u := tr.Consume()
		assert.Equal(t, []servicemap.ServicePortName{http}, u.Changed)
		assert.Equal(t, beforeDump, before.Dump())
		sp, _ := u.Snapshot.Get(http)
		assert.Equal(t, servicemap.CondFalse, sp.Endpoints[0].Ready)
	})

	t.Run("resync and no-op updates report nothing", func(t *testing.T) {
		tr.OnEndpointSliceUpdate(nil, slice("2", smt.Endpoint("10.0.0.1", smt.Ready(false))))
		tr.OnServiceUpdate(nil, webService(smt.ServiceResourceVersion("1")))
		assert.Empty(t, tr.Consume().Changed)
		// A new resourceVersion with the same content is rebuilt but not reported.
		tr.OnServiceUpdate(nil, webService(smt.ServiceResourceVersion("7")))
		assert.Empty(t, tr.Consume().Changed)
	})

	t.Run("a change undone before Consume reports nothing", func(t *testing.T) {
		tr.OnEndpointSliceUpdate(nil, slice("3", smt.Endpoint("10.0.0.5")))
		tr.OnEndpointSliceUpdate(nil, slice("4", smt.Endpoint("10.0.0.1", smt.Ready(false))))
		assert.Empty(t, tr.Consume().Changed)
	})

	t.Run("Service update that removes a port", func(t *testing.T) {
		tr.OnServiceUpdate(nil, smt.Service("ns", "web", smt.ClusterIPs("10.96.0.10", "fd00::10"), smt.Port("http", 80, v1.ProtocolTCP)))
		u := tr.Consume()
		assert.Equal(t, []servicemap.ServicePortName{dns}, u.Changed)
		_, ok := u.Snapshot.Get(dns)
		assert.False(t, ok)
	})

	t.Run("Service deleted, slice kept; re-created Service gets the endpoints back", func(t *testing.T) {
		tr.OnServiceDelete(webService())
		u := tr.Consume()
		assert.Equal(t, []servicemap.ServicePortName{http}, u.Changed)
		assert.Equal(t, 0, u.Snapshot.Len())
		tr.OnServiceAdd(webService(smt.ServiceResourceVersion("9")))
		u = tr.Consume()
		sp, ok := u.Snapshot.Get(http)
		require.True(t, ok)
		assert.Len(t, sp.Endpoints, 1)
	})

	t.Run("slice relabelled to another Service leaves the first", func(t *testing.T) {
		tr.OnServiceAdd(smt.Service("ns", "api", smt.ClusterIPs("10.96.0.20"), smt.Port("http", 80, v1.ProtocolTCP)))
		tr.Consume()
		moved := slice("5", smt.Endpoint("10.0.0.1"))
		moved.Labels[discovery.LabelServiceName] = "api"
		tr.OnEndpointSliceUpdate(nil, moved)
		u := tr.Consume()
		apiHTTP := servicemap.ServicePortName{NamespacedName: nn("ns", "api"), Port: "http", Protocol: v1.ProtocolTCP}
		assert.Equal(t, []servicemap.ServicePortName{apiHTTP, http}, u.Changed)
		web, _ := u.Snapshot.Get(http)
		assert.Empty(t, web.Endpoints)
		api, _ := u.Snapshot.Get(apiHTTP)
		assert.Len(t, api.Endpoints, 1)
	})

	t.Run("slice that loses its label is removed", func(t *testing.T) {
		lost := slice("6", smt.Endpoint("10.0.0.1"))
		delete(lost.Labels, discovery.LabelServiceName)
		tr.OnEndpointSliceUpdate(nil, lost)
		u := tr.Consume()
		apiHTTP := servicemap.ServicePortName{NamespacedName: nn("ns", "api"), Port: "http", Protocol: v1.ProtocolTCP}
		assert.Equal(t, []servicemap.ServicePortName{apiHTTP}, u.Changed)
	})

	t.Run("deleting everything empties the map", func(t *testing.T) {
		tr.OnServiceDelete(webService())
		tr.OnServiceDelete(smt.Service("ns", "api"))
		tr.OnEndpointSliceDelete(slice("7"))
		u := tr.Consume()
		assert.Equal(t, 0, u.Snapshot.Len())
		assert.Equal(t, 0, u.Snapshot.Services())
		assert.Equal(t, "", u.Snapshot.Dump())
	})
}

func TestNilAndNamelessInput(t *testing.T) {
	var logs logSink
	tr := servicemap.NewTracker(servicemap.Config{Logger: logs.logger()})
	tr.OnServiceAdd(nil)
	tr.OnServiceUpdate(nil, nil)
	tr.OnServiceDelete(nil)
	tr.OnEndpointSliceAdd(nil)
	tr.OnEndpointSliceUpdate(nil, nil)
	tr.OnEndpointSliceDelete(nil)
	tr.OnServiceAdd(smt.Service("ns", "", smt.ClusterIPs("10.96.0.1"), smt.Port("", 80, v1.ProtocolTCP)))
	tr.OnEndpointSliceAdd(smt.EndpointSlice("ns", "", "web", discovery.AddressTypeIPv4))
	assert.Equal(t, 0, tr.Consume().Snapshot.Len())
	assert.True(t, logs.has("Skipping Service", "Service has no name"))
	assert.True(t, logs.has("Skipping EndpointSlice", "needs a name"))
}

type countingMetrics struct {
	mu                                  sync.Mutex
	services, slices, invalid, consumes int
	lastPending                         int
}

func (m *countingMetrics) ServiceChange()       { m.mu.Lock(); m.services++; m.mu.Unlock() }
func (m *countingMetrics) EndpointSliceChange() { m.mu.Lock(); m.slices++; m.mu.Unlock() }
func (m *countingMetrics) InvalidObject(string) { m.mu.Lock(); m.invalid++; m.mu.Unlock() }
func (m *countingMetrics) PendingServices(n int) {
	m.mu.Lock()
	m.lastPending = n
	m.mu.Unlock()
}
func (m *countingMetrics) Consumed(int, int, time.Duration) { m.mu.Lock(); m.consumes++; m.mu.Unlock() }

func TestMetrics(t *testing.T) {
	m := &countingMetrics{}
	tr := servicemap.NewTracker(servicemap.Config{Metrics: m})
	tr.OnServiceAdd(webService())
	tr.OnEndpointSliceAdd(smt.EndpointSlice("ns", "a", "web", discovery.AddressTypeIPv4))
	tr.OnEndpointSliceAdd(smt.EndpointSlice("ns", "b", "", discovery.AddressTypeIPv4))
	assert.Equal(t, 1, m.lastPending)
	tr.Consume()
	assert.Equal(t, 1, m.services)
	assert.Equal(t, 1, m.slices)
	assert.Equal(t, 1, m.invalid)
	assert.Equal(t, 1, m.consumes)
	assert.Equal(t, 0, m.lastPending)
}

// TestSnapshotReadersDuringUpdates reads one snapshot from several goroutines while
// the tracker keeps changing every service; under -race this checks that snapshots
// share nothing mutable, and the snapshot's content must not move.
func TestSnapshotReadersDuringUpdates(t *testing.T) {
	tr := servicemap.NewTracker(servicemap.Config{})
	mkSlice := func(i, v int) *discovery.EndpointSlice {
		return smt.EndpointSlice("ns", fmt.Sprintf("s%d-a", i), fmt.Sprintf("s%d", i), discovery.AddressTypeIPv4,
			smt.SlicePort("", 8080, v1.ProtocolTCP), smt.Endpoints(smt.Endpoint(fmt.Sprintf("10.0.%d.%d", i, v%200))))
	}
	for i := 0; i < 200; i++ {
		tr.OnServiceAdd(smt.Service("ns", fmt.Sprintf("s%d", i), smt.ClusterIPs(fmt.Sprintf("10.96.0.%d", i)), smt.Port("", 80, v1.ProtocolTCP)))
		tr.OnEndpointSliceAdd(mkSlice(i, 0))
	}
	snap := tr.Consume().Snapshot
	want := snap.Dump()
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 20; k++ {
				assert.Equal(t, want, snap.Dump())
			}
		}()
	}
	for v := 1; v < 30; v++ {
		for i := 0; i < 200; i += 3 {
			tr.OnEndpointSliceUpdate(nil, mkSlice(i, v))
		}
		u := tr.Consume()
		require.Len(t, u.ChangedServices, 67)
	}
	wg.Wait()
	assert.Equal(t, want, snap.Dump())
}

// The tracker converts objects on arrival and keeps none of them: once the caller
// drops a Service and its EndpointSlice they are collected, and the snapshot still
// answers. Endpoints in one place share their Topology.
func TestTrackerKeepsNoAPIObjects(t *testing.T) {
	tr := servicemap.NewTracker(servicemap.Config{})
	collected := make(chan string, 2)
	func() {
		svc := smt.Service("ns", "web", smt.ClusterIPs("10.96.0.10"), smt.Port("http", 80, v1.ProtocolTCP))
		es := smt.EndpointSlice("ns", "web-a", "web", discovery.AddressTypeIPv4, smt.SlicePort("http", 8080, v1.ProtocolTCP),
			smt.Endpoints(smt.Endpoint("10.0.0.1", smt.OnNode("n1"), smt.InZone("z1")), smt.Endpoint("10.0.0.2", smt.OnNode("n1"), smt.InZone("z1"))))
		runtime.AddCleanup(svc, func(kind string) { collected <- kind }, "Service")
		runtime.AddCleanup(es, func(kind string) { collected <- kind }, "EndpointSlice")
		tr.OnServiceAdd(svc)
		tr.OnEndpointSliceAdd(es)
	}()
	snap := tr.Consume().Snapshot
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 2 && time.Now().Before(deadline) {
		runtime.GC()
		select {
		case kind := <-collected:
			got = append(got, kind)
		case <-time.After(20 * time.Millisecond):
		}
	}
	assert.ElementsMatch(t, []string{"Service", "EndpointSlice"}, got, "objects still reachable from the tracker")

	sp, ok := snap.Get(servicemap.ServicePortName{NamespacedName: nn("ns", "web"), Port: "http", Protocol: v1.ProtocolTCP})
	require.True(t, ok)
	require.Len(t, sp.Endpoints, 2)
	assert.Equal(t, "10.0.0.1:8080 node=n1 zone=z1", sp.Endpoints[0].Dump())
	assert.Equal(t, "n1", sp.Endpoints[1].NodeName())
	assert.Equal(t, "z1", sp.Endpoints[1].Zone())
	assert.Same(t, sp.Endpoints[0].Topology, sp.Endpoints[1].Topology, "one Topology per place")
	runtime.KeepAlive(tr) // the tracker itself must stay alive for the check to mean anything
}
