//go:build tools

// This file pins the upstream packages hack/build-e2e.sh builds, so that `go mod tidy`
// keeps them in go.mod and go.sum. It is never compiled.
package e2e

import (
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/nonewprivs"
)
