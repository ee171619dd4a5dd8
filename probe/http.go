package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/idna"
	corev1 "k8s.io/api/core/v1"
)

// This file speaks HTTP/1.1 for plain-http probes directly on a socket: one
// request per connection (the kubelet turns keep-alives off), so net/http's
// Transport machinery (connection pool, read and write goroutines, channels)
// buys nothing and costs most of a probe's allocations. Everything net/http's
// Client and Transport do that a probe can observe is reproduced: the request
// bytes (Host, User-Agent, sorted headers, Connection: close), 1xx handling,
// the response header limit, redirects as Client.Do follows them (Referer,
// header copying, the Host of relative redirects, CheckRedirect), and the error
// messages. Hops to https (or any other scheme) go through the same
// http.Transport the kubelet configures, so TLS and HTTP/2 are net/http's own.

// maxResponseHeaderBytes is http.Transport's default MaxResponseHeaderBytes.
const maxResponseHeaderBytes = 10 << 20

// aLongTimeAgo is a deadline in the past, to wake a blocked read or wait at once.
var aLongTimeAgo = time.Unix(1, 0)

// maxRedirectSlurp is how much of a redirect's body http.Client reads before
// it follows the redirect.
const maxRedirectSlurp = 2 << 10

// probeURL builds the URL of an httpGet probe as the kubelet does: it parses
// the path, sets scheme and host:port, and then (http.NewRequest) parses the
// URL's string form again. A plain path skips the two parses, which give the
// same URL for it.
func probeURL(scheme, host string, port int, path string) (*url.URL, error) {
	hostPort := net.JoinHostPort(host, strconv.Itoa(port))
	if plainPath(path) {
		u := &url.URL{Scheme: scheme, Host: hostPort, Path: path}
		if validURLHost(hostPort) {
			return u, nil
		}
	}
	u, err := url.Parse(path)
	if err != nil {
		u = &url.URL{Path: path}
	}
	u.Scheme = scheme
	u.Host = hostPort
	return url.Parse(u.String())
}

// plainPath reports whether path is "/" followed by unreserved characters and
// slashes only, so that parsing and printing it changes nothing.
func plainPath(path string) bool {
	if path == "" || path[0] != '/' {
		return false
	}
	for i := 1; i < len(path); i++ {
		c := path[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '/', c == '-', c == '.', c == '_', c == '~':
		default:
			return false
		}
	}
	return true
}

// validURLHost reports whether hostPort is an IPv4 literal or an IPv6 literal
// in brackets or a plain DNS name, with a port: what url.Parse would keep as is.
func validURLHost(hostPort string) bool {
	h, p, err := net.SplitHostPort(hostPort)
	if err != nil || p == "" {
		return false
	}
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == ""
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return h != ""
}

// probeHeaders builds the request headers as the kubelet does. A spec without
// headers shares the Prober's read-only default set.
func (p *Prober) probeHeaders(list []corev1.HTTPHeader) http.Header {
	if len(list) == 0 {
		return p.defaultHeader
	}
	hdr := make(http.Header, len(list)+2)
	for _, kv := range list {
		hdr.Add(kv.Name, kv.Value)
	}
	if _, ok := hdr["User-Agent"]; !ok {
		hdr.Set("User-Agent", p.opts.UserAgent)
	}
	if _, ok := hdr["Accept"]; !ok {
		hdr.Set("Accept", "*/*")
	} else if hdr.Get("Accept") == "" {
		hdr.Del("Accept")
	}
	return hdr
}

// hop is one request of a probe's redirect chain.
type hop struct {
	url *url.URL
	// host is the Request.Host: the Host header's value, if any.
	host string
	// header is the initial request's headers, shared read-only by every hop.
	header http.Header
	// referer, when set, replaces any Referer in header.
	referer string
	// stripSensitive drops credentials, once a redirect left the first host.
	stripSensitive bool
	// stripBody drops the headers about a request body, once a 301, 302 or
	// 303 redirect turned the request into one without a body.
	stripBody bool
}

// dropped reports whether the initial request's header k is left out of h.
func (h *hop) dropped(k string) bool {
	if !h.stripSensitive && !h.stripBody {
		return false
	}
	switch http.CanonicalHeaderKey(k) {
	case "Authorization", "Www-Authenticate", "Cookie", "Cookie2", "Proxy-Authorization", "Proxy-Authenticate":
		return h.stripSensitive
	case "Content-Encoding", "Content-Language", "Content-Location", "Content-Type":
		return h.stripBody
	}
	return false
}

// basicAuth is the Authorization http.Client adds for credentials in the URL,
// when the request carries none; else "".
func (h *hop) basicAuth() string {
	u := h.url.User
	if u == nil {
		return ""
	}
	if v := h.header.Get("Authorization"); v != "" && !h.dropped("Authorization") {
		return ""
	}
	pw, _ := u.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pw))
}

// exchange is one open plain-http response: its connection and reader.
type exchange struct {
	conn probeConn
	lim  limitReader
	br   *bufio.Reader
	// sawEOF records that the connection has been read to its end.
	sawEOF bool
	buf    []byte
	// stopCancel detaches the context's cancellation from conn; nil when the
	// context cannot be cancelled.
	stopCancel func() bool
}

// probeConn is what an HTTP probe needs of its connection.
type probeConn interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
	SetReadDeadline(time.Time) error
}

// limitReader counts what the header reader takes from the connection, for the
// Transport's limit on response header bytes.
type limitReader struct {
	ex   *exchange
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		return 0, fmt.Errorf("read limit of %d bytes exhausted", maxResponseHeaderBytes)
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.ex.conn.Read(p)
	l.left -= int64(n)
	if err == io.EOF {
		l.ex.sawEOF = true
	}
	return n, err
}

var exchangePool = sync.Pool{New: func() any {
	ex := &exchange{buf: make([]byte, 0, 512)}
	ex.lim.ex = ex
	ex.br = bufio.NewReaderSize(&ex.lim, 4096)
	return ex
}}

var bodyPool = sync.Pool{New: func() any { b := make([]byte, maxBodyBytes); return &b }}

// httpTarget resolves an httpGet handler into the URL and the headers of its
// first request. The headers may be shared: callers must not change them.
func (p *Prober) httpTarget(h *corev1.HTTPGetAction, target Target) (*url.URL, http.Header, error) {
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	host := h.Host
	if host == "" {
		host = target.Host
	}
	port, err := resolvePort(h.Port, target.Container)
	if err != nil {
		return nil, nil, err
	}
	u, err := probeURL(scheme, host, port, h.Path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: httpGet: %w", ErrInvalidProbe, err)
	}
	return u, p.probeHeaders(h.HTTPHeaders), nil
}

// probeHTTPGet runs an httpGet handler: it follows redirects as http.Client
// with the kubelet's CheckRedirect does, and judges the final response.
func (p *Prober) probeHTTPGet(ctx context.Context, h *corev1.HTTPGetAction, target Target, timeout time.Duration) (Result, error) {
	u, hdr, err := p.httpTarget(h, target)
	if err != nil {
		return Result{Kind: Unknown}, err
	}
	first := hop{url: u, host: hdr.Get("Host"), header: hdr}

	clientDeadline := time.Now().Add(timeout)
	deadline := clientDeadline
	if cd, ok := ctx.Deadline(); ok && cd.Before(deadline) {
		deadline = cd
	}
	resp, ex, cur, err := p.doHTTP(ctx, first, deadline, clientDeadline)
	if err != nil {
		return Result{Kind: Failure, Message: err.Error()}, nil
	}
	bp := bodyPool.Get().(*[]byte)
	defer bodyPool.Put(bp)
	body, rerr := readAtMostInto(resp.Body, *bp)
	truncated := len(body) == maxBodyBytes
	if ex != nil {
		ex.finish(deadline, truncated || rerr != nil)
	} else {
		_ = resp.Body.Close()
	}
	if rerr != nil {
		return Result{Kind: Failure}, fmt.Errorf("reading body of %s: %w", cur.String(), rerr)
	}
	log := logr.FromContextOrDiscard(ctx).V(4)
	if resp.StatusCode >= http.StatusOK && resp.StatusCode < http.StatusBadRequest {
		if resp.StatusCode >= http.StatusMultipleChoices {
			log.Info("Probe terminated redirects", "url", cur.String(), "status", resp.StatusCode)
			return Result{Kind: Warning, Message: "Probe terminated redirects, Response body: " + string(body)}, nil
		}
		return Result{Kind: Success, Message: string(body)}, nil
	}
	log.Info("HTTP probe failed", "url", cur.String(), "status", resp.StatusCode)
	return Result{Kind: Failure, Message: "HTTP probe failed with statuscode: " + strconv.Itoa(resp.StatusCode)}, nil
}

// doHTTP is http.Client.Do for a probe: it sends first and follows redirects.
// Sending ends by deadline; clientDeadline is http.Client's own (now+timeout),
// past which its errors say "Client.Timeout exceeded".
// On success the response is open: ex is its plain-http exchange (nil for a
// response from the Transport) and cur the URL it answers.
func (p *Prober) doHTTP(ctx context.Context, first hop, deadline, clientDeadline time.Time) (resp *http.Response, ex *exchange, cur *url.URL, err error) {
	req := first
	nreqs := 0
	var prev *url.URL
	dropBody := false
	for {
		if nreqs > 0 {
			loc := resp.Header.Get("Location")
			if loc == "" {
				return resp, ex, prev, nil
			}
			u, perr := prev.Parse(loc)
			if perr != nil {
				closeHop(resp, ex, deadline)
				return nil, nil, nil, &url.Error{Op: "Get", URL: stripPassword(prev), Err: fmt.Errorf("failed to parse Location header %q: %v", loc, perr)}
			}
			next := hop{url: u, header: first.header, stripSensitive: req.stripSensitive, stripBody: dropBody}
			if req.host != "" && req.host != req.url.Host {
				if lu, _ := url.Parse(loc); lu != nil && !lu.IsAbs() {
					next.host = req.host
				}
			}
			if !next.stripSensitive && first.url.Host != u.Host && !shouldCopyHeaderOnRedirect(first.url, u) {
				next.stripSensitive = true
			}
			next.referer = refererFor(prev, u, first.header.Get("Referer"))
			cerr := p.checkRedirectURL(u, first.url, nreqs)
			if errors.Is(cerr, http.ErrUseLastResponse) {
				return resp, ex, prev, nil
			}
			// Like Client.Do: read a little of the body, then close it.
			if resp.ContentLength == -1 || resp.ContentLength <= maxRedirectSlurp {
				_, _ = io.CopyN(io.Discard, resp.Body, maxRedirectSlurp)
			}
			closeHop(resp, ex, deadline)
			if cerr != nil {
				return nil, nil, nil, &url.Error{Op: "Get", URL: loc, Err: cerr}
			}
			req = next
		}
		nreqs++
		prev = req.url
		resp, ex, err = p.sendHop(ctx, req, deadline)
		if err != nil {
			// Only the plain-http hops: upstream's Transport is set up for
			// HTTP/2 by x/net/http2, which http.Client does not recognise, so
			// for https its timer races the request context and loses, and
			// the error carries no "Client.Timeout" note.
			if req.url.Scheme == "http" && time.Now().After(clientDeadline) {
				err = errors.New(err.Error() + " (Client.Timeout exceeded while awaiting headers)")
			}
			return nil, nil, nil, &url.Error{Op: "Get", URL: stripPassword(req.url), Err: err}
		}
		switch resp.StatusCode {
		case 301, 302, 303:
			dropBody = true // the next hop is a GET without body
		case 307, 308:
		default:
			return resp, ex, req.url, nil
		}
	}
}

// closeHop closes a response that will not be read further.
func closeHop(resp *http.Response, ex *exchange, deadline time.Time) {
	if ex != nil {
		ex.finish(deadline, false)
		return
	}
	_ = resp.Body.Close()
}

// checkRedirectURL is the kubelet's redirect checker for a redirect to u, the
// first request having gone to first and nreqs requests having been sent.
func (p *Prober) checkRedirectURL(u, first *url.URL, nreqs int) error {
	if !p.opts.FollowNonLocalRedirects && u.Hostname() != first.Hostname() {
		return http.ErrUseLastResponse
	}
	if nreqs >= maxRedirects {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// stripPassword is how http.Client prints a URL in its errors.
func stripPassword(u *url.URL) string {
	if _, set := u.User.Password(); set {
		return strings.Replace(u.String(), u.User.String()+"@", u.User.Username()+":***@", 1)
	}
	return u.String()
}

// refererFor is the Referer http.Client sets on a redirect from last to next.
func refererFor(last, next *url.URL, explicit string) string {
	if last.Scheme == "https" && next.Scheme == "http" {
		return ""
	}
	if explicit != "" {
		return explicit
	}
	ref := last.String()
	if last.User != nil {
		ref = strings.Replace(ref, last.User.String()+"@", "", 1)
	}
	return ref
}

// shouldCopyHeaderOnRedirect reports whether credentials may follow a redirect
// from initial to dest: same host, or a subdomain of it, as http.Client decides.
func shouldCopyHeaderOnRedirect(initial, dest *url.URL) bool {
	parent, sub := asciiHost(initial.Hostname()), asciiHost(dest.Hostname())
	if sub == parent {
		return true
	}
	if strings.ContainsAny(sub, ":%") { // IPv6 literals have no subdomains
		return false
	}
	return strings.HasSuffix(sub, parent) && sub[len(sub)-len(parent)-1] == '.'
}

// asciiHost is h in its IDNA ASCII form, as the Transport dials it; h itself
// when it is ASCII already or has no such form.
func asciiHost(h string) string {
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 {
			if a, err := idna.Lookup.ToASCII(h); err == nil {
				return a
			}
			return h
		}
	}
	return h
}

// sendHop sends one request. Plain http is spoken here; anything else goes to
// the kubelet-configured Transport.
func (p *Prober) sendHop(ctx context.Context, h hop, deadline time.Time) (*http.Response, *exchange, error) {
	if h.url.Scheme != "http" {
		resp, err := p.transportHop(ctx, h, deadline)
		return resp, nil, err
	}
	if msg := validateHeaders(h.header); msg != "" {
		return nil, nil, errors.New("net/http: invalid header " + msg)
	}
	if h.referer != "" && !httpguts.ValidHeaderFieldValue(h.referer) {
		return nil, nil, errors.New(`net/http: invalid header field value for "Referer"`)
	}
	if h.url.Host == "" {
		return nil, nil, errors.New("http: no Host in request URL")
	}
	ex := exchangePool.Get().(*exchange)
	resp, err := p.roundTrip(ctx, ex, h, deadline)
	if err != nil {
		exchangePool.Put(ex)
		return nil, nil, err
	}
	return resp, ex, nil
}

// transportHop sends h through the Transport, as http.Client's send does.
func (p *Prober) transportHop(ctx context.Context, h hop, deadline time.Time) (*http.Response, error) {
	hdr := h.header.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	for k := range hdr {
		if h.dropped(k) {
			delete(hdr, k)
		}
	}
	if h.referer != "" {
		hdr.Set("Referer", h.referer)
	}
	if auth := h.basicAuth(); auth != "" {
		hdr.Set("Authorization", auth)
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	req := (&http.Request{Method: http.MethodGet, URL: h.url, Header: hdr, Host: h.host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}).WithContext(dctx)
	resp, err := p.transport.RoundTrip(req)
	if err != nil {
		cancel()
		var rh tls.RecordHeaderError
		if errors.As(err, &rh) && string(rh.RecordHeader[:]) == "HTTP/" {
			err = http.ErrSchemeMismatch
		}
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// validateHeaders checks header names and values as http.Transport does before
// sending, returning its message or "".
func validateHeaders(hdr http.Header) string {
	for k, vv := range hdr {
		if !httpguts.ValidHeaderFieldName(k) {
			return fmt.Sprintf("field name %q", k)
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return fmt.Sprintf("field value for %q", k)
			}
		}
	}
	return ""
}

// roundTrip dials, writes the request and reads the response head into ex.
func (p *Prober) roundTrip(ctx context.Context, ex *exchange, h hop, deadline time.Time) (*http.Response, error) {
	req, err := ex.writeRequest(p, h)
	if err != nil {
		return nil, err
	}
	conn, err := p.dialHTTP(ctx, h.url, deadline)
	if err != nil {
		return nil, ctxOr(ctx, deadline, err)
	}
	ex.conn = conn
	ex.sawEOF = false
	ex.lim.left = maxResponseHeaderBytes
	ex.br.Reset(&ex.lim)
	_ = conn.SetDeadline(deadline)
	if ctx.Done() != nil {
		// Until finish: cancellation must also cut the body read short.
		ex.stopCancel = context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	}
	fail := func(err error) (*http.Response, error) {
		ex.abort()
		return nil, ctxOr(ctx, deadline, err)
	}
	if n, err := conn.Write(req); err != nil {
		if n == 0 {
			return fail(err)
		}
		return fail(fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", err))
	}
	if _, err := ex.br.Peek(1); err != nil {
		return fail(err)
	}
	var resp *http.Response
	for {
		resp, err = http.ReadResponse(ex.br, nil)
		if err != nil {
			if ex.lim.left <= 0 {
				err = fmt.Errorf("net/http: server response headers exceeded %d bytes; aborted", maxResponseHeaderBytes)
			}
			return fail(fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", err))
		}
		if resp.StatusCode < 100 || resp.StatusCode > 199 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	ex.lim.left = 1<<63 - 1
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = io.NopCloser(ex.br)
	}
	return resp, nil
}

// ctxOr returns the error the Transport reports when a request fails: the
// context's error once the request's context ended, else err.
func ctxOr(ctx context.Context, deadline time.Time, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return err
}

// dialHTTP connects to u's host and port (80 by default).
func (p *Prober) dialHTTP(ctx context.Context, u *url.URL, deadline time.Time) (probeConn, error) {
	host, port := u.Hostname(), u.Port()
	if port == "" {
		port = "80"
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() == "" && dialFast {
		if n, err := strconv.ParseUint(port, 10, 16); err == nil && n > 0 {
			f, err := dialIP(ctx, netip.AddrPortFrom(a, uint16(n)), deadline, 1)
			if err != nil {
				return nil, err
			}
			return &fileConn{f: f, raddr: netip.AddrPortFrom(a.Unmap(), uint16(n))}, nil
		}
	}
	host = asciiHost(host)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	c, err := p.dialer.DialContext(dctx, "tcp", net.JoinHostPort(host, port))
	if err != nil {
		return nil, err
	}
	return c, nil
}

// writeRequest renders h as net/http's Transport writes it, into ex.buf.
func (ex *exchange) writeRequest(p *Prober, h hop) ([]byte, error) {
	host := h.host
	if host == "" {
		host = h.url.Host
	}
	host, err := httpguts.PunycodeHostPort(host)
	if err != nil {
		return nil, err
	}
	if !httpguts.ValidHostHeader(host) {
		host = ""
	}
	host = removeZone(host)
	ruri := h.url.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if b := ruri[i]; b < ' ' || b == 0x7f {
			return nil, errors.New("net/http: can't write control character in Request.URL")
		}
	}
	b := ex.buf[:0]
	b = append(b, "GET "...)
	b = append(b, ruri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	ua := "Go-http-client/1.1"
	if vv, ok := h.header["User-Agent"]; ok {
		ua = ""
		if len(vv) > 0 {
			ua = vv[0]
		}
	}
	if ua != "" {
		b = appendHeader(b, "User-Agent", ua)
	}
	// Referer and Authorization may be set (replacing any copied values) by
	// http.Client on this hop.
	auth := h.basicAuth()
	override := func(k string) (string, bool) {
		switch {
		case k == "Referer" && h.referer != "":
			return h.referer, true
		case k == "Authorization" && auth != "":
			return auth, true
		}
		return "", false
	}
	var keysArr [16]string
	keys := keysArr[:0]
	for k := range h.header {
		switch k {
		case "Host", "User-Agent", "Content-Length", "Transfer-Encoding", "Trailer":
			continue
		}
		if _, ok := override(k); ok || h.dropped(k) {
			continue
		}
		keys = append(keys, k)
	}
	if h.referer != "" {
		keys = append(keys, "Referer")
	}
	if auth != "" {
		keys = append(keys, "Authorization")
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		if v, ok := override(k); ok {
			b = appendHeader(b, k, v)
			continue
		}
		for _, v := range h.header[k] {
			b = appendHeader(b, k, v)
		}
	}
	if !wantsClose(h.header) && !protocolSwitch(h.header) {
		b = append(b, "Connection: close\r\n"...)
	}
	b = append(b, "\r\n"...)
	ex.buf = b
	return b, nil
}

// appendHeader writes one header line, values cleaned as net/http does.
func appendHeader(b []byte, k, v string) []byte {
	b = append(b, k...)
	b = append(b, ": "...)
	start := len(b)
	b = append(b, textproto.TrimString(v)...)
	for i := start; i < len(b); i++ {
		if b[i] == '\n' || b[i] == '\r' {
			b[i] = ' '
		}
	}
	return append(b, "\r\n"...)
}

// wantsClose reports whether the request already asks to close the connection.
func wantsClose(hdr http.Header) bool {
	return hasToken(hdr.Get("Connection"), "close")
}

// protocolSwitch reports an Upgrade request, to which the Transport adds no
// Connection: close.
func protocolSwitch(hdr http.Header) bool {
	return hasToken(hdr.Get("Connection"), "upgrade") && hdr.Get("Upgrade") != ""
}

func hasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(textproto.TrimString(f), token) {
			return true
		}
	}
	return false
}

// removeZone drops an IPv6 zone from a bracketed host, as the Host header
// must not carry one.
func removeZone(host string) string {
	if !strings.HasPrefix(host, "[") {
		return host
	}
	end := strings.LastIndexByte(host, ']')
	if end < 0 {
		return host
	}
	pct := strings.LastIndexByte(host[:end], '%')
	if pct < 0 {
		return host
	}
	return host[:pct] + host[end:]
}

// abort closes the connection at once and returns ex to the pool's care of
// the caller.
func (ex *exchange) abort() {
	ex.detach()
	if ex.conn != nil {
		_ = ex.conn.Close()
		ex.conn = nil
	}
}

// finish closes the exchange's connection and puts ex back in the pool. The
// server was asked to close ("Connection: close"); unless the response was cut
// short, finish waits briefly for that close, so the prober's side is the
// passive closer and keeps no TIME_WAIT socket (SO_LINGER then has nothing to
// do). A cut-short response is closed at once, with a reset, as net/http does.
func (ex *exchange) finish(deadline time.Time, cutShort bool) {
	ex.detach()
	if ex.conn == nil {
		exchangePool.Put(ex)
		return
	}
	if !cutShort && !ex.sawEOF {
		wait := time.Now().Add(finWait)
		if deadline.Before(wait) {
			wait = deadline
		}
		if ex.conn.SetReadDeadline(wait) == nil {
			var scratch [512]byte
			for range 8 {
				if _, err := ex.conn.Read(scratch[:]); err != nil {
					break
				}
			}
		}
	}
	_ = ex.conn.Close()
	ex.conn = nil
	ex.br.Reset(&ex.lim)
	exchangePool.Put(ex)
}

// detach stops the context's cancellation from touching the connection.
func (ex *exchange) detach() {
	if ex.stopCancel != nil {
		ex.stopCancel()
		ex.stopCancel = nil
	}
}

// readAtMostInto reads r into buf up to len(buf) bytes; more is dropped.
func readAtMostInto(r io.Reader, buf []byte) ([]byte, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return buf[:n], nil
		}
		if err != nil {
			return buf[:n], err
		}
	}
	return buf[:n], nil
}

// fileConn is a TCP connection dialled by dialIP. Its errors read like
// net.TCPConn's ("read tcp 10.0.0.2:40000->10.0.0.1:80: read: connection
// reset by peer").
type fileConn struct {
	f     *os.File
	raddr netip.AddrPort
}

func (c *fileConn) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	if err != nil && err != io.EOF {
		err = c.opError("read", err)
	}
	return n, err
}

func (c *fileConn) Write(p []byte) (int, error) {
	n, err := c.f.Write(p)
	if err != nil {
		err = c.opError("write", err)
	}
	return n, err
}

func (c *fileConn) Close() error                       { return c.f.Close() }
func (c *fileConn) SetDeadline(t time.Time) error      { return c.f.SetDeadline(t) }
func (c *fileConn) SetReadDeadline(t time.Time) error  { return c.f.SetReadDeadline(t) }
func (c *fileConn) SetWriteDeadline(t time.Time) error { return c.f.SetWriteDeadline(t) }

func (c *fileConn) opError(op string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, os.ErrClosed) {
		err = os.NewSyscallError(op, err)
	}
	var src net.Addr
	if sc, serr := c.f.SyscallConn(); serr == nil {
		_ = sc.Control(func(fd uintptr) { src = localAddr(int(fd)) })
	}
	return &net.OpError{Op: op, Net: "tcp", Source: src, Addr: net.TCPAddrFromAddrPort(c.raddr), Err: err}
}
