// Package mirror is the read-only registry `nodekit up` runs for its nodes: it serves,
// over the OCI distribution API, exactly the images the cluster has imported from OCI
// layout tarballs, so that a pull (imagePullPolicy: Always, or a digest) of a loaded
// image succeeds without the internet and gives the image containerd already holds.
//
// # What it serves
//
// Every image an OCI layout tar's index.json names, as containerd's import names it
// (the io.containerd.image.name annotation, else a fully qualified
// org.opencontainers.image.ref.name), by tag and by the digest of the descriptor
// index.json gives: the manifest bytes in the tar are served unchanged, so the digest a
// node resolves is the digest its import recorded, and its config (the image ID) and
// layers are the blobs it already has. Blobs are read from the tars in place; nothing
// is copied. Docker-archive tars (manifest.json, no index.json) are not served:
// containerd converts them on import into a manifest this package cannot reproduce.
//
// # Names
//
// containerd, sent to a mirror by a node's certs.d hosts.toml, adds the registry the
// reference names as the query parameter ns (registry.k8s.io, docker.io, ...) to the
// repository path; without ns the path is read as a whole reference
// ("/v2/registry.k8s.io/pause/manifests/3.10.2", "/v2/library/busybox/..." for
// docker.io), which is how a plain client reaches the same images.
//
// # Protocol
//
// github.com/google/go-containerregistry/pkg/registry does the protocol (manifests by
// tag and digest, HEAD, blobs with ranges, tags/list, the error bodies: NAME_UNKNOWN
// and MANIFEST_UNKNOWN with 404 for what is not served); this package feeds it the
// manifests and a blob store over the tars, and refuses every method but GET and HEAD
// (405, UNSUPPORTED).
package mirror

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/distribution/reference"
	"github.com/fsnotify/fsnotify"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// ErrNotOCILayout marks a tar without an OCI layout index.json (a docker archive, or
// not an image at all).
var ErrNotOCILayout = errors.New("not an OCI layout tar")

// containerd's own annotation for the image name an import creates.
const annotationImageName = "io.containerd.image.name"

// Mirror serves the images of the tars added to it. Build it with New; it is an
// http.Handler.
type Mirror struct {
	reg     http.Handler
	logger  *log.Logger
	blobs   *tarBlobs
	mu      sync.Mutex
	added   map[string]bool // tar paths already served
	images  []Image
	list    string // see Config.ListFile
	listSig string // the list file's size and mtime when last read
}

// Image is one served image.
type Image struct {
	// Name is the normalized reference with its tag ("registry.k8s.io/pause:3.10.2").
	Name string
	// Digest is the descriptor's digest: the same reference pulled by digest.
	Digest string
	// Tar is the file it is served from.
	Tar string
}

// Config configures New.
type Config struct {
	// ListFile, when set, names a file of tar paths, one a line: the tars in it are
	// added when Serve starts, when the file changes while Serve runs (watched), and
	// before a request is answered if it changed since it was last read, so `nodekit
	// load` (which appends to it) is served from its next pull on. Empty: only what
	// Add adds.
	ListFile string
	// Log receives one line per request and per added image. Nil: discarded.
	Log io.Writer
}

// New returns an empty mirror.
func New(cfg Config) *Mirror {
	w := cfg.Log
	if w == nil {
		w = io.Discard
	}
	logger := log.New(w, "mirror: ", log.LstdFlags)
	m := &Mirror{logger: logger, blobs: &tarBlobs{entries: map[string]blobEntry{}}, added: map[string]bool{}, list: cfg.ListFile}
	m.reg = registry.New(registry.Logger(logger), registry.WithBlobHandler(m.blobs))
	return m
}

// Images lists what is served, in the order added.
func (m *Mirror) Images() []Image {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Image(nil), m.images...)
}

// Close closes the tars.
func (m *Mirror) Close() error { return m.blobs.close() }

// Add serves the images of the OCI layout tar at path. The file stays open until
// Close, so the tar may be replaced or removed afterwards. Adding a path twice is a
// no-op.
func (m *Mirror) Add(path string) ([]Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addLocked(path)
}

func (m *Mirror) addLocked(path string) ([]Image, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	if m.added[abs] {
		return nil, nil
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, err
	}
	entries, err := indexTar(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	idx, ok := entries["index.json"]
	if !ok {
		f.Close()
		return nil, fmt.Errorf("%s: %w (no index.json; docker archives are not served)", abs, ErrNotOCILayout)
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(readEntry(f, idx), &index); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: index.json: %w", abs, err)
	}
	blobs := map[string]blobEntry{}
	for name, e := range entries {
		if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && len(hexDigest) == 64 {
			e.file = f
			blobs["sha256:"+hexDigest] = e
		}
	}
	// The blobs first: the manifests refer to them.
	m.blobs.add(f, blobs)
	var out []Image
	for _, desc := range index.Manifests {
		name, err := imageName(desc.Annotations)
		if err != nil {
			return out, fmt.Errorf("%s: index.json entry %s: %w", abs, desc.Digest, err)
		}
		if name == nil {
			m.logger.Printf("%s: index.json entry %s has no image name: not served", abs, desc.Digest)
			continue
		}
		if err := m.putManifest(reference.TrimNamed(name).String(), name.Tag(), desc, blobs, 0); err != nil {
			return out, fmt.Errorf("%s: image %s: %w", abs, name, err)
		}
		img := Image{Name: name.String(), Digest: desc.Digest.String(), Tar: abs}
		m.images = append(m.images, img)
		out = append(out, img)
		m.logger.Printf("serving %s (%s) from %s", img.Name, img.Digest, abs)
	}
	m.added[abs] = true
	return out, nil
}

// imageName is the name containerd's import gives the descriptor, normalized, or nil
// when it gives none.
func imageName(ann map[string]string) (reference.NamedTagged, error) {
	raw := ann[annotationImageName]
	if raw == "" {
		// containerd takes a ref.name only when it is a whole reference.
		raw = ann["org.opencontainers.image.ref.name"]
		if !strings.ContainsAny(raw, "/") {
			return nil, nil
		}
	}
	named, err := reference.ParseNormalizedNamed(raw)
	if err != nil {
		return nil, fmt.Errorf("image name %q: %w", raw, err)
	}
	tagged, ok := reference.TagNameOnly(named).(reference.NamedTagged)
	if !ok {
		return nil, fmt.Errorf("image name %q has a digest and no tag", raw)
	}
	return tagged, nil
}

// putManifest stores desc's manifest (and, for an index, the manifests it lists that
// the tar holds) under repo by tag ("" for by digest only) through the registry's own
// PUT, after checking its bytes against the digest.
func (m *Mirror) putManifest(repo, tag string, desc v1.Descriptor, blobs map[string]blobEntry, depth int) error {
	if depth > 4 {
		return errors.New("indexes nested too deep")
	}
	e, ok := blobs[desc.Digest.String()]
	if !ok {
		return fmt.Errorf("manifest %s is not in the tar", desc.Digest)
	}
	body := readEntry(e.file, e)
	sum := sha256.Sum256(body)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != desc.Digest.String() {
		return fmt.Errorf("manifest %s: the tar's blob has digest %s", desc.Digest, got)
	}
	if desc.MediaType.IsIndex() {
		child, err := v1.ParseIndexManifest(bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("index %s: %w", desc.Digest, err)
		}
		for _, c := range child.Manifests {
			if _, held := blobs[c.Digest.String()]; !held {
				// Another platform's image, left out of the tar: not served, as a
				// single-platform import does not have it either.
				continue
			}
			if err := m.putManifest(repo, "", c, blobs, depth+1); err != nil {
				return err
			}
		}
	}
	ref := tag
	if ref == "" {
		ref = desc.Digest.String()
	}
	req := httptest.NewRequest(http.MethodPut, "/v2/"+repo+"/manifests/"+ref, bytes.NewReader(body))
	req.Header.Set("Content-Type", string(desc.MediaType))
	rec := httptest.NewRecorder()
	m.reg.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		return fmt.Errorf("storing manifest %s: %d %s", desc.Digest, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}

// ServeHTTP answers GET and HEAD of the distribution API.
func (m *Mirror) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry mirror is read-only")
		m.logger.Printf("%s %s %d read-only", r.Method, r.URL, http.StatusMethodNotAllowed)
		return
	}
	m.refresh()
	path, err := rewrite(r.URL.Path, r.URL.Query().Get("ns"))
	if err != nil {
		writeError(w, http.StatusNotFound, "NAME_INVALID", err.Error())
		m.logger.Printf("%s %s %d %v", r.Method, r.URL, http.StatusNotFound, err)
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath, r2.URL.RawQuery = path, "", ""
	m.reg.ServeHTTP(w, r2)
}

// rewrite turns the request path into /v2/<normalized repository>/<rest>: the
// repository is ns + the path's repository when ns is given, else the path's
// repository read as a reference.
func rewrite(p, ns string) (string, error) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok || rest == "" {
		return p, nil
	}
	elems := strings.Split(strings.TrimSuffix(rest, "/"), "/")
	// The repository is everything before the last "manifests", "blobs", "tags" or
	// "referrers" element (blob uploads are refused before this).
	cut := -1
	for i := len(elems) - 2; i >= 1; i-- {
		switch elems[i] {
		case "manifests", "blobs", "tags", "referrers":
			cut = i
		}
		if cut >= 0 {
			break
		}
	}
	if cut < 0 {
		return p, nil
	}
	repo := strings.Join(elems[:cut], "/")
	switch ns {
	case "":
	case "registry-1.docker.io", "index.docker.io":
		repo = "docker.io/" + repo
	default:
		repo = ns + "/" + repo
	}
	named, err := reference.ParseNormalizedNamed(repo)
	if err != nil {
		return "", fmt.Errorf("repository %q: %w", repo, err)
	}
	return "/v2/" + named.Name() + "/" + strings.Join(elems[cut:], "/"), nil
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"errors": []map[string]string{{"code": code, "message": msg}}})
}

// refresh adds the list file's tars that are new, when the file changed.
func (m *Mirror) refresh() {
	if m.list == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st, err := os.Stat(m.list)
	if err != nil {
		return
	}
	sig := fmt.Sprintf("%d %d", st.Size(), st.ModTime().UnixNano())
	if sig == m.listSig {
		return
	}
	m.listSig = sig
	paths, err := ReadList(m.list)
	if err != nil {
		m.logger.Printf("%v", err)
		return
	}
	for _, p := range paths {
		if _, err := m.addLocked(p); err != nil {
			m.logger.Printf("not served: %v", err)
		}
	}
}

// watch refreshes on every change of the list file's directory until ctx ends. A
// watch that cannot be set up is logged: requests still refresh.
func (m *Mirror) watch(ctx context.Context) {
	dir := filepath.Dir(m.list)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		m.logger.Printf("not watching %s: %v", m.list, err)
		return
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		m.logger.Printf("not watching %s: %v", m.list, err)
		return
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		m.logger.Printf("not watching %s: %v", m.list, err)
		return
	}
	// A change between the first refresh and the watch.
	m.refresh()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Clean(ev.Name) == filepath.Clean(m.list) {
				m.refresh()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			m.logger.Printf("watching %s: %v", m.list, err)
		}
	}
}

// ReadList reads a list file: one tar path a line, blank lines skipped.
func ReadList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if line := strings.TrimSpace(s.Text()); line != "" {
			out = append(out, line)
		}
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// AppendList adds tar (made absolute) to the list file at path, creating it.
func AppendList(path, tar string) error {
	abs, err := filepath.Abs(tar)
	if err != nil {
		return err
	}
	if strings.ContainsAny(abs, "\n\r") {
		return fmt.Errorf("tar path %q: a line break cannot be listed", abs)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, abs)
	return errors.Join(err, f.Close())
}

// Registries lists the registry hosts (docker.io, registry.k8s.io, ...) of the images
// an OCI layout tar names, without serving it. A tar that is not OCI layout names
// none.
func Registries(tarPath string) ([]string, error) {
	f, err := os.Open(tarPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	entries, err := indexTar(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tarPath, err)
	}
	idx, ok := entries["index.json"]
	if !ok {
		return nil, nil
	}
	var index v1.IndexManifest
	if err := json.Unmarshal(readEntry(f, idx), &index); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", tarPath, err)
	}
	seen := map[string]bool{}
	var out []string
	for _, desc := range index.Manifests {
		name, err := imageName(desc.Annotations)
		if err != nil || name == nil {
			continue
		}
		if d := reference.Domain(name); !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out, nil
}

// Serve answers on l until ctx ends, then shuts the server down. With a list file, it
// reads it first and whenever it changes.
func (m *Mirror) Serve(ctx context.Context, l net.Listener) error {
	if m.list != "" {
		m.refresh()
		watchCtx, stopWatch := context.WithCancel(ctx)
		watched := make(chan struct{})
		defer func() { stopWatch(); <-watched }()
		go func() {
			defer close(watched)
			m.watch(watchCtx)
		}()
	}
	srv := &http.Server{Handler: m, ReadHeaderTimeout: 30 * time.Second, ErrorLog: m.logger}
	done := make(chan struct{})
	stopped := context.AfterFunc(ctx, func() {
		defer close(done)
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	})
	err := srv.Serve(l)
	if stopped() {
		// ctx never ended: Serve failed on its own.
		return err
	}
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
