package main

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

func TestServiceHealthServers(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { http.DefaultClient.CloseIdleConnections(); goleak.VerifyNone(t, before) })
	var healthy atomic.Bool
	healthy.Store(true)
	s := newServiceHealth(v1.IPv4Protocol, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, healthy.Load)
	defer s.Close()
	ports, err := testenv.FreePorts(1)
	require.NoError(t, err)
	port := uint16(ports[0])
	nn := types.NamespacedName{Namespace: "default", Name: "lb"}
	url := "http://127.0.0.1:" + strconv.Itoa(int(port)) + "/healthz"
	get := func() (int, string, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("X-Load-Balancing-Endpoint-Weight"), string(b)
	}

	s.sync(klog.Background(), map[types.NamespacedName]uint16{nn: port}, map[types.NamespacedName]int{nn: 2})
	code, weight, body := get()
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "2", weight)
	assert.Equal(t, "{\n\t\"service\": {\n\t\t\"namespace\": \"default\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": 2,\n\t\"serviceProxyHealthy\": true\n}", body)

	s.sync(klog.Background(), map[types.NamespacedName]uint16{nn: port}, nil)
	code, weight, body = get()
	assert.Equal(t, http.StatusServiceUnavailable, code, "no local endpoint")
	assert.Equal(t, "0", weight)
	assert.Contains(t, body, "\"localEndpoints\": 0,")

	s.sync(klog.Background(), map[types.NamespacedName]uint16{nn: port}, map[types.NamespacedName]int{nn: 1})
	healthy.Store(false)
	code, _, body = get()
	assert.Equal(t, http.StatusServiceUnavailable, code, "proxy unhealthy")
	assert.Contains(t, body, "\"serviceProxyHealthy\": false")

	s.sync(klog.Background(), nil, nil)
	_, err = http.Get(url)
	assert.Error(t, err, "the server closes when the Service no longer has a health check port")
}

// TestServiceHealthPerFamily: as upstream's per-proxier servers, each family's
// servers listen on that family's addresses only, for that family's Services,
// with that family's local endpoint count; one port number serves both.
func TestServiceHealthPerFamily(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	healthy := func() bool { return true }
	var networks []string
	listen := func(network, addr string) (net.Listener, error) {
		networks = append(networks, network+" "+addr)
		return net.Listen(network, addr)
	}
	v4 := newServiceHealth(v1.IPv4Protocol, []netip.Addr{netip.MustParseAddr("127.0.0.1")}, listen, healthy)
	defer v4.Close()
	v6 := newServiceHealth(v1.IPv6Protocol, []netip.Addr{netip.IPv6Loopback()}, listen, healthy)
	defer v6.Close()
	ports, err := testenv.FreePorts(2)
	require.NoError(t, err)
	dual, only4 := types.NamespacedName{Namespace: "default", Name: "dual"}, types.NamespacedName{Namespace: "default", Name: "only4"}
	p1, p2 := uint16(ports[0]), uint16(ports[1])
	v4.sync(klog.Background(), map[types.NamespacedName]uint16{dual: p1, only4: p2}, map[types.NamespacedName]int{dual: 2, only4: 1})
	v6.sync(klog.Background(), map[types.NamespacedName]uint16{dual: p1}, map[types.NamespacedName]int{dual: 1})
	assert.ElementsMatch(t, []string{
		"tcp4 127.0.0.1:" + strconv.Itoa(int(p1)), "tcp4 127.0.0.1:" + strconv.Itoa(int(p2)), "tcp6 [::1]:" + strconv.Itoa(int(p1)),
	}, networks)

	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	weight := func(host string, port uint16) string {
		t.Helper()
		resp, err := c.Get("http://" + net.JoinHostPort(host, strconv.Itoa(int(port))) + "/")
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.Header.Get("X-Load-Balancing-Endpoint-Weight")
	}
	assert.Equal(t, "2", weight("127.0.0.1", p1), "IPv4 local endpoints")
	assert.Equal(t, "1", weight("::1", p1), "IPv6 local endpoints")
	assert.Equal(t, "1", weight("127.0.0.1", p2))
	_, err = c.Get("http://" + net.JoinHostPort("::1", strconv.Itoa(int(p2))) + "/")
	assert.Error(t, err, "an IPv4-only Service has no IPv6 server")
}
