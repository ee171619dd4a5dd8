package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// closedWithin reads c until it fails and reports whether that was the server
// closing it (EOF or reset) within d, and what it had sent before.
func closedWithin(c net.Conn, d time.Duration) (bool, string) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false, string(b)
	}
	return true, string(b)
}

// TestServerBounds attacks the server the kubelet binary runs (newKubeletServer and
// Start, TLS on loopback) with oversized headers, headers sent byte by byte and TLS
// handshakes that never start, and checks each is refused or cut off and that no
// goroutine or fd is left once they are over. The timeouts are shortened (the kubelet's
// are 4h, TestKubeletLimits checks them); the header limit is the kubelet's own.
func TestServerBounds(t *testing.T) {
	// Short enough that a header sent a byte every 50ms (about 6 s) is cut off, long
	// enough that 1 MiB of oversized header crosses loopback TLS in time on a loaded
	// 2-core machine (at 1 s, CI at load 25 saw the server time out before its 431).
	const timeout = 3 * time.Second
	const cutOff = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"
	f := newServerFixture(t, func(c *ServerConfig) {
		c.Config = c.Config.DeepCopy()
		c.Config.Address, c.Config.Port = "127.0.0.1", 0
		lim := kubeletLimits
		lim.ReadTimeout, lim.WriteTimeout, lim.IdleTimeout = timeout, timeout, timeout
		c.limits = &lim
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, err := f.server.Start(ctx)
	require.NoError(t, err)
	defer f.server.Close()
	addr := a.String()

	dialTLS := func() *tls.Conn {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, insecureTLS())
		require.NoError(t, err)
		return c
	}
	// healthz sends one well-formed request on a fresh connection.
	healthz := func() (int, string) {
		c := dialTLS()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Test-User: admin\r\nConnection: close\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	// Warm up (TLS certificate, lazily started goroutines), then take the baseline.
	code, body := healthz()
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", body)
	runtime.GC()
	time.Sleep(100 * time.Millisecond)
	goroutinesBefore, fdsBefore := runtime.NumGoroutine(), openFDs(t)

	// oversized sends headers beyond MaxHeaderBytes (net/http allows 4 KiB of slack):
	// a 431 with net/http's body, then the connection is closed.
	oversized := func() (string, error) {
		c := dialTLS()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		go func() {
			// The server stops reading at its limit; a failed write is expected.
			big := strings.Repeat("a", kubeletLimits.MaxHeaderBytes+8192)
			_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: "+big+"\r\n\r\n")
		}()
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
			return "", fmt.Errorf("connection still open after the 431: %v", err)
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
	}
	// slow sends a request's headers a byte every 50ms: the server must close the
	// connection before they are complete.
	slow := func() (string, error) {
		start := time.Now()
		c := dialTLS()
		defer c.Close()
		req := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Test-User: admin\r\nX-Padding: " + strings.Repeat("p", 60) + "\r\n\r\n"
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range len(req) {
				if _, err := c.Write([]byte{req[i]}); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		closed, got := closedWithin(c, 5*timeout)
		el := time.Since(start)
		<-done
		// net/http closes the connection at the deadline, answering the 400 it gives
		// any request it could not read when the TLS layer lets it write.
		if got != "" && got != cutOff {
			return "", fmt.Errorf("a slow request was answered: %q", got)
		}
		if el < timeout || el > 5*timeout {
			return "", fmt.Errorf("cut off after %v", el)
		}
		if !closed {
			return "", nil
		}
		if got == cutOff {
			return "slow headers: 400 and closed", nil
		}
		return "slow headers: closed", nil
	}
	// idle opens a TCP connection and never starts the TLS handshake.
	idle := func() (bool, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return false, err
		}
		defer c.Close()
		closed, got := closedWithin(c, 5*timeout)
		if got != "" {
			return false, fmt.Errorf("the server sent %q to a connection with no handshake", got)
		}
		return closed, nil
	}

	const nOversized, nSlow, nIdle = 20, 100, 200
	var (
		mu      sync.Mutex
		refused = map[string]int{}
		wg      sync.WaitGroup
	)
	count := func(what string, ok bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil:
			t.Errorf("%s: %v", what, err)
		case ok:
			refused[what]++
		default:
			t.Errorf("%q: not refused", what)
		}
	}
	// run runs fn n times, parallel at most at a time (1 MiB of TLS each for the
	// oversized ones: few at once, so that they are not slowed past the timeout).
	run := func(n, parallel int, fn func()) {
		sem := make(chan struct{}, parallel)
		for range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				fn()
			}()
		}
	}
	start := time.Now()
	run(nOversized, 4, func() {
		got, err := oversized()
		count("431 and closed", got == "431 431 Request Header Fields Too Large", err)
	})
	wg.Wait()
	run(nSlow, 50, func() {
		how, err := slow()
		count(how, how != "", err)
	})
	run(nIdle, 100, func() { closed, err := idle(); count("no handshake closed", closed, err) })
	wg.Wait()
	elapsed := time.Since(start)

	// The server still serves.
	code, body = healthz()
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "ok", body)

	var goroutinesAfter, fdsAfter int
	deadline := time.Now().Add(5 * time.Second)
	for {
		runtime.GC()
		goroutinesAfter, fdsAfter = runtime.NumGoroutine(), openFDs(t)
		if (goroutinesAfter <= goroutinesBefore && fdsAfter <= fdsBefore) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("tried %d (oversized %d, slow %d, no handshake %d) in %v; refused %v; goroutines %d -> %d; fds %d -> %d",
		nOversized+nSlow+nIdle, nOversized, nSlow, nIdle, elapsed.Round(time.Millisecond), refused,
		goroutinesBefore, goroutinesAfter, fdsBefore, fdsAfter)
	assert.Equal(t, nSlow, refused["slow headers: 400 and closed"]+refused["slow headers: closed"])
	delete(refused, "slow headers: 400 and closed")
	delete(refused, "slow headers: closed")
	assert.Equal(t, map[string]int{"431 and closed": nOversized, "no handshake closed": nIdle}, refused)
	assert.LessOrEqual(t, goroutinesAfter, goroutinesBefore, "leaked goroutines")
	assert.LessOrEqual(t, fdsAfter, fdsBefore, "leaked fds")
}

// TestKubeletLimits pins the server's bounds to the kubelet's
// (ListenAndServeKubeletServer).
func TestKubeletLimits(t *testing.T) {
	assert.Equal(t, httpLimits{
		ReadTimeout: 4 * time.Hour, WriteTimeout: 4 * time.Hour, IdleTimeout: 90 * time.Second, MaxHeaderBytes: 1 << 20,
	}, kubeletLimits)
}
