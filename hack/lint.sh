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
exit "$fail"
