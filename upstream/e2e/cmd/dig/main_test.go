package main

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestParse(t *testing.T) {
	q, err := parse([]string{"+tcp", "+noall", "+answer", "+search", "kubernetes.default", "srv"})
	if err != nil {
		t.Fatal(err)
	}
	want := query{name: "kubernetes.default", rtype: "SRV", tcp: true, search: true}
	if q != want {
		t.Errorf("parse = %+v, want %+v", q, want)
	}
	for _, bad := range [][]string{{}, {"a", "b", "c"}, {"+trace", "x"}, {"x", "MX"}} {
		if _, err := parse(bad); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
}

func TestCandidates(t *testing.T) {
	c := resolvConf{server: "10.96.0.10:53", search: []string{"ns.svc.cluster.local", "svc.cluster.local"}, ndots: 5}
	for _, tc := range []struct {
		name   string
		search bool
		want   []string
	}{
		{"a.b", true, []string{"a.b.ns.svc.cluster.local.", "a.b.svc.cluster.local.", "a.b."}},
		{"a.b.c.d.e.f", true, []string{"a.b.c.d.e.f.", "a.b.c.d.e.f.ns.svc.cluster.local.", "a.b.c.d.e.f.svc.cluster.local."}},
		{"a.b", false, []string{"a.b."}},
		{"rooted.", true, []string{"rooted."}},
	} {
		if got := c.candidates(tc.name, tc.search); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("candidates(%q, %v) = %q, want %q", tc.name, tc.search, got, tc.want)
		}
	}
}

func TestReadResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte("search a.local b.local\nnameserver 10.96.0.10\nnameserver 8.8.8.8\noptions ndots:5 timeout:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := readResolvConf(p)
	if err != nil {
		t.Fatal(err)
	}
	want := resolvConf{server: "10.96.0.10:53", search: []string{"a.local", "b.local"}, ndots: 5}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("readResolvConf = %+v, want %+v", c, want)
	}
	if err := os.WriteFile(p, []byte("search a.local\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readResolvConf(p); err == nil {
		t.Error("a resolv.conf without a nameserver was accepted")
	}
}

// answer builds the reply a tiny server gives: one A record for known, NXDOMAIN else.
func answer(t *testing.T, req []byte, known string, truncate bool) []byte {
	t.Helper()
	var m dnsmessage.Message
	if err := m.Unpack(req); err != nil {
		t.Errorf("server: bad query: %v", err)
		return nil
	}
	reply := dnsmessage.Message{Header: dnsmessage.Header{ID: m.Header.ID, Response: true, Truncated: truncate}, Questions: m.Questions}
	if q := m.Questions[0]; q.Name.String() == known && !truncate {
		reply.Answers = []dnsmessage.Resource{{
			Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 30},
			Body:   &dnsmessage.AResource{A: [4]byte{10, 96, 0, 1}},
		}}
	} else if !truncate {
		reply.Header.RCode = dnsmessage.RCodeNameError
	}
	b, err := reply.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// serve answers on one loopback port over UDP (always truncated when truncateUDP) and TCP.
func serve(t *testing.T, known string, truncateUDP bool) (addr string, tcpQueries *atomic.Int32) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close(); l.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(answer(t, buf[:n], known, truncateUDP), from)
		}
	}()
	count := new(atomic.Int32)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			count.Add(1)
			var size [2]byte
			if _, err := io.ReadFull(c, size[:]); err == nil {
				req := make([]byte, binary.BigEndian.Uint16(size[:]))
				if _, err := io.ReadFull(c, req); err == nil {
					b := answer(t, req, known, false)
					_, _ = c.Write(append([]byte{byte(len(b) >> 8), byte(len(b))}, b...))
				}
			}
			c.Close()
		}
	}()
	return pc.LocalAddr().String(), count
}

func TestExchange(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr, _ := serve(t, "kubernetes.default.svc.cluster.local.", false)
	for _, tcp := range []bool{false, true} {
		answers, rcode, err := exchange(ctx, addr, "kubernetes.default.svc.cluster.local.", dnsmessage.TypeA, tcp)
		if err != nil || rcode != dnsmessage.RCodeSuccess || len(answers) != 1 || rdata(answers[0]) != "10.96.0.1" {
			t.Errorf("tcp=%v: answers %v rcode %v err %v, want one A 10.96.0.1", tcp, answers, rcode, err)
		}
		_, rcode, err = exchange(ctx, addr, "nosuch.", dnsmessage.TypeA, tcp)
		if err != nil || rcode != dnsmessage.RCodeNameError {
			t.Errorf("tcp=%v: nosuch: rcode %v err %v, want NXDOMAIN", tcp, rcode, err)
		}
	}

	// A truncated UDP reply is asked again over TCP.
	addr, tcpQueries := serve(t, "x.", true)
	answers, _, err := exchange(ctx, addr, "x.", dnsmessage.TypeA, false)
	if err != nil || len(answers) != 1 || tcpQueries.Load() != 1 {
		t.Errorf("truncated: answers %v err %v tcp queries %d, want the TCP retry's answer", answers, err, tcpQueries.Load())
	}

	if _, _, err := exchange(ctx, "127.0.0.1:1", "x.", dnsmessage.TypeA, true); err == nil {
		t.Error("a closed port gave no error")
	}
}
