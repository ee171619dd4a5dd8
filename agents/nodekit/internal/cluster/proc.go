package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 keeps named network namespaces.
const netnsDir = "/var/run/netns"

func nsPath(name string) string { return filepath.Join(netnsDir, name) }

// ip runs one iproute2 command. iproute2 rather than netlink calls: each step is then a
// command an operator can read in the log and type by hand, and `ip netns` owns the
// bind mounts under /var/run/netns that other tools (ip netns exec, nsenter) expect.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNS runs a short command inside a namespace.
func inNS(ctx context.Context, ns string, args ...string) error {
	return ip(ctx, append([]string{"netns", "exec", ns}, args...)...)
}

// startIn starts bin in network namespace ns, in its own process group, output
// appended to logPath. The process is not tied to this one: it outlives `up --detach`.
func startIn(ns, logPath, bin string, args ...string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	return startCommand(logPath, argvIn(ns, bin, args...))
}

// argvIn is the command line that runs bin in network namespace ns: through nsenter
// (which execs bin, so the PID is bin's own), or directly when ns is "", the
// machine's own namespace (--host-network).
func argvIn(ns, bin string, args ...string) []string {
	if ns == "" {
		return append([]string{bin}, args...)
	}
	return append([]string{"nsenter", "--net=" + nsPath(ns), "--", bin}, args...)
}

// startCommand starts argv in its own process group, output appended to logPath, and
// reaps it when it exits.
func startCommand(logPath string, argv []string) (*exec.Cmd, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	// Reap it when it exits, whoever stops it, so it never lingers as a zombie.
	go func() { _ = cmd.Wait() }()
	return cmd, nil
}

// stop ends p: SIGTERM to its process group, SIGKILL after grace. A process whose PID
// now belongs to someone else is left alone.
func stop(p Process, grace time.Duration) {
	if !p.Alive() {
		return
	}
	_ = syscall.Kill(-p.PID, syscall.SIGTERM)
	_ = syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	_ = syscall.Kill(p.PID, syscall.SIGKILL)
	for range 100 {
		if !p.Alive() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shimsOf lists the containerd shims serving the containerd at address: they run in
// their own process groups and outlive containerd by design.
func shimsOf(address string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), "containerd-shim") {
			continue
		}
		for _, arg := range strings.Split(string(b), "\x00") {
			if arg == address {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// mountsUnder lists mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return nil
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unmountAll(dir string) error {
	var errs []error
	for range 3 {
		mounts := mountsUnder(dir)
		if len(mounts) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, m := range mounts {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
	}
	if m := mountsUnder(dir); len(m) > 0 {
		errs = append(errs, fmt.Errorf("still mounted: %v", m))
	}
	return errors.Join(errs...)
}
