package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestClaimRefusesASecondCluster(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, checkFree(dir))
	require.NoError(t, claim(dir, "one"))
	st, err := LoadState(dir)
	require.NoError(t, err)
	assert.Equal(t, "one", st.Name)

	// A running process recorded in the state is counted in the refusal.
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	start, err := startTime(cmd.Process.Pid)
	require.NoError(t, err)
	st.StateDir = dir
	st.Processes = []Process{{Name: "sleep", PID: cmd.Process.Pid, StartTime: start}, {Name: "gone", PID: cmd.Process.Pid, StartTime: start + 1}}
	require.NoError(t, st.save())

	for _, err := range []error{checkFree(dir), claim(dir, "two")} {
		require.ErrorIs(t, err, ErrInUse)
		assert.Contains(t, err.Error(), `cluster "one" is there with 1 of 2 processes running`)
		assert.Contains(t, err.Error(), "run `nodekit down --state-dir "+dir+"` first")
	}
	_, err = LoadState(t.TempDir())
	assert.ErrorIs(t, err, ErrNoCluster)
}

func TestProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	st, err := startTime(cmd.Process.Pid)
	require.NoError(t, err)
	p := Process{Name: "sleep", PID: cmd.Process.Pid, StartTime: st}
	assert.True(t, p.Alive())
	assert.False(t, Process{PID: p.PID, StartTime: st + 1}.Alive(), "a reused PID (another start time) is not ours")
	require.NoError(t, cmd.Process.Kill())
	// Not yet reaped: a zombie is not alive.
	require.Eventually(t, func() bool { return !p.Alive() }, 5*time.Second, 10*time.Millisecond)
	_ = cmd.Wait()
	assert.False(t, p.Alive())
	assert.False(t, Process{}.Alive())
}

// TestForwardThroughNSDialer forwards to an HTTP server through a dialer that entered
// this process's own namespace (the path a real run gives is the control plane's).
func TestForwardThroughNSDialer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("entering a network namespace needs root")
	}
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "through") }))
	defer srv.Close()
	d, err := NewNSDialer("/proc/self/ns/net")
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Forward(ctx, l, d, srv.Listener.Addr().String()) }()

	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		resp, err := client.Get("http://" + l.Addr().String())
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, "through", string(b))
	}
	// A connection held open is closed when the forwarder stops.
	held, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer held.Close()

	cancel()
	require.NoError(t, <-done)
	require.NoError(t, held.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = held.Read(make([]byte, 1))
	require.Error(t, err, "the held connection must be closed")
	assert.False(t, os.IsTimeout(err), "the held connection must be closed, not left hanging: %v", err)
	d.Close()
	_, err = d.DialContext(context.Background(), "tcp", srv.Listener.Addr().String())
	assert.Error(t, err, "a closed dialer refuses")
	client.CloseIdleConnections()

	_, err = NewNSDialer("/nonexistent/ns")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "enter network namespace /nonexistent/ns")
	assert.False(t, errors.Is(err, ErrInUse))
}

func TestConfigDefaults(t *testing.T) {
	c := Config{StateDir: "rel"}
	require.NoError(t, c.defaults())
	assert.Equal(t, "nodekit", c.Name)
	assert.Equal(t, 1, c.Nodes)
	assert.Equal(t, APIServerPort, c.APIPort)
	assert.Equal(t, 50*time.Second, c.NodeMonitorGracePeriod)
	assert.True(t, filepath.IsAbs(c.StateDir))
	for _, bad := range []Config{{StateDir: "x", Nodes: -1}, {StateDir: "x", Name: "a/b"}, {}} {
		assert.Error(t, bad.defaults(), "%+v", bad)
	}
}

func TestCheckPrerequisitesNamesTheMissingPart(t *testing.T) {
	c := Config{PeersDir: t.TempDir(), ImagesDir: t.TempDir()}
	_, err := CheckPrerequisites(&c)
	require.ErrorIs(t, err, ErrPrerequisite)
	// Which part is named first depends on the machine; every message names a part and
	// how to get it.
	assert.Regexp(t, `missing prerequisite: .+ (not installed|missing|not found)`, err.Error())
}

func TestCheckPrerequisitesContainerdDir(t *testing.T) {
	for _, tool := range []string{"ip", "nsenter", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the check stops there first", tool)
		}
	}
	_, err := CheckPrerequisites(&Config{ContainerdDir: "bin/containerd2"})
	require.ErrorIs(t, err, ErrPrerequisite)
	assert.EqualError(t, err, "missing prerequisite: --containerd-dir bin/containerd2: want an absolute path")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "containerd"), []byte("#!/bin/sh\n"), 0o755))
	_, err = CheckPrerequisites(&Config{ContainerdDir: dir})
	require.ErrorIs(t, err, ErrPrerequisite)
	assert.EqualError(t, err, "missing prerequisite: containerd-shim-runc-v2 not found in --containerd-dir "+dir+" (hack/build-containerd.sh builds it)")

	st := &State{}
	assert.Equal(t, "ctr", st.containerdBinary("ctr"), "without a folder: the machine's, on $PATH")
	st.ContainerdDir = dir
	assert.Equal(t, filepath.Join(dir, "ctr"), st.containerdBinary("ctr"))
}
