package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RemoteAddrHeader is the response header in which a pod's HTTP server reports the
// peer address (ip:port) it saw: the client's own, or the node's when masqueraded.
const RemoteAddrHeader = "X-Remote-Addr"

// Pod is a pod namespace with its servers.
type Pod struct {
	*Namespace
	// IP is the pod's address on the bridge.
	IP netip.Addr
	// IP6 is the pod's IPv6 address (Config.IPv6), else zero.
	IP6 netip.Addr
	// HTTPPort serves the pod's name; UDPPort answers "<name> <payload>".
	HTTPPort int
	UDPPort  int
	// dual: the servers listen on both families.
	dual bool

	httpRequests atomic.Int64
	udpPackets   atomic.Int64

	srv  *http.Server
	udp  net.PacketConn
	wg   sync.WaitGroup
	errs chan error
}

// HTTPAddr is "IP:HTTPPort", the pod's HTTP endpoint.
func (p *Pod) HTTPAddr() string { return net.JoinHostPort(p.IP.String(), strconv.Itoa(p.HTTPPort)) }

// UDPAddr is "IP:UDPPort", the pod's UDP endpoint.
func (p *Pod) UDPAddr() string { return net.JoinHostPort(p.IP.String(), strconv.Itoa(p.UDPPort)) }

// HTTPRequests is how many HTTP requests the pod has served.
func (p *Pod) HTTPRequests() int64 { return p.httpRequests.Load() }

// UDPPackets is how many datagrams the pod has answered.
func (p *Pod) UDPPackets() int64 { return p.udpPackets.Load() }

func (p *Pod) startServers() error {
	var ln net.Listener
	err := p.Do(func() error {
		var err error
		tcp, udp := "tcp4", "udp4"
		if p.dual {
			tcp, udp = "tcp", "udp" // [::] without IPV6_V6ONLY: both families
		}
		ln, err = net.Listen(tcp, fmt.Sprintf(":%d", p.HTTPPort))
		if err != nil {
			return err
		}
		p.udp, err = net.ListenPacket(udp, fmt.Sprintf(":%d", p.UDPPort))
		if err != nil {
			ln.Close()
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("servers in %s: %w", p.Name, err)
	}
	name := p.Name
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p.httpRequests.Add(1)
			w.Header().Set(RemoteAddrHeader, r.RemoteAddr)
			_, _ = w.Write([]byte(name))
		}),
		ReadHeaderTimeout: 5 * time.Second,
	}
	p.errs = make(chan error, 2)
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		if err := p.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.errs <- fmt.Errorf("%s HTTP server: %w", name, err)
		}
	}()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, from, err := p.udp.ReadFrom(buf)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					p.errs <- fmt.Errorf("%s UDP server: %w", name, err)
				}
				return
			}
			p.udpPackets.Add(1)
			reply := append([]byte(name+" "), buf[:n]...)
			_, _ = p.udp.WriteTo(reply, from)
		}
	}()
	return nil
}

func (p *Pod) stopServers() error {
	if p.srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := p.srv.Shutdown(ctx)
	if err != nil {
		err = errors.Join(err, p.srv.Close())
	}
	err = errors.Join(err, p.udp.Close())
	p.wg.Wait()
	close(p.errs)
	for e := range p.errs {
		err = errors.Join(err, e)
	}
	p.srv = nil
	return err
}

// Get sends one HTTP GET to http://addr/ with client and returns the body (the name
// of the pod that served it) and the peer address the pod saw.
func Get(ctx context.Context, client *http.Client, addr string) (pod, remoteAddr string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		return "", "", err
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return "", "", fmt.Errorf("read response from %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("GET %s: status %d", addr, resp.StatusCode)
	}
	return string(body), resp.Header.Get(RemoteAddrHeader), nil
}

// EchoUDP sends payload from inside ns to addr over UDP and returns the pod name the
// reply carries. It waits at most timeout (0 means 2 s) for the reply.
func EchoUDP(ctx context.Context, ns *Namespace, addr, payload string, timeout time.Duration) (string, error) {
	if timeout == 0 {
		timeout = 2 * time.Second
	}
	conn, err := ns.Dial(ctx, "udp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := conn.Write([]byte(payload)); err != nil {
		return "", fmt.Errorf("UDP send to %s: %w", addr, err)
	}
	buf := make([]byte, 64<<10)
	n, err := conn.Read(buf)
	if err != nil {
		return "", fmt.Errorf("UDP reply from %s: %w", addr, err)
	}
	name, rest, ok := strings.Cut(string(buf[:n]), " ")
	if !ok || rest != payload {
		return "", fmt.Errorf("UDP reply from %s: unexpected %q", addr, buf[:n])
	}
	return name, nil
}
