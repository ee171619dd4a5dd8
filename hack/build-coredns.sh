#!/usr/bin/env bash
# Builds CoreDNS at the version kubeadm v1.37.2 deploys, from the Go module proxy
# (hack/coredns, a nested module whose main is CoreDNS's own), statically
# (CGO_ENABLED=0), and packs it as an OCI image-layout tar named
# registry.k8s.io/coredns/coredns:v1.14.6, with tar, gzip and sha256sum alone. No
# registry is needed: `nodekit up --coredns-image-tar` imports it into every node.
#
# Cached by content under ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/coredns/<key>: a second
# run prints the cached tar at once. Prints the tar's path on stdout; logs go to stderr.
# NODEKIT_COREDNS_IMAGE_TAR, when set, is printed as is and nothing is built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "build-coredns: $*" >&2; }

if [ -n "${NODEKIT_COREDNS_IMAGE_TAR:-}" ]; then
  echo "$NODEKIT_COREDNS_IMAGE_TAR"
  exit 0
fi

version=v1.14.6
image=registry.k8s.io/coredns/coredns:$version
src=$root/hack/coredns
key=$( (cat "$0" "$src/go.mod" "$src/go.sum" "$src/main.go"; go version) | sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/coredns
out=$base/$version-$key
if [ -f "$out/.complete" ]; then
  log "cached in $out"
  echo "$out/coredns.tar"
  exit 0
fi

mkdir -p "$base"
work=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "building CoreDNS $version (go build in hack/coredns: about 2 minutes on 2 cores when cold)"
mkdir -p "$work/rootfs/etc"
(cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/rootfs/coredns" .)
got=$("$work/rootfs/coredns" -version | head -1)
case "$got" in
  "CoreDNS-${version#v}") ;;
  *) log "built binary says $got, want CoreDNS-${version#v}"; exit 1 ;;
esac
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$work/rootfs/etc/passwd"

# One layer holding the rootfs; config, manifest and index name each other by digest.
layout=$work/layout
mkdir -p "$layout/blobs/sha256"
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
put() { local d; d=$(sha "$1"); mv "$1" "$layout/blobs/sha256/$d"; echo "$d"; }
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/rootfs" -cf "$work/layer.tar" .
diff_id=$(sha "$work/layer.tar")
gzip -n "$work/layer.tar"
layer_size=$(size "$work/layer.tar.gz")
layer=$(put "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/coredns"],"ExposedPorts":{"53/tcp":{},"53/udp":{}},"User":"0"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' "$diff_id" >"$work/config.json"
config_size=$(size "$work/config.json")
config=$(put "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
  "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
manifest_size=$(size "$work/manifest.json")
manifest=$(put "$work/manifest.json")
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$image" "$version" >"$layout/index.json"
mkdir -p "$work/out"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$work/out/coredns.tar" oci-layout index.json blobs
touch "$work/out/.complete"
rm -rf "$out"
mv "$work/out" "$out"
log "$image built into $out/coredns.tar"
echo "$out/coredns.tar"
