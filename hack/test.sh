#!/usr/bin/env bash
# nodekit's one test command. On a fresh Debian 12 machine, as root, it:
#   1. installs the host packages the tests use, when missing (apt-get);
#   2. builds the peer binaries (k8s.io/kubernetes v1.37.2, embedded etcd) or reuses the cache;
#   3. builds the local container images (pause, busybox, CoreDNS) or reuses the cache;
#   4. lints both modules (gofmt, go vet, staticcheck, go mod tidy -diff);
#   5. runs every test with -race: the harness self-tests first, verbosely, so the log shows
#      their start-up times, then everything else;
#   6. runs upstream's conformance smoke subset on a two-node `nodekit up` cluster
#      (hack/conformance.sh --smoke; e2e.test and its images are built once and cached).
# Run casually (not root, peers missing), tests that need real components skip; with CI=true
# (as .ci/run sets) a missing prerequisite fails the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

step_start=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  echo "=== [$(date -u +%H:%M:%S)] $* (previous step took $((now - step_start))s)"
  step_start=$now
}
run_start=$(date +%s)

export PATH="$PATH:/usr/local/go/bin"
export PATH="$PATH:$(go env GOPATH)/bin"

phase "host packages"
if [ "$(id -u)" -eq 0 ]; then
  "$root/hack/setup-host.sh"
else
  echo "not root: skipping package installation; tests that need root will skip"
fi

phase "peer binaries"
NODEKIT_PEERS_DIR=$("$root/hack/build-peers.sh")
export NODEKIT_PEERS_DIR

phase "container images"
if [ "$(id -u)" -eq 0 ]; then
  NODEKIT_IMAGES_DIR=$("$root/hack/setup-containerd.sh")
  export NODEKIT_IMAGES_DIR
  NODEKIT_COREDNS_IMAGE_TAR=$("$root/hack/build-coredns.sh")
  export NODEKIT_COREDNS_IMAGE_TAR
  # containerd 2.x for the tests of what Debian's 1.6 lacks (image volumes); the
  # machine's containerd stays the default everywhere else (NODEKIT_CONTAINERD_DIR,
  # which nodekit up reads, stays unset; hack/conformance.sh builds its own).
  NODEKIT_TEST_CONTAINERD2_DIR=$("$root/hack/build-containerd.sh")
  export NODEKIT_TEST_CONTAINERD2_DIR
else
  echo "not root: skipping containerd images"
fi

phase "lint"
"$root/hack/lint.sh"

phase "harness self-tests"
go test -race -count=1 -v ./internal/testenv/... 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)' 

phase "all other tests (root module)"
# shellcheck disable=SC2046
go test -race -count=1 -timeout 30m $(go list ./... | grep -v '/internal/testenv')

# upstream/ and the modules nested in it: behaviour comparisons against k8s.io/kubernetes.
for mod in upstream $(find upstream -mindepth 2 -name go.mod -printf '%h\n' | sort); do
  phase "tests ($mod)"
  (cd "$mod" && go test -count=1 ./...)
done

# Upstream's own conformance tests, the CI subset (hack/conformance/smoke.txt), on a
# two-node `nodekit up` cluster: builds e2e.test and its images once (cached by version).
phase "conformance smoke"
if [ "$(id -u)" -eq 0 ]; then
  "$root/hack/conformance.sh" --smoke --no-doc
elif [ "${CI:-}" = true ]; then
  echo "conformance smoke needs root (network namespaces, containerd)" >&2
  exit 1
else
  echo "not root: skipping the conformance smoke subset"
fi

phase "done"
echo "total: $(( $(date +%s) - run_start ))s"
