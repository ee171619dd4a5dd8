package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

var t0 = time.Date(2026, 12, 3, 5, 30, 0, 0, time.UTC)

func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.Walk(dir, func(path string, info os.FileInfo, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, path)
		switch {
		case rel == ".":
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(path)
			out[rel] = "-> " + target
		case info.IsDir():
			out[rel] = "dir " + info.Mode().Perm().String()
		default:
			data, _ := os.ReadFile(path)
			out[rel] = info.Mode().Perm().String() + " " + string(data)
		}
		return nil
	}))
	return out
}

func tsDirOf(t *testing.T, dir string) string {
	t.Helper()
	ts, err := os.Readlink(filepath.Join(dir, dataDirName))
	require.NoError(t, err)
	return ts
}

func TestWriteAtomicLayout(t *testing.T) {
	dir := t.TempDir()
	changed, err := writeAtomic(dir, map[string]file{
		"game.properties": {data: []byte("lives=3"), mode: 0o644},
		"conf/ui/theme":   {data: []byte("dark"), mode: 0o400},
		"./conf/level":    {data: []byte("9"), mode: 0o600},
	}, t0, nil)
	require.NoError(t, err)
	assert.True(t, changed)
	ts := tsDirOf(t, dir)
	assert.True(t, strings.HasPrefix(ts, "..2026_12_03_05_30_00."), ts)
	assert.Equal(t, map[string]string{
		"..data":                "-> " + ts,
		"game.properties":       "-> ..data/game.properties",
		"conf":                  "-> ..data/conf",
		ts:                      "dir -rwxr-xr-x",
		ts + "/game.properties": "-rw-r--r-- lives=3",
		ts + "/conf":            "dir -rwxr-xr-x",
		ts + "/conf/ui":         "dir -rwxr-xr-x",
		ts + "/conf/ui/theme":   "-r-------- dark",
		ts + "/conf/level":      "-rw------- 9",
	}, readTree(t, dir))
	data, err := os.ReadFile(filepath.Join(dir, "conf/ui/theme"))
	require.NoError(t, err)
	assert.Equal(t, "dark", string(data), "visible paths go through ..data")

	// The same payload again: nothing is written, the data folder stays.
	changed, err = writeAtomic(dir, map[string]file{
		"game.properties": {data: []byte("lives=3"), mode: 0o644},
		"conf/ui/theme":   {data: []byte("dark"), mode: 0o400},
		"conf/level":      {data: []byte("9"), mode: 0o600},
	}, t0.Add(time.Minute), nil)
	require.NoError(t, err)
	assert.False(t, changed)
	assert.Equal(t, ts, tsDirOf(t, dir))

	// An update drops conf/ entirely and changes a mode: new data folder, the old
	// one and the conf link are gone.
	changed, err = writeAtomic(dir, map[string]file{
		"game.properties": {data: []byte("lives=3"), mode: 0o444},
		"new":             {data: []byte("x"), mode: 0o644},
	}, t0.Add(2*time.Minute), nil)
	require.NoError(t, err)
	assert.True(t, changed)
	ts2 := tsDirOf(t, dir)
	assert.NotEqual(t, ts, ts2)
	assert.True(t, strings.HasPrefix(ts2, "..2026_12_03_05_32_00."), ts2)
	assert.Equal(t, map[string]string{
		"..data":                 "-> " + ts2,
		"game.properties":        "-> ..data/game.properties",
		"new":                    "-> ..data/new",
		ts2:                      "dir -rwxr-xr-x",
		ts2 + "/game.properties": "-r--r--r-- lives=3",
		ts2 + "/new":             "-rw-r--r-- x",
	}, readTree(t, dir))

	// An empty payload (an optional configMap that went away) empties the volume.
	_, err = writeAtomic(dir, map[string]file{}, t0.Add(3*time.Minute), nil)
	require.NoError(t, err)
	ts3 := tsDirOf(t, dir)
	assert.Equal(t, map[string]string{"..data": "-> " + ts3, ts3: "dir -rwxr-xr-x"}, readTree(t, dir))
}

func TestWriteAtomicModeIgnoresUmask(t *testing.T) {
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	dir := t.TempDir()
	_, err := writeAtomic(dir, map[string]file{"a": {data: []byte("1"), mode: 0o644}}, t0, nil)
	require.NoError(t, err)
	st, err := os.Stat(filepath.Join(dir, "a"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o644), st.Mode().Perm())
	st, err = os.Stat(filepath.Join(dir, dataDirName))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())
}

func TestWriteAtomicInvalidPaths(t *testing.T) {
	for p, want := range map[string]string{
		"":                         `invalid path: must not be empty: ""`,
		"/etc/passwd":              "invalid path: must be relative path: /etc/passwd",
		"../escape":                "invalid path: must not contain '..': ../escape",
		"a/../../b":                "invalid path: must not contain '..': a/../../b",
		"..data":                   "invalid path: must not start with '..': ..data",
		"..hidden/x":               "invalid path: must not start with '..': ..hidden/x",
		strings.Repeat("n", 256):   "invalid path: filenames must be less than or equal to 255 characters",
		strings.Repeat("d/", 2049): "invalid path: must be less than or equal to 4096 characters",
	} {
		dir := t.TempDir()
		_, err := writeAtomic(dir, map[string]file{p: {data: []byte("x"), mode: 0o644}, "ok": {mode: 0o644}}, t0, nil)
		require.Error(t, err, p)
		assert.ErrorIs(t, err, ErrInvalidPath)
		assert.Equal(t, want, err.Error())
		entries, _ := os.ReadDir(dir)
		assert.Empty(t, entries, "nothing is written for an invalid payload")
	}
}

// TestWriteAtomicReadersSeeWholeVersions flips between two payloads while
// readers read them. A reader that pins the data folder once sees one version
// in every file, and no read of a visible path ever returns a partial file.
func TestWriteAtomicReadersSeeWholeVersions(t *testing.T) {
	dir := t.TempDir()
	names := []string{"a", "b", "sub/c", "sub/d"}
	version := func(v string) map[string]file {
		p := map[string]file{}
		for _, n := range names {
			p[n] = file{data: []byte(strings.Repeat(v, 4096)), mode: 0o644}
		}
		return p
	}
	_, err := writeAtomic(dir, version("1"), t0, nil)
	require.NoError(t, err)

	var stop atomic.Bool
	var mixed, partial, consistent atomic.Int64
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				// Pinned read: open ..data once, read every file relative to it.
				fd, err := unix.Open(filepath.Join(dir, dataDirName), unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err != nil {
					continue
				}
				seen := map[byte]bool{}
				ok := true
				for _, n := range names {
					f, err := unix.Openat(fd, n, unix.O_RDONLY, 0)
					if err != nil {
						ok = false // the old folder was removed under us: retry
						break
					}
					buf := make([]byte, 8192)
					k, _ := unix.Read(f, buf)
					unix.Close(f)
					if k != 4096 {
						partial.Add(1)
					}
					seen[buf[0]] = true
				}
				unix.Close(fd)
				if ok {
					if len(seen) != 1 {
						mixed.Add(1)
					} else {
						consistent.Add(1)
					}
				}
				// Unpinned read through the visible link.
				data, err := os.ReadFile(filepath.Join(dir, "sub/c"))
				if err == nil && (len(data) != 4096 || strings.Count(string(data), string(data[0])) != 4096) {
					partial.Add(1)
				}
			}
		}()
	}
	for i := 0; i < 300; i++ {
		v := "1"
		if i%2 == 0 {
			v = "2"
		}
		_, err := writeAtomic(dir, version(v), t0.Add(time.Duration(i)*time.Second), nil)
		require.NoError(t, err)
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, mixed.Load(), "a pinned reader saw two versions at once")
	assert.Zero(t, partial.Load(), "a reader saw a partial file")
	assert.Positive(t, consistent.Load())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var tsDirs int
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..2026") {
			tsDirs++
		}
	}
	assert.Equal(t, 1, tsDirs, "old data folders are removed")
}

func TestWriteAtomicPermsHookFailure(t *testing.T) {
	dir := t.TempDir()
	_, err := writeAtomic(dir, map[string]file{"a": {data: []byte("1"), mode: 0o644}}, t0, nil)
	require.NoError(t, err)
	ts := tsDirOf(t, dir)
	boom := errors.New("chown refused")
	_, err = writeAtomic(dir, map[string]file{"a": {data: []byte("2"), mode: 0o644}}, t0.Add(time.Second), func(string) error { return boom })
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, ts, tsDirOf(t, dir), "a failed write leaves the old version visible")
	data, _ := os.ReadFile(filepath.Join(dir, "a"))
	assert.Equal(t, "1", string(data))
}

func TestWriteAtomicRestoresLostLinks(t *testing.T) {
	dir := t.TempDir()
	payload := map[string]file{"a": {data: []byte("1"), mode: 0o644}, "b/c": {data: []byte("2"), mode: 0o644}}
	_, err := writeAtomic(dir, payload, t0, nil)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(dir, "b")))
	changed, err := writeAtomic(dir, payload, t0.Add(time.Second), nil)
	require.NoError(t, err)
	assert.False(t, changed, "the data is up to date")
	link, err := os.Readlink(filepath.Join(dir, "b"))
	require.NoError(t, err)
	assert.Equal(t, "..data/b", link, "the lost link is made again")
}
