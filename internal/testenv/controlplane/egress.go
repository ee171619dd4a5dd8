package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// egressConfig is kube-apiserver's --egress-selector-config-file: traffic to the
// cluster (nodes, pods, services) goes through an HTTP CONNECT proxy on a unix socket,
// as with konnectivity; the control plane's and etcd's traffic stays direct.
const egressConfig = `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`

// egressProxy is the HTTP CONNECT proxy behind the "cluster" egress: each CONNECT
// host:port is dialled with the test's function and spliced to the API server.
type egressProxy struct {
	l    net.Listener
	dial func(ctx context.Context, address string) (net.Conn, error)

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startEgress writes the egress selector configuration and serves the proxy on a unix
// socket in the control plane's folder. It returns the configuration's path.
func (cp *ControlPlane) startEgress() (string, error) {
	sock := cp.path("egress.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return "", fmt.Errorf("egress proxy: %w", err)
	}
	p := &egressProxy{l: l, dial: cp.opts.ClusterEgress, conns: map[net.Conn]struct{}{}}
	cp.egress = p
	p.wg.Add(1)
	go p.serve()
	cfg := cp.path("egress-selector.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, egressConfig, sock), 0o600); err != nil {
		return "", err
	}
	return cfg, nil
}

func (p *egressProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *egressProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		if p.conns != nil {
			delete(p.conns, c)
		}
	}
}

func (p *egressProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(c)
		}()
	}
}

// handle answers one CONNECT: 200 and a spliced connection, or 502 when the dial fails.
func (p *egressProxy) handle(in net.Conn) {
	br := bufio.NewReader(in)
	_ = in.SetReadDeadline(time.Now().Add(10 * time.Second))
	req, err := http.ReadRequest(br)
	if err != nil {
		p.untrack(in)
		return
	}
	_ = in.SetReadDeadline(time.Time{})
	if req.Method != http.MethodConnect {
		_, _ = io.WriteString(in, "HTTP/1.1 405 Method Not Allowed\r\n\r\n")
		p.untrack(in)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	out, err := p.dial(ctx, req.URL.Host)
	cancel()
	if err != nil {
		_, _ = fmt.Fprintf(in, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain\r\n\r\n%v", err)
		p.untrack(in)
		return
	}
	if !p.track(out) {
		p.untrack(in)
		return
	}
	if _, err := io.WriteString(in, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		p.untrack(in, out)
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(out, br); closeWrite(out); done <- struct{}{} }()
	go func() { _, _ = io.Copy(in, out); closeWrite(in); done <- struct{}{} }()
	<-done
	<-done
	p.untrack(in, out)
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// stop closes the listener and every open connection and waits for the handlers.
func (p *egressProxy) stop() {
	p.l.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}
