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
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
