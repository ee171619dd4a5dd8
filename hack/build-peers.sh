#!/usr/bin/env bash
# Builds the peer binaries nodekit's tests run against, from the Go module proxy, and caches
# them by content so a second run costs a few seconds:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kube-proxy and the
#   kubelet (k8s.io/kubernetes), and
#   etcd (upstream/cmd/etcd over go.etcd.io/etcd/server/v3/embed).
# They are built as upstream builds its release binaries (hack/lib/golang.sh, not DBG):
# -trimpath, -s -w and the tags selinux,notest,grpcnotrace; every peer static
# (CGO_ENABLED=0) but the kubelet, which upstream links with cgo. The tags matter to every
# comparison of memory: without grpcnotrace, gRPC links golang.org/x/net/trace, whose
# templates make the linker keep every exported method, and the kubelet came out 92 MB
# instead of release's 61. The static ones come from ONE `go build`, so the packages they
# share compile once; the kubelet from a second, with cgo.
#
# Prints the directory holding the binaries on stdout. Everything else goes to stderr.
# NODEKIT_PEERS_DIR, when set, is used as is and nothing is built.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

if [ -n "${NODEKIT_PEERS_DIR:-}" ]; then
  echo "$NODEKIT_PEERS_DIR"
  exit 0
fi

k8s_version=v1.37.2
peers=(kube-apiserver kube-controller-manager kube-scheduler kubectl kube-proxy kubelet etcd)

minor=${k8s_version#v1.}; minor=${minor%%.*}
tags=selinux,notest,grpcnotrace
ldflags="-s -w"
ldflags+=" -X k8s.io/component-base/version.gitVersion=${k8s_version}"
ldflags+=" -X k8s.io/component-base/version.gitMajor=1"
ldflags+=" -X k8s.io/component-base/version.gitMinor=${minor}"
ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=${k8s_version}"

# The cache key covers everything that decides the binaries' content.
key=$( (cd "$root/upstream" && cat go.mod go.sum cmd/etcd/*.go; echo "$ldflags $tags cgo:kubelet ${peers[*]}") | sha256sum | cut -c1-16)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/peers/${k8s_version}-${key}
if [ -f "$cache/.complete" ]; then
  echo "build-peers: cached in $cache" >&2
  echo "$cache"
  exit 0
fi

mkdir -p "$cache"
tmp=$(mktemp -d "$cache.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "build-peers: building ${peers[*]} at ${k8s_version} (cold: 15 to 30 minutes on 2 cores)" >&2
start=$(date +%s)
(
  cd "$root/upstream"
  CGO_ENABLED=0 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kube-proxy \
    ./cmd/etcd
  CGO_ENABLED=1 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$tmp/" k8s.io/kubernetes/cmd/kubelet
)
for p in "${peers[@]}"; do
  mv "$tmp/$p" "$cache/$p"
done
"$cache/kube-apiserver" --version >&2
echo "build-peers: built in $(( $(date +%s) - start ))s into $cache" >&2
touch "$cache/.complete"
echo "$cache"
