package probe

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

// This file speaks the one gRPC call a probe makes, grpc.health.v1.Health/Check,
// directly over HTTP/2 (cleartext, prior knowledge), instead of building a
// grpc.ClientConn, its resolver, balancer and transport goroutines per probe.
// What the kubelet's prober (a blocking grpc.DialContext, then Check) shows is
// kept: the connection counts as up only once the server's HTTP/2 SETTINGS
// arrived; until then failures are retried with gRPC's connection backoff
// (1 s, x1.6, 20% jitter) and the probe ends with the "failed to connect ...
// within" timeout; the call carries grpc-timeout and the same User-Agent; its
// status maps to the same messages.
//
// Flow control is minimal: the response to Check is a few bytes, far inside
// HTTP/2's initial 64 KiB windows, so no WINDOW_UPDATE is sent. A response
// bigger than that stalls and ends at the timeout.

const (
	grpcHealthPath = "/grpc.health.v1.Health/Check"
	// grpcMaxRecvMsg is grpc-go's default limit on a received message.
	grpcMaxRecvMsg = 4 << 20
	// grpcMaxHeaderList is grpc-go's default limit on received header lists.
	grpcMaxHeaderList = 16 << 20
	// grpcBaseBackoff, grpcBackoffFactor and grpcBackoffJitter are gRPC's
	// default connection backoff.
	grpcBaseBackoff   = time.Second
	grpcBackoffFactor = 1.6
	grpcBackoffJitter = 0.2
	grpcMaxBackoff    = 120 * time.Second
)

// grpcUserAgent is what grpc-go sends for grpc.WithUserAgent(ua).
func grpcUserAgent(ua string) string { return ua + " grpc-go/" + grpc.Version }

// h2Conn is one HTTP/2 connection of a gRPC probe: pooled read and write
// buffers around a swappable connection.
type h2Conn struct {
	conn probeConn
	rw   connRW
	br   *bufio.Reader
	bw   *bufio.Writer
	hbuf []byte
	msg  []byte
}

// connRW forwards to the current connection, so the pooled buffers can be
// reused across connections.
type connRW struct{ c *h2Conn }

func (rw connRW) Read(p []byte) (int, error)  { return rw.c.conn.Read(p) }
func (rw connRW) Write(p []byte) (int, error) { return rw.c.conn.Write(p) }

var h2Pool = sync.Pool{New: func() any {
	c := &h2Conn{}
	c.rw = connRW{c}
	c.br = bufio.NewReaderSize(c.rw, 4096)
	c.bw = bufio.NewWriterSize(c.rw, 1024)
	return c
}}

// probeGRPCDirect runs a plaintext gRPC health check against host:port.
func (p *Prober) probeGRPCDirect(ctx context.Context, host, service string, port int, timeout time.Duration) Result {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	deadline := probeDeadline(ctx, timeout)
	c := h2Pool.Get().(*h2Conn)
	defer h2Pool.Put(c)

	connectTimeout := func() Result {
		return Result{Kind: Failure, Message: fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, context.DeadlineExceeded)}
	}
	connectCanceled := func(err error) Result {
		return Result{Kind: Failure, Message: fmt.Sprintf("error: failed to connect service at %q: %+v", addr, err)}
	}
	backoff := grpcBaseBackoff
	for {
		fr, err := c.connect(ctx, p, host, port, deadline)
		if err == nil {
			defer c.close()
			return p.grpcCheck(ctx, c, fr, addr, service, deadline, timeout)
		}
		c.close()
		if cerr := ctx.Err(); cerr != nil && !errors.Is(cerr, context.DeadlineExceeded) {
			return connectCanceled(cerr)
		}
		if !time.Now().Before(deadline) {
			return connectTimeout()
		}
		wait := time.Duration(float64(backoff) * (1 + grpcBackoffJitter*(rand.Float64()*2-1)))
		backoff = min(time.Duration(float64(backoff)*grpcBackoffFactor), grpcMaxBackoff)
		t := time.NewTimer(min(time.Until(deadline), wait))
		select {
		case <-ctx.Done():
			t.Stop()
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connectTimeout()
			}
			return connectCanceled(ctx.Err())
		case <-t.C:
		}
		if !time.Now().Before(deadline) {
			return connectTimeout()
		}
	}
}

// connect dials and exchanges HTTP/2 prefaces: the connection is ready when
// the server's first frame, a SETTINGS frame, has arrived.
func (c *h2Conn) connect(ctx context.Context, p *Prober, host string, port int, deadline time.Time) (*http2.Framer, error) {
	conn, err := p.dialProbe(ctx, host, port, deadline)
	if err != nil {
		return nil, err
	}
	c.conn = conn
	_ = conn.SetDeadline(deadline)
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
		defer stop()
	}
	c.br.Reset(c.rw)
	c.bw.Reset(c.rw)
	fr := http2.NewFramer(c.bw, c.br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = grpcMaxHeaderList
	if _, err := c.bw.WriteString(http2.ClientPreface); err != nil {
		return nil, err
	}
	if err := fr.WriteSettings(); err != nil {
		return nil, err
	}
	if err := c.bw.Flush(); err != nil {
		return nil, err
	}
	f, err := fr.ReadFrame()
	if err != nil {
		return nil, err
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		return nil, errors.New("first frame received is not a setting frame")
	}
	if err := fr.WriteSettingsAck(); err != nil {
		return nil, err
	}
	return fr, nil
}

// dialProbe connects to host:port by deadline, directly for IP literals.
func (p *Prober) dialProbe(ctx context.Context, host string, port int, deadline time.Time) (probeConn, error) {
	if ap, ok := literalAddrPort(host, port); ok {
		f, err := dialIP(ctx, ap, deadline, 1)
		if err != nil {
			return nil, err
		}
		return &fileConn{f: f, raddr: ap}, nil
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return p.dialer.DialContext(dctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
}

func (c *h2Conn) close() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.conn = nil
	}
}

// grpcCall is what the Check call received.
type grpcCall struct {
	gotHeaders bool
	// code and message are the call's status; set means it is known.
	code    codes.Code
	message string
	set     bool
	msg     []byte
	nmsgs   int
	// nonGRPC holds the status of a response that is not gRPC, whose body
	// (up to grpcNonGRPCData bytes) grpc-go appends to the message.
	nonGRPC     *grpcCall
	nonGRPCData []byte
}

// grpcNonGRPCData is how much of a non-gRPC response body grpc-go reports.
const grpcNonGRPCData = 1024

// finalizeNonGRPC is the status of a non-gRPC response, with its body.
func (call *grpcCall) finalizeNonGRPC() grpcCall {
	return grpcCall{code: call.nonGRPC.code, message: fmt.Sprintf("%s\ndata: %q", call.nonGRPC.message, call.nonGRPCData), set: true}
}

// grpcCheck sends Check on stream 1 of a ready connection and judges the reply.
func (p *Prober) grpcCheck(ctx context.Context, c *h2Conn, fr *http2.Framer, addr, service string, deadline time.Time, timeout time.Duration) Result {
	if ctx.Done() != nil {
		conn := c.conn
		stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
		defer stop()
	}
	call, err := c.call(fr, p.opts.UserAgent, addr, service, deadline)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			if errors.Is(cerr, context.DeadlineExceeded) {
				return grpcFailure(codes.DeadlineExceeded, "context deadline exceeded", timeout)
			}
			return grpcFailure(codes.Canceled, "context canceled", timeout)
		}
		if !time.Now().Before(deadline) {
			return grpcFailure(codes.DeadlineExceeded, "context deadline exceeded", timeout)
		}
		return grpcFailure(codes.Unavailable, "error reading from server: "+err.Error(), timeout)
	}
	if call.code != codes.OK {
		return grpcFailure(call.code, call.message, timeout)
	}
	if call.nmsgs == 0 {
		return grpcFailure(codes.Internal, "cardinality violation: received no response message from non-streaming RPC", timeout)
	}
	st, ok := decodeHealthResponse(call.msg)
	if !ok {
		return grpcFailure(codes.Internal, "grpc: error unmarshalling response: proto: cannot parse invalid wire-format data", timeout)
	}
	if st != healthpb.HealthCheckResponse_SERVING {
		return Result{Kind: Failure, Message: fmt.Sprintf("service unhealthy (responded with %q)", st.String())}
	}
	return Result{Kind: Success, Message: "service healthy"}
}

// grpcFailure is the kubelet's message for a Check that failed with code.
func grpcFailure(code codes.Code, msg string, timeout time.Duration) Result {
	switch code {
	case codes.Unimplemented:
		return Result{Kind: Failure, Message: "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): " + msg}
	case codes.DeadlineExceeded:
		return Result{Kind: Failure, Message: fmt.Sprintf("timeout: health rpc did not complete within %v", timeout)}
	}
	return Result{Kind: Failure, Message: fmt.Sprintf("error: health rpc probe failed: %+v", status.Error(code, msg))}
}

// call writes the request and reads until stream 1 ends. A returned error is a
// connection failure; the call's own outcome is in grpcCall.
func (c *h2Conn) call(fr *http2.Framer, ua, authority, service string, deadline time.Time) (grpcCall, error) {
	var call grpcCall
	h := c.hbuf[:0]
	enc := hpack.NewEncoder((*appendWriter)(&h))
	for _, f := range [...]hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: grpcHealthPath},
		{Name: ":authority", Value: authority},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "user-agent", Value: grpcUserAgent(ua)},
		{Name: "te", Value: "trailers"},
		{Name: "grpc-timeout", Value: encodeGRPCTimeout(time.Until(deadline))},
	} {
		if err := enc.WriteField(f); err != nil {
			return call, err
		}
	}
	c.hbuf = h
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h, EndHeaders: true}); err != nil {
		return call, err
	}
	m := c.msg[:0]
	m = append(m, 0, 0, 0, 0, 0)
	if service != "" {
		m = protowire.AppendTag(m, 1, protowire.BytesType)
		m = protowire.AppendString(m, service)
	}
	binary.BigEndian.PutUint32(m[1:5], uint32(len(m)-5))
	c.msg = m
	if err := fr.WriteData(1, true, m); err != nil {
		return call, err
	}
	if err := c.bw.Flush(); err != nil {
		return call, err
	}
	call.msg = c.msg[:0]
	var body []byte // DATA payload of stream 1, gRPC length-prefixed
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) && se.StreamID == 1 {
				return grpcCall{code: codes.Internal, message: se.Error(), set: true}, nil
			}
			return call, err
		}
		ended := false
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					return call, err
				}
				if err := c.bw.Flush(); err != nil {
					return call, err
				}
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				if err := fr.WritePing(true, f.Data); err != nil {
					return call, err
				}
				if err := c.bw.Flush(); err != nil {
					return call, err
				}
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID != 1 {
				continue
			}
			ended = f.StreamEnded()
			if done := call.headers(f); done {
				return call, nil
			}
		case *http2.DataFrame:
			if f.StreamID != 1 {
				continue
			}
			ended = f.StreamEnded()
			if call.nonGRPC != nil {
				d := f.Data()
				call.nonGRPCData = append(call.nonGRPCData, d[:min(len(d), grpcNonGRPCData-len(call.nonGRPCData))]...)
				if len(call.nonGRPCData) >= grpcNonGRPCData || ended {
					return call.finalizeNonGRPC(), nil
				}
				continue
			}
			if !call.gotHeaders {
				return grpcCall{code: codes.Internal, message: "received DATA before HEADERS", set: true}, nil
			}
			body = append(body, f.Data()...)
			for len(body) >= 5 {
				n := binary.BigEndian.Uint32(body[1:5])
				if n > grpcMaxRecvMsg {
					return grpcCall{code: codes.ResourceExhausted, message: fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", n, grpcMaxRecvMsg), set: true}, nil
				}
				if uint32(len(body)-5) < n {
					break
				}
				if body[0] != 0 {
					return grpcCall{code: codes.Internal, message: "grpc: compressed flag set with identity or empty encoding", set: true}, nil
				}
				call.msg = append(call.msg[:0], body[5:5+n]...)
				call.nmsgs++
				body = body[5+n:]
			}
			if ended {
				return grpcCall{code: codes.Internal, message: "server closed the stream without sending trailers", set: true}, nil
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return grpcCall{code: rstCode(f.ErrCode, deadline), message: fmt.Sprintf("stream terminated by RST_STREAM with error code: %v", f.ErrCode), set: true}, nil
			}
		case *http2.GoAwayFrame:
			if f.LastStreamID < 1 {
				return grpcCall{code: codes.Unavailable, message: "the connection is draining due to GOAWAY", set: true}, nil
			}
		}
		if ended {
			return call, nil
		}
	}
}

// headers takes a HEADERS block of stream 1; done reports that the call's
// outcome is known.
func (call *grpcCall) headers(f *http2.MetaHeadersFrame) (done bool) {
	initial := !call.gotHeaders
	end := f.StreamEnded()
	if call.nonGRPC != nil {
		if end {
			*call = call.finalizeNonGRPC()
			return true
		}
		return false
	}
	if !initial && !end {
		*call = grpcCall{code: codes.Internal, message: "a HEADERS frame cannot appear in the middle of a stream", set: true}
		return true
	}
	if f.Truncated {
		*call = grpcCall{code: codes.Internal, message: "peer header list size exceeded limit", set: true}
		return true
	}
	isGRPC := !initial
	contentTypeErr := "malformed header: missing HTTP content-type"
	code := codes.Unknown
	var msg, httpStatus string
	for _, hf := range f.Fields {
		switch hf.Name {
		case "content-type":
			if !grpcContentType(hf.Value) {
				contentTypeErr = fmt.Sprintf("transport: received unexpected content-type %q", hf.Value)
				break
			}
			contentTypeErr = ""
			isGRPC = true
		case "grpc-status":
			n, err := strconv.ParseInt(hf.Value, 10, 32)
			if err != nil {
				*call = grpcCall{code: codes.Unknown, message: fmt.Sprintf("transport: malformed grpc-status: %v", err), set: true}
				return true
			}
			code = codes.Code(uint32(n))
		case "grpc-message":
			msg = decodeGRPCMessage(hf.Value)
		case ":status":
			httpStatus = hf.Value
		}
	}
	if !isGRPC {
		ecode := codes.Internal
		var errs []string
		if httpStatus == "" {
			errs = append(errs, "malformed header: missing HTTP status")
		} else {
			sc, err := strconv.Atoi(httpStatus)
			if err != nil {
				*call = grpcCall{code: codes.Internal, message: fmt.Sprintf("transport: malformed http-status: %v", err), set: true}
				return true
			}
			if sc >= 100 && sc < 200 {
				if end {
					*call = grpcCall{code: codes.Internal, message: fmt.Sprintf("protocol error: informational header with status code %d must not have END_STREAM set", sc), set: true}
					return true
				}
				return false
			}
			errs = append(errs, fmt.Sprintf("unexpected HTTP status code received from server: %d (%s)", sc, http.StatusText(sc)))
			ecode = httpToGRPCCode(sc)
		}
		if contentTypeErr != "" {
			errs = append(errs, contentTypeErr)
		}
		st := &grpcCall{code: ecode, message: strings.Join(errs, "; "), set: true}
		if end {
			*call = *st
			return true
		}
		call.nonGRPC = st
		return false
	}
	call.gotHeaders = true
	if !end {
		return false
	}
	call.code, call.message, call.set = code, msg, true
	return true
}

// grpcContentType reports "application/grpc", alone or with a subtype
// ("application/grpc+proto" or ";..."), as grpc-go accepts it.
func grpcContentType(v string) bool {
	const base = "application/grpc"
	if !strings.HasPrefix(strings.ToLower(v), base) {
		return false
	}
	if len(v) == len(base) {
		return true
	}
	return v[len(base)] == '+' || v[len(base)] == ';'
}

// httpToGRPCCode is grpc-go's mapping of a non-gRPC HTTP status.
func httpToGRPCCode(sc int) codes.Code {
	switch sc {
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Unknown
}

// rstCode is grpc-go's mapping of an RST_STREAM error code. A CANCEL once the
// call's deadline passed is the server giving up on that deadline (its own
// timer, from grpc-timeout): DeadlineExceeded, as grpc-go reports it.
func rstCode(c http2.ErrCode, deadline time.Time) codes.Code {
	switch c {
	case http2.ErrCodeNo, http2.ErrCodeProtocol, http2.ErrCodeInternal, http2.ErrCodeSettingsTimeout,
		http2.ErrCodeStreamClosed, http2.ErrCodeFrameSize, http2.ErrCodeCompression, http2.ErrCodeConnect,
		http2.ErrCodeHTTP11Required:
		return codes.Internal
	case http2.ErrCodeFlowControl, http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		if !deadline.After(time.Now()) {
			return codes.DeadlineExceeded
		}
		return codes.Canceled
	case http2.ErrCodeInadequateSecurity:
		return codes.PermissionDenied
	}
	return codes.Unknown
}

// decodeGRPCMessage undoes grpc-message's percent-encoding, as grpc-go does
// (a '%' among the last two bytes is kept as is).
func decodeGRPCMessage(msg string) string {
	if !strings.Contains(msg, "%") {
		return msg
	}
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		ch := msg[i]
		if ch == '%' && i+2 < len(msg) {
			if v, err := strconv.ParseUint(msg[i+1:i+3], 16, 8); err == nil {
				sb.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		sb.WriteByte(ch)
	}
	return sb.String()
}

// encodeGRPCTimeout writes d as a grpc-timeout value: the finest unit whose
// count fits in 8 digits, rounded up.
func encodeGRPCTimeout(d time.Duration) string {
	if d <= 0 {
		return "0n"
	}
	const maxValue = 1e8 - 1
	for _, u := range [...]struct {
		d   time.Duration
		tag string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}} {
		if n := (d + u.d - 1) / u.d; n <= maxValue {
			return strconv.FormatInt(int64(n), 10) + u.tag
		}
	}
	return strconv.FormatInt(int64((d+time.Hour-1)/time.Hour), 10) + "H"
}

// decodeHealthResponse reads the status field of a HealthCheckResponse.
func decodeHealthResponse(b []byte) (healthpb.HealthCheckResponse_ServingStatus, bool) {
	var st healthpb.HealthCheckResponse_ServingStatus
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			st = healthpb.HealthCheckResponse_ServingStatus(int32(v))
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return st, true
}

// appendWriter is an io.Writer appending to a byte slice.
type appendWriter []byte

func (w *appendWriter) Write(p []byte) (int, error) {
	*w = append(*w, p...)
	return len(p), nil
}

var _ io.Writer = (*appendWriter)(nil)
