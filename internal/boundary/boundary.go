// Package boundary checks the rules that keep nodekit embeddable: the root module never
// requires k8s.io/kubernetes, and the library packages (lease, probe, cri, staticpod,
// servicemap, rules) import none of each other. The check runs in this package's tests.
package boundary

import (
	"fmt"
	"sort"
	"strings"
)

// Module is nodekit's root module path.
const Module = "github.com/nodekit-dev/nodekit"

// Libraries are the top-level library packages, each with its subpackages.
var Libraries = []string{"lease", "probe", "cri", "staticpod", "servicemap", "rules"}

// Package is what the check needs of one package in the build: its path and what it
// imports, for its own code (transitively) and for its tests (directly).
type Package struct {
	ImportPath  string
	Deps        []string // transitive imports of the non-test code
	TestImports []string // direct imports of _test.go files, in and out of the package
}

// library returns which library a package path belongs to, or "".
func library(importPath string) string {
	rest, ok := strings.CutPrefix(importPath, Module+"/")
	if !ok {
		return ""
	}
	top, _, _ := strings.Cut(rest, "/")
	for _, l := range Libraries {
		if top == l {
			return l
		}
	}
	return ""
}

// Violations lists every import that crosses from one library into another, and every
// use of k8s.io/kubernetes, in a stable order.
func Violations(pkgs []Package) []string {
	var out []string
	for _, p := range pkgs {
		self := library(p.ImportPath)
		check := func(imp, via string) {
			if imp == "k8s.io/kubernetes" || strings.HasPrefix(imp, "k8s.io/kubernetes/") {
				out = append(out, fmt.Sprintf("%s %s k8s.io/kubernetes (%s)", p.ImportPath, via, imp))
				return
			}
			if self == "" {
				return
			}
			if other := library(imp); other != "" && other != self {
				out = append(out, fmt.Sprintf("%s %s %s: library packages must not import each other", p.ImportPath, via, imp))
			}
		}
		for _, d := range p.Deps {
			check(d, "depends on")
		}
		for _, d := range p.TestImports {
			check(d, "imports in tests")
		}
	}
	sort.Strings(out)
	return out
}

// RequiresKubernetes reports whether a list of required module paths names
// k8s.io/kubernetes.
func RequiresKubernetes(modules []string) bool {
	for _, m := range modules {
		if m == "k8s.io/kubernetes" {
			return true
		}
	}
	return false
}
