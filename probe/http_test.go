package probe_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/probe"
)

// seen records what the last request looked like at the server.
type seen struct {
	mu  sync.Mutex
	req *http.Request
	n   int
}

func (s *seen) record(r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.req = r.Clone(context.Background())
	s.n++
}

func (s *seen) last() (*http.Request, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.req, s.n
}

func TestHTTPProbe(t *testing.T) {
	big := strings.Repeat("x", 20<<10)
	var other seen
	otherSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		other.record(r)
	}))
	defer otherSrv.Close()
	_, otherPort := serverHostPort(t, otherSrv)

	mux := http.NewServeMux()
	var got seen
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { got.record(r); fmt.Fprint(w, "fine") })
	mux.HandleFunc("/status/", func(w http.ResponseWriter, r *http.Request) {
		got.record(r)
		var code int
		fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/status/"), "%d", &code)
		w.WriteHeader(code)
		fmt.Fprint(w, "secret-body")
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, big) })
	mux.HandleFunc("/exact", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, big[:10<<10]) })
	mux.HandleFunc("/redirect-local", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/redirect-other", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("http://localhost:%d/", otherPort), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	chain := func(n int) string { return fmt.Sprintf("/chain/%d", n) }
	mux.HandleFunc("/chain/", func(w http.ResponseWriter, r *http.Request) {
		var n int
		fmt.Sscanf(strings.TrimPrefix(r.URL.Path, "/chain/"), "%d", &n)
		if n == 0 {
			fmt.Fprint(w, "end")
			return
		}
		http.Redirect(w, r, chain(n-1), http.StatusFound)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	host, port := serverHostPort(t, srv)
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	_, tlsPort := serverHostPort(t, tlsSrv)

	withHeaders := func(kv ...string) func(*corev1.HTTPGetAction) {
		return func(h *corev1.HTTPGetAction) {
			for i := 0; i+1 < len(kv); i += 2 {
				h.HTTPHeaders = append(h.HTTPHeaders, corev1.HTTPHeader{Name: kv[i], Value: kv[i+1]})
			}
		}
	}
	cases := []struct {
		name      string
		spec      *corev1.Probe
		target    probe.Target
		opts      probe.Options
		kind      probe.Kind
		message   string // exact, unless msgSub is set
		msgSub    string
		errIs     error
		check     func(t *testing.T, r *http.Request)
		otherHits int
	}{
		{name: "200 is success with the body as message", spec: httpSpec(port, "/ok"), kind: probe.Success, message: "fine",
			check: func(t *testing.T, r *http.Request) {
				assert.Equal(t, "kube-probe/1.37", r.Header.Get("User-Agent"))
				assert.Equal(t, "*/*", r.Header.Get("Accept"))
				assert.Empty(t, r.Header.Get("Accept-Encoding"), "compression must be off")
				assert.True(t, r.Close, "keep-alives must be off")
				assert.Equal(t, fmt.Sprintf("%s:%d", host, port), r.Host)
			}},
		{name: "204 is success", spec: httpSpec(port, "/status/204"), kind: probe.Success, message: ""},
		{name: "399 is warning", spec: httpSpec(port, "/status/399"), kind: probe.Warning, message: "Probe terminated redirects, Response body: secret-body"},
		{name: "304 is warning", spec: httpSpec(port, "/status/304"), kind: probe.Warning, message: "Probe terminated redirects, Response body: "},
		{name: "400 is failure without body", spec: httpSpec(port, "/status/400"), kind: probe.Failure, message: "HTTP probe failed with statuscode: 400"},
		{name: "503 is failure without body", spec: httpSpec(port, "/status/503"), kind: probe.Failure, message: "HTTP probe failed with statuscode: 503"},
		{name: "body capped at 10 KiB", spec: httpSpec(port, "/big"), kind: probe.Success, message: big[:10<<10]},
		{name: "body of exactly 10 KiB", spec: httpSpec(port, "/exact"), kind: probe.Success, message: big[:10<<10]},
		{name: "custom user agent and accept kept", spec: httpSpec(port, "/ok", withHeaders("User-Agent", "mine", "Accept", "text/plain", "X-A", "1")), kind: probe.Success, message: "fine",
			check: func(t *testing.T, r *http.Request) {
				assert.Equal(t, "mine", r.Header.Get("User-Agent"))
				assert.Equal(t, "text/plain", r.Header.Get("Accept"))
				assert.Equal(t, "1", r.Header.Get("X-A"))
			}},
		{name: "empty accept removes it", spec: httpSpec(port, "/ok", withHeaders("Accept", "")), kind: probe.Success, message: "fine",
			check: func(t *testing.T, r *http.Request) {
				_, ok := r.Header["Accept"]
				assert.False(t, ok)
			}},
		{name: "host header sets the request host", spec: httpSpec(port, "/ok", withHeaders("Host", "example.test")), kind: probe.Success, message: "fine",
			check: func(t *testing.T, r *http.Request) { assert.Equal(t, "example.test", r.Host) }},
		{name: "explicit host field", spec: httpSpec(port, "/ok", func(h *corev1.HTTPGetAction) { h.Host = host }), target: probe.Target{Host: "192.0.2.1"}, kind: probe.Success, message: "fine"},
		{name: "query string kept", spec: httpSpec(port, "/ok?a=b"), kind: probe.Success, message: "fine",
			check: func(t *testing.T, r *http.Request) { assert.Equal(t, "a=b", r.URL.RawQuery) }},
		{name: "scheme is lowercased, https without verification", spec: httpSpec(tlsPort, "/ok", func(h *corev1.HTTPGetAction) { h.Scheme = "HTTPS" }), kind: probe.Success, message: "fine"},
		{name: "local redirect followed", spec: httpSpec(port, "/redirect-local"), kind: probe.Success, message: "fine"},
		// Ten requests in all: the tenth redirect is refused, as with upstream's checker.
		{name: "nine redirects followed", spec: httpSpec(port, chain(9)), kind: probe.Success, message: "end"},
		{name: "ten redirects fail", spec: httpSpec(port, chain(10)), kind: probe.Failure, msgSub: "stopped after 10 redirects"},
		{name: "redirect loop fails", spec: httpSpec(port, "/loop"), kind: probe.Failure, msgSub: "stopped after 10 redirects"},
		{name: "redirect to other host is a warning, not followed", spec: httpSpec(port, "/redirect-other"), kind: probe.Warning, msgSub: "Probe terminated redirects, Response body: "},
		{name: "redirect to other host followed when allowed", spec: httpSpec(port, "/redirect-other"), opts: probe.Options{FollowNonLocalRedirects: true}, kind: probe.Success, otherHits: 1},
		{name: "named port", spec: httpSpec(0, "/ok", func(h *corev1.HTTPGetAction) { h.Port = intstr.FromString("web") }),
			target: probe.Target{Container: &corev1.Container{Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: int32(port)}}}}, kind: probe.Success, message: "fine"},
		{name: "unknown named port", spec: httpSpec(0, "/ok", func(h *corev1.HTTPGetAction) { h.Port = intstr.FromString("nope") }),
			target: probe.Target{Container: &corev1.Container{Name: "c"}}, kind: probe.Unknown, errIs: probe.ErrUnknownPort},
		{name: "connection refused", spec: httpSpec(1, "/"), kind: probe.Failure, msgSub: "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.target.Host == "" {
				tc.target.Host = host
			}
			before := other.n
			_, n0 := got.last()
			res, err := probe.NewProber(tc.opts).Probe(context.Background(), tc.spec, tc.target)
			if tc.errIs != nil {
				require.ErrorIs(t, err, tc.errIs)
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.kind, res.Kind)
			switch {
			case tc.msgSub != "":
				assert.Contains(t, res.Message, tc.msgSub)
			case tc.errIs == nil && tc.otherHits == 0:
				assert.Equal(t, tc.message, res.Message)
			}
			if res.Kind == probe.Failure {
				assert.NotContains(t, res.Message, "secret-body", "failure messages never carry the body")
			}
			if tc.check != nil {
				r, n := got.last()
				require.Greater(t, n, n0, "server saw no request")
				tc.check(t, r)
			}
			_, after := other.last()
			assert.Equal(t, tc.otherHits, after-before, "requests to the other host")
		})
	}
}
