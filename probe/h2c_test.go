package probe_test

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nodekit-dev/nodekit/probe"
)

// TestHTTPGetH2C checks the httpGet path for protocol HTTP2: with EnableH2C the
// request goes out as cleartext HTTP/2 with the kubelet's headers; without it
// the field is ignored and the probe speaks HTTP/1.1.
func TestHTTPGetH2C(t *testing.T) {
	type seen struct {
		proto     int
		userAgent string
		custom    string
		path      string
	}
	got := make(chan seen, 4)
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Protocols: &protocols,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got <- seen{r.ProtoMajor, r.UserAgent(), r.Header.Get("X-Check"), r.URL.Path}
			w.WriteHeader(http.StatusOK)
		}),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	h2 := corev1.HTTPProtocolHTTP2
	spec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
		Path:        "/healthz",
		Port:        intstr.FromInt(port),
		Protocol:    &h2,
		HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Check", Value: "yes"}},
	}}}
	for _, tc := range []struct {
		enable bool
		proto  int
	}{{true, 2}, {false, 1}} {
		t.Run("EnableH2C="+strconv.FormatBool(tc.enable), func(t *testing.T) {
			p := probe.NewProber(probe.Options{EnableH2C: tc.enable})
			res, err := p.ProbeOnce(context.Background(), spec, probe.Target{Host: "127.0.0.1"})
			require.NoError(t, err)
			assert.Equal(t, probe.Success, res.Kind, res.Message)
			s := <-got
			assert.Equal(t, tc.proto, s.proto)
			assert.Equal(t, probe.UserAgent, s.userAgent)
			assert.Equal(t, "yes", s.custom)
			assert.Equal(t, "/healthz", s.path)
		})
	}
}
