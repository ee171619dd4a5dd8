#!/usr/bin/env bash
# Builds containerd 2.x from the Go module proxy, at the version hack/containerd/go.mod
# pins, and caches it by content:
#   containerd, containerd-shim-runc-v2 and ctr   (github.com/containerd/containerd/v2/cmd/...)
# Debian 12 ships containerd 1.6.20, which has no CRI image mounts (image volumes need
# containerd 2.1 or later); `nodekit up --containerd-dir DIR` runs these instead.
#
# Static (CGO_ENABLED=0; the btrfs and devmapper snapshotters, which need cgo, are left out
# with their build tags, as upstream's Makefile does with BUILDTAGS), -trimpath, and the
# version stamped the way upstream's Makefile stamps it, so `containerd --version` names it.
# One `go build` for the three programs so the packages they share compile once (upstream
# builds the shim apart with the no_grpc tag, for a smaller binary only).
#
# Cached under ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/containerd/<version>-<key>: a second
# run prints the folder at once. Prints the folder on stdout; logs go to stderr.
# NODEKIT_CONTAINERD_DIR, when set, is printed as is and nothing is built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "build-containerd: $*" >&2; }

if [ -n "${NODEKIT_CONTAINERD_DIR:-}" ]; then
  echo "$NODEKIT_CONTAINERD_DIR"
  exit 0
fi

mod=$root/hack/containerd
pkg=github.com/containerd/containerd/v2
version=$(cd "$mod" && go list -m -f '{{.Version}}' "$pkg")
tags="urfave_cli_no_docs no_btrfs no_devmapper"
ldflags="-s -w -X $pkg/version.Version=$version -X $pkg/version.Package=$pkg"
key=$( (cat "$0" "$mod/go.mod" "$mod/go.sum"; echo "$tags $ldflags"; go version) | sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/containerd
out=$base/$version-$key
if [ -f "$out/.complete" ]; then
  log "cached in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$base"
# One build at a time: a second caller waits for the first and then takes its result.
exec 9>"$base/.lock"
if ! flock -n 9; then
  log "another build is running, waiting for it"
  flock 9
fi
if [ -f "$out/.complete" ]; then
  log "cached in $out"
  echo "$out"
  exit 0
fi
work=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "building containerd $version (cold, empty Go build cache: 11 min wall measured at load 18, 210 s of CPU, 0.6 GB peak)"
start=$(date +%s)
(
  cd "$mod"
  CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$work/" \
    "$pkg/cmd/containerd" "$pkg/cmd/containerd-shim-runc-v2" "$pkg/cmd/ctr"
)
got=$("$work/containerd" --version)
case "$got" in
  *" $version"|*" $version "*) ;;
  *) log "built binary says '$got', want version $version"; exit 1 ;;
esac
touch "$work/.complete"
rm -rf "$out"
mv "$work" "$out"
chmod 755 "$out"
log "$got built in $(( $(date +%s) - start ))s into $out"
echo "$out"
