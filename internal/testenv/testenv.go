// Package testenv holds what nodekit's real-component test harnesses share: the rule
// that a missing prerequisite skips a casual run and fails a CI run, the location of
// the peer binaries built by hack/build-peers.sh, and small process helpers.
//
// The harnesses themselves live in the subpackages: controlplane (etcd,
// kube-apiserver, kube-controller-manager), containerd (containerd + runc + CNI) and
// netns (network namespaces with pods, a node and a client).
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// CI reports whether the run is a CI run (CI=true), where a missing prerequisite is a
// failure rather than a skip.
func CI() bool {
	v := strings.ToLower(os.Getenv("CI"))
	return v == "true" || v == "1" || v == "yes"
}

// Unavailable ends the test because a prerequisite is missing: it skips with the
// one-line reason on a casual run and fails the test under CI=true.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	reason := fmt.Sprintf(format, args...)
	if CI() {
		tb.Fatalf("prerequisite missing under CI=true: %s", reason)
	}
	tb.Skip(reason)
}

// RequireRoot ends the test through Unavailable unless the process runs as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Unavailable(tb, "needs root (run the README's test command as root)")
	}
}

// RequireLong ends the test when -short is set: real-component tests take seconds.
func RequireLong(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("real-component test: skipped in -short mode")
	}
}

// PeerBinary returns the path of a peer binary built by hack/build-peers.sh
// (kube-apiserver, kube-controller-manager, kubectl, kube-proxy, etcd). It looks in
// $NODEKIT_PEERS_DIR, which the test command sets; a missing binary ends the test
// through Unavailable.
func PeerBinary(tb testing.TB, name string) string {
	tb.Helper()
	dir := os.Getenv("NODEKIT_PEERS_DIR")
	if dir == "" {
		Unavailable(tb, "NODEKIT_PEERS_DIR is unset: run hack/build-peers.sh or the README's test command")
	}
	p := filepath.Join(dir, name)
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		Unavailable(tb, "peer binary %s not found in NODEKIT_PEERS_DIR=%s", name, dir)
	}
	return p
}

// LookPath returns the path of a host tool (containerd, nft, iptables-legacy, ...), ending
// the test through Unavailable when it is not installed.
func LookPath(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Unavailable(tb, "%s is not installed (the README's test command installs it)", name)
	}
	return p
}
