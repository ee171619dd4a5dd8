package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The atomic writer's reserved names inside a volume, as upstream's.
const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
	maxNameLength  = 255
	maxPathLength  = 4096
)

// file is one file of a payload: its content and mode.
type file struct {
	data []byte
	mode os.FileMode
}

// writeAtomic projects payload into dir the way pkg/volume/util/atomic_writer.go
// does, so that a reader sees the whole old payload or the whole new one:
//
//	dir/..2026_12_03_05_30_00.123456789/<payload>   the files themselves
//	dir/..data -> ..2026_12_03_05_30_00.123456789    swapped by rename(2)
//	dir/<top> -> ..data/<top>                        one per top-level name, made after the swap
//
// perms, when not nil, adjusts ownership and modes of the new data folder before
// it becomes visible. It returns whether anything changed. Nothing is written when the files and
// modes on disk already match the payload. dir must exist.
func writeAtomic(dir string, payload map[string]file, now time.Time, perms func(tsDir string) error) (bool, error) {
	clean, err := validatePayload(payload)
	if err != nil {
		return false, err
	}
	dataLink := filepath.Join(dir, dataDirName)
	oldTS, err := os.Readlink(dataLink)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("reading %s: %w", dataLink, err)
	}
	var remove []string
	if oldTS != "" {
		oldPath := filepath.Join(dir, oldTS)
		remove, err = pathsToRemove(clean, oldPath)
		if err != nil {
			return false, err
		}
		same, err := payloadOnDisk(clean, oldPath)
		if err != nil {
			return false, err
		}
		if same && len(remove) == 0 {
			// Up to date; still make sure every visible link exists, as upstream
			// does since kubernetes#121472 (a link lost by a crash would otherwise
			// stay lost).
			return false, createVisibleLinks(dir, clean)
		}
	}

	tsDir, err := os.MkdirTemp(dir, now.UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, fmt.Errorf("creating the data folder: %w", err)
	}
	// Others must be able to walk into it whatever the umask.
	if err := os.Chmod(tsDir, 0o755); err != nil {
		_ = os.RemoveAll(tsDir)
		return false, fmt.Errorf("chmod %s: %w", tsDir, err)
	}
	if err := writePayload(clean, tsDir); err != nil {
		_ = os.RemoveAll(tsDir)
		return false, err
	}
	if perms != nil {
		if err := perms(tsDir); err != nil {
			_ = os.RemoveAll(tsDir)
			return false, fmt.Errorf("setting ownership: %w", err)
		}
	}
	tmpLink := filepath.Join(dir, newDataDirName)
	_ = os.Remove(tmpLink) // left over by a crash between symlink and rename
	if err := os.Symlink(filepath.Base(tsDir), tmpLink); err != nil {
		_ = os.RemoveAll(tsDir)
		return false, fmt.Errorf("creating %s: %w", tmpLink, err)
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		_ = os.Remove(tmpLink)
		_ = os.RemoveAll(tsDir)
		return false, fmt.Errorf("swapping %s: %w", dataLink, err)
	}
	// The links are made after the swap, so none ever points at a name the
	// current ..data lacks.
	if err := createVisibleLinks(dir, clean); err != nil {
		return true, err
	}
	var errs []error
	for _, p := range remove {
		// Only top-level names have links of their own; deeper paths vanish with
		// the old data folder.
		if strings.Contains(p, "/") {
			continue
		}
		if err := os.Remove(filepath.Join(dir, p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if oldTS != "" {
		if err := os.RemoveAll(filepath.Join(dir, oldTS)); err != nil {
			errs = append(errs, err)
		}
	}
	return true, errors.Join(errs...)
}

// validatePayload checks every path as upstream's validatePath does and returns
// the payload with cleaned paths.
func validatePayload(payload map[string]file) (map[string]file, error) {
	clean := make(map[string]file, len(payload))
	for p, f := range payload {
		if err := validatePath(p); err != nil {
			return nil, err
		}
		clean[filepath.Clean(p)] = f
	}
	return clean, nil
}

func validatePath(p string) error {
	if p == "" {
		return fmt.Errorf("%w: must not be empty: %q", ErrInvalidPath, p)
	}
	if filepath.IsAbs(p) {
		return fmt.Errorf("%w: must be relative path: %s", ErrInvalidPath, p)
	}
	if len(p) > maxPathLength {
		return fmt.Errorf("%w: must be less than or equal to %d characters", ErrInvalidPath, maxPathLength)
	}
	parts := strings.Split(p, "/")
	for _, part := range parts {
		if part == ".." {
			return fmt.Errorf("%w: must not contain '..': %s", ErrInvalidPath, p)
		}
		if len(part) > maxNameLength {
			return fmt.Errorf("%w: filenames must be less than or equal to %d characters", ErrInvalidPath, maxNameLength)
		}
	}
	if strings.HasPrefix(parts[0], "..") && len(parts[0]) > 2 {
		return fmt.Errorf("%w: must not start with '..': %s", ErrInvalidPath, p)
	}
	return nil
}

// payloadOnDisk reports whether every file of payload is in oldDir with the same
// content and mode. Upstream compares content only; a changed mode (a new
// defaultMode) is written too here, so the files always show the pod's modes.
func payloadOnDisk(payload map[string]file, oldDir string) (bool, error) {
	for p, f := range payload {
		full := filepath.Join(oldDir, p)
		st, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if !st.Mode().IsRegular() || st.Mode().Perm() != f.mode.Perm() {
			return false, nil
		}
		data, err := os.ReadFile(full)
		if err != nil {
			return false, err
		}
		if !bytes.Equal(data, f.data) {
			return false, nil
		}
	}
	return true, nil
}

// pathsToRemove lists the paths under oldDir that the new payload no longer has,
// leaving out the folders that still lead to new files.
func pathsToRemove(payload map[string]file, oldDir string) ([]string, error) {
	keep := map[string]bool{}
	for p := range payload {
		for q := p; q != "." && q != "/" && q != ""; q = filepath.Dir(q) {
			keep[q] = true
		}
	}
	var out []string
	err := filepath.WalkDir(oldDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(oldDir, path)
		if err != nil || rel == "." {
			return err
		}
		if !keep[rel] {
			out = append(out, rel)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	sort.Strings(out)
	return out, err
}

func writePayload(payload map[string]file, dir string) error {
	for p, f := range payload {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("creating folder for %s: %w", p, err)
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		// WriteFile's mode passes through the umask; the pod asked for this one.
		if err := os.Chmod(full, f.mode); err != nil {
			return fmt.Errorf("chmod %s: %w", p, err)
		}
	}
	return nil
}

func createVisibleLinks(dir string, payload map[string]file) error {
	for p := range payload {
		top, _, _ := strings.Cut(p, "/")
		link := filepath.Join(dir, top)
		if _, err := os.Readlink(link); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s exists and is not a link: %w", link, err)
		}
		if err := os.Symlink(filepath.Join(dataDirName, top), link); err != nil {
			return fmt.Errorf("linking %s: %w", link, err)
		}
	}
	return nil
}
