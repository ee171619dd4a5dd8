package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/cri-streaming/pkg/streaming"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	kexec "k8s.io/utils/exec"
)

// fakeStreams is the runtime side of a CRI streaming server, in process: what
// containerd's streaming server does behind the URL Exec/Attach/PortForward return.
// exec runs "echo ARGS", "cat" (stdin to stdout), "fail N" (stderr, exit N) and
// "tty" (says whether it has one); attach says hello and copies stdin to stdout;
// port-forward answers each line with the port and the line.
type fakeStreams struct {
	server streaming.Server

	mu    sync.Mutex
	calls []string
}

func newFakeStreams(t *testing.T) *fakeStreams {
	t.Helper()
	f := &fakeStreams{}
	hs := httptest.NewUnstartedServer(nil)
	cfg := streaming.DefaultConfig
	cfg.Addr = hs.Listener.Addr().String()
	cfg.BaseURL = &url.URL{Scheme: "http", Host: cfg.Addr}
	s, err := streaming.NewServer(cfg, f)
	require.NoError(t, err)
	f.server = s
	hs.Config.Handler = s
	hs.Start()
	t.Cleanup(hs.Close)
	return f
}

func (f *fakeStreams) record(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakeStreams) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeStreams) Exec(_ context.Context, id string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, _ <-chan remotecommandserver.TerminalSize) error {
	f.record("exec %s %q tty=%v", id[:8], cmd, tty)
	switch cmd[0] {
	case "echo":
		_, _ = fmt.Fprintln(out, strings.Join(cmd[1:], " "))
	case "cat":
		_, _ = io.Copy(out, in)
	case "fail":
		_, _ = fmt.Fprintln(errw, "failing on purpose")
		var code int
		_, _ = fmt.Sscan(cmd[1], &code)
		return kexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	case "tty":
		_, _ = fmt.Fprintf(out, "tty=%v\n", tty)
	}
	return nil
}

func (f *fakeStreams) Attach(_ context.Context, id string, in io.Reader, out, _ io.WriteCloser, tty bool, _ <-chan remotecommandserver.TerminalSize) error {
	f.record("attach %s tty=%v", id[:8], tty)
	_, _ = fmt.Fprintln(out, "attached")
	if in != nil {
		_, _ = io.Copy(out, in)
	}
	return nil
}

func (f *fakeStreams) PortForward(_ context.Context, sandboxID string, port int32, stream io.ReadWriteCloser) error {
	f.record("portforward %s %d", sandboxID[:8], port)
	defer stream.Close()
	r := bufio.NewReader(stream)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil
		}
		_, _ = fmt.Fprintf(stream, "port %d: %s", port, line)
	}
}

func (f *serverFixture) restConfig(asUser string) *rest.Config {
	return &rest.Config{Host: f.http.URL, BearerToken: asUser}
}

func (f *serverFixture) spdyExec(t *testing.T, path, asUser string, stdin io.Reader) (string, string, error) {
	t.Helper()
	u, err := url.Parse(f.http.URL + path)
	require.NoError(t, err)
	ex, err := remotecommand.NewSPDYExecutor(f.restConfig(asUser), "POST", u)
	require.NoError(t, err)
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The streams asked for match the query, as kubectl's do (a stream the server
	// was not told about races with the end of the session).
	opts := remotecommand.StreamOptions{Stdin: stdin}
	if u.Query().Get("output") == "1" {
		opts.Stdout = &out
	}
	if u.Query().Get("error") == "1" {
		opts.Stderr = &errb
	}
	opts.Tty = u.Query().Get("tty") == "1"
	err = ex.StreamWithContext(ctx, opts)
	return out.String(), errb.String(), err
}

func TestServerExec(t *testing.T) {
	f := newServerFixture(t, nil)
	_, st := f.runPod("web", false, "main")
	id := strings.TrimPrefix(st.ContainerStatuses[0].ContainerID, "fakeruntime://")

	t.Run("output over SPDY", func(t *testing.T) {
		out, _, err := f.spdyExec(t, "/exec/default/web/main?command=echo&command=hello&command=world&output=1&error=1", "admin", nil)
		require.NoError(t, err)
		assert.Equal(t, "hello world\n", out)
		assert.Contains(t, f.rt.stream.seen(), fmt.Sprintf("exec %s [\"echo\" \"hello\" \"world\"] tty=false", id[:8]))
	})
	t.Run("exit code and stderr", func(t *testing.T) {
		_, errOut, err := f.spdyExec(t, "/exec/default/web/main?command=fail&command=3&output=1&error=1", "admin", nil)
		var exitErr utilexec.ExitError
		require.True(t, errors.As(err, &exitErr), "%v", err)
		assert.Equal(t, 3, exitErr.ExitStatus())
		assert.Equal(t, "failing on purpose\n", errOut)
	})
	t.Run("stdin", func(t *testing.T) {
		out, _, err := f.spdyExec(t, "/exec/default/web/main?command=cat&input=1&output=1&error=1", "admin", strings.NewReader("from stdin\n"))
		require.NoError(t, err)
		assert.Equal(t, "from stdin\n", out)
	})
	t.Run("the uid form of the route", func(t *testing.T) {
		out, _, err := f.spdyExec(t, "/exec/default/web/uid-web/main?command=echo&command=ok&output=1&error=1", "admin", nil)
		require.NoError(t, err)
		assert.Equal(t, "ok\n", out)
	})
	t.Run("WebSocket v5 is translated to the runtime's SPDY", func(t *testing.T) {
		ex, err := remotecommand.NewWebSocketExecutor(f.restConfig("admin"), "GET",
			f.http.URL+"/exec/default/web/main?command=cat&input=1&output=1&error=1")
		require.NoError(t, err)
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: strings.NewReader("over websocket\n"), Stdout: &out})
		require.NoError(t, err)
		assert.Equal(t, "over websocket\n", out.String())
		ex, err = remotecommand.NewWebSocketExecutor(f.restConfig("admin"), "GET",
			f.http.URL+"/exec/default/web/main?command=fail&command=7&output=1&error=1")
		require.NoError(t, err)
		err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: io.Discard, Stderr: io.Discard})
		var exitErr utilexec.ExitError
		require.True(t, errors.As(err, &exitErr), "%v", err)
		assert.Equal(t, 7, exitErr.ExitStatus())
	})
	t.Run("refusals and bad input", func(t *testing.T) {
		code, body := f.do("POST", "/exec/default/web/main?command=ls", "admin")
		assert.Equal(t, http.StatusBadRequest, code)
		assert.Equal(t, "you must specify at least 1 of stdin, stdout, stderr", body)
		code, body = f.do("POST", "/exec/default/nope/main?command=ls&output=1", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `pod does not exist`, body)
		code, body = f.do("POST", "/exec/default/web/sidecar?command=ls&output=1", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Contains(t, body, `container not found ("sidecar")`)
		code, _ = f.do("PUT", "/exec/default/web/main?command=ls&output=1", "admin")
		assert.Equal(t, http.StatusMethodNotAllowed, code)
		_, _, err := f.spdyExec(t, "/exec/default/web/main?command=echo&output=1", "mallory", nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "Forbidden (user=mallory, verb=create, resource=nodes, subresource(s)=[proxy])")
		_, _, err = f.spdyExec(t, "/exec/default/web/main?command=echo&output=1", "", nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "Unauthorized")
	})
	t.Run("an exited container is not found", func(t *testing.T) {
		require.NoError(t, f.client.StopContainer(context.Background(), id, 0))
		code, body := f.do("POST", "/exec/default/web/main?command=ls&output=1", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Contains(t, body, `container not found ("main")`)
	})
}

func TestServerAttach(t *testing.T) {
	f := newServerFixture(t, nil)
	pod, st := f.runPod("web", false, "main")
	id := strings.TrimPrefix(st.ContainerStatuses[0].ContainerID, "fakeruntime://")
	out, _, err := f.spdyExec(t, "/attach/default/web/main?input=1&output=1&error=1", "admin", strings.NewReader("typed\n"))
	require.NoError(t, err)
	assert.Equal(t, "attached\ntyped\n", out)
	assert.Contains(t, f.rt.stream.seen(), fmt.Sprintf("attach %s tty=false", id[:8]))
	// The TTY of attach is the container's (kubectl attach -t reads it from the spec).
	pod.Spec.Containers[0].TTY = true
	out, _, err = f.spdyExec(t, "/attach/default/web/main?input=1&output=1&tty=1", "admin", strings.NewReader("typed\n"))
	require.NoError(t, err)
	assert.Equal(t, "attached\ntyped\n", out)
	assert.Contains(t, f.rt.stream.seen(), fmt.Sprintf("attach %s tty=true", id[:8]))

	code, body := f.do("POST", "/attach/default/web/other?output=1", "admin")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "rpc error: code = NotFound desc = container other not found in pod web_default", body)
	code, body = f.do("POST", "/attach/default/nope/main?output=1", "admin")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, `pod does not exist`, body)
	code, _ = f.do("POST", "/attach/default/web/main", "admin")
	assert.Equal(t, http.StatusBadRequest, code)
}

func TestServerPortForward(t *testing.T) {
	f := newServerFixture(t, nil)
	f.runPod("web", false, "main")
	sb, err := f.client.ListPodSandbox(context.Background(), nil)
	require.NoError(t, err)
	require.Len(t, sb, 1)

	check := func(t *testing.T, fw *portforward.PortForwarder, ready chan struct{}) {
		errc := make(chan error, 1)
		go func() { errc <- fw.ForwardPorts() }()
		select {
		case <-ready:
		case err := <-errc:
			t.Fatalf("port-forward: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("port-forward not ready")
		}
		ports, err := fw.GetPorts()
		require.NoError(t, err)
		require.Len(t, ports, 1)
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0].Local), 5*time.Second)
		require.NoError(t, err)
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = io.WriteString(conn, "ping\n")
		require.NoError(t, err)
		line, err := bufio.NewReader(conn).ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "port 8080: ping\n", line)
	}
	t.Run("SPDY", func(t *testing.T) {
		u, _ := url.Parse(f.http.URL + "/portForward/default/web")
		tr, up, err := spdy.RoundTripperFor(f.restConfig("admin"))
		require.NoError(t, err)
		dialer := spdy.NewDialer(up, &http.Client{Transport: tr}, "POST", u)
		stop, ready := make(chan struct{}), make(chan struct{})
		defer close(stop)
		fw, err := portforward.New(dialer, []string{"0:8080"}, stop, ready, io.Discard, io.Discard)
		require.NoError(t, err)
		check(t, fw, ready)
		assert.Contains(t, f.rt.stream.seen(), fmt.Sprintf("portforward %s 8080", sb[0].GetId()[:8]))
	})
	t.Run("WebSocket tunnel", func(t *testing.T) {
		u, _ := url.Parse(f.http.URL + "/portForward/default/web/uid-web")
		dialer, err := portforward.NewSPDYOverWebsocketDialer(u, f.restConfig("admin"))
		require.NoError(t, err)
		stop, ready := make(chan struct{}), make(chan struct{})
		defer close(stop)
		fw, err := portforward.New(dialer, []string{"0:8080"}, stop, ready, io.Discard, io.Discard)
		require.NoError(t, err)
		check(t, fw, ready)
	})
	t.Run("refusals", func(t *testing.T) {
		code, body := f.do("POST", "/portForward/default/nope", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `pod does not exist`, body)
		code, body = f.do("POST", "/portForward/default/web/other-uid", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `pod not found`, body)
		require.NoError(t, f.client.StopPodSandbox(context.Background(), sb[0].GetId()))
		code, body = f.do("POST", "/portForward/default/web", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Contains(t, body, `pod not found ("web_default")`)
	})
}

func TestServerRun(t *testing.T) {
	f := newServerFixture(t, nil)
	f.runPod("web", false, "main")
	code, body := f.do("POST", "/run/default/web/main?cmd="+url.QueryEscape("echo hello there"), "admin")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "hello there\n", body)
	code, body = f.do("POST", "/run/default/web/uid-web/main?cmd="+url.QueryEscape("exit 3"), "admin")
	assert.Equal(t, http.StatusInternalServerError, code)
	assert.Equal(t, "command 'exit 3' exited with 3: ", body)
	code, body = f.do("POST", "/run/default/web/other?cmd=true", "admin")
	assert.Equal(t, http.StatusInternalServerError, code, "upstream's getRun writes RunInContainer's error as a 500")
	assert.Equal(t, `container not found ("other")`, body)
	code, body = f.do("POST", "/run/default/nope/main?cmd=true", "admin")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, `pod does not exist`, body)
	code, _ = f.do("GET", "/run/default/web/main?cmd=true", "admin")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
}
