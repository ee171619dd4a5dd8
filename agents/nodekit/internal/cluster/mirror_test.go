package cluster

import (
	"archive/tar"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMirrorHosts: every node's certs.d sends the fixed registries and those the
// loaded images name to the mirror, in the form containerd 1.6 accepts (a host table;
// without one it falls back to the registry itself).
func TestMirrorHosts(t *testing.T) {
	tarPath := filepath.Join(t.TempDir(), "img.tar")
	f, err := os.Create(tarPath)
	require.NoError(t, err)
	tw := tar.NewWriter(f)
	index := []byte(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` +
		"0000000000000000000000000000000000000000000000000000000000000000" + `","size":1,"annotations":{"io.containerd.image.name":"example.test:5000/team/app:1"}}]}`)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "index.json", Mode: 0o644, Size: int64(len(index)), Typeflag: tar.TypeReg}))
	_, err = tw.Write(index)
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, f.Close())

	regs, err := registriesOf([]string{tarPath})
	require.NoError(t, err)
	assert.Equal(t, append(append([]string(nil), mirrorRegistries...), "example.test:5000"), regs)

	n := Node{Name: "node-1", Dir: t.TempDir()}
	require.NoError(t, writeMirrorHosts(n, "172.30.0.1:5000", regs))
	for _, r := range []string{"_default", "registry.k8s.io", "docker.io", "example.test:5000"} {
		b, err := os.ReadFile(filepath.Join(n.Dir, "certs.d", r, "hosts.toml"))
		require.NoError(t, err, r)
		assert.Contains(t, string(b), "\nserver = \"http://172.30.0.1:5000\"\n", r)
		assert.Contains(t, string(b), "\n[host.\"http://172.30.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n", r)
	}
}
