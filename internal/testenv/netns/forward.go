package netns

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Forward listens on 127.0.0.1 inside the namespace and forwards every connection to
// target (host:port), dialled from the test process's own namespace. It returns the
// listener's address (127.0.0.1:PORT as seen from inside the namespace). This is how
// an agent running in a node namespace reaches an API server that listens on the
// machine's loopback: the listening socket is created on a thread switched into the
// namespace (and keeps living there), the dials happen from ordinary goroutines.
// Everything stops on test cleanup, open connections included.
func (n *Namespace) Forward(tb testing.TB, target string) string {
	tb.Helper()
	var l net.Listener
	if err := n.Do(func() error {
		var err error
		l, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		tb.Fatalf("netns: forwarder in %s: %v", n.Name, err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) bool {
		mu.Lock()
		defer mu.Unlock()
		if conns == nil {
			c.Close()
			return false
		}
		conns[c] = struct{}{}
		return true
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			if !track(in) {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					in.Close()
					return
				}
				if !track(out) {
					in.Close()
					return
				}
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) {
					_, _ = io.Copy(dst, src)
					// Half-close so the peer sees EOF, then let the other side finish.
					if tc, ok := dst.(*net.TCPConn); ok {
						_ = tc.CloseWrite()
					}
					done <- struct{}{}
				}
				go pipe(out, in)
				go pipe(in, out)
				<-done
				<-done
				in.Close()
				out.Close()
				mu.Lock()
				if conns != nil {
					delete(conns, in)
					delete(conns, out)
				}
				mu.Unlock()
			}()
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}
