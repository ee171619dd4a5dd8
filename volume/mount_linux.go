package volume

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// SystemMounter mounts with mount(2). It is the default Mounter and needs root
// (CAP_SYS_ADMIN).
type SystemMounter struct{}

// MountTmpfs mounts a tmpfs on target.
func (SystemMounter) MountTmpfs(target string, sizeBytes int64) error {
	opts := ""
	if sizeBytes > 0 {
		opts = "size=" + strconv.FormatInt(sizeBytes, 10)
	}
	if err := unix.Mount("tmpfs", target, "tmpfs", 0, opts); err != nil {
		return fmt.Errorf("mount -t tmpfs -o %q tmpfs %s: %w", opts, target, err)
	}
	return nil
}

// BindMount bind-mounts source on target; target must exist.
func (SystemMounter) BindMount(source, target string) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount --bind %s %s: %w", source, target, err)
	}
	return nil
}

// Unmount unmounts target, detaching it if it is busy.
func (SystemMounter) Unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil {
		if err == unix.EBUSY {
			if err2 := unix.Unmount(target, unix.MNT_DETACH); err2 == nil {
				return nil
			}
		}
		return fmt.Errorf("umount %s: %w", target, err)
	}
	return nil
}

// MountPoints lists the mount points at or below dir from /proc/self/mountinfo,
// deepest first, so they can be unmounted in that order.
func (SystemMounter) MountPoints(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sortDeepestFirst(out)
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for a space ...) of mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
