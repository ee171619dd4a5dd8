package volume

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// openBeneath opens base/sub with O_PATH, refusing any resolution that leaves
// base (a "..", an absolute symlink, a symlink pointing outside), and creates
// missing folders on the way with base's mode, as the kubelet's SafeMakeDir.
func openBeneath(base, sub string) (*os.File, error) {
	st, err := os.Stat(base)
	if err != nil {
		return nil, err
	}
	perm := uint32(st.Mode().Perm())
	baseFD, err := unix.Open(base, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", base, err)
	}
	defer unix.Close(baseFD)

	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS}
	parts := strings.Split(strings.Trim(sub, "/"), "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		fd, err := unix.Openat2(baseFD, prefix, how)
		if err == nil {
			if i == len(parts)-1 {
				return os.NewFile(uintptr(fd), base+"/"+prefix), nil
			}
			unix.Close(fd)
			continue
		}
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("subpath %q not within volume path %q: %w", sub, base, err)
		}
		if !errors.Is(err, unix.ENOENT) {
			return nil, fmt.Errorf("open %s in %s: %w", prefix, base, err)
		}
		// Missing: create it inside the (already checked) parent.
		parentFD := baseFD
		if i > 0 {
			pfd, err := unix.Openat2(baseFD, strings.Join(parts[:i], "/"), &unix.OpenHow{
				Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: how.Resolve})
			if err != nil {
				return nil, fmt.Errorf("open %s in %s: %w", strings.Join(parts[:i], "/"), base, err)
			}
			defer unix.Close(pfd)
			parentFD = pfd
		}
		if err := unix.Mkdirat(parentFD, parts[i], perm); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("mkdir %s in %s: %w", prefix, base, err)
		}
		fd, err = unix.Openat2(baseFD, prefix, how)
		if err != nil {
			return nil, fmt.Errorf("open %s in %s: %w", prefix, base, err)
		}
		if i == len(parts)-1 {
			return os.NewFile(uintptr(fd), base+"/"+prefix), nil
		}
		unix.Close(fd)
	}
	return nil, fmt.Errorf("empty subpath")
}
