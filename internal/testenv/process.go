package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a peer started by a harness. Its output goes to a log file, which is kept
// for the failure message when the process dies early.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string

	done    chan struct{}
	waitErr error
	once    sync.Once
}

// StartProcess starts bin with args, its stdout and stderr appended to logPath.
// The process gets its own process group so Stop ends its children too.
func StartProcess(name, logPath string, env []string, bin string, args ...string) (*Process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("%s: start %s: %w", name, bin, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Stop sends SIGTERM to the process group, then SIGKILL after grace, and waits.
// It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) {
	p.once.Do(func() {
		pgid := p.Cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
	})
}

// Kill sends SIGKILL to the process group and waits: a crash, not a shutdown.
func (p *Process) Kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
}

// Tail returns the last n bytes of the process's log, for failure messages.
func (p *Process) Tail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(log unreadable: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// WaitFor polls check every interval until it returns nil, ctx ends, or the process
// exits. The returned error carries the last check error and the log's tail.
//
// A check error wrapping ErrPortTaken ends the wait at once, and so does an exit
// whose log says a bind failed with "address already in use": both errors wrap
// ErrPortTaken, so a harness knows to start again on fresh ports.
func (p *Process) WaitFor(ctx context.Context, interval time.Duration, check func(context.Context) error) error {
	var last error
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if last = check(ctx); last == nil {
			return nil
		}
		if errors.Is(last, ErrPortTaken) {
			return fmt.Errorf("%s: %w", p.Name, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last check: %v)\n--- %s log tail ---\n%s", p.Name, ctx.Err(), last, p.Name, p.Tail(4000))
		case <-p.done:
			tail := p.Tail(4000)
			if strings.Contains(tail, addrInUse) {
				return fmt.Errorf("%s exited before it was ready (%v): %w (its log says %q)\n--- %s log tail ---\n%s", p.Name, p.waitErr, ErrPortTaken, addrInUse, p.Name, tail)
			}
			return fmt.Errorf("%s exited before it was ready (%v)\n--- %s log tail ---\n%s", p.Name, p.waitErr, p.Name, tail)
		case <-t.C:
		}
	}
}

// addrInUse is how a Go program's failed bind reads in its log (EADDRINUSE).
const addrInUse = "address already in use"
