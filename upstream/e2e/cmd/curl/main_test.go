package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newServer(t *testing.T, tlsOn bool) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Method", r.Method)
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s host=%s", r.URL.Query().Get("msg"), body, r.Header.Get("X-Extra"), r.Host)
	})
	mux.HandleFunc("/missing", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "nope", http.StatusNotFound) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/echo?msg=after", http.StatusFound) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, _ *http.Request) { time.Sleep(2 * time.Second) })
	mux.HandleFunc("/close", func(w http.ResponseWriter, _ *http.Request) {
		c, _, _ := w.(http.Hijacker).Hijack()
		c.Close()
	})
	if tlsOn {
		s := httptest.NewTLSServer(mux)
		t.Cleanup(s.Close)
		return s
	}
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestCurl(t *testing.T) {
	plain := newServer(t, false)
	secure := newServer(t, true)
	host := strings.TrimPrefix(plain.URL, "http://")
	outFile := filepath.Join(t.TempDir(), "out")
	cases := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // substrings stdout must hold
		exact      string   // stdout must equal this when set
		stderrHas  string
		stderrNone bool
	}{
		{name: "the e2e hook form", args: []string{"http://" + host + "/echo?msg=poststart"}, exact: "poststart   host=" + host},
		{name: "no scheme", args: []string{host + "/echo?msg=x"}, exact: "x   host=" + host},
		{name: "silent quiet globoff", args: []string{"-g", "-q", "-s", "--max-time", "15", "--connect-timeout", "1", plain.URL + "/echo?msg=a"}, exact: "a   host=" + host},
		{name: "status code only", args: []string{"-q", "-s", "-o", "/dev/null", "-w", "%{http_code}", plain.URL + "/missing"}, exact: "404"},
		{name: "write-out after the body", args: []string{"-s", "-w", `\n%{http_code}\n`, plain.URL + "/echo?msg=b"}, exact: "b   host=" + host + "\n200\n"},
		{name: "include headers", args: []string{"-i", "-s", plain.URL + "/echo?msg=c"}, stdout: []string{"HTTP/1.1 200 OK\r\n", "X-Method: GET\r\n", "\r\n\r\nc "}},
		{name: "head with combined short options", args: []string{"-sIk", plain.URL + "/echo"}, stdout: []string{"HTTP/1.1 200 OK", "X-Method: HEAD"}},
		{name: "glued request method", args: []string{"-s", "-i", "-XPOST", plain.URL + "/echo"}, stdout: []string{"X-Method: POST"}},
		{name: "data posts", args: []string{"-s", "-d", "payload", plain.URL + "/echo"}, stdout: []string{" payload "}},
		{name: "header and Host override", args: []string{"-s", "-H", "X-Extra: yes", "--header", "Host: example.test", plain.URL + "/echo"}, stdout: []string{"yes host=example.test"}},
		{name: "redirect not followed", args: []string{"-s", "-w", "%{http_code}", "-o", "/dev/null", plain.URL + "/moved"}, exact: "302"},
		{name: "redirect followed", args: []string{"-sL", plain.URL + "/moved"}, stdout: []string{"after"}},
		{name: "fail on HTTP error", args: []string{"-s", "--fail", plain.URL + "/missing"}, code: 22, exact: "", stderrNone: true},
		{name: "fail shows error with -S", args: []string{"-sS", "-f", plain.URL + "/missing"}, code: 22, stderrHas: "curl: (22) The requested URL returned error: 404"},
		{name: "no fail: body of a 404", args: []string{"-s", plain.URL + "/missing"}, stdout: []string{"nope"}},
		{name: "https needs -k", args: []string{"-s", secure.URL + "/echo?msg=s"}, code: 35, stderrNone: true},
		{name: "https with -k", args: []string{"-sk", secure.URL + "/echo?msg=s"}, stdout: []string{"s "}},
		{name: "connection refused", args: []string{"--connect-timeout", "1", "http://" + closedPort(t) + "/"}, code: 7, stderrHas: "curl: (7) Failed to connect to 127.0.0.1 port"},
		{name: "max time", args: []string{"-s", "-m", "0.3", plain.URL + "/slow"}, code: 28},
		{name: "empty reply", args: []string{"-s", plain.URL + "/close"}, code: 52},
		{name: "output to a file", args: []string{"-s", "-o", outFile, plain.URL + "/echo?msg=f"}, exact: ""},
		{name: "unknown option", args: []string{"--frobnicate", plain.URL}, code: 2, stderrHas: "option --frobnicate: is unknown"},
		{name: "missing parameter", args: []string{plain.URL, "-o"}, code: 2, stderrHas: "option -o: requires parameter"},
		{name: "bad number", args: []string{"--connect-timeout", "soon", plain.URL}, code: 2},
		{name: "no URL", args: []string{"-s"}, code: 2},
		{name: "malformed URL", args: []string{"ftp://" + host + "/"}, code: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.code, stderr.String())
			}
			if tc.exact != "" || (tc.stdout == nil && tc.code == 0) {
				if got := stdout.String(); got != tc.exact {
					t.Errorf("stdout %q, want %q", got, tc.exact)
				}
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout %q lacks %q", stdout.String(), s)
				}
			}
			if tc.stderrHas != "" && !strings.Contains(stderr.String(), tc.stderrHas) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.stderrHas)
			}
			if tc.stderrNone && stderr.Len() != 0 {
				t.Errorf("stderr %q, want nothing under -s", stderr.String())
			}
		})
	}
	got, err := os.ReadFile(outFile)
	if err != nil || string(got) != "f   host="+host {
		t.Errorf("-o file holds %q (%v)", got, err)
	}
}
