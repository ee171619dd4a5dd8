package volume

import "sort"

// NoMount is a Mounter that mounts nothing: tmpfs volumes stay plain folders on
// disk and subPaths are handed to the runtime as resolved paths instead of being
// pinned with a bind mount. For agents that run without root and for tests.
type NoMount struct{}

// MountTmpfs does nothing.
func (NoMount) MountTmpfs(string, int64) error { return nil }

// BindMount does nothing.
func (NoMount) BindMount(string, string) error { return nil }

// Unmount does nothing.
func (NoMount) Unmount(string) error { return nil }

// MountPoints reports none.
func (NoMount) MountPoints(string) ([]string, error) { return nil, nil }

func sortDeepestFirst(paths []string) {
	sort.Slice(paths, func(i, j int) bool {
		if len(paths[i]) != len(paths[j]) {
			return len(paths[i]) > len(paths[j])
		}
		return paths[i] < paths[j]
	})
}
