package main

import (
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

func TestServiceHealthServers(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	s := newServiceHealth([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil, healthy.Load)
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
