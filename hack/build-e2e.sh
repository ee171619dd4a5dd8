#!/usr/bin/env bash
# Builds upstream's conformance test binary and its main test image's program from the Go
# module proxy, at the Kubernetes version nodekit pins, and caches them by content:
#   e2e.test   go test -c k8s.io/kubernetes/test/e2e
#   agnhost    go build k8s.io/kubernetes/test/images/agnhost (static, for hack/build-e2e-images.sh)
# Both build in the nested module upstream/e2e (same versions and replace lines as upstream/,
# via upstream/gen-replace.sh), so upstream/go.sum, the peers' cache key, never changes.
# CGO_ENABLED=0, -trimpath and the release tags as in hack/build-peers.sh (upstream builds
# e2e.test with the same tags), so the packages they share come out of the same build cache.
#
# Prints the path of e2e.test on stdout (agnhost is beside it). Everything else goes to stderr.
# NODEKIT_E2E_TEST, when set, is used as is and nothing is built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [ -n "${NODEKIT_E2E_TEST:-}" ]; then
  echo "$NODEKIT_E2E_TEST"
  exit 0
fi

k8s_version=v1.37.2
minor=${k8s_version#v1.}; minor=${minor%%.*}
tags=selinux,notest,grpcnotrace
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=${k8s_version}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"

mod=$root/upstream/e2e
# The key is the module build list (every module's path, version and replacement: what
# decides the binaries), not go.mod's text, so tidying the small tools beside it in
# upstream/e2e does not rebuild e2e.test.
key=$( (cd "$mod" && go list -m -f '{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}' all &&
  cat go.sum; echo "$ldflags $tags"; go version) | sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/e2e
cache=$base/${k8s_version}-${key}
if [ -f "$cache/.complete" ]; then
  echo "build-e2e: cached in $cache" >&2
  echo "$cache/e2e.test"
  exit 0
fi

mkdir -p "$base"
# One build at a time: a second caller waits for the first and then takes its result.
exec 9>"$base/.lock"
if ! flock -n 9; then
  echo "build-e2e: another build is running, waiting for it" >&2
  flock 9
fi
if [ -f "$cache/.complete" ]; then
  echo "build-e2e: cached in $cache" >&2
  echo "$cache/e2e.test"
  exit 0
fi
tmp=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "build-e2e: building e2e.test and agnhost at ${k8s_version} (cold: about 10 minutes and 3.5 GB on 2 cores with the peers' build cache warm)" >&2
start=$(date +%s)
(
  cd "$mod"
  export CGO_ENABLED=0
  go test -c -vet=off -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/e2e.test" k8s.io/kubernetes/test/e2e
  go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/agnhost" k8s.io/kubernetes/test/images/agnhost
)
"$tmp/e2e.test" --version >&2 || true
touch "$tmp/.complete"
rm -rf "$cache"
mv "$tmp" "$cache"
trap - EXIT
# Builds for older module contents are dead weight (each is over 200 MB).
find "$base" -mindepth 1 -maxdepth 1 -type d ! -name "${k8s_version}-${key}" ! -name ".build.*" -exec rm -rf {} +
echo "build-e2e: built in $(( $(date +%s) - start ))s into $cache" >&2
echo "$cache/e2e.test"
