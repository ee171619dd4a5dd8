// Command coredns is CoreDNS built from the Go module proxy at the version kubeadm
// v1.37.2 deploys, with CoreDNS's own default plugin set, for the clusters nodekit up
// makes (no registry is reachable to pull its image). hack/build-coredns.sh builds it.
package main

import (
	_ "github.com/coredns/coredns/core/plugin" // registers the default plugins
	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
