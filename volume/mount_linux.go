package volume

import (
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/moby/sys/mountinfo"
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
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Clean(dir)))
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	out := make([]string, 0, len(infos))
	for _, m := range infos {
		out = append(out, m.Mountpoint)
	}
	sortDeepestFirst(out)
	return out, nil
}
