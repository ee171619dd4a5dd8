package boundary

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func moduleRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func goCmd(t *testing.T, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr.String())
	return out
}

// TestRootModuleDoesNotRequireKubernetes reads the root go.mod's requirements and the
// whole build list: k8s.io/kubernetes appears in neither.
func TestRootModuleDoesNotRequireKubernetes(t *testing.T) {
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	require.NoError(t, json.Unmarshal(goCmd(t, "mod", "edit", "-json"), &mod))
	require.Equal(t, Module, mod.Module.Path)
	var required []string
	for _, r := range mod.Require {
		required = append(required, r.Path)
	}
	require.NotEmpty(t, required)
	assert.False(t, RequiresKubernetes(required), "the root go.mod requires k8s.io/kubernetes; it belongs in upstream/ only")

	buildList := strings.Fields(string(goCmd(t, "list", "-m", "-f", "{{.Path}}", "all")))
	assert.False(t, RequiresKubernetes(buildList), "k8s.io/kubernetes is in the root module's build list")
}

// TestLibrariesImportNoneOfEachOther lists every package of the root module with its
// dependencies and test imports and fails on any crossing.
func TestLibrariesImportNoneOfEachOther(t *testing.T) {
	out := goCmd(t, "list", "-e", "-json=ImportPath,Deps,TestImports,XTestImports", "./...")
	dec := json.NewDecoder(bytes.NewReader(out))
	var pkgs []Package
	for dec.More() {
		var p struct {
			ImportPath                      string
			Deps, TestImports, XTestImports []string
		}
		require.NoError(t, dec.Decode(&p))
		pkgs = append(pkgs, Package{
			ImportPath:  p.ImportPath,
			Deps:        p.Deps,
			TestImports: append(p.TestImports, p.XTestImports...),
		})
	}
	require.NotEmpty(t, pkgs)
	assert.Empty(t, Violations(pkgs))
}

// TestViolationsCatchesCrossings proves the check above can fail.
func TestViolationsCatchesCrossings(t *testing.T) {
	pkgs := []Package{
		{ImportPath: Module + "/lease", Deps: []string{"context", Module + "/probe", Module + "/lease/internal/x"}},
		{ImportPath: Module + "/rules/nft", TestImports: []string{Module + "/servicemap/servicemaptest", Module + "/internal/testenv"}},
		{ImportPath: Module + "/cri", Deps: []string{"k8s.io/kubernetes/pkg/kubelet"}},
		{ImportPath: Module + "/agents/kubelet", Deps: []string{Module + "/lease", Module + "/probe"}},
		{ImportPath: Module + "/leasetools", Deps: []string{Module + "/probe"}},
		{ImportPath: Module + "/staticpod", TestImports: []string{Module + "/agents/kubelet"}},
		{ImportPath: Module + "/probe/probetest", Deps: []string{Module + "/agents/internal/x", Module + "/internal/testenv"}},
		{ImportPath: Module + "/internal/testenv", Deps: []string{Module + "/lease", Module + "/agents/kubelet"}},
	}
	assert.Equal(t, []string{
		Module + "/cri depends on k8s.io/kubernetes (k8s.io/kubernetes/pkg/kubelet)",
		Module + "/lease depends on " + Module + "/probe: library packages must not import each other",
		Module + "/leasetools depends on " + Module + "/probe: library packages must not import each other",
		Module + "/probe/probetest depends on " + Module + "/agents/internal/x: library packages must not import the agents",
		Module + "/rules/nft imports in tests " + Module + "/servicemap/servicemaptest: library packages must not import each other",
		Module + "/staticpod imports in tests " + Module + "/agents/kubelet: library packages must not import the agents",
	}, Violations(pkgs))
	assert.True(t, RequiresKubernetes([]string{"k8s.io/api", "k8s.io/kubernetes"}))
	assert.False(t, RequiresKubernetes([]string{"k8s.io/api", "k8s.io/kubernetes-extra"}))
}
