package mirror

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// blobEntry is a regular file inside a tar: its bytes are file[offset:offset+size].
type blobEntry struct {
	file   *os.File
	offset int64
	size   int64
}

// indexTar lists the regular files of the tar in f with where their bytes lie. A tar
// is uncompressed, so each file's data starts right after its header: the offset is
// f's position once the reader has read the header (tar.Reader reads whole blocks and
// seeks past data it skips, never ahead of the header).
func indexTar(f *os.File) (map[string]blobEntry, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	out := map[string]blobEntry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading the tar: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		off, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return nil, err
		}
		out[h.Name] = blobEntry{offset: off, size: h.Size}
	}
}

// readEntry reads a small entry (index.json, a manifest) whole.
func readEntry(f *os.File, e blobEntry) []byte {
	b := make([]byte, e.size)
	n, _ := f.ReadAt(b, e.offset)
	return b[:n]
}

// tarBlobs is the registry's blob store: every blob of every added tar by digest,
// whatever the repository (blobs are content-addressed; the tars are the cluster's
// own images).
type tarBlobs struct {
	mu      sync.RWMutex
	entries map[string]blobEntry
	files   []*os.File
}

var (
	_ registry.BlobHandler     = (*tarBlobs)(nil)
	_ registry.BlobStatHandler = (*tarBlobs)(nil)
)

func (t *tarBlobs) add(f *os.File, blobs map[string]blobEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.files = append(t.files, f)
	for d, e := range blobs {
		if _, ok := t.entries[d]; !ok {
			t.entries[d] = e
		}
	}
}

func (t *tarBlobs) lookup(h v1.Hash) (blobEntry, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	e, ok := t.entries[h.String()]
	if !ok {
		return blobEntry{}, registry.ErrNotFound
	}
	return e, nil
}

func (t *tarBlobs) Stat(_ context.Context, _ string, h v1.Hash) (int64, error) {
	e, err := t.lookup(h)
	return e.size, err
}

// sectionCloser is a blob's bytes: a ReaderAt too, so the registry serves ranges
// without reading what comes before.
type sectionCloser struct{ *io.SectionReader }

func (sectionCloser) Close() error { return nil }

func (t *tarBlobs) Get(_ context.Context, _ string, h v1.Hash) (io.ReadCloser, error) {
	e, err := t.lookup(h)
	if err != nil {
		return nil, err
	}
	return sectionCloser{io.NewSectionReader(e.file, e.offset, e.size)}, nil
}

func (t *tarBlobs) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, f := range t.files {
		errs = append(errs, f.Close())
	}
	t.files, t.entries = nil, map[string]blobEntry{}
	return errors.Join(errs...)
}
