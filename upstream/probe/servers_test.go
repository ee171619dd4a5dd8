package probe

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func splitHostPort(t testing.TB, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return h, n
}

func urlHostPort(t testing.TB, s string) (string, int) {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return splitHostPort(t, u.Host)
}

// raw starts a TCP server whose connections are handed to serve.
func raw(t testing.TB, serve func(c net.Conn, stop <-chan struct{})) (string, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c, stop)
			}()
		}
	}()
	t.Cleanup(func() { close(stop); ln.Close(); wg.Wait() })
	return splitHostPort(t, ln.Addr().String())
}

func readHeaders(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		l, err := r.ReadString('\n')
		if err != nil || l == "\r\n" {
			return
		}
	}
}

func every(c net.Conn, stop <-chan struct{}, d time.Duration, piece func(int) string) {
	tk := time.NewTicker(d)
	defer tk.Stop()
	for i := 0; ; i++ {
		if _, err := io.WriteString(c, piece(i)); err != nil {
			return
		}
		select {
		case <-stop:
			return
		case <-tk.C:
		}
	}
}

var (
	hang        = func(c net.Conn, stop <-chan struct{}) { <-stop }
	acceptClose = func(c net.Conn, stop <-chan struct{}) {}
	garbage     = func(c net.Conn, stop <-chan struct{}) {
		every(c, stop, 10*time.Millisecond, func(int) string { return "\x16\x03garbage\x00\xff\r\n" })
	}
	dribbleStatus = func(c net.Conn, stop <-chan struct{}) {
		readHeaders(c)
		line := "HTTP/1.1 200 OK\r\n"
		every(c, stop, time.Second, func(i int) string { return string(line[i%len(line)]) })
	}
	dribbleBody = func(c net.Conn, stop <-chan struct{}) {
		readHeaders(c)
		every(c, stop, time.Second, func(i int) string {
			if i == 0 {
				return "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nx"
			}
			return "x"
		})
	}
	endless = func(c net.Conn, stop <-chan struct{}) {
		readHeaders(c)
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n"); err != nil {
			return
		}
		chunk := strings.Repeat("y", 64<<10)
		for {
			if _, err := io.WriteString(c, chunk); err != nil {
				return
			}
		}
	}
	hugeHeaders = func(c net.Conn, stop <-chan struct{}) {
		readHeaders(c)
		w := bufio.NewWriter(c)
		fmt.Fprint(w, "HTTP/1.1 200 OK\r\n")
		line := "X-Filler: " + strings.Repeat("h", 1000) + "\r\n"
		for i := 0; i < 1<<20/len(line); i++ {
			fmt.Fprint(w, line)
		}
		fmt.Fprint(w, "Content-Length: 2\r\n\r\nok")
		_ = w.Flush()
	}
	noResponse = func(c net.Conn, stop <-chan struct{}) { readHeaders(c) }
)

// httpMux serves the HTTP behaviours; otherPort is a second server on
// "localhost" for cross-host redirects.
func httpMux(otherPort int) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	mux.HandleFunc("/code/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/code/"))
		w.WriteHeader(n)
		fmt.Fprint(w, "body")
	})
	mux.HandleFunc("/to-ok/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/to-ok/"))
		http.Redirect(w, r, "/ok", n)
	})
	mux.HandleFunc("/to-other", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, fmt.Sprintf("http://localhost:%d/", otherPort), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/chain/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/chain/"))
		if n == 0 {
			fmt.Fprint(w, "end")
			return
		}
		http.Redirect(w, r, fmt.Sprintf("/chain/%d", n-1), http.StatusFound)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, strings.Repeat("b", 20<<10)) })
	mux.HandleFunc("/want-accept", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept") != "*/*" {
			w.WriteHeader(http.StatusNotAcceptable)
		}
	})
	mux.HandleFunc("/want-no-accept", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header["Accept"]; ok {
			w.WriteHeader(http.StatusNotAcceptable)
		}
	})
	mux.HandleFunc("/want-ua", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.UserAgent(), "kube-probe/") {
			w.WriteHeader(http.StatusForbidden)
		}
	})
	mux.HandleFunc("/want-host", func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "example.test" {
			w.WriteHeader(http.StatusMisdirectedRequest)
		}
	})
	mux.HandleFunc("/want-close", func(w http.ResponseWriter, r *http.Request) {
		if !r.Close || r.Header.Get("Accept-Encoding") != "" {
			w.WriteHeader(http.StatusTeapot)
		}
	})
	return mux
}

type hangingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (hangingHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// grpcSrv starts a gRPC server: mode "health" (SERVING overall, "up" SERVING,
// "down" NOT_SERVING), "hang" (Check blocks) or "bare" (no health service).
func grpcSrv(t testing.TB, mode string) (string, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	switch mode {
	case "health":
		hs := health.NewServer()
		hs.SetServingStatus("up", healthpb.HealthCheckResponse_SERVING)
		hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
		healthpb.RegisterHealthServer(s, hs)
	case "hang":
		healthpb.RegisterHealthServer(s, hangingHealth{})
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return splitHostPort(t, ln.Addr().String())
}

func closedPort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, p := splitHostPort(t, ln.Addr().String())
	ln.Close()
	return p
}

func newHTTPServers(t testing.TB) (host string, port, tlsPort int) {
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(other.Close)
	_, otherPort := urlHostPort(t, other.URL)
	mux := httpMux(otherPort)
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	ts := httptest.NewTLSServer(mux)
	t.Cleanup(ts.Close)
	host, port = urlHostPort(t, s.URL)
	_, tlsPort = urlHostPort(t, ts.URL)
	return host, port, tlsPort
}

// readHead returns the request line and headers as received.
func readHead(r *bufio.Reader) (string, error) {
	var head strings.Builder
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return head.String(), err
		}
		head.WriteString(l)
		if l == "\r\n" {
			return head.String(), nil
		}
	}
}

// echo answers 200 with the request head it received as the body, so the
// probe's message shows the exact bytes the prober sent. /to-echo redirects
// (relative) to /echo, /to-abs-echo to http://127.0.0.1:port/echo.
func echo(c net.Conn, stop <-chan struct{}) {
	head, err := readHead(bufio.NewReader(c))
	if err != nil {
		return
	}
	switch {
	case strings.HasPrefix(head, "GET /to-echo "):
		fmt.Fprint(c, "HTTP/1.1 302 Found\r\nLocation: /echo\r\nContent-Length: 0\r\n\r\n")
	case strings.HasPrefix(head, "GET /to-abs-echo "):
		fmt.Fprintf(c, "HTTP/1.1 307 Temporary Redirect\r\nLocation: http://%s/echo\r\nContent-Length: 0\r\n\r\n", c.LocalAddr())
	default:
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(head), head)
	}
}

// canned answers every request with resp, then closes.
func canned(resp string) func(c net.Conn, stop <-chan struct{}) {
	return func(c net.Conn, stop <-chan struct{}) {
		if _, err := readHead(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, resp)
	}
}

// fullBacklog returns a loopback port whose listener never accepts and whose
// accept queue is full, so new connections hang in SYN_SENT: a connect timeout
// without touching any network but loopback.
func fullBacklog(t testing.TB) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*syscall.SockaddrInet4).Port
	var fill []net.Conn
	t.Cleanup(func() {
		for _, c := range fill {
			c.Close()
		}
		syscall.Close(fd)
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return port // the queue is full
		}
		fill = append(fill, c)
	}
	t.Fatal("accept queue never filled")
	return 0
}

// scriptedHealth answers Check by service name with a chosen status or error.
type scriptedHealth struct {
	healthpb.UnimplementedHealthServer
}

func (scriptedHealth) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.Service {
	case "perm":
		return nil, status.Error(codes.PermissionDenied, "not 100% allowed: ünïcode\nand a newline")
	case "unavailable":
		return nil, status.Error(codes.Unavailable, "busy")
	case "deadline":
		return nil, status.Error(codes.DeadlineExceeded, "server says slow")
	case "seven":
		return &healthpb.HealthCheckResponse{Status: 7}, nil
	case "service-unknown":
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVICE_UNKNOWN}, nil
	case "unknown-status":
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_UNKNOWN}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// scriptedGRPC starts a gRPC server running scriptedHealth.
func scriptedGRPC(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, scriptedHealth{})
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	_, p := splitHostPort(t, ln.Addr().String())
	return p
}

// h2cServer starts a cleartext HTTP/2 server that is not gRPC: it answers
// every request with code and a text body.
func h2cServer(t testing.TB, code int) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(code)
		fmt.Fprint(w, "not grpc")
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	_, p := splitHostPort(t, ln.Addr().String())
	return p
}
