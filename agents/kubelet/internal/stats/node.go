package stats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// host reads the machine: /proc, the root cgroup and file systems. Paths are
// fields so unit tests point them at a folder of fixtures.
type host struct {
	procDir   string // default /proc
	cgroupDir string // default /sys/fs/cgroup
	// statfs, procCount and dirUsage touch the system; tests replace them.
	statfs    func(path string) (fsInfo, error)
	procCount func() (uint64, error)
	dirUsage  func(dir string) (bytes, inodes uint64, err error)
}

func realHost() host {
	return host{procDir: "/proc", cgroupDir: "/sys/fs/cgroup", statfs: statfs, procCount: procCount, dirUsage: dirUsage}
}

// fsInfo is one file system's size, as statfs reports it.
type fsInfo struct {
	capacity, available, used uint64
	inodes, inodesFree        uint64
}

func statfs(path string) (fsInfo, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return fsInfo{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bsize := uint64(st.Bsize)
	return fsInfo{
		capacity:   st.Blocks * bsize,
		available:  st.Bavail * bsize,
		used:       (st.Blocks - st.Bfree) * bsize,
		inodes:     st.Files,
		inodesFree: st.Ffree,
	}, nil
}

func procCount() (uint64, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, fmt.Errorf("sysinfo: %w", err)
	}
	return uint64(si.Procs), nil
}

// nodeMemory is the root cgroup's memory figures the way cAdvisor reads them.
type nodeMemory struct {
	capacity, usage, workingSet, rss, pageFaults, majorPageFaults uint64
	swapTotal, swapFree                                           uint64
}

// unified reports whether the machine runs cgroup v2 only. A hybrid v1 layout
// (controllers on v1, systemd's tree on /sys/fs/cgroup/unified) counts as v1.
func (h host) unified() bool {
	_, err := os.Stat(filepath.Join(h.cgroupDir, "cgroup.controllers"))
	return err == nil
}

// cpuUsage is the node's cumulative CPU time in nanoseconds: the root cgroup's
// cpuacct.usage on v1, usage_usec of cpu.stat on v2, and /proc/stat's busy time
// when neither exists.
func (h host) cpuUsage() (uint64, error) {
	if h.unified() {
		if kv, err := h.readKV(filepath.Join(h.cgroupDir, "cpu.stat")); err == nil {
			if v, ok := kv["usage_usec"]; ok {
				return v * 1000, nil
			}
		}
		return h.procStatCPU()
	}
	for _, dir := range []string{"cpuacct", "cpu,cpuacct", "cpuacct,cpu"} {
		v, err := h.readUint(filepath.Join(h.cgroupDir, dir, "cpuacct.usage"))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
	}
	return h.procStatCPU()
}

// procStatCPU sums the busy columns of /proc/stat's "cpu" line (user, nice,
// system, irq, softirq, steal), converted from USER_HZ (100 on Linux) ticks.
func (h host) procStatCPU() (uint64, error) {
	path := filepath.Join(h.procDir, "stat")
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			continue
		}
		var ticks uint64
		for _, i := range []int{1, 2, 3, 6, 7, 8} {
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: column %d of the cpu line: %w", path, i, err)
			}
			ticks += v
		}
		return ticks * uint64(10*time.Millisecond), nil
	}
	return 0, fmt.Errorf("%s: no cpu line", path)
}

// memory reads the node's memory as cAdvisor does for the root container: usage
// from memory.usage_in_bytes (v1) or MemTotal-MemFree (v2, whose root cgroup has no
// memory.current), and the working set as usage minus inactive file pages, the
// figure the kubelet evicts on.
func (h host) memory() (nodeMemory, error) {
	meminfo, err := h.readKV(filepath.Join(h.procDir, "meminfo"))
	if err != nil {
		return nodeMemory{}, err
	}
	// /proc/meminfo is in kB.
	m := nodeMemory{
		capacity:  meminfo["MemTotal"] * 1024,
		swapTotal: meminfo["SwapTotal"] * 1024,
		swapFree:  meminfo["SwapFree"] * 1024,
	}
	var stat map[string]uint64
	var inactiveFile uint64
	if h.unified() {
		m.usage = m.capacity - meminfo["MemFree"]*1024
		if stat, err = h.readKV(filepath.Join(h.cgroupDir, "memory.stat")); err != nil {
			return nodeMemory{}, err
		}
		inactiveFile = stat["inactive_file"]
		m.rss = stat["anon"]
		m.pageFaults = stat["pgfault"]
		m.majorPageFaults = stat["pgmajfault"]
	} else {
		dir := filepath.Join(h.cgroupDir, "memory")
		if m.usage, err = h.readUint(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
			return nodeMemory{}, err
		}
		if stat, err = h.readKV(filepath.Join(dir, "memory.stat")); err != nil {
			return nodeMemory{}, err
		}
		inactiveFile = stat["total_inactive_file"]
		m.rss = stat["total_rss"]
		m.pageFaults = stat["total_pgfault"]
		m.majorPageFaults = stat["total_pgmajfault"]
	}
	m.workingSet = m.usage
	if inactiveFile < m.workingSet {
		m.workingSet -= inactiveFile
	} else {
		m.workingSet = 0
	}
	return m, nil
}

// bootTime is btime from /proc/stat: the node's start time.
func (h host) bootTime() (time.Time, error) {
	kv, err := h.readKV(filepath.Join(h.procDir, "stat"))
	if err != nil {
		return time.Time{}, err
	}
	bt, ok := kv["btime"]
	if !ok {
		return time.Time{}, fmt.Errorf("%s: no btime", filepath.Join(h.procDir, "stat"))
	}
	return time.Unix(int64(bt), 0), nil
}

func (h host) maxPID() (uint64, error) {
	return h.readUint(filepath.Join(h.procDir, "sys", "kernel", "pid_max"))
}

// netInterface is one line of /proc/net/dev.
type netInterface struct {
	name                                 string
	rxBytes, rxErrors, txBytes, txErrors uint64
}

// ignoredInterface names the devices cAdvisor leaves out of the root container's
// network: loopback, pod veths and docker's bridges.
func ignoredInterface(name string) bool {
	for _, p := range []string{"lo", "veth", "docker", "nerdctl"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// network reads /proc/net/dev of the agent's own network namespace.
func (h host) network() ([]netInterface, error) {
	path := filepath.Join(h.procDir, "net", "dev")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []netInterface
	for line := range strings.Lines(string(b)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		name = strings.TrimSpace(name)
		f := strings.Fields(rest)
		if len(f) < 16 || ignoredInterface(name) {
			continue
		}
		var v [16]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
				return nil, fmt.Errorf("%s: interface %s: %w", path, name, err)
			}
		}
		// Receive: bytes packets errs ...; transmit starts at column 8.
		out = append(out, netInterface{name: name, rxBytes: v[0], rxErrors: v[2], txBytes: v[8], txErrors: v[10]})
	}
	return out, nil
}

// dirUsage sums the disk space (allocated blocks, as du counts them) of the files
// directly in dir, and counts them, as the kubelet measures a container's logs.
// Sub-folders are not counted; a missing dir is an error.
func dirUsage(dir string) (bytes, files uint64, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		info, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // rotated away meanwhile
		}
		if err != nil {
			return 0, 0, err
		}
		files++
		if st, ok := info.Sys().(*unix.Stat_t); ok {
			bytes += uint64(st.Blocks) * 512
		} else {
			bytes += uint64(info.Size())
		}
	}
	return bytes, files, nil
}

func (h host) readUint(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// readKV parses "key value [unit]" or "key: value [unit]" lines; lines whose value
// is not a number are skipped.
func (h host) readKV(path string) (map[string]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	kv := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		kv[strings.TrimSuffix(fields[0], ":")] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return kv, nil
}
