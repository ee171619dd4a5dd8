#!/usr/bin/env bash
# The main job: a local Kubernetes cluster made of nodekit's agents, in one command.
#
#   sudo ./hack/up.sh [nodekit up flags...]      e.g. --nodes 3, --detach, --name demo
#
# On a fresh Debian 12 machine, as root, it installs what is missing (hack/setup-host.sh,
# hack/setup-containerd.sh: containerd, runc, CNI plugins, the pause and busybox images;
# hack/build-coredns.sh: the CoreDNS image kubeadm deploys, built from the Go module proxy),
# builds the control-plane peers (hack/build-peers.sh: minutes the first time, cached by
# content afterwards), builds nodekit and, when they are in the tree, nodekit's kubelet
# and kube-proxy agents into $NODEKIT_BIN_DIR (default ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/bin:
# give each checkout its own when several run side by side), and then execs
# `nodekit up "$@"`. Every step reuses its cache, so a second run starts in seconds.
# NODEKIT_CONTAINERD_DIR=$(hack/build-containerd.sh) runs the nodes on containerd 2.x
# (nodekit up --containerd-dir) instead of the machine's.
# Everything but the final `nodekit up` logs to stderr. docs/up.md has the details.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "up.sh: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "run as root: nodekit up makes network namespaces and runs containerd"
  exit 1
fi
if ! command -v go >/dev/null 2>&1; then
  log "go is not installed: install Go $(awk '/^go /{print $2}' "$root/go.mod") or newer, then run this again"
  exit 1
fi

"$root/hack/setup-host.sh" >&2
NODEKIT_PEERS_DIR=$("$root/hack/build-peers.sh")
NODEKIT_IMAGES_DIR=$("$root/hack/setup-containerd.sh")
NODEKIT_COREDNS_IMAGE_TAR=$("$root/hack/build-coredns.sh")
export NODEKIT_PEERS_DIR NODEKIT_IMAGES_DIR NODEKIT_COREDNS_IMAGE_TAR

bin=${NODEKIT_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/bin}
mkdir -p "$bin"
pkgs=(./agents/nodekit)
# nodekit up takes kubelet and kube-proxy from its own folder: build them there, and
# never leave an older build of an agent that is no longer in the tree.
for agent in kubelet kube-proxy; do
  rm -f "$bin/$agent"
  if [ -f "$root/agents/$agent/main.go" ]; then
    pkgs+=("./agents/$agent")
  else
    log "agents/$agent is not in this tree: nodes run without it"
  fi
done
log "building ${pkgs[*]}"
# -tags grpcnotrace, as upstream builds its release binaries: without it gRPC links
# golang.org/x/net/trace, whose templates call reflect's MethodByName, and the linker keeps
# every exported method of every type (the kubelet comes out 93 MB instead of 62).
(cd "$root" && go build -tags grpcnotrace -o "$bin/" "${pkgs[@]}")

exec "$bin/nodekit" up "$@"
