package staticpod_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/staticpod"
	"github.com/nodekit-dev/nodekit/staticpod/staticpodtest"
)

func TestBadManifests(t *testing.T) {
	tests := []struct {
		name     string
		manifest string
		kind     error
		line     int // 0: do not check
		column   int
		field    string
		contains string
	}{
		{
			name:     "invalid YAML",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: [web\nspec: {}\n",
			kind:     staticpod.ErrSyntax,
			line:     4,
			contains: "did not find expected",
		},
		{
			name:     "invalid JSON",
			manifest: `{"apiVersion": "v1", "kind": "Pod",, "metadata": {}}`,
			kind:     staticpod.ErrSyntax,
			line:     1,
		},
		{
			name:     "bad indentation",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n labels: {}\nspec: {}\n",
			kind:     staticpod.ErrSyntax,
			line:     5,
		},
		{
			name:     "tab indentation",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n\tname: web\n",
			kind:     staticpod.ErrSyntax,
			line:     4,
		},
		{
			name:     "empty file",
			manifest: "",
			kind:     staticpod.ErrWrongKind,
			contains: "empty",
		},
		{
			name:     "comments only",
			manifest: "# nothing here\n",
			kind:     staticpod.ErrWrongKind,
		},
		{
			name:     "wrong kind",
			manifest: "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n",
			kind:     staticpod.ErrWrongKind,
			line:     2,
			column:   7,
			field:    "kind",
			contains: `kind "Deployment"`,
		},
		{
			name:     "a PodList is not read from files",
			manifest: "apiVersion: v1\nkind: PodList\nitems: []\n",
			kind:     staticpod.ErrWrongKind,
			field:    "kind",
			contains: "HTTP source",
		},
		{
			name:     "kind missing",
			manifest: "apiVersion: v1\nmetadata:\n  name: web\n",
			kind:     staticpod.ErrWrongKind,
			contains: "kind is missing",
		},
		{
			name:     "wrong apiVersion",
			manifest: "apiVersion: v2\nkind: Pod\nmetadata:\n  name: web\n",
			kind:     staticpod.ErrWrongKind,
			line:     1,
			field:    "apiVersion",
		},
		{
			name:     "a list at top level",
			manifest: "- a\n- b\n",
			kind:     staticpod.ErrWrongKind,
			contains: "found a list",
		},
		{
			name:     "two documents",
			manifest: minimal + "---\n" + minimal,
			kind:     staticpod.ErrMultipleDocuments,
			line:     9,
		},
		{
			name:     "unknown field with a suggestion",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    imagee: nginx\n",
			kind:     staticpod.ErrUnknownField,
			line:     8,
			column:   5,
			field:    "spec.containers[0].imagee",
			contains: `did you mean "image"?`,
		},
		{
			name:     "unknown top-level field",
			manifest: minimal + "extra: true\n",
			kind:     staticpod.ErrUnknownField,
			line:     9,
			field:    "extra",
		},
		{
			name:     "unknown field in a JSON manifest",
			manifest: "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Pod\",\n  \"metadata\": {\"name\": \"web\", \"lables\": {}},\n  \"spec\": {\"containers\": [{\"name\": \"web\", \"image\": \"nginx\"}]}\n}\n",
			kind:     staticpod.ErrUnknownField,
			line:     4,
			field:    "metadata.lables",
			contains: `did you mean "labels"?`,
		},
		{
			name:     "string where a number belongs",
			manifest: minimal + "    ports:\n    - containerPort: \"80\"\n",
			kind:     staticpod.ErrFieldType,
			line:     10,
			field:    "spec.containers[0].ports[0].containerPort",
			contains: "expected an integer",
		},
		{
			name:     "number where a string belongs",
			manifest: minimal + "    env:\n    - name: PORT\n      value: 8080\n",
			kind:     staticpod.ErrFieldType,
			line:     11,
			field:    "spec.containers[0].env[0].value",
			contains: "quote it",
		},
		{
			name:     "object where a list belongs",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n    name: web\n",
			kind:     staticpod.ErrFieldType,
			line:     7,
			field:    "spec.containers",
		},
		{
			name:     "integer out of range",
			manifest: minimal + "    ports:\n    - containerPort: 99999999999\n",
			kind:     staticpod.ErrFieldType,
			field:    "spec.containers[0].ports[0].containerPort",
		},
		{
			name:     "bad quantity",
			manifest: minimal + "    resources:\n      requests:\n        cpu: lots\n",
			kind:     staticpod.ErrFieldType,
			line:     11,
			column:   14,
			field:    "spec.containers[0].resources.requests.cpu",
			contains: `"lots" is not a quantity`,
		},
		{
			name:     "repeated key",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  name: web2\nspec:\n  containers:\n  - name: web\n    image: nginx\n",
			kind:     staticpod.ErrSyntax,
			line:     5,
			field:    "metadata.name",
			contains: "first at line 4",
		},
		{
			name:     "name missing",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec:\n  containers:\n  - name: web\n    image: nginx\n",
			kind:     staticpod.ErrInvalidPod,
			field:    "metadata.name",
			contains: "invalid pod: name is needed for the pod",
		},
		{
			name:     "no containers",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec: {}\n",
			kind:     staticpod.ErrInvalidPod,
			contains: "spec.containers: Required value",
		},
		{
			name:     "image missing",
			manifest: "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n",
			kind:     staticpod.ErrInvalidPod,
			contains: "spec.containers[0].image: Required value",
		},
		{
			name:     "upper-case name",
			manifest: strings.Replace(minimal, "name: web\nspec", "name: Web\nspec", 1),
			kind:     staticpod.ErrInvalidPod,
			contains: "metadata.name",
		},
		{
			name:     "mount of an undeclared volume",
			manifest: minimal + "    volumeMounts:\n    - name: data\n      mountPath: /data\n",
			kind:     staticpod.ErrInvalidPod,
			contains: `spec.containers[0].volumeMounts[0].name: Not found: "data"`,
		},
		{
			name:     "liveness successThreshold must be 1",
			manifest: minimal + "    livenessProbe:\n      successThreshold: 2\n      tcpSocket:\n        port: 80\n",
			kind:     staticpod.ErrInvalidPod,
			contains: "livenessProbe.successThreshold",
		},
		{
			name:     "hostPort differs from containerPort under hostNetwork",
			manifest: minimal + "    ports:\n    - containerPort: 80\n      hostPort: 8080\n  hostNetwork: true\n",
			kind:     staticpod.ErrInvalidPod,
			contains: "must match `containerPort`",
		},
		{
			name:     "service account",
			manifest: minimal + "  serviceAccountName: builder\n",
			kind:     staticpod.ErrAPIReference,
			contains: "static pods may not reference serviceaccounts",
		},
		{
			name:     "secret volume",
			manifest: minimal + "  volumes:\n  - name: s\n    secret:\n      secretName: tls\n",
			kind:     staticpod.ErrAPIReference,
			contains: "static pods may not reference secrets",
		},
		{
			name:     "config map env",
			manifest: minimal + "    env:\n    - name: X\n      valueFrom:\n        configMapKeyRef:\n          name: cm\n          key: x\n",
			kind:     staticpod.ErrAPIReference,
			contains: "static pods may not reference configmaps",
		},
		{
			name:     "image pull secret",
			manifest: minimal + "  imagePullSecrets:\n  - name: regcred\n",
			kind:     staticpod.ErrAPIReference,
			contains: "may not reference secrets",
		},
		{
			name:     "persistent volume claim",
			manifest: minimal + "  volumes:\n  - name: d\n    persistentVolumeClaim:\n      claimName: data\n",
			kind:     staticpod.ErrAPIReference,
			contains: "may not reference persistentvolumeclaims",
		},
		{
			name:     "projected service account token",
			manifest: minimal + "  volumes:\n  - name: t\n    projected:\n      sources:\n      - serviceAccountToken:\n          path: token\n",
			kind:     staticpod.ErrAPIReference,
			contains: "may not reference serviceaccounts (via projected volumes)",
		},
		{
			name:     "CSI volume",
			manifest: minimal + "  volumes:\n  - name: c\n    csi:\n      driver: example.csi\n",
			kind:     staticpod.ErrAPIReference,
			contains: "may not reference csidrivers (via CSI volumes)",
		},
		{
			name:     "resource claim",
			manifest: minimal + "  resourceClaims:\n  - name: gpu\n    resourceClaimName: gpu\n",
			kind:     staticpod.ErrAPIReference,
			contains: "may not reference resourceclaims",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "bad.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tt.manifest), 0o644))
			// A good neighbour loads whatever happens to bad.yaml.
			staticpodtest.WriteManifest(t, dir, "good.yaml", []byte(minimal))

			snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n"})
			require.NoError(t, err)
			assert.Equal(t, []string{"default/web-n"}, staticpodtest.Names(snap.Pods), "the good manifest still loads")
			require.Len(t, snap.Errors, 1)
			got := snap.Errors[0]
			t.Log(got.Error())

			assert.ErrorIs(t, got, staticpod.ErrInvalidManifest)
			assert.ErrorIs(t, got, tt.kind)
			assert.Equal(t, path, got.Path)
			assert.True(t, strings.HasPrefix(got.Error(), path), "the message starts with the file")
			if tt.line != 0 {
				assert.Equal(t, tt.line, got.Line, "line")
			}
			if tt.column != 0 {
				assert.Equal(t, tt.column, got.Column, "column")
			}
			if tt.field != "" {
				assert.Equal(t, tt.field, got.Field, "field")
			}
			if tt.contains != "" {
				assert.Contains(t, got.Error(), tt.contains)
			}
		})
	}
}

func TestManifestsThatLoad(t *testing.T) {
	tests := map[string]string{
		"trailing document marker":  minimal + "---\n",
		"leading document marker":   "---\n" + minimal,
		"JSON":                      `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web"},"spec":{"containers":[{"name":"web","image":"nginx"}]}}`,
		"anchors and merge keys":    "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: &l\n    app: web\n  annotations:\n    <<: *l\nspec:\n  containers:\n  - name: web\n    image: nginx\n",
		"numeric quantity":          minimal + "    resources:\n      limits:\n        cpu: 1\n",
		"octal file mode":           minimal + "  volumes:\n  - name: d\n    downwardAPI:\n      defaultMode: 0644\n      items:\n      - path: labels\n        fieldRef:\n          fieldPath: metadata.labels\n",
		"int-or-string probe port":  minimal + "    readinessProbe:\n      httpGet:\n        port: http\n    ports:\n    - name: http\n      containerPort: 80\n",
		"null fields":               minimal + "  nodeSelector: null\nstatus: {}\n",
		"unquoted date in a string": strings.Replace(minimal, "  name: web\n", "  name: web\n  annotations:\n    built: 2024-01-02\n", 1),
	}
	for name, m := range tests {
		t.Run(name, func(t *testing.T) {
			pod, err := staticpod.ParseManifest("/m/web.yaml", []byte(m), "n")
			require.NoError(t, err)
			assert.Equal(t, "web-n", pod.Name)
		})
	}
	t.Run("date text is kept verbatim", func(t *testing.T) {
		pod, err := staticpod.ParseManifest("/m/web.yaml", []byte(tests["unquoted date in a string"]), "n")
		require.NoError(t, err)
		assert.Equal(t, "2024-01-02", pod.Annotations["built"])
	})
	t.Run("limits default requests", func(t *testing.T) {
		pod, err := staticpod.ParseManifest("/m/web.yaml", []byte(tests["numeric quantity"]), "n")
		require.NoError(t, err)
		assert.Equal(t, "1", pod.Spec.Containers[0].Resources.Requests.Cpu().String())
	})
	t.Run("octal mode is 420", func(t *testing.T) {
		pod, err := staticpod.ParseManifest("/m/web.yaml", []byte(tests["octal file mode"]), "n")
		require.NoError(t, err)
		assert.Equal(t, int32(0o644), *pod.Spec.Volumes[0].DownwardAPI.DefaultMode)
	})
}

func TestOversize(t *testing.T) {
	dir := t.TempDir()
	// Exactly 10 MiB is refused (the kubelet's ReadAtMost treats reaching the limit as
	// an error); one byte less loads. Padding is a YAML comment.
	pad := func(size int) []byte {
		b := bytes.NewBufferString(minimal)
		b.WriteString("#")
		b.Write(bytes.Repeat([]byte("x"), size-b.Len()-1))
		b.WriteString("\n")
		require.Equal(t, size, b.Len())
		return b.Bytes()
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a-big.yaml"), pad(staticpod.MaxManifestSize), 0o644))
	limit := pad(staticpod.MaxManifestSize - 1)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b-limit.yaml"), bytes.Replace(limit, []byte("name: web\n"), []byte("name: wex\n"), 1), 0o644))

	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n"})
	require.NoError(t, err)
	assert.Equal(t, []string{"default/wex-n"}, staticpodtest.Names(snap.Pods))
	require.Len(t, snap.Errors, 1)
	assert.ErrorIs(t, snap.Errors[0], staticpod.ErrTooLarge)
	assert.Equal(t, filepath.Join(dir, "a-big.yaml"), snap.Errors[0].Path)

	_, err = staticpod.ParseManifest("x.yaml", pad(staticpod.MaxManifestSize), "n")
	assert.ErrorIs(t, err, staticpod.ErrTooLarge)
}

// TestUnreadable covers entries that cannot be read as a manifest. Tests run as root,
// for whom mode 000 does not make a file unreadable, so it uses entries that no
// permission bit can fix: a FIFO (which must not hang the reader), a dangling symlink
// and a symlink loop.
func TestUnreadable(t *testing.T) {
	dir := t.TempDir()
	staticpodtest.WriteManifest(t, dir, "good.yaml", []byte(minimal))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, "missing-target.yaml"), filepath.Join(dir, "dangling.yaml")))
	require.NoError(t, os.Symlink(filepath.Join(dir, "loop.yaml"), filepath.Join(dir, "loop.yaml")))

	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n"})
	require.NoError(t, err)
	assert.Equal(t, []string{"default/web-n"}, staticpodtest.Names(snap.Pods))
	var bad []string
	for _, e := range snap.Errors {
		assert.ErrorIs(t, e, staticpod.ErrUnreadable, e.Error())
		bad = append(bad, filepath.Base(e.Path))
	}
	assert.Equal(t, []string{"dangling.yaml", "fifo.yaml", "loop.yaml"}, bad)
}

func TestIgnoredEntries(t *testing.T) {
	dir := t.TempDir()
	staticpodtest.WriteManifest(t, dir, "web.yaml", []byte(minimal))
	for _, name := range []string{".hidden.yaml", "web.yaml~", "#web.yaml#", "4913", "web.yaml.swp", "web.yaml.dpkg-old", "web.yaml.bak"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("not: [yaml"), 0o644))
	}
	// A subfolder named like a manifest is not recursed into, nor an error.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nested.yaml"), 0o755))
	staticpodtest.WriteManifest(t, filepath.Join(dir, "nested.yaml"), "inner.yaml", []byte(minimal))

	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n"})
	require.NoError(t, err)
	assert.Equal(t, []string{"default/web-n"}, staticpodtest.Names(snap.Pods))
	assert.Empty(t, snap.Errors)

	t.Run("kubelet rule skips only dotfiles", func(t *testing.T) {
		snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n", Ignore: staticpod.KubeletIgnore})
		require.NoError(t, err)
		assert.Equal(t, []string{"default/web-n"}, staticpodtest.Names(snap.Pods))
		assert.Len(t, snap.Errors, 6, "the six editor files are read and fail")
	})
}

func TestDuplicateNames(t *testing.T) {
	dir := t.TempDir()
	staticpodtest.WriteManifest(t, dir, "a.yaml", []byte(minimal))
	staticpodtest.WriteManifest(t, dir, "b.yaml", []byte(strings.Replace(minimal, "nginx:1.27", "nginx:1.28", 1)))
	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "n"})
	require.NoError(t, err)
	require.Len(t, snap.Pods, 1)
	assert.Equal(t, "nginx:1.27", snap.Pods[0].Spec.Containers[0].Image, "the first file in sorted order wins")
	require.Len(t, snap.Errors, 1)
	assert.ErrorIs(t, snap.Errors[0], staticpod.ErrDuplicateName)
	assert.Equal(t, filepath.Join(dir, "b.yaml"), snap.Errors[0].Path)
	assert.Contains(t, snap.Errors[0].Error(), "a.yaml")
}

func TestManifestErrorUnwrap(t *testing.T) {
	_, err := staticpod.ParseManifest("/m/x.yaml", []byte("kind: Pod\napiVersion: v1\nfoo: 1\n"), "n")
	var me *staticpod.ManifestError
	require.True(t, errors.As(err, &me))
	assert.ErrorIs(t, err, staticpod.ErrUnknownField)
	assert.NotErrorIs(t, err, staticpod.ErrSyntax)
	assert.Equal(t, `/m/x.yaml:3:1: foo: unknown field "foo"`, err.Error())
}
