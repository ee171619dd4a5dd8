package volumetest

import (
	"sort"
	"strings"
	"sync"
)

// RecordingMounter is a Mounter for tests that records calls and keeps a mount
// table in memory instead of mounting.
type RecordingMounter struct {
	mu     sync.Mutex
	mounts map[string]string
	calls  []string
	// Err, when non-nil, is returned by MountTmpfs and BindMount.
	Err error
	// UnmountErr, when non-nil, is returned by Unmount (the mount stays).
	UnmountErr error
}

// MountTmpfs records a tmpfs mount.
func (r *RecordingMounter) MountTmpfs(target string, size int64) error {
	return r.add("tmpfs", target)
}

// BindMount records a bind mount.
func (r *RecordingMounter) BindMount(source, target string) error {
	return r.add("bind "+source, target)
}

func (r *RecordingMounter) add(what, target string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "mount "+what+" "+target)
	if r.Err != nil {
		return r.Err
	}
	if r.mounts == nil {
		r.mounts = map[string]string{}
	}
	r.mounts[target] = what
	return nil
}

// Unmount records an unmount.
func (r *RecordingMounter) Unmount(target string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "umount "+target)
	if r.UnmountErr != nil {
		return r.UnmountErr
	}
	delete(r.mounts, target)
	return nil
}

// MountPoints lists the recorded mounts at or below dir, deepest first.
func (r *RecordingMounter) MountPoints(dir string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for mp := range r.mounts {
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return len(out[i]) > len(out[j]) || (len(out[i]) == len(out[j]) && out[i] < out[j])
	})
	return out, nil
}

// Calls returns the calls so far, e.g. "mount tmpfs /root/pods/u/volumes/...".
func (r *RecordingMounter) Calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}
