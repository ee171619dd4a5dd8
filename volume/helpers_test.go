package volume_test

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

type unixStatfs = unix.Statfs_t

const tmpfsMagic = unix.TMPFS_MAGIC

func statfs(path string, st *unix.Statfs_t) error { return unix.Statfs(path, st) }

func typesUID(s string) types.UID { return types.UID(s) }

type typesUIDAlias = types.UID

// requireRoot skips (fails under CI=true) when mounts cannot be made.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Unavailable(t, "mounting tmpfs and bind mounts needs root")
	}
}

// countMounts counts mount points at or below path in /proc/self/mountinfo.
func countMounts(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == path || strings.HasPrefix(f[4], path+"/")) {
			n++
		}
	}
	return n
}
