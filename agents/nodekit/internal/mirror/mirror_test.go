package mirror

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeLayoutTar writes img as an OCI layout tar whose index.json names it as
// `ctr images import` reads it, the way hack/setup-containerd.sh and
// hack/build-e2e-images.sh lay their images out.
func writeLayoutTar(t *testing.T, img v1.Image, imageName, refName string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	tw := tar.NewWriter(f)
	put := func(name string, b []byte) {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}))
		_, err := tw.Write(b)
		require.NoError(t, err)
	}
	blob := func(b []byte) {
		h, _, err := v1.SHA256(strings.NewReader(string(b)))
		require.NoError(t, err)
		put("blobs/sha256/"+h.Hex, b)
	}
	put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	raw, err := img.RawManifest()
	require.NoError(t, err)
	mt, err := img.MediaType()
	require.NoError(t, err)
	digest, err := img.Digest()
	require.NoError(t, err)
	ann := map[string]string{"org.opencontainers.image.ref.name": refName}
	if imageName != "" {
		ann[annotationImageName] = imageName
	}
	index, err := json.Marshal(v1.IndexManifest{SchemaVersion: 2, Manifests: []v1.Descriptor{{
		MediaType: mt, Digest: digest, Size: int64(len(raw)), Annotations: ann,
	}}})
	require.NoError(t, err)
	put("index.json", index)
	blob(raw)
	cfg, err := img.RawConfigFile()
	require.NoError(t, err)
	blob(cfg)
	layers, err := img.Layers()
	require.NoError(t, err)
	for _, l := range layers {
		rc, err := l.Compressed()
		require.NoError(t, err)
		b, err := io.ReadAll(rc)
		require.NoError(t, err)
		rc.Close()
		blob(b)
	}
	require.NoError(t, tw.Close())
	return path
}

func newServer(t *testing.T, cfg Config) (*Mirror, *httptest.Server) {
	t.Helper()
	m := New(cfg)
	srv := httptest.NewServer(m)
	t.Cleanup(func() {
		srv.Close()
		assert.NoError(t, m.Close())
	})
	return m, srv
}

// ref is a reference a plain client (ggcr's remote) uses: the mirror's address, then
// the whole image name as its repository path.
func ref(t *testing.T, srv *httptest.Server, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/"+s, name.Insecure)
	require.NoError(t, err)
	return r
}

func statusOf(err error) (int, string) {
	var terr *transport.Error
	if !errors.As(err, &terr) {
		return 0, ""
	}
	code := ""
	if len(terr.Errors) > 0 {
		code = string(terr.Errors[0].Code)
	}
	return terr.StatusCode, code
}

func TestPullByTagAndDigest(t *testing.T) {
	img, err := random.Image(2048, 2)
	require.NoError(t, err)
	tarPath := writeLayoutTar(t, img, "registry.k8s.io/e2e-test-images/agnhost:2.66.1", "2.66.1")
	m, srv := newServer(t, Config{})
	added, err := m.Add(tarPath)
	require.NoError(t, err)
	wantDigest, err := img.Digest()
	require.NoError(t, err)
	require.Equal(t, []Image{{Name: "registry.k8s.io/e2e-test-images/agnhost:2.66.1", Digest: wantDigest.String(), Tar: tarPath}}, added)

	wantConfig, err := img.ConfigName()
	require.NoError(t, err)
	for _, r := range []string{
		"registry.k8s.io/e2e-test-images/agnhost:2.66.1",
		"registry.k8s.io/e2e-test-images/agnhost@" + wantDigest.String(),
	} {
		t.Run(r, func(t *testing.T) {
			got, err := remote.Image(ref(t, srv, r))
			require.NoError(t, err)
			d, err := got.Digest()
			require.NoError(t, err)
			assert.Equal(t, wantDigest, d, "the manifest digest must be the loaded one")
			c, err := got.ConfigName()
			require.NoError(t, err)
			assert.Equal(t, wantConfig, c, "the image ID must be the loaded one")
			layers, err := got.Layers()
			require.NoError(t, err)
			wantLayers, err := img.Layers()
			require.NoError(t, err)
			require.Len(t, layers, len(wantLayers))
			for i, l := range layers {
				rc, err := l.Compressed() // verifies the digest as it reads
				require.NoError(t, err)
				b, err := io.ReadAll(rc)
				require.NoError(t, err, "layer %d", i)
				rc.Close()
				wl, err := wantLayers[i].Compressed()
				require.NoError(t, err)
				wb, err := io.ReadAll(wl)
				require.NoError(t, err)
				assert.Equal(t, wb, b, "layer %d", i)
			}
		})
	}
}

func TestNotServed(t *testing.T) {
	img, err := random.Image(512, 1)
	require.NoError(t, err)
	m, srv := newServer(t, Config{})
	_, err = m.Add(writeLayoutTar(t, img, "registry.k8s.io/pause:3.10.2", "3.10.2"))
	require.NoError(t, err)
	for _, tc := range []struct{ ref, code string }{
		{"registry.k8s.io/pause:9.9", "MANIFEST_UNKNOWN"},
		{"registry.k8s.io/pause@sha256:" + strings.Repeat("0", 64), "MANIFEST_UNKNOWN"},
		{"registry.k8s.io/nothere:1", "NAME_UNKNOWN"},
		// Same path, another registry: not the served image.
		{"docker.io/library/pause:3.10.2", "NAME_UNKNOWN"},
	} {
		_, err := remote.Image(ref(t, srv, tc.ref))
		require.Error(t, err, tc.ref)
		status, code := statusOf(err)
		assert.Equal(t, http.StatusNotFound, status, tc.ref)
		assert.Equal(t, tc.code, code, tc.ref)
	}
}

// TestContainerdPaths asks what a node's containerd asks when its hosts.toml sends
// registry.k8s.io or docker.io to the mirror: the repository without the registry,
// and the registry as ns.
func TestContainerdPaths(t *testing.T) {
	img, err := random.Image(512, 1)
	require.NoError(t, err)
	m, srv := newServer(t, Config{})
	_, err = m.Add(writeLayoutTar(t, img, "registry.k8s.io/e2e-test-images/busybox:1.37.0-2", "1.37.0-2"))
	require.NoError(t, err)
	_, err = m.Add(writeLayoutTar(t, img, "docker.io/library/busybox:1.36", "1.36"))
	require.NoError(t, err)
	digest, err := img.Digest()
	require.NoError(t, err)
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodHead, "/v2/e2e-test-images/busybox/manifests/1.37.0-2?ns=registry.k8s.io", 200},
		{http.MethodGet, "/v2/e2e-test-images/busybox/manifests/" + digest.String() + "?ns=registry.k8s.io", 200},
		{http.MethodGet, "/v2/library/busybox/manifests/1.36?ns=docker.io", 200},
		{http.MethodGet, "/v2/busybox/manifests/1.36", 200}, // docker.io/library by default
		{http.MethodGet, "/v2/e2e-test-images/busybox/manifests/1.37.0-2?ns=docker.io", 404},
		{http.MethodGet, "/v2/", 200},
	} {
		req, err := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, tc.status, resp.StatusCode, "%s %s", tc.method, tc.path)
		if tc.status == 200 && strings.Contains(tc.path, "/manifests/") {
			assert.Equal(t, digest.String(), resp.Header.Get("Docker-Content-Digest"), tc.path)
		}
	}
}

func TestReadOnly(t *testing.T) {
	_, srv := newServer(t, Config{})
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete} {
		req, err := http.NewRequest(method, srv.URL+"/v2/registry.k8s.io/pause/blobs/uploads/", strings.NewReader("x"))
		require.NoError(t, err)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, method)
		assert.Contains(t, string(body), "UNSUPPORTED", method)
	}
}

// TestListFile: a tar appended to the list file (as `nodekit load` does) is served
// from the next request on.
func TestListFile(t *testing.T) {
	list := filepath.Join(t.TempDir(), "images")
	_, srv := newServer(t, Config{ListFile: list})
	img, err := random.Image(512, 1)
	require.NoError(t, err)
	r := ref(t, srv, "registry.k8s.io/e2e-test-images/nginx:1.27.0-2")
	_, err = remote.Image(r)
	status, _ := statusOf(err)
	require.Equal(t, http.StatusNotFound, status)

	require.NoError(t, AppendList(list, writeLayoutTar(t, img, "registry.k8s.io/e2e-test-images/nginx:1.27.0-2", "1.27.0-2")))
	got, err := remote.Image(r)
	require.NoError(t, err)
	d, err := got.Digest()
	require.NoError(t, err)
	want, err := img.Digest()
	require.NoError(t, err)
	assert.Equal(t, want, d)
}

func TestBadTars(t *testing.T) {
	m := New(Config{})
	defer m.Close()
	dir := t.TempDir()

	docker := filepath.Join(dir, "docker.tar")
	f, err := os.Create(docker)
	require.NoError(t, err)
	tw := tar.NewWriter(f)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "manifest.json", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}))
	_, err = tw.Write([]byte("[]"))
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, f.Close())
	_, err = m.Add(docker)
	assert.ErrorIs(t, err, ErrNotOCILayout)
	assert.ErrorContains(t, err, docker)

	garbage := filepath.Join(dir, "garbage.tar")
	require.NoError(t, os.WriteFile(garbage, []byte(strings.Repeat("not a tar ", 100)), 0o644))
	_, err = m.Add(garbage)
	assert.ErrorContains(t, err, garbage)

	// A manifest whose bytes do not have the digest index.json gives.
	img, err := random.Image(512, 1)
	require.NoError(t, err)
	other, err := random.Image(512, 1)
	require.NoError(t, err)
	good := writeLayoutTar(t, img, "registry.k8s.io/pause:1", "1")
	otherRaw, err := other.RawManifest()
	require.NoError(t, err)
	d, err := img.Digest()
	require.NoError(t, err)
	bad := rewriteEntry(t, good, "blobs/sha256/"+d.Hex, otherRaw)
	_, err = m.Add(bad)
	assert.ErrorContains(t, err, "registry.k8s.io/pause:1")
	assert.ErrorContains(t, err, "digest")

	_, err = m.Add(filepath.Join(dir, "missing.tar"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.Empty(t, m.Images())
}

// rewriteEntry copies the tar at path with entry name's content replaced.
func rewriteEntry(t *testing.T, path, name string, content []byte) string {
	t.Helper()
	in, err := os.Open(path)
	require.NoError(t, err)
	defer in.Close()
	outPath := filepath.Join(t.TempDir(), "rewritten.tar")
	out, err := os.Create(outPath)
	require.NoError(t, err)
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		if h.Name == name {
			b = content
			h.Size = int64(len(b))
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err = tw.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return outPath
}

func TestRegistries(t *testing.T) {
	img, err := random.Image(512, 1)
	require.NoError(t, err)
	got, err := Registries(writeLayoutTar(t, img, "quay.io/x/y:1", "1"))
	require.NoError(t, err)
	assert.Equal(t, []string{"quay.io"}, got)
	got, err = Registries(writeLayoutTar(t, img, "", "busybox:1"))
	require.NoError(t, err)
	assert.Empty(t, got, "a bare ref.name is not an image name containerd imports")
}

// TestServe: Serve reads a tar appended to the list file without waiting for a
// request (the tar may be gone by then), answers on its listener, and returns nil once
// ctx ends, leaving nothing running.
func TestServe(t *testing.T) {
	list := filepath.Join(t.TempDir(), "mirror", "images")
	m := New(Config{ListFile: list})
	defer m.Close()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- m.Serve(ctx, l) }()

	img, err := random.Image(512, 1)
	require.NoError(t, err)
	tarPath := writeLayoutTar(t, img, "registry.k8s.io/e2e-test-images/nginx:1.28.0-2", "1.28.0-2")
	require.NoError(t, AppendList(list, tarPath))
	require.Eventually(t, func() bool { return len(m.Images()) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the appended tar is read with no request")
	require.NoError(t, os.Remove(tarPath))

	r, err := name.ParseReference(l.Addr().String()+"/registry.k8s.io/e2e-test-images/nginx:1.28.0-2", name.Insecure)
	require.NoError(t, err)
	got, err := remote.Image(r)
	require.NoError(t, err)
	layers, err := got.Layers()
	require.NoError(t, err)
	for _, layer := range layers {
		rc, err := layer.Compressed()
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, rc)
		require.NoError(t, err, "the removed tar is still served: the mirror holds it open")
		rc.Close()
	}

	cancel()
	select {
	case err := <-served:
		assert.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return after ctx ended")
	}
	_, err = net.Dial("tcp", l.Addr().String())
	assert.Error(t, err, "the listener is closed")
}
