package probe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
)

// UserAgent is the User-Agent of HTTP and gRPC probes, as the kubelet 1.37 sends it.
const UserAgent = "kube-probe/1.37"

// maxBodyBytes is how much of an HTTP response body a probe reads (10 KiB);
// the rest is dropped without error. Exec output is capped the same way.
const maxBodyBytes = 10 << 10

// maxRedirects is where the redirect checker stops a chain.
const maxRedirects = 10

// Target says where a probe goes and what it may resolve against.
type Target struct {
	// Host is the address used when the handler names no host: the pod IP for the
	// kubelet, any IP or DNS name elsewhere. gRPC probes always use it.
	Host string
	// Container supplies named ports and the env for $(VAR) expansion in exec
	// commands. Nil means no named ports and no expansion.
	Container *corev1.Container
	// ContainerID is handed to the Execer for exec probes.
	ContainerID string
}

// Options configure a Prober. The zero value gives the kubelet's defaults.
type Options struct {
	// Execer runs exec probes. Nil makes exec probes return ErrNoExecer; use
	// OSExecer for commands on this host, or a CRI ExecSync adapter.
	Execer Execer
	// FollowNonLocalRedirects follows HTTP redirects to other hosts. The kubelet
	// leaves it false: such a redirect is not followed and the probe is a Warning.
	FollowNonLocalRedirects bool
	// EnableH2C honours httpGet.protocol HTTP2 (cleartext HTTP/2 with prior
	// knowledge), the kubelet's alpha H2CContainerProbe gate. Off by default.
	EnableH2C bool
	// EnableGRPCTLS honours grpc.mode TLS, the kubelet's alpha GRPCContainerProbeTLS
	// gate. Off by default: TLS mode is dialled in plaintext, as upstream does.
	EnableGRPCTLS bool
	// UserAgent overrides UserAgent. Empty means UserAgent.
	UserAgent string
	// ResetTCPProbes closes tcpSocket probe connections with a reset (SO_LINGER 0)
	// instead of a FIN, so they leave no TIME_WAIT socket on this side. Off by
	// default, as in the kubelet, whose SO_LINGER of 1 s does not stop the
	// prober's side of a tcpSocket probe from entering TIME_WAIT (see docs/probe.md).
	ResetTCPProbes bool
}

// Prober runs probe specs. It is safe for concurrent use and holds no
// connections between probes (keep-alives are off), so it needs no Close.
type Prober struct {
	opts      Options
	transport *http.Transport
	h2c       *http.Transport
	dialer    *net.Dialer
	// defaultHeader is the headers of an httpGet probe that sets none. Shared
	// by every such probe, so never modified.
	defaultHeader http.Header
}

// NewProber returns a Prober with opts.
func NewProber(opts Options) *Prober {
	if opts.UserAgent == "" {
		opts.UserAgent = UserAgent
	}
	d := probeDialer()
	// HTTP probes ask the server to close ("Connection: close"); letting it close
	// first puts the TIME_WAIT socket on the server's side, not the prober's.
	httpDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &serverClosesFirst{Conn: c}, nil
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // probes never verify, as the kubelet's
		DisableKeepAlives:   true,
		Proxy:               nil,
		DisableCompression:  true,
		DialContext:         httpDial,
		TLSHandshakeTimeout: 10 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	h2c := &http.Transport{
		DisableKeepAlives:  true,
		Proxy:              nil,
		DisableCompression: true,
		DialContext:        httpDial,
		Protocols:          new(http.Protocols),
	}
	h2c.Protocols.SetUnencryptedHTTP2(true)
	return &Prober{opts: opts, transport: tr, h2c: h2c, dialer: d,
		defaultHeader: http.Header{"User-Agent": {opts.UserAgent}, "Accept": {"*/*"}}}
}

// probeDialer sets SO_LINGER on with a 1 s timeout on every probe socket, as the
// kubelet does, so probes do not leave a pile of TIME_WAIT sockets behind.
func probeDialer() *net.Dialer {
	return &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error { return c.Control(setLinger) }}
}

var linger1s = syscall.Linger{Onoff: 1, Linger: 1}

// setLinger is a plain function (no closure) so dialling allocates nothing for
// it. Like the kubelet, a failure to set the option does not fail the probe.
func setLinger(fd uintptr) {
	l := linger1s
	_ = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &l)
}

// finWait is how long closing an HTTP probe connection waits for the server's
// FIN. Closing happens in the transport's goroutine, after the result is known,
// so it never delays a probe.
const finWait = 50 * time.Millisecond

// serverClosesFirst delays Close until the peer has closed its side (or finWait
// passed), so the prober is the passive closer and keeps no TIME_WAIT socket.
type serverClosesFirst struct {
	net.Conn
	once sync.Once
}

func (c *serverClosesFirst) Close() error {
	var err error
	c.once.Do(func() {
		if c.Conn.SetReadDeadline(time.Now().Add(finWait)) == nil {
			var b [1]byte
			_, _ = c.Conn.Read(b[:])
		}
		err = c.Conn.Close()
	})
	return err
}

var defaultProber = NewProber(Options{Execer: OSExecer{}})

// Probe is the one-off entry point: it defaults and validates spec, then probes
// target now with the kubelet's retry rule, using a shared Prober whose exec
// probes run on this host through OSExecer. See Prober.Probe.
func Probe(ctx context.Context, spec *corev1.Probe, target Target) (Result, error) {
	return defaultProber.Probe(ctx, spec, target)
}

// Probe defaults and validates spec, then runs it against target the way the
// kubelet does: an attempt that returns an error is retried, up to 3 attempts in
// all; a Failure is final. The result keeps its raw kind (Warning and Unknown
// included). The error is non-nil when the spec is invalid or every attempt
// errored; the result is then Unknown (or the last attempt's kind).
// Each attempt is bounded by the spec's timeoutSeconds and by ctx.
func (p *Prober) Probe(ctx context.Context, spec *corev1.Probe, target Target) (Result, error) {
	if err := Validate(spec, Readiness, nil); err != nil {
		return Result{Kind: Unknown}, err
	}
	var (
		res Result
		err error
	)
	for range maxProbeRetries {
		res, err = p.attempt(ctx, spec, target)
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	return res, err
}

// ProbeOnce runs one attempt of spec against target, without retries.
func (p *Prober) ProbeOnce(ctx context.Context, spec *corev1.Probe, target Target) (Result, error) {
	if err := Validate(spec, Readiness, nil); err != nil {
		return Result{Kind: Unknown}, err
	}
	return p.attempt(ctx, spec, target)
}

// attempt runs spec once; spec has been validated (not necessarily defaulted).
func (p *Prober) attempt(ctx context.Context, spec *corev1.Probe, target Target) (Result, error) {
	secs := spec.TimeoutSeconds
	if secs == 0 {
		secs = DefaultTimeoutSeconds
	}
	timeout := time.Duration(secs) * time.Second
	switch {
	case spec.Exec != nil:
		var env []corev1.EnvVar
		if target.Container != nil {
			env = target.Container.Env
		}
		return p.probeExec(ctx, target.ContainerID, ExpandCommand(spec.Exec.Command, env), timeout)
	case spec.HTTPGet != nil:
		if !p.opts.EnableH2C || spec.HTTPGet.Protocol == nil || *spec.HTTPGet.Protocol != corev1.HTTPProtocolHTTP2 {
			return p.probeHTTPGet(ctx, spec.HTTPGet, target, timeout)
		}
		req, err := p.newHTTPRequest(ctx, spec.HTTPGet, target)
		if err != nil {
			return Result{Kind: Unknown}, err
		}
		return p.probeHTTP(ctx, req, p.h2c, timeout)
	case spec.TCPSocket != nil:
		port, err := resolvePort(spec.TCPSocket.Port, target.Container)
		if err != nil {
			return Result{Kind: Unknown}, err
		}
		host := spec.TCPSocket.Host
		if host == "" {
			host = target.Host
		}
		return p.probeTCP(ctx, host, port, timeout), nil
	case spec.GRPC != nil:
		service := ""
		if spec.GRPC.Service != nil {
			service = *spec.GRPC.Service
		}
		useTLS := p.opts.EnableGRPCTLS && spec.GRPC.Mode != nil && *spec.GRPC.Mode == corev1.GRPCProbeModeTLS
		return p.probeGRPC(ctx, target.Host, service, int(spec.GRPC.Port), timeout, useTLS), nil
	default:
		return Result{Kind: Unknown}, ErrNoHandler
	}
}

// newHTTPRequest builds the GET the kubelet sends for an httpGet handler.
func (p *Prober) newHTTPRequest(ctx context.Context, h *corev1.HTTPGetAction, target Target) (*http.Request, error) {
	u, hdr, err := p.httpTarget(h, target)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: httpGet: %w", ErrInvalidProbe, err)
	}
	req.Header = hdr.Clone()
	req.Host = hdr.Get("Host")
	return req, nil
}

func (p *Prober) checkRedirect(req *http.Request, via []*http.Request) error {
	if p.opts.FollowNonLocalRedirects {
		if len(via) >= maxRedirects {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= maxRedirects {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

func (p *Prober) probeHTTP(ctx context.Context, req *http.Request, tr *http.Transport, timeout time.Duration) (Result, error) {
	client := http.Client{Timeout: timeout, Transport: tr, CheckRedirect: p.checkRedirect}
	resp, err := client.Do(req)
	if err != nil {
		return Result{Kind: Failure, Message: err.Error()}, nil
	}
	defer resp.Body.Close()
	body, err := readAtMost(resp.Body, maxBodyBytes)
	if err != nil {
		return Result{Kind: Failure}, fmt.Errorf("reading body of %s: %w", req.URL, err)
	}
	log := logr.FromContextOrDiscard(ctx).V(4)
	if resp.StatusCode >= http.StatusOK && resp.StatusCode < http.StatusBadRequest {
		if resp.StatusCode >= http.StatusMultipleChoices {
			log.Info("Probe terminated redirects", "url", req.URL.String(), "status", resp.StatusCode)
			return Result{Kind: Warning, Message: "Probe terminated redirects, Response body: " + string(body)}, nil
		}
		return Result{Kind: Success, Message: string(body)}, nil
	}
	log.Info("HTTP probe failed", "url", req.URL.String(), "status", resp.StatusCode)
	return Result{Kind: Failure, Message: "HTTP probe failed with statuscode: " + strconv.Itoa(resp.StatusCode)}, nil
}

// readAtMost reads up to limit bytes; more data is silently truncated.
func readAtMost(r io.Reader, limit int) ([]byte, error) {
	buf := make([]byte, 0, 512)
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), min(2*cap(buf), limit))
			copy(nb, buf)
			buf = nb
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

func (p *Prober) probeTCP(ctx context.Context, host string, port int, timeout time.Duration) Result {
	if ap, ok := literalAddrPort(host, port); ok {
		var linger int32 = 1
		if p.opts.ResetTCPProbes {
			linger = 0
		}
		f, err := dialIP(ctx, ap, probeDeadline(ctx, timeout), linger)
		if err != nil {
			return Result{Kind: Failure, Message: err.Error()}
		}
		if err := f.Close(); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "Unexpected error closing TCP probe socket", "addr", ap.String())
		}
		return Result{Kind: Success}
	}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	d := *p.dialer
	d.Timeout = timeout
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{Kind: Failure, Message: err.Error()}
	}
	if p.opts.ResetTCPProbes {
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	if err := conn.Close(); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "Unexpected error closing TCP probe socket", "addr", addr)
	}
	return Result{Kind: Success}
}

// literalAddrPort parses host as an IP literal without a zone, for the direct
// dial path; names, zones and the empty host go through net.Dialer, whose
// resolver and scope handling they need.
func literalAddrPort(host string, port int) (netip.AddrPort, bool) {
	if !dialFast || port < 1 || port > 65535 {
		return netip.AddrPort{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a, uint16(port)), true
}

// probeDeadline is when an attempt started now with timeout must end: the
// earlier of now+timeout and ctx's deadline, as net.Dialer and http.Client
// combine them.
func probeDeadline(ctx context.Context, timeout time.Duration) time.Time {
	d := time.Now().Add(timeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		return cd
	}
	return d
}

func (p *Prober) probeExec(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (Result, error) {
	if p.opts.Execer == nil {
		return Result{Kind: Unknown}, ErrNoExecer
	}
	stdout, stderr, code, err := p.opts.Execer.ExecSync(ctx, containerID, cmd, timeout)
	out := capOutput(stdout, stderr)
	switch {
	case err == nil && code == 0:
		return Result{Kind: Success, Message: string(out)}, nil
	case err == nil:
		return Result{Kind: Failure, Message: string(out)}, nil
	case errors.Is(err, ErrExecTimeout):
		return Result{Kind: Failure, Message: err.Error()}, nil
	default:
		return Result{Kind: Unknown}, fmt.Errorf("exec probe in container %q: %w", containerID, err)
	}
}

// capOutput joins stdout and stderr like the kubelet's RunInContainer and keeps
// the first 10 KiB.
func capOutput(stdout, stderr []byte) []byte {
	out := make([]byte, 0, min(len(stdout)+len(stderr), maxBodyBytes))
	out = append(out, stdout[:min(len(stdout), maxBodyBytes)]...)
	return append(out, stderr[:min(len(stderr), maxBodyBytes-len(out))]...)
}
