// Package probe compares nodekit's probe package with the kubelet's own probers
// (k8s.io/kubernetes/pkg/probe/{http,tcp,grpc} v1.37.2) against the same servers.
package probe

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
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

	_, echoPort := raw(t, echo)
	_, noLocPort := raw(t, canned("HTTP/1.1 302 Found\r\nContent-Length: 4\r\n\r\nbody"))
	_, badLocPort := raw(t, canned("HTTP/1.1 302 Found\r\nLocation: http://[::1\r\nContent-Length: 0\r\n\r\n"))
	_, ftpLocPort := raw(t, canned("HTTP/1.1 301 Moved\r\nLocation: ftp://127.0.0.1/x\r\nContent-Length: 0\r\n\r\n"))
	_, httpsLocPort := raw(t, canned(fmt.Sprintf("HTTP/1.1 302 Found\r\nLocation: https://127.0.0.1:%d/ok\r\nContent-Length: 0\r\n\r\n", tlsPort)))
	_, otherPortLocPort := raw(t, canned(fmt.Sprintf("HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/ok\r\nContent-Length: 0\r\n\r\n", port)))
	_, switchPort := raw(t, canned("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"))
	_, earlyHintsPort := raw(t, canned("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhints"))
	_, chunkedPort := raw(t, canned("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"))
	_, shortBodyPort := raw(t, canned("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"))
	_, closeDelimitedPort := raw(t, canned("HTTP/1.1 200 OK\r\n\r\nuntil close"))
	_, http10Port := raw(t, canned("HTTP/1.0 204 No Content\r\n\r\n"))
	synHangPort := fullBacklog(t)
	gScriptPort := scriptedGRPC(t)
	h2c404Port, h2c503Port, h2c200Port := h2cServer(t, http.StatusNotFound), h2cServer(t, http.StatusServiceUnavailable), h2cServer(t, http.StatusOK)

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
		{"http request bytes", httpGet(echoPort, "/echo"), rawHost},
		{"http request bytes with query", httpGet(echoPort, "/echo?a=b&c=%20d"), rawHost},
		{"http request bytes, escaped path", httpGet(echoPort, "/e c%2Fho/ü"), rawHost},
		{"http request bytes, custom headers", httpGet(echoPort, "/echo",
			header("x-b", "2"), header("X-A", "1"), header("x-a", " 0 "), header("Accept", "text/plain"),
			header("Connection", "keep-alive"), header("Referer", "http://r/"), header("Authorization", "Bearer t")), rawHost},
		{"http request bytes, empty User-Agent", httpGet(echoPort, "/echo", header("User-Agent", "")), rawHost},
		{"http request bytes, Connection close", httpGet(echoPort, "/echo", header("Connection", "close")), rawHost},
		{"http request bytes, Host header", httpGet(echoPort, "/echo", header("Host", "example.test:81")), rawHost},
		{"http request bytes after relative redirect", httpGet(echoPort, "/to-echo", header("X-Keep", "yes"), header("Content-Type", "text/x"), header("Cookie", "c=1")), rawHost},
		{"http request bytes after relative redirect, Host header", httpGet(echoPort, "/to-echo", header("Host", "example.test")), rawHost},
		{"http request bytes after absolute redirect, Host header", httpGet(echoPort, "/to-abs-echo", header("Host", "example.test"), header("Content-Type", "text/x")), rawHost},
		{"http request bytes, credentials in the path", httpGet(echoPort, "//user:p%40ss@ignored/echo"), rawHost},
		{"http request bytes, credentials in the path and Authorization", httpGet(echoPort, "//user:pw@ignored/echo", header("Authorization", "Bearer x")), rawHost},
		{"http invalid header name", httpGet(echoPort, "/echo", header("Bad Name", "x")), rawHost},
		{"http invalid header value", httpGet(echoPort, "/echo", header("X-Bad", "a\x00b")), rawHost},
		{"http 302 without Location", httpGet(noLocPort, "/"), rawHost},
		{"http bad Location", httpGet(badLocPort, "/"), rawHost},
		{"http redirect to ftp", httpGet(ftpLocPort, "/"), rawHost},
		{"http redirect to https same host", httpGet(httpsLocPort, "/"), rawHost},
		{"http redirect to another port same host", httpGet(otherPortLocPort, "/"), rawHost},
		{"http 101 switching protocols", httpGet(switchPort, "/"), rawHost},
		{"http 103 then 200", httpGet(earlyHintsPort, "/"), rawHost},
		{"http chunked body", httpGet(chunkedPort, "/"), rawHost},
		{"http body shorter than Content-Length", httpGet(shortBodyPort, "/"), rawHost},
		{"http body until close", httpGet(closeDelimitedPort, "/"), rawHost},
		{"http HTTP/1.0 204", httpGet(http10Port, "/"), rawHost},
		{"http connect timeout", httpGet(synHangPort, "/"), rawHost},
		{"https connect timeout", httpGet(synHangPort, "/", https), rawHost},
		{"tcp connect timeout", tcpSocket(synHangPort), rawHost},
		{"tcp to IPv6 loopback, refused", tcpSocket(refused), "::1"},
		{"http to IPv6 loopback, refused", httpGet(refused, "/"), "::1"},
		{"tcp to a v4-mapped address", tcpSocket(port), "::ffff:127.0.0.1"},
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
		{"grpc status with an encoded message", grpcCheck(gScriptPort, "perm"), gHost},
		{"grpc status unavailable", grpcCheck(gScriptPort, "unavailable"), gHost},
		{"grpc status deadline exceeded from the server", grpcCheck(gScriptPort, "deadline"), gHost},
		{"grpc serving status 7", grpcCheck(gScriptPort, "seven"), gHost},
		{"grpc SERVICE_UNKNOWN", grpcCheck(gScriptPort, "service-unknown"), gHost},
		{"grpc UNKNOWN", grpcCheck(gScriptPort, "unknown-status"), gHost},
		{"grpc long service name", grpcCheck(gScriptPort, strings.Repeat("s", 300)), gHost},
		{"grpc to an h2c server, 404", grpcCheck(h2c404Port, ""), gHost},
		{"grpc to an h2c server, 503", grpcCheck(h2c503Port, ""), gHost},
		{"grpc to an h2c server, 200", grpcCheck(h2c200Port, ""), gHost},
		{"grpc connect timeout", grpcCheck(synHangPort, ""), rawHost},
		{"grpc to IPv6 loopback, refused", grpcCheck(refused, ""), "::1"},
	}
	h2Port := scriptServer(t, nil)
	names := make([]string, 0, len(fixedScripts))
	for name := range fixedScripts {
		names = append(names, name)
	}
	slices.Sort(names)
	b = append(b, behaviour{"grpc raw h2: request headers over the server's limit",
		grpcCheck(scriptServer(t, []http2.Setting{{ID: http2.SettingMaxHeaderListSize, Val: 100}}), "fixed:well-behaved"), gHost})
	for _, name := range names {
		b = append(b, behaviour{"grpc raw h2: " + name, grpcCheck(h2Port, "fixed:"+name), gHost})
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
		// A test binary carries no version stamp, so upstream's default
		// User-Agent comes out as "kube-probe/."; a released 1.37 kubelet sends
		// probe.UserAgent.
		if req.Header.Get("User-Agent") == "kube-probe/." {
			req.Header.Set("User-Agent", probe.UserAgent)
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
			if racyScripts[strings.TrimPrefix(b.name, "grpc raw h2: ")] && !sameAnswer(upKind, upMsg, upErr, res, err) {
				if ups, nks, ok := answersMeet(nk, b); ok {
					t.Logf("answers vary from run to run: upstream %v, nodekit %v", ups, nks)
					return
				}
			}
			if string(res.Kind) != upKind {
				t.Errorf("kind: nodekit %s (%q, %v), upstream %s (%q, %v)", res.Kind, res.Message, err, upKind, upMsg, upErr)
			}
			if (err != nil) != (upErr != nil) {
				t.Errorf("error: nodekit %v, upstream %v", err, upErr)
			}
			if got, want := normalize(res.Message), normalize(upMsg); got != want {
				t.Errorf("message: nodekit %q, upstream %q", got, want)
			}
			t.Logf("%s: %s", upKind, trim(upMsg))
		})
	}
}

var portRE = regexp.MustCompile(`:[0-9]{2,5}\b`)

// racyForms are the spellings upstream's own messages alternate between from
// run to run for one server behaviour, because net/http's Transport races its
// read loop, write loop and timers: each is replaced by one canonical form.
var racyForms = strings.NewReplacer(
	// Timeouts: the request context, the Client's timer or the connection
	// wait may report first.
	" (Client.Timeout exceeded while awaiting headers)", "",
	"net/http: request canceled while waiting for connection", "context deadline exceeded",
	// A response that cannot be parsed: whether the connection is already
	// marked broken when the error is mapped.
	"net/http: HTTP/1.x transport connection broken: ", "",
	// A server that closes as the request arrives: its FIN or its reset to the
	// request's bytes may be read first.
	"read tcp 127.0.0.1:PORT->127.0.0.1:PORT: read: connection reset by peer", "EOF",
	// The same server, when its FIN reaches the Transport before the request
	// is registered on the connection.
	"http: server closed idle connection", "EOF",
)

// normalize hides port numbers, which differ between two runs against the
// same server (the prober's ephemeral ports, and the redirect target's), and
// upstream's racy spellings.
func normalize(msg string) string {
	return racyForms.Replace(portRE.ReplaceAllString(msg, ":PORT"))
}

func trim(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// outcome is a probe's kind and normalized message.
type outcome struct{ kind, msg string }

func sameAnswer(upKind, upMsg string, upErr error, res probe.Result, err error) bool {
	return upKind == string(res.Kind) && normalize(upMsg) == normalize(res.Message) && (upErr == nil) == (err == nil)
}

// answersMeet probes b up to 20 more times with each prober and reports
// whether some answer (kind and message) came from both. grpc-go races its
// reader against the call when a server sends more DATA than the window it
// granted: the violation may be seen before or after the message is read, so
// the kubelet's own answer changes from run to run, and nodekit's with it.
func answersMeet(nk *probe.Prober, b behaviour) (ups, nks map[outcome]bool, ok bool) {
	ups, nks = map[outcome]bool{}, map[outcome]bool{}
	for range 20 {
		k, m, e := runUpstream(b.spec, b.host)
		if e == nil {
			ups[outcome{k, normalize(m)}] = true
		}
		r, e2 := nk.ProbeOnce(context.Background(), b.spec, probe.Target{Host: b.host})
		if e2 == nil {
			nks[outcome{string(r.Kind), normalize(r.Message)}] = true
		}
		for o := range nks {
			if ups[o] {
				return ups, nks, true
			}
		}
	}
	return ups, nks, false
}
