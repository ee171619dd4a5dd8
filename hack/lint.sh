#!/usr/bin/env bash
# gofmt, go vet, staticcheck and tidy modules, for the root module and upstream/.
# staticcheck is installed from the Go module proxy at a pinned version when missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

staticcheck_version=v0.8.2
gobin=$(go env GOPATH)/bin
sc="$gobin/staticcheck"
if ! { [ -x "$sc" ] && "$sc" -version 2>/dev/null | grep -q "${staticcheck_version#v}"; }; then
  echo "lint: installing staticcheck ${staticcheck_version}"
  GOBIN="$gobin" go install "honnef.co/go/tools/cmd/staticcheck@${staticcheck_version}"
fi

fail=0
unformatted=$(gofmt -l $(git ls-files -co --exclude-standard '*.go'))
if [ -n "$unformatted" ]; then
  echo "lint: not gofmt'd:"; echo "$unformatted"; fail=1
fi

for mod in . upstream $(find upstream -mindepth 2 -name go.mod -printf '%h\n' | sort); do
  echo "lint: $mod"
  (cd "$mod" && go mod tidy -diff) || { echo "lint: $mod: go.mod/go.sum not tidy (run go mod tidy)"; fail=1; }
  (cd "$mod" && go vet ./...) || fail=1
  (cd "$mod" && "$sc" ./...) || fail=1
done
# hack/coredns only wraps CoreDNS's own main: keep it tidy; vetting CoreDNS itself is not ours.
# hack/aggregator only pins the sample-apiserver and etcd commands hack/build-e2e-images.sh builds,
# hack/containerd the containerd 2.x commands hack/build-containerd.sh builds.
for mod in hack/coredns hack/aggregator hack/containerd; do
  (cd "$mod" && go mod tidy -diff) || { echo "lint: $mod: go.mod/go.sum not tidy (run go mod tidy)"; fail=1; }
done

# The agents are built with -tags grpcnotrace (hack/up.sh, the tests, docs/kubelet.md), as
# upstream builds its release binaries. A reachable call of reflect's Method or MethodByName
# with a computed name makes the linker keep every exported method of every type in the
# binary: gRPC's golang.org/x/net/trace (html/template) did that to the kubelet, 93 MB
# instead of 62. The linker's dependency dump marks such a call <ReflectMethod>.
for agent in kubelet kube-proxy nodekit; do
  calls=$(go build -tags grpcnotrace -ldflags=-dumpdep -o /dev/null "./agents/$agent" 2>&1 | grep -c '<ReflectMethod>' || true)
  if [ "$calls" != 0 ]; then
    echo "lint: agents/$agent links a reflect Method/MethodByName call, which keeps every unused method;"
    echo "  see: go build -tags grpcnotrace -ldflags=-dumpdep -o /dev/null ./agents/$agent 2>&1 | grep '<ReflectMethod>'"
    fail=1
  fi
done
exit "$fail"
