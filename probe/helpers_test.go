package probe_test

import (
	"net"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func hostPort(t testing.TB, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return h, n
}

func serverHostPort(t testing.TB, s *httptest.Server) (string, int) {
	t.Helper()
	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	return hostPort(t, u.Host)
}

func httpSpec(port int, path string, mod ...func(*corev1.HTTPGetAction)) *corev1.Probe {
	h := &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}
	for _, f := range mod {
		f(h)
	}
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: h}, TimeoutSeconds: 1}
}

func tcpSpec(port int) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(port)}}, TimeoutSeconds: 1}
}

func grpcSpec(port int, service *string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(port), Service: service}}, TimeoutSeconds: 1}
}

func execSpec(cmd ...string) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}, TimeoutSeconds: 1}
}

func ptr[T any](v T) *T { return &v }

// closingListener is a loopback TCP listener that accepts every connection and closes
// it at once: a tcpSocket probe's healthy target. It closes on test cleanup.
func closingListener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	return ln
}
