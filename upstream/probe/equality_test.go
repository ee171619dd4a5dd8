// Package probe compares nodekit's probe package with the kubelet's own probers
// (k8s.io/kubernetes/pkg/probe/{http,tcp,grpc} v1.37.2) against the same servers.
package probe

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	upgrpc "k8s.io/kubernetes/pkg/probe/grpc"
	uphttp "k8s.io/kubernetes/pkg/probe/http"
	uptcp "k8s.io/kubernetes/pkg/probe/tcp"

	"github.com/nodekit-dev/nodekit/probe"
)

type behaviour struct {
	name string
	spec *corev1.Probe
	host string
}

func httpGet(port int, path string, mod ...func(*corev1.HTTPGetAction)) *corev1.Probe {
	h := &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}
	for _, f := range mod {
		f(h)
	}
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: h}, TimeoutSeconds: 1}
}

func https(h *corev1.HTTPGetAction) { h.Scheme = corev1.URISchemeHTTPS }

func header(k, v string) func(*corev1.HTTPGetAction) {
	return func(h *corev1.HTTPGetAction) {
		h.HTTPHeaders = append(h.HTTPHeaders, corev1.HTTPHeader{Name: k, Value: v})
	}
}

func tcpSocket(port int) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}, TimeoutSeconds: 1}
}

func grpcCheck(port int, service string) *corev1.Probe {
	g := &corev1.GRPCAction{Port: int32(port)}
	if service != "" {
		g.Service = &service
	}
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: g}, TimeoutSeconds: 1}
}

func behaviours(t testing.TB) []behaviour {
	host, port, tlsPort := newHTTPServers(t)
	rawHost, hangPort := raw(t, hang)
	_, closePort := raw(t, acceptClose)
	_, garbagePort := raw(t, garbage)
	_, dribbleStatusPort := raw(t, dribbleStatus)
	_, dribbleBodyPort := raw(t, dribbleBody)
	_, endlessPort := raw(t, endless)
	_, hugePort := raw(t, hugeHeaders)
	_, noRespPort := raw(t, noResponse)
	refused := closedPort(t)
	gHost, gPort := grpcSrv(t, "health")
	_, gHangPort := grpcSrv(t, "hang")
	_, gBarePort := grpcSrv(t, "bare")

	b := []behaviour{
		{"http 200", httpGet(port, "/ok"), host},
		{"http 201", httpGet(port, "/code/201"), host},
		{"http 204", httpGet(port, "/code/204"), host},
		{"http 299", httpGet(port, "/code/299"), host},
		{"http 300", httpGet(port, "/code/300"), host},
		{"http 304", httpGet(port, "/code/304"), host},
		{"http 399", httpGet(port, "/code/399"), host},
		{"http 400", httpGet(port, "/code/400"), host},
		{"http 401", httpGet(port, "/code/401"), host},
		{"http 404", httpGet(port, "/code/404"), host},
		{"http 500", httpGet(port, "/code/500"), host},
		{"http 503", httpGet(port, "/code/503"), host},
		{"http 301 same host", httpGet(port, "/to-ok/301"), host},
		{"http 302 same host", httpGet(port, "/to-ok/302"), host},
		{"http 307 same host", httpGet(port, "/to-ok/307"), host},
		{"http 308 same host", httpGet(port, "/to-ok/308"), host},
		{"http redirect other host", httpGet(port, "/to-other"), host},
		{"http redirect loop", httpGet(port, "/loop"), host},
		{"http 9 redirects", httpGet(port, "/chain/9"), host},
		{"http 10 redirects", httpGet(port, "/chain/10"), host},
		{"http 20 KiB body", httpGet(port, "/big"), host},
		{"http wants Accept */*", httpGet(port, "/want-accept"), host},
		{"http empty Accept removes it", httpGet(port, "/want-no-accept", header("Accept", "")), host},
		{"http custom Accept", httpGet(port, "/want-accept", header("Accept", "text/plain")), host},
		{"http wants kube-probe UA", httpGet(port, "/want-ua"), host},
		{"http custom UA", httpGet(port, "/want-ua", header("User-Agent", "mine")), host},
		{"http Host header", httpGet(port, "/want-host", header("Host", "example.test")), host},
		{"http no Host header", httpGet(port, "/want-host"), host},
		{"http no keep-alive, no gzip", httpGet(port, "/want-close"), host},
		{"http query string", httpGet(port, "/ok?x=1"), host},
		{"http explicit host field", httpGet(port, "/ok", func(h *corev1.HTTPGetAction) { h.Host = host }), "192.0.2.1"},
		{"http path without slash", httpGet(port, "ok"), host},
		{"https 200 self-signed", httpGet(tlsPort, "/ok", https), host},
		{"https 500", httpGet(tlsPort, "/code/500", https), host},
		{"http to a TLS port", httpGet(tlsPort, "/ok"), host},
		{"https to a plain port", httpGet(port, "/ok", https), host},
		{"http connection refused", httpGet(refused, "/"), rawHost},
		{"http accept and hang", httpGet(hangPort, "/"), rawHost},
		{"https accept and hang", httpGet(hangPort, "/", https), rawHost},
		{"http accept and close", httpGet(closePort, "/"), rawHost},
		{"http no response after request", httpGet(noRespPort, "/"), rawHost},
		{"http garbage", httpGet(garbagePort, "/"), rawHost},
		{"https garbage", httpGet(garbagePort, "/", https), rawHost},
		{"http status line a byte a second", httpGet(dribbleStatusPort, "/"), rawHost},
		{"http body a byte a second", httpGet(dribbleBodyPort, "/"), rawHost},
		{"http endless body", httpGet(endlessPort, "/"), rawHost},
		{"http 1 MB of headers", httpGet(hugePort, "/"), rawHost},
		{"tcp open", tcpSocket(port), host},
		{"tcp refused", tcpSocket(refused), rawHost},
		{"tcp accept and hang", tcpSocket(hangPort), rawHost},
		{"tcp accept and close", tcpSocket(closePort), rawHost},
		{"tcp garbage", tcpSocket(garbagePort), rawHost},
		{"grpc serving", grpcCheck(gPort, ""), gHost},
		{"grpc named service serving", grpcCheck(gPort, "up"), gHost},
		{"grpc not serving", grpcCheck(gPort, "down"), gHost},
		{"grpc unknown service", grpcCheck(gPort, "nope"), gHost},
		{"grpc health unimplemented", grpcCheck(gBarePort, ""), gHost},
		{"grpc check hangs", grpcCheck(gHangPort, ""), gHost},
		{"grpc accept and hang", grpcCheck(hangPort, ""), rawHost},
		{"grpc refused", grpcCheck(refused, ""), rawHost},
		{"grpc garbage", grpcCheck(garbagePort, ""), rawHost},
		{"grpc to an http server", grpcCheck(port, ""), host},
	}
	return b
}

var (
	upHTTP = uphttp.New(false)
	upTCP  = uptcp.New()
	upGRPC = upgrpc.New()
)

// runUpstream runs one attempt the way pkg/kubelet/prober/prober.go runProbe does.
func runUpstream(spec *corev1.Probe, host string) (string, string, error) {
	to := time.Duration(spec.TimeoutSeconds) * time.Second
	switch {
	case spec.HTTPGet != nil:
		req, err := uphttp.NewRequestForHTTPGetAction(spec.HTTPGet, &corev1.Container{}, host, "probe")
		if err != nil {
			return "unknown", "", err
		}
		r, msg, err := upHTTP.Probe(req, to)
		return string(r), msg, err
	case spec.TCPSocket != nil:
		h := spec.TCPSocket.Host
		if h == "" {
			h = host
		}
		r, msg, err := upTCP.Probe(h, spec.TCPSocket.Port.IntValue(), to)
		return string(r), msg, err
	default:
		svc := ""
		if spec.GRPC.Service != nil {
			svc = *spec.GRPC.Service
		}
		r, msg, err := upGRPC.Probe(host, svc, int(spec.GRPC.Port), to, upgrpc.ProbeOptions{})
		return string(r), msg, err
	}
}

func TestBehaviourEquality(t *testing.T) {
	nk := probe.NewProber(probe.Options{})
	bs := behaviours(t)
	if len(bs) < 30 {
		t.Fatalf("only %d behaviours", len(bs))
	}
	for _, b := range bs {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			upKind, upMsg, upErr := runUpstream(b.spec, b.host)
			res, err := nk.ProbeOnce(context.Background(), b.spec, probe.Target{Host: b.host})
			if string(res.Kind) != upKind {
				t.Errorf("kind: nodekit %s (%q, %v), upstream %s (%q, %v)", res.Kind, res.Message, err, upKind, upMsg, upErr)
			}
			if (err != nil) != (upErr != nil) {
				t.Errorf("error: nodekit %v, upstream %v", err, upErr)
			}
			if upKind != "success" && len(upMsg) < 200 && res.Message != upMsg && !sameShape(res.Message, upMsg) {
				t.Logf("messages differ: nodekit %q, upstream %q", res.Message, upMsg)
			}
			t.Logf("%s: %s", upKind, trim(upMsg))
		})
	}
}

// sameShape ignores ephemeral ports in dial errors.
func sameShape(a, b string) bool {
	return len(a) > 0 && len(b) > 0 && a[:min(len(a), 20)] == b[:min(len(b), 20)]
}

func trim(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}
