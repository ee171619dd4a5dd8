package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// machine reads what cAdvisor tells the upstream kubelet about the host: identity,
// versions, CPUs, memory, huge pages and the filesystem holding the root dir. root
// prefixes every path so unit tests can point it at a fake /proc, /sys and /etc.
type machine struct {
	root string
	// statfs and uname are the syscalls, swapped in unit tests.
	statfs func(path string, st *unix.Statfs_t) error
	uname  func(u *unix.Utsname) error
}

func newMachine() *machine {
	return &machine{root: "/", statfs: unix.Statfs, uname: unix.Uname}
}

func (m *machine) read(path string) string {
	b, err := os.ReadFile(filepath.Join(m.root, path))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// machineID is /etc/machine-id (cAdvisor also tries /var/lib/dbus/machine-id).
func (m *machine) machineID() string {
	if id := m.read("etc/machine-id"); id != "" {
		return id
	}
	return m.read("var/lib/dbus/machine-id")
}

// systemUUID is the DMI product UUID, as cAdvisor reads it.
func (m *machine) systemUUID() string { return m.read("sys/class/dmi/id/product_uuid") }

func (m *machine) bootID() string { return m.read("proc/sys/kernel/random/boot_id") }

func (m *machine) kernelVersion() string {
	var u unix.Utsname
	if err := m.uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// osImage is PRETTY_NAME from os-release, as cAdvisor's ContainerOsVersion; "Linux"
// when the file is missing (cAdvisor's fallback).
func (m *machine) osImage() string {
	for _, p := range []string{"etc/os-release", "usr/lib/os-release"} {
		f, err := os.Open(filepath.Join(m.root, p))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), "=")
			if ok && k == "PRETTY_NAME" {
				f.Close()
				if uq, err := strconv.Unquote(v); err == nil {
					return uq
				}
				return strings.Trim(v, `"'`)
			}
		}
		f.Close()
	}
	return "Linux"
}

// numCPU counts the online CPUs (/sys/devices/system/cpu/online, "0-3,6"), falling
// back to the Go runtime's count.
func (m *machine) numCPU() int {
	s := m.read("sys/devices/system/cpu/online")
	if s == "" {
		return runtime.NumCPU()
	}
	n := 0
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || b < a {
			return runtime.NumCPU()
		}
		n += b - a + 1
	}
	return n
}

// meminfo returns /proc/meminfo's fields in bytes.
func (m *machine) meminfo() map[string]int64 {
	out := map[string]int64{}
	b, err := os.ReadFile(filepath.Join(m.root, "proc/meminfo"))
	if err != nil {
		return out
	}
	for line := range bytes.Lines(b) {
		k, v, ok := strings.Cut(string(line), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		out[k] = n
	}
	return out
}

// hugePages returns capacity per huge page size (hugepages-2Mi: pages x size), from
// /sys/kernel/mm/hugepages, as cAdvisor and the kubelet report them.
func (m *machine) hugePages() corev1.ResourceList {
	out := corev1.ResourceList{}
	dir := filepath.Join(m.root, "sys/kernel/mm/hugepages")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	for _, e := range entries {
		kb, ok := strings.CutPrefix(e.Name(), "hugepages-")
		if !ok {
			continue
		}
		kb = strings.TrimSuffix(kb, "kB")
		size, err := strconv.ParseInt(kb, 10, 64)
		if err != nil {
			continue
		}
		pages, _ := strconv.ParseInt(m.read(filepath.Join("sys/kernel/mm/hugepages", e.Name(), "nr_hugepages")), 10, 64)
		sizeQ := resource.NewQuantity(size*1024, resource.BinarySI)
		name := corev1.ResourceName(corev1.ResourceHugePagesPrefix + sizeQ.String())
		out[name] = *resource.NewQuantity(pages*size*1024, resource.BinarySI)
	}
	return out
}

// fsStats are a filesystem's sizes, for ephemeral-storage capacity and DiskPressure.
type fsStats struct {
	capacity, available int64
	inodes, inodesFree  int64
}

func (m *machine) fs(path string) (fsStats, error) {
	var st unix.Statfs_t
	if err := m.statfs(path, &st); err != nil {
		return fsStats{}, fmt.Errorf("statfs %s: %w", path, err)
	}
	bs := int64(st.Bsize)
	return fsStats{
		capacity:   int64(st.Blocks) * bs,
		available:  int64(st.Bavail) * bs,
		inodes:     int64(st.Files),
		inodesFree: int64(st.Ffree),
	}, nil
}

// runningProcesses counts the numeric entries of /proc.
func (m *machine) runningProcesses() int64 {
	entries, err := os.ReadDir(filepath.Join(m.root, "proc"))
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n
}
