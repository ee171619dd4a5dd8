package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// NSDialer opens TCP connections from inside a network namespace: a socket keeps the
// namespace of the thread that created it, so one goroutine locked to an OS thread
// that entered the namespace makes every socket. The rest of the process stays in the
// machine's namespace.
type NSDialer struct {
	reqs chan dialReq
	once sync.Once
	done chan struct{}
}

type dialReq struct {
	ctx  context.Context
	addr string
	resp chan dialResp
}

type dialResp struct {
	conn net.Conn
	err  error
}

// NewNSDialer starts the dialing thread in the namespace at path.
func NewNSDialer(path string) (*NSDialer, error) {
	d := &NSDialer{reqs: make(chan dialReq), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		// The thread is never unlocked: when this goroutine returns, the runtime ends the
		// thread instead of handing a thread in the wrong namespace to other goroutines.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err == nil {
			err = netns.Set(h)
			h.Close()
		}
		ready <- err
		if err != nil {
			return
		}
		for {
			select {
			case <-d.done:
				return
			case r := <-d.reqs:
				var nd net.Dialer
				c, err := nd.DialContext(r.ctx, "tcp", r.addr)
				r.resp <- dialResp{c, err}
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	return d, nil
}

// DialContext has net.Dialer's signature, for http.Transport.
func (d *NSDialer) DialContext(ctx context.Context, _, addr string) (net.Conn, error) {
	r := dialReq{ctx: ctx, addr: addr, resp: make(chan dialResp, 1)}
	select {
	case d.reqs <- r:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-d.done:
		return nil, errors.New("namespace dialer closed")
	}
	select {
	case res := <-r.resp:
		return res.conn, res.err
	case <-ctx.Done():
		// The dial finishes on the namespace thread; close what it makes.
		go func() {
			if res := <-r.resp; res.conn != nil {
				res.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// Close ends the dialing thread.
func (d *NSDialer) Close() { d.once.Do(func() { close(d.done) }) }

// Forward accepts on l and joins each connection to a new one to target made by d,
// until ctx ends. Bytes are copied both ways; no TLS is terminated here.
func Forward(ctx context.Context, l net.Listener, d *NSDialer, target string) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			// Anything else (EMFILE, ENFILE, a timeout) passes: back off as net/http's
			// server does and accept again, so the API port stays up.
			if backoff == 0 {
				backoff = 5 * time.Millisecond
			} else if backoff *= 2; backoff > time.Second {
				backoff = time.Second
			}
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := d.DialContext(dctx, "tcp", target)
			cancel()
			if err != nil {
				return
			}
			defer up.Close()
			stopCopy := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
			defer stopCopy()
			var cw sync.WaitGroup
			cw.Add(2)
			go func() { defer cw.Done(); _, _ = io.Copy(up, c); closeWrite(up) }()
			go func() { defer cw.Done(); _, _ = io.Copy(c, up); closeWrite(c) }()
			cw.Wait()
		}()
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
