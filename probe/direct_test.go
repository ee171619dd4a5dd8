//go:build linux

package probe_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/probe"
)

// synHangPort returns a loopback port whose accept queue is full, so a connect
// to it hangs until its timeout.
func synHangPort(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	port := sa.(*syscall.SockaddrInet4).Port
	var fill []net.Conn
	t.Cleanup(func() {
		for _, c := range fill {
			c.Close()
		}
		syscall.Close(fd)
	})
	for range 8 {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 200*time.Millisecond)
		if err != nil {
			return port
		}
		fill = append(fill, c)
	}
	t.Fatal("accept queue never filled")
	return 0
}

func freePort(t *testing.T, network, addr string) int {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("no %s loopback: %v", network, err)
	}
	_, p := hostPort(t, ln.Addr().String())
	ln.Close()
	return p
}

// TestTCPDirectDialMatchesNetDialer checks that the direct connect reports
// exactly what net.Dialer reports, for every way a connect can end.
func TestTCPDirectDialMatchesNetDialer(t *testing.T) {
	hang := synHangPort(t)
	refused4 := freePort(t, "tcp4", "127.0.0.1:0")
	refused6 := freePort(t, "tcp6", "[::1]:0")
	cases := []struct {
		name    string
		host    string
		port    int
		timeout time.Duration
		cancel  time.Duration // cancel the context after this long; 0: never
	}{
		{name: "refused ipv4", host: "127.0.0.1", port: refused4, timeout: time.Second},
		{name: "refused ipv6", host: "::1", port: refused6, timeout: time.Second},
		{name: "refused v4-mapped", host: "::ffff:127.0.0.1", port: refused4, timeout: time.Second},
		{name: "connect timeout", host: "127.0.0.1", port: hang, timeout: 300 * time.Millisecond},
		{name: "connect cancelled", host: "127.0.0.1", port: hang, timeout: 5 * time.Second, cancel: 100 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				if tc.cancel > 0 {
					time.AfterFunc(tc.cancel, cancel)
				}
				return ctx, cancel
			}
			c1, cancel1 := ctx()
			defer cancel1()
			d := net.Dialer{Timeout: tc.timeout}
			_, want := d.DialContext(c1, "tcp", net.JoinHostPort(tc.host, strconv.Itoa(tc.port)))
			require.Error(t, want)

			c2, cancel2 := ctx()
			defer cancel2()
			spec := tcpSpec(tc.port)
			spec.TimeoutSeconds = int32((tc.timeout + time.Second - 1) / time.Second)
			start := time.Now()
			res, err := probe.NewProber(probe.Options{}).ProbeOnce(c2, spec, probe.Target{Host: tc.host})
			require.NoError(t, err)
			assert.Equal(t, probe.Failure, res.Kind)
			assert.Equal(t, want.Error(), res.Message)
			assert.Less(t, time.Since(start), time.Duration(spec.TimeoutSeconds)*time.Second+500*time.Millisecond)
		})
	}
}

// TestDirectProbesHonourContext cancels probes of every network kind while
// they wait on a target that never answers.
func TestDirectProbesHonourContext(t *testing.T) {
	hangHost, hangPort := rawServer(t, func(c net.Conn, stop <-chan struct{}) { <-stop })
	syn := synHangPort(t)
	_, gHost, gPort := grpcServer(t, true)
	cases := []struct {
		name   string
		spec   *corev1.Probe
		host   string
		msgSub string
	}{
		{name: "tcp connect", spec: tcpSpec(syn), host: "127.0.0.1", msgSub: "operation was canceled"},
		{name: "http connect", spec: httpSpec(syn, "/"), host: "127.0.0.1", msgSub: "context canceled"},
		{name: "http response", spec: httpSpec(hangPort, "/"), host: hangHost, msgSub: "context canceled"},
		{name: "grpc connect", spec: grpcSpec(syn, nil), host: "127.0.0.1", msgSub: "error: failed to connect service"},
		{name: "grpc handshake", spec: grpcSpec(hangPort, nil), host: hangHost, msgSub: "context canceled"},
		{name: "grpc call", spec: grpcSpec(gPort, nil), host: gHost, msgSub: "code = Canceled"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.TimeoutSeconds = 30
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			time.AfterFunc(150*time.Millisecond, cancel)
			start := time.Now()
			res, err := probe.NewProber(probe.Options{}).ProbeOnce(ctx, tc.spec, probe.Target{Host: tc.host})
			require.NoError(t, err)
			assert.Equal(t, probe.Failure, res.Kind)
			assert.Contains(t, res.Message, tc.msgSub)
			assert.Less(t, time.Since(start), time.Second)
		})
	}
}

// TestHTTPPooledBuffersDoNotLeak runs probes with different headers and bodies
// concurrently: pooled request and body buffers must never mix them.
func TestHTTPPooledBuffersDoNotLeak(t *testing.T) {
	host, port := rawServer(t, func(c net.Conn, stop <-chan struct{}) {
		r := bufio.NewReader(c)
		var id string
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if v, ok := strings.CutPrefix(l, "X-Id: "); ok {
				id = strings.TrimSpace(v)
			}
			if l == "\r\n" {
				break
			}
		}
		body := strings.Repeat(id, 1+len(id)%7)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	p := probe.NewProber(probe.Options{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				id := strconv.Itoa(w*1000 + i)
				spec := httpSpec(port, "/", func(h *corev1.HTTPGetAction) {
					h.HTTPHeaders = []corev1.HTTPHeader{{Name: "X-Id", Value: id}}
				})
				res, err := p.ProbeOnce(context.Background(), spec, probe.Target{Host: host})
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, strings.Repeat(id, 1+len(id)%7), res.Message)
			}
		}()
	}
	wg.Wait()
}

// TestHTTPBodyReadHonoursContext cancels a probe whose server sent headers and
// then stalls in the body.
func TestHTTPBodyReadHonoursContext(t *testing.T) {
	host, port := rawServer(t, func(c net.Conn, stop <-chan struct{}) {
		drainHeaders(c)
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
		<-stop
	})
	spec := httpSpec(port, "/")
	spec.TimeoutSeconds = 30
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	time.AfterFunc(150*time.Millisecond, cancel)
	start := time.Now()
	res, err := probe.NewProber(probe.Options{}).ProbeOnce(ctx, spec, probe.Target{Host: host})
	require.Error(t, err, "a body read cut short is an error, as upstream's")
	assert.Equal(t, probe.Failure, res.Kind)
	assert.Less(t, time.Since(start), time.Second)
}
