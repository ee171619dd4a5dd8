package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestFreePorts checks the ports are distinct, bindable, outside the kernel's
// ephemeral range, never handed out twice by the process, skip a port something
// already listens on, and come from a block no other process can take.
func TestFreePorts(t *testing.T) {
	first, err := FreePorts(5)
	require.NoError(t, err)
	if len(portBlocks.locks) == 0 {
		t.Skipf("no port block could be reserved in %s: FreePorts fell back to kernel ports", portLockDir)
	}
	// Something that is not a nodekit test listens on the next port of the block.
	portBlocks.mu.Lock()
	occupied := portBlocks.next
	portBlocks.mu.Unlock()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(occupied)))
	require.NoError(t, err)
	defer l.Close()
	second, err := FreePorts(5)
	require.NoError(t, err)

	seen := map[int]bool{}
	for _, p := range append(first, second...) {
		assert.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, portRangeLow)
		assert.Less(t, p, portRangeHigh)
		pl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if assert.NoError(t, err, "port %d must be free", p) {
			pl.Close()
		}
	}
	assert.NotContains(t, second, occupied, "a port something listens on is skipped")

	// The block's lock is exclusive: another open file description, as another test
	// process would have, cannot take it.
	block := (first[0] - portRangeLow) / portBlockSize
	f, err := os.Open(filepath.Join(portLockDir, fmt.Sprintf("nodekit-ports-%d.lock", block)))
	require.NoError(t, err)
	defer f.Close()
	assert.ErrorIs(t, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
}

// TestCheckListening checks the verdicts on who listens on a port: this process's own
// listener is its own, a listener another process holds is ErrPortTaken, a port
// nobody listens on is "not yet", and an exited process is never the owner.
func TestCheckListening(t *testing.T) {
	own, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer own.Close()
	ownPort := own.Addr().(*net.TCPAddr).Port

	// A child holds the only descriptor of the other listener.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	otherPort := other.Addr().(*net.TCPAddr).Port
	f, err := other.(*net.TCPListener).File()
	require.NoError(t, err)
	other.Close()
	child := exec.Command("sleep", "60")
	child.ExtraFiles = []*os.File{f}
	require.NoError(t, child.Start())
	f.Close()
	childDone := make(chan struct{})
	go func() { _ = child.Wait(); close(childDone) }()
	defer func() { _ = child.Process.Kill(); <-childDone }()

	free, err := FreePorts(1)
	require.NoError(t, err)

	running := make(chan struct{})
	exited := make(chan struct{})
	close(exited)
	me := os.Getpid()
	tests := []struct {
		name     string
		pid      int
		exited   chan struct{}
		ports    []int
		wantErr  bool
		wantLost bool
	}{
		{name: "own listener", pid: me, exited: running, ports: []int{ownPort}},
		{name: "the child's own listener", pid: child.Process.Pid, exited: childDone, ports: []int{otherPort}},
		{name: "another process's listener", pid: me, exited: running, ports: []int{ownPort, otherPort}, wantErr: true, wantLost: true},
		{name: "nobody listens yet", pid: me, exited: running, ports: []int{free[0]}, wantErr: true},
		{name: "exited", pid: me, exited: exited, ports: []int{ownPort}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkListening(tt.pid, tt.exited, tt.ports...)
			if !tt.wantErr {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, tt.wantLost, errors.Is(err, ErrPortTaken), "%v", err)
		})
	}
}
