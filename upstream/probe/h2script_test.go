package probe

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// This file is a cleartext HTTP/2 server that answers a gRPC health Check with
// a script of raw frames, chosen by the service name in the request: fixed
// scripts for the named behaviours of the equality test, and random scripts
// (frame sequences, headers, trailers, sizes) drawn from a seed for the
// randomized comparison. The server never validates what it writes: the point
// is to send what a broken or hostile server might.

// h2w writes one connection's frames.
type h2w struct {
	fr  *http2.Framer
	bw  *bufio.Writer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

// step is one thing a script does, with a description for failure reports.
type step struct {
	desc string
	do   func(w *h2w) error
}

// endMode is what the server does once the script is written.
type endMode int

const (
	endClose endMode = iota // close the write side, drain, close
	endHang                 // keep the connection open until the test ends
)

type h2Script struct {
	steps []step
	end   endMode
}

func (s h2Script) String() string {
	var b strings.Builder
	for i, st := range s.steps {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(st.desc)
	}
	if s.end == endHang {
		b.WriteString("; hang")
	} else {
		b.WriteString("; close")
	}
	return b.String()
}

type hf = [2]string

// headers writes a header block on stream, split into HEADERS and
// CONTINUATION frames of at most split bytes when split > 0.
func headers(stream uint32, end bool, split int, fields ...hf) step {
	var d []string
	for _, f := range fields {
		d = append(d, f[0]+"="+trunc(f[1]))
	}
	desc := fmt.Sprintf("HEADERS s%d end=%v split=%d {%s}", stream, end, split, strings.Join(d, " "))
	return step{desc, func(w *h2w) error {
		w.hb.Reset()
		for _, f := range fields {
			if err := w.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
				return err
			}
		}
		block := w.hb.Bytes()
		if split <= 0 || split >= len(block) {
			return w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block, EndStream: end, EndHeaders: true})
		}
		if err := w.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block[:split], EndStream: end}); err != nil {
			return err
		}
		block = block[split:]
		for len(block) > 0 {
			n := min(split, len(block))
			if err := w.fr.WriteContinuation(stream, n == len(block), block[:n]); err != nil {
				return err
			}
			block = block[n:]
		}
		return nil
	}}
}

// data writes payload on stream in DATA frames of at most chunk bytes (0: one
// frame, whatever its size); end is set on the last.
func data(stream uint32, end bool, chunk int, payload []byte) step {
	desc := fmt.Sprintf("DATA s%d end=%v len=%d chunk=%d", stream, end, len(payload), chunk)
	if len(payload) <= 16 {
		desc += fmt.Sprintf(" %x", payload)
	}
	return step{desc, func(w *h2w) error {
		p := payload
		for {
			n := len(p)
			if chunk > 0 {
				n = min(chunk, n)
			}
			last := n == len(p)
			if err := w.fr.WriteData(stream, end && last, p[:n]); err != nil {
				return err
			}
			p = p[n:]
			if last {
				return nil
			}
		}
	}}
}

func rst(stream uint32, code http2.ErrCode) step {
	return step{fmt.Sprintf("RST_STREAM s%d %v", stream, code), func(w *h2w) error { return w.fr.WriteRSTStream(stream, code) }}
}

func goAway(last uint32, code http2.ErrCode) step {
	return step{fmt.Sprintf("GOAWAY last=%d %v", last, code), func(w *h2w) error { return w.fr.WriteGoAway(last, code, []byte("bye")) }}
}

func ping() step {
	return step{"PING", func(w *h2w) error { return w.fr.WritePing(false, [8]byte{1, 2, 3}) }}
}

func settings(s ...http2.Setting) step {
	return step{fmt.Sprintf("SETTINGS %v", s), func(w *h2w) error { return w.fr.WriteSettings(s...) }}
}

func windowUpdate(stream, inc uint32) step {
	return step{fmt.Sprintf("WINDOW_UPDATE s%d +%d", stream, inc), func(w *h2w) error { return w.fr.WriteWindowUpdate(stream, inc) }}
}

func unknownFrame(stream uint32) step {
	return step{fmt.Sprintf("frame type 0xfa s%d", stream), func(w *h2w) error { return w.fr.WriteRawFrame(0xfa, 0, stream, []byte("?")) }}
}

// grpcMsg is a length-prefixed gRPC message; a negative length writes the
// payload's own.
func grpcMsg(compressed bool, length int64, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	if compressed {
		b[0] = 1
	}
	if length < 0 {
		length = int64(len(payload))
	}
	binary.BigEndian.PutUint32(b[1:], uint32(length))
	return append(b, payload...)
}

// healthResp is a HealthCheckResponse with status st, padded with an unknown
// bytes field (number 2) to at least pad bytes.
func healthResp(st int, pad int) []byte {
	var b []byte
	if st != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(st))
	}
	if pad > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, bytes.Repeat([]byte{'p'}, pad))
	}
	return b
}

// statusDetails is a grpc-status-details-bin value.
func statusDetails(code int32, msg string) string {
	b, err := proto.Marshal(&spb.Status{Code: code, Message: msg})
	if err != nil {
		panic(err)
	}
	return base64.RawStdEncoding.EncodeToString(b)
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

var (
	okHeaders = []hf{{":status", "200"}, {"content-type", "application/grpc"}}
	serving   = grpcMsg(false, -1, healthResp(1, 0))
)

func okTrailers(extra ...hf) step {
	return headers(1, true, 0, append([]hf{{"grpc-status", "0"}}, extra...)...)
}

// fixedScripts are the named misbehaviours of the equality test.
var fixedScripts = map[string]h2Script{
	"well-behaved": {steps: []step{headers(1, false, 0, okHeaders...), data(1, false, 0, serving), okTrailers()}},
	"content-type in capitals": {steps: []step{
		headers(1, false, 0, hf{":status", "200"}, hf{"content-type", "Application/GRPC"}), data(1, false, 0, serving), okTrailers()}},
	"-bin metadata not base64": {steps: []step{
		headers(1, false, 0, append(okHeaders, hf{"x-trace-bin", "!!not base64!!"})...), data(1, false, 0, serving), okTrailers()}},
	"-bin trailer not base64": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, serving), okTrailers(hf{"x-trace-bin", "%%%"})}},
	"two response messages": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, append(append([]byte{}, serving...), serving...)), okTrailers()}},
	"100 KiB response, no flow control": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 16384, grpcMsg(false, -1, healthResp(1, 100<<10))), okTrailers()}},
	"60 KiB response": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 16384, grpcMsg(false, -1, healthResp(1, 60<<10))), okTrailers()}},
	"message over grpc-go's 4 MiB limit": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, grpcMsg(false, 5<<20, []byte{8, 1})), okTrailers()}},
	"DATA frame over the max frame size": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, grpcMsg(false, -1, healthResp(1, 20<<10))), okTrailers()}},
	"DATA before HEADERS": {steps: []step{data(1, false, 0, serving), headers(1, false, 0, okHeaders...), okTrailers()}},
	"non-gRPC 503 ending in an empty DATA frame": {steps: []step{
		headers(1, false, 0, hf{":status", "503"}, hf{"content-type", "text/plain"}), data(1, false, 0, []byte("overloaded")), data(1, true, 0, nil)}},
	"non-gRPC 200 text/html": {steps: []step{
		headers(1, false, 0, hf{":status", "200"}, hf{"content-type", "text/html"}), data(1, true, 0, []byte("<html>"))}},
	"grpc-status-details-bin disagrees with grpc-message": {steps: []step{
		headers(1, true, 0, append(okHeaders, hf{"grpc-status", "14"}, hf{"grpc-message", "from message"},
			hf{"grpc-status-details-bin", statusDetails(14, "from details")})...)}},
	"grpc-status-details-bin with another code": {steps: []step{
		headers(1, true, 0, append(okHeaders, hf{"grpc-status", "14"}, hf{"grpc-message", "m"},
			hf{"grpc-status-details-bin", statusDetails(5, "other code")})...)}},
	"grpc-status-details-bin not a Status": {steps: []step{
		headers(1, true, 0, append(okHeaders, hf{"grpc-status", "13"}, hf{"grpc-message", "m"},
			hf{"grpc-status-details-bin", base64.RawStdEncoding.EncodeToString([]byte{0xff, 0xff})})...)}},
	"GOAWAY instead of an answer":          {steps: []step{goAway(0, http2.ErrCodeNo)}},
	"GOAWAY after the stream":              {steps: []step{goAway(1, http2.ErrCodeNo), headers(1, false, 0, okHeaders...), data(1, false, 0, serving), okTrailers()}},
	"RST_STREAM after headers":             {steps: []step{headers(1, false, 0, okHeaders...), rst(1, http2.ErrCodeInternal)}},
	"malformed response message":           {steps: []step{headers(1, false, 0, okHeaders...), data(1, false, 0, grpcMsg(false, -1, []byte{0xff, 0xff})), okTrailers()}},
	"OK status without a response message": {steps: []step{headers(1, false, 0, okHeaders...), okTrailers()}},
	"OK trailers-only":                     {steps: []step{headers(1, true, 0, append(okHeaders, hf{"grpc-status", "0"})...)}},
	"compressed flag without grpc-encoding": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, grpcMsg(true, -1, healthResp(1, 0))), okTrailers()}},
	"unknown grpc-encoding": {steps: []step{
		headers(1, false, 0, append(okHeaders, hf{"grpc-encoding", "snappy"})...), data(1, false, 0, grpcMsg(true, -1, healthResp(1, 0))), okTrailers()}},
	"headers split over CONTINUATION frames": {steps: []step{
		headers(1, false, 3, append(okHeaders, hf{"x-long", strings.Repeat("v", 100)})...), data(1, false, 0, serving), okTrailers()}},
	"upper-case header name": {steps: []step{
		headers(1, false, 0, append(okHeaders, hf{"X-Upper", "v"})...), data(1, false, 0, serving), okTrailers()}},
	"trailers without grpc-status": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, serving), headers(1, true, 0, hf{"grpc-message", "no status"})}},
	"grpc-status not a number": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, serving), headers(1, true, 0, hf{"grpc-status", "zero"})}},
	"stream ends without trailers": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, true, 0, serving)}},
	"message cut short by the close": {steps: []step{
		headers(1, false, 0, okHeaders...), data(1, false, 0, serving[:4])}},
	"noise frames around the answer": {steps: []step{
		ping(), settings(http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 20}), windowUpdate(0, 1000), unknownFrame(1),
		headers(1, false, 0, okHeaders...), headers(3, true, 0, okHeaders...), data(1, false, 0, serving), okTrailers()}},
	"window update of zero on the stream": {steps: []step{windowUpdate(1, 0), headers(1, false, 0, okHeaders...), data(1, false, 0, serving), okTrailers()}},
	"informational 100 then the answer": {steps: []step{
		headers(1, false, 0, hf{":status", "100"}), headers(1, false, 0, okHeaders...), data(1, false, 0, serving), okTrailers()}},
	"stream never answered, connection kept": {steps: []step{ping()}, end: endHang},
}

// racyScripts are the fixed scripts whose answer grpc-go (the kubelet's and
// nodekit's alike) does not always give the same way: more DATA than the
// flow-control window, so whether the violation or the message is seen first
// depends on timing. Measured: the kubelet's prober called "100 KiB response,
// no flow control" healthy in 4 of 25 runs and failed it ("unexpected EOF")
// in 21.
var racyScripts = map[string]bool{
	"100 KiB response, no flow control": true,
}

// serverSettings are the SETTINGS the randomized servers start with; a seed
// picks one (the server must send them before it reads the request).
var serverSettings = [][]http2.Setting{
	nil,
	{{ID: http2.SettingMaxFrameSize, Val: 1 << 20}},
	{{ID: http2.SettingInitialWindowSize, Val: 1 << 20}, {ID: http2.SettingHeaderTableSize, Val: 0}},
	{{ID: http2.SettingMaxHeaderListSize, Val: 1 << 10}},
}

// randomScript draws a response from seed.
func randomScript(seed uint64) h2Script {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	pick := func(p float64) bool { return r.Float64() < p }
	one := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	var s []step
	noise := func() {
		for pick(0.15) {
			switch r.IntN(7) {
			case 0:
				s = append(s, ping())
			case 1:
				s = append(s, settings(http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: uint32(r.IntN(3))}))
			case 2:
				s = append(s, windowUpdate(uint32(r.IntN(2)), uint32(r.IntN(70000))))
			case 3:
				s = append(s, unknownFrame(uint32(r.IntN(4))))
			case 4:
				s = append(s, headers(3, pick(0.5), 0, okHeaders...))
			case 5:
				s = append(s, data(3, pick(0.5), 0, serving))
			case 6:
				s = append(s, rst(3, http2.ErrCodeCancel))
			}
		}
	}
	status := func() string {
		return one("200", "200", "200", "200", "204", "400", "401", "403", "404", "429", "500", "503", "100", "2x0", "")
	}
	ctype := func() string {
		return one("application/grpc", "application/grpc", "application/grpc", "application/grpc+proto",
			"application/grpc;charset=utf-8", "Application/GRPC", "application/grpcx", "application/grpc+", "text/plain", "")
	}
	meta := func(f []hf) []hf {
		for pick(0.25) {
			switch r.IntN(6) {
			case 0:
				f = append(f, hf{"x-md", one("v", "", "a b")})
			case 1:
				f = append(f, hf{"x-md-bin", one(base64.StdEncoding.EncodeToString([]byte("ok?")), base64.RawStdEncoding.EncodeToString([]byte("ok?")), "!!", "YQ=", "YWI=,YWI")})
			case 2:
				f = append(f, hf{"grpc-encoding", one("identity", "gzip", "snappy", "")})
			case 3:
				f = append(f, hf{"content-type", ctype()})
			case 4:
				f = append(f, hf{"X-Caps", "v"})
			case 5:
				f = append(f, hf{":status", status()})
			}
		}
		return f
	}
	respHeaders := func() []hf {
		var f []hf
		if st := status(); st != "" {
			f = append(f, hf{":status", st})
		}
		if ct := ctype(); ct != "" {
			f = append(f, hf{"content-type", ct})
		}
		return meta(f)
	}
	grpcStatus := func(f []hf) []hf {
		if c := one("0", "0", "0", "1", "2", "5", "8", "12", "13", "14", "16", "17", "-1", "abc", ""); c != "" {
			f = append(f, hf{"grpc-status", c})
		}
		if m := one("", "", "plain", "percent%20enc%", "%zz%4", "ünï"); m != "" {
			f = append(f, hf{"grpc-message", m})
		}
		if pick(0.2) {
			f = append(f, hf{"grpc-status-details-bin", one(
				statusDetails(int32(r.IntN(17)), one("details", "")), statusDetails(0, "ok details"),
				"!!", base64.RawStdEncoding.EncodeToString([]byte{0xff}))})
		}
		return meta(f)
	}
	split := func() int {
		if pick(0.15) {
			return 1 + r.IntN(8)
		}
		return 0
	}
	message := func() []byte {
		var payload []byte
		switch r.IntN(8) {
		case 0:
			payload = nil
		case 1:
			payload = []byte{0xff, 0xff}
		case 2:
			payload = healthResp(r.IntN(4), []int{100, 16 << 10, 60 << 10, 70 << 10, 100 << 10}[r.IntN(5)])
		default:
			payload = healthResp([]int{0, 1, 1, 1, 2, 3, 7}[r.IntN(7)], 0)
		}
		length := int64(-1)
		if pick(0.08) {
			length, _ = strconv.ParseInt(one("0", "1", "3", "5242880", "4194305"), 10, 64)
		}
		return grpcMsg(pick(0.05), length, payload)
	}
	chunk := func() int { return []int{16384, 16384, 1000, 7, 0}[r.IntN(5)] }

	noise()
	switch shape := r.IntN(10); {
	case shape < 5: // headers, messages, trailers
		s = append(s, headers(1, false, split(), respHeaders()...))
		noise()
		var body []byte
		n := []int{1, 1, 1, 0, 2}[r.IntN(5)]
		for range n {
			body = append(body, message()...)
		}
		if pick(0.1) && len(body) > 2 {
			body = body[:r.IntN(len(body))]
		}
		if len(body) > 0 || pick(0.2) {
			s = append(s, data(1, pick(0.1), chunk(), body))
		}
		noise()
		if pick(0.9) {
			s = append(s, headers(1, true, split(), grpcStatus(nil)...))
		}
	case shape < 7: // trailers-only
		s = append(s, headers(1, pick(0.9), split(), grpcStatus(respHeaders())...))
	case shape < 8: // not gRPC: a body, then an empty DATA or trailers
		f := []hf{{":status", one("200", "404", "500", "503", "302")}, {"content-type", one("text/plain", "text/html", "")}}
		s = append(s, headers(1, false, 0, meta(f)...))
		body := bytes.Repeat([]byte("b"), []int{0, 10, 1500}[r.IntN(3)])
		if pick(0.5) {
			s = append(s, data(1, false, chunk(), body), data(1, true, 0, nil))
		} else {
			s = append(s, data(1, pick(0.5), chunk(), body))
			s = append(s, headers(1, true, 0, grpcStatus(nil)...))
		}
	case shape < 9: // DATA first
		s = append(s, data(1, pick(0.3), 0, message()))
		s = append(s, headers(1, false, 0, okHeaders...), okTrailers())
	default: // an abrupt end
		if pick(0.5) {
			s = append(s, headers(1, false, 0, respHeaders()...))
		}
		codes := []http2.ErrCode{http2.ErrCodeNo, http2.ErrCodeProtocol, http2.ErrCodeInternal, http2.ErrCodeFlowControl,
			http2.ErrCodeRefusedStream, http2.ErrCodeCancel, http2.ErrCodeEnhanceYourCalm, http2.ErrCodeInadequateSecurity, http2.ErrCode(99)}
		if pick(0.5) {
			s = append(s, rst(1, codes[r.IntN(len(codes))]))
		} else {
			s = append(s, goAway(uint32(r.IntN(2)), codes[r.IntN(len(codes))]))
		}
	}
	noise()
	end := endClose
	if pick(0.05) {
		end = endHang
	}
	return h2Script{steps: s, end: end}
}

// scriptServer serves scripts by service name: "fixed:<name>" from
// fixedScripts, "seed:<n>" from randomScript. It starts with the SETTINGS
// given.
func scriptServer(t testing.TB, initial []http2.Setting) int {
	t.Helper()
	_, port := raw(t, func(c net.Conn, stop <-chan struct{}) { serveScript(c, stop, initial) })
	return port
}

func serveScript(c net.Conn, stop <-chan struct{}, initial []http2.Setting) {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	w := &h2w{bw: bufio.NewWriter(c)}
	w.fr = http2.NewFramer(w.bw, br)
	w.fr.AllowIllegalWrites = true
	w.fr.AllowIllegalReads = true
	w.enc = hpack.NewEncoder(&w.hb)
	if err := w.fr.WriteSettings(initial...); err != nil || w.bw.Flush() != nil {
		return
	}
	// Read the request: DATA on stream 1 up to END_STREAM.
	var body []byte
	for {
		f, err := w.fr.ReadFrame()
		if err != nil {
			return
		}
		if d, ok := f.(*http2.DataFrame); ok && d.StreamID == 1 {
			body = append(body, d.Data()...)
			if d.StreamEnded() {
				break
			}
		}
	}
	script, ok := scriptFor(requestService(body))
	if !ok {
		return
	}
	// Keep reading (and dropping) what the client sends, so closing does not
	// turn into a reset for unread data.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(io.Discard, br)
	}()
	defer wg.Wait()
	for _, st := range script.steps {
		if err := st.do(w); err != nil {
			break
		}
	}
	_ = w.bw.Flush()
	if script.end == endHang {
		select {
		case <-stop:
		case <-time.After(3 * time.Second):
		}
		_ = c.Close()
		return
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	} else {
		_ = c.Close()
	}
}

// requestService reads the service name of a length-prefixed
// HealthCheckRequest.
func requestService(b []byte) string {
	if len(b) < 5 {
		return ""
	}
	b = b[5:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeString(b)
			if n < 0 {
				return ""
			}
			return v
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

func scriptFor(service string) (h2Script, bool) {
	if name, ok := strings.CutPrefix(service, "fixed:"); ok {
		s, ok := fixedScripts[name]
		return s, ok
	}
	if n, ok := strings.CutPrefix(service, "seed:"); ok {
		seed, err := strconv.ParseUint(n, 10, 64)
		if err != nil {
			return h2Script{}, false
		}
		return randomScript(seed), true
	}
	return h2Script{}, false
}
