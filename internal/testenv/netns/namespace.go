package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// Namespace is one network namespace of the environment: the node, the client or a pod.
type Namespace struct {
	// Name is a label for logs and errors ("node", "client", "pod-0", ...).
	Name string

	handle vnetns.NsHandle
	nl     *netlink.Handle
}

// errThreadLost marks a thread that could not be switched back to its own namespace.
// The thread stays locked so that Go ends it with its goroutine.
var errThreadLost = errors.New("could not restore the thread's network namespace")

// newNamespace creates an unnamed network namespace. It is created on a throw-away
// locked thread, so no other goroutine ever runs inside it by accident.
func newNamespace(name string) (*Namespace, error) {
	var h vnetns.NsHandle
	err := onLockedThread(func(orig vnetns.NsHandle) error {
		var err error
		h, err = vnetns.New()
		if err != nil {
			return fmt.Errorf("create network namespace %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		if h.IsOpen() {
			h.Close()
		}
		return nil, err
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("netlink handle in namespace %s: %w", name, err)
	}
	return &Namespace{Name: name, handle: h, nl: nl}, nil
}

// onLockedThread runs fn in a new goroutine whose OS thread is locked, then switches
// that thread back to the namespace it started in. If the switch back fails, the
// thread is left locked, so the runtime ends it instead of reusing it.
func onLockedThread(fn func(orig vnetns.NsHandle) error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			done <- fmt.Errorf("get the thread's network namespace: %w", err)
			return // thread stays locked and dies with the goroutine
		}
		defer orig.Close()
		ferr := fn(orig)
		if err := vnetns.Set(orig); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("%w: %v", errThreadLost, err))
			return // thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Do runs fn on an OS thread that is switched into the namespace, and returns fn's
// error. Sockets fn creates belong to the namespace for their whole life; a child
// process fn starts inherits the namespace. fn must not start goroutines that
// expect to run in the namespace: only fn's own thread is in it.
func (n *Namespace) Do(fn func() error) error {
	return onLockedThread(func(vnetns.NsHandle) error {
		if err := vnetns.Set(n.handle); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", n.Name, err)
		}
		return fn()
	})
}

// Netlink returns a netlink handle bound to the namespace (links, addresses, routes,
// conntrack). The harness owns and closes it.
func (n *Namespace) Netlink() *netlink.Handle { return n.nl }

// FD returns the namespace's file descriptor, for libraries that take one (for
// example nftables.WithNetNSFd). It stays valid until the test's cleanup.
func (n *Namespace) FD() int { return int(n.handle) }

// Path returns a path naming the namespace that any process can open while the
// harness runs (nsenter --net=PATH, ip -n is not usable as the namespace has no name).
func (n *Namespace) Path() string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(n.handle))
}

// Inode returns the namespace's inode number, which identifies it (ls -l /proc/PID/ns/net).
func (n *Namespace) Inode() (uint64, error) {
	var st fileStat
	if err := fstat(int(n.handle), &st); err != nil {
		return 0, fmt.Errorf("stat network namespace %s: %w", n.Name, err)
	}
	return st.Ino, nil
}

// Start starts cmd inside the namespace. The child is forked from a thread that is in
// the namespace, so it lives there; waiting for it can happen anywhere.
func (n *Namespace) Start(cmd *exec.Cmd) error {
	if err := n.Do(cmd.Start); err != nil {
		return fmt.Errorf("start %s in network namespace %s: %w", filepath.Base(cmd.Path), n.Name, err)
	}
	return nil
}

// Run runs name with args inside the namespace and returns its standard output. A
// failure carries the command line and its standard error.
func (n *Namespace) Run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := n.Start(cmd); err != nil {
		return "", err
	}
	if err := cmd.Wait(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s in network namespace %s: %w: %s",
			name, strings.Join(args, " "), n.Name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Dial opens a connection from inside the namespace (the socket is created there).
func (n *Namespace) Dial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	var conn net.Conn
	err := n.Do(func() error {
		var err error
		conn, err = d.DialContext(ctx, network, address)
		return err
	})
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// HTTPClient returns a client whose connections are made from inside the namespace.
// Keep-alives are off, so every request opens a new connection and is load-balanced
// on its own; timeout bounds each request (0 means 5 s).
func (n *Namespace) HTTPClient(timeout time.Duration) *http.Client {
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			// The dial is bounded by the same timeout: net/http lets a dial outlive
			// the request that started it, and a SYN into a blackhole retries for
			// minutes, past the namespace's teardown.
			DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
				ctx, cancel := context.WithTimeout(ctx, timeout)
				defer cancel()
				return n.Dial(ctx, network, address)
			},
			DisableKeepAlives: true,
		},
	}
}

// sysctl writes value to /proc/sys/KEY inside the namespace (KEY in dotted form).
func (n *Namespace) sysctl(key, value string) error {
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	return n.Do(func() error {
		if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
			return fmt.Errorf("sysctl %s=%s in network namespace %s: %w", key, value, n.Name, err)
		}
		return nil
	})
}

func (n *Namespace) close() {
	if n.nl != nil {
		n.nl.Close()
		n.nl = nil
	}
	if n.handle.IsOpen() {
		_ = n.handle.Close()
	}
}
