// Package boundary checks the rules that keep nodekit embeddable: the root module never
// requires k8s.io/kubernetes, the library packages (every top-level folder of the root
// module except agents/ and internal/) import none of each other, and none imports the
// agents. The check runs in this package's tests.
package boundary

import (
	"fmt"
	"sort"
	"strings"
)

// Module is nodekit's root module path.
const Module = "github.com/nodekit-dev/nodekit"

// notLibraries are the top-level folders of the root module that hold no library: the
// agents (the one place libraries are wired together) and the project's internals.
var notLibraries = map[string]bool{"agents": true, "internal": true}

// Agents is the folder of the reference agents, which no library may import.
const Agents = "agents"

// Package is what the check needs of one package in the build: its path and what it
// imports, for its own code (transitively) and for its tests (directly).
type Package struct {
	ImportPath  string
	Deps        []string // transitive imports of the non-test code
	TestImports []string // direct imports of _test.go files, in and out of the package
}

// topLevel returns the top-level folder of a package path inside the module, or "".
func topLevel(importPath string) string {
	rest, ok := strings.CutPrefix(importPath, Module+"/")
	if !ok {
		return ""
	}
	top, _, _ := strings.Cut(rest, "/")
	return top
}

// library returns which library a package path belongs to, or "". A new top-level
// package is a library from the moment it exists, so the rules cover it unasked.
func library(importPath string) string {
	top := topLevel(importPath)
	if top == "" || notLibraries[top] {
		return ""
	}
	return top
}

// Violations lists every import that crosses from one library into another or from a
// library into the agents, and every use of k8s.io/kubernetes, in a stable order.
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
			if topLevel(imp) == Agents {
				out = append(out, fmt.Sprintf("%s %s %s: library packages must not import the agents", p.ImportPath, via, imp))
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
