package main

import (
	"bufio"
	"bytes"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tcpServer answers each connection's first line with "got LINE" and closes, as
// agnhost's serve-hostname answers and closes.
func tcpServer(t *testing.T, close bool) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("got " + line))
				if !close {
					time.Sleep(10 * time.Second)
				}
			}()
		}
	}()
	return l.Addr().String()
}

func udpServer(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("udp "), buf[:n]...), from)
		}
	}()
	return pc.LocalAddr().String()
}

func ncRun(args []string, stdin string) (stdout, stderr string, code int, took time.Duration) {
	var o, e bytes.Buffer
	begin := time.Now()
	code = run(args, strings.NewReader(stdin), &o, &e)
	return o.String(), e.String(), code, time.Since(begin)
}

func split(t *testing.T, addr string) (string, string) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

func TestClient(t *testing.T) {
	host, port := split(t, tcpServer(t, true))
	out, errOut, code, _ := ncRun([]string{"-v", "-t", "-w", "2", host, port}, "hostName\n")
	if code != 0 || out != "got hostName\n" {
		t.Fatalf("the e2e reachability form: code %d stdout %q stderr %q", code, out, errOut)
	}
	if want := "Connection to " + host + " " + port + " port [tcp/*] succeeded!\n"; errOut != want {
		t.Errorf("stderr %q, want %q", errOut, want)
	}

	_, errOut, code, _ = ncRun([]string{"-vz", host, port, "-w", "1"}, "")
	if code != 0 || !strings.Contains(errOut, "succeeded!") {
		t.Errorf("-vz on an open port: code %d stderr %q", code, errOut)
	}

	l, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	_, errOut, code, _ = ncRun([]string{"-v", "-w", "2", "127.0.0.1", strconv.Itoa(closed)}, "x\n")
	if want := "nc: connect to 127.0.0.1 port " + strconv.Itoa(closed) + " (tcp) failed: Connection refused\n"; code != 1 || errOut != want {
		t.Errorf("refused: code %d stderr %q, want %q", code, errOut, want)
	}
}

func TestIdleTimeout(t *testing.T) {
	host, port := split(t, tcpServer(t, false))
	out, _, code, took := ncRun([]string{"-w", "1", host, port}, "hi\n")
	if code != 0 || out != "got hi\n" {
		t.Fatalf("code %d stdout %q", code, out)
	}
	if took < 900*time.Millisecond || took > 5*time.Second {
		t.Errorf("an idle connection must end after -w 1, not %s", took)
	}
}

func TestUDP(t *testing.T) {
	host, port := split(t, udpServer(t))
	out, errOut, code, _ := ncRun([]string{"-v", "-u", "-w", "1", host, port}, "hostName\n")
	if code != 0 || out != "udp hostName\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	if !strings.Contains(errOut, "port [udp/*] succeeded!") {
		t.Errorf("stderr %q", errOut)
	}
	// The e2e's other UDP form: -w before -u.
	out, _, code, _ = ncRun([]string{"-w", "1", "-u", host, port}, "envvar NODE_NAME\n")
	if code != 0 || out != "udp envvar NODE_NAME\n" {
		t.Errorf("code %d stdout %q", code, out)
	}
}

func TestListenUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sock")
	type result struct {
		out  string
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, _, code, _ := ncRun([]string{"-lU", path}, "")
		done <- result{out, code}
	}()
	var c net.Conn
	var err error
	for range 100 {
		if c, err = net.Dial("unix", path); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("over the socket\n"))
	c.Close()
	select {
	case r := <-done:
		if r.code != 0 || r.out != "over the socket\n" {
			t.Errorf("code %d stdout %q", r.code, r.out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nc -lU did not end when the client closed")
	}
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{{"-x", "h", "1"}, {"h"}, {"-w"}, {"-w", "soon", "h", "1"}, {"h", "70000"}, {"-l"}} {
		_, errOut, code, _ := ncRun(args, "")
		if code != 1 || !strings.HasPrefix(errOut, "nc: ") || !strings.Contains(errOut, "usage: nc") {
			t.Errorf("%v: code %d stderr %q", args, code, errOut)
		}
	}
}
