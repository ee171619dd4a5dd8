package probe

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Execer runs an exec probe's command. Its shape follows CRI's ExecSync so the
// node agents can hand it a CRI runtime client; OSExecer runs commands on this host.
//
// A command that ran and exited returns its exit code with a nil error (exit code
// 0 is Success, anything else Failure). A command that outlived timeout returns an
// error wrapping ErrExecTimeout (Failure). Any other error means the command
// could not be run; the probe is then Unknown and retried.
type Execer interface {
	ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) (stdout, stderr []byte, exitCode int, err error)
}

// ExecerFunc adapts a function to Execer.
type ExecerFunc func(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error)

// ExecSync calls f.
func (f ExecerFunc) ExecSync(ctx context.Context, containerID string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	return f(ctx, containerID, cmd, timeout)
}

// OSExecer runs exec probe commands as processes on this host, ignoring the
// container ID. Each command gets its own process group; at the timeout the whole
// group is killed, so a command that forks children which hold its output open
// still ends on time. Output beyond 10 KiB per stream is read and dropped.
type OSExecer struct {
	// Dir is the working directory; empty means the caller's.
	Dir string
	// Env is the environment; nil means the caller's.
	Env []string
}

// ExecSync runs cmd with timeout.
func (e OSExecer) ExecSync(ctx context.Context, _ string, cmd []string, timeout time.Duration) ([]byte, []byte, int, error) {
	if len(cmd) == 0 {
		return nil, nil, -1, fmt.Errorf("%w: exec.command: required value", ErrInvalidProbe)
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := exec.CommandContext(tctx, cmd[0], cmd[1:]...)
	c.Dir = e.Dir
	c.Env = e.Env
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	c.WaitDelay = 100 * time.Millisecond
	var stdout, stderr cappedBuffer
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	if tctx.Err() != nil && ctx.Err() == nil {
		return stdout.Bytes(), stderr.Bytes(), -1, fmt.Errorf("%w: %q timed out after %s", ErrExecTimeout, strings.Join(cmd, " "), timeout)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.ExitCode() >= 0 {
		return stdout.Bytes(), stderr.Bytes(), exitErr.ExitCode(), nil
	}
	if err != nil {
		return stdout.Bytes(), stderr.Bytes(), -1, fmt.Errorf("running %q: %w", cmd[0], err)
	}
	return stdout.Bytes(), stderr.Bytes(), 0, nil
}

// cappedBuffer keeps the first maxBodyBytes written and accepts (drops) the rest,
// so a chatty command neither blocks on a full pipe nor grows memory.
type cappedBuffer struct{ bytes.Buffer }

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := maxBodyBytes - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}
