#!/usr/bin/env bash
# Prepares this machine for nodekit's containerd tests (internal/testenv/containerd) and
# builds the images they run, with no registry reachable:
#   - apt-get installs containerd, runc, containernetworking-plugins, docker-registry and
#     skopeo when one is missing (apt-get update first, only then);
#   - builds two OCI image-layout tars with tar, gzip and sha256sum alone:
#       registry.k8s.io/pause:3.10.2   a static C program that sleeps until signalled
#                                      (3.10.2 is the pause kubeadm v1.37 pins)
#       nodekit.test/busybox:1.35.0    Debian's busybox-static, applets as hard links
#   - builds crictl v1.37.0 (sigs.k8s.io/cri-tools, from the Go module proxy), cached by
#     version under .../nodekit/tools and linked into the image folder, for the interop
#     tests (minutes when cold; skipped with a warning when go is missing);
#   - caches all of it by content under ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/images/<key>,
#     so a second run only checks the packages.
#
# Prints the image folder on stdout (export it as NODEKIT_IMAGES_DIR); everything else
# goes to stderr. The folder holds images.tsv: "<role> <image name> <tar file>" per line.
# Run as root. Idempotent.
set -euo pipefail

pause_image=registry.k8s.io/pause:3.10.2
busybox_image=nodekit.test/busybox:1.35.0
packages=(containerd runc containernetworking-plugins docker-registry skopeo gcc libc6-dev)

log() { echo "setup-containerd: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root"
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The cache key covers everything that decides the images' bytes: this script (which holds
# the pause source and the layout recipe), the busybox-static package and the compiler.
busybox_sha=$(apt-cache show --no-all-versions busybox-static 2>/dev/null | awk '/^SHA256:/ {print $2; exit}')
if [ -z "$busybox_sha" ]; then
  apt-get update -qq >&2
  busybox_sha=$(apt-cache show --no-all-versions busybox-static | awk '/^SHA256:/ {print $2; exit}')
fi
key=$( (cat "$0"; echo "$busybox_sha"; gcc --version | head -1) | sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/images
out=$base/$key
crictl_version=v1.37.0
# ensure_crictl DIR: links crictl into DIR, building it first unless the version is
# cached (under nodekit/tools, keyed by version alone, so new images do not rebuild it).
ensure_crictl() {
  local dir=$1
  local tools=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/tools/crictl-$crictl_version
  if [ ! -x "$tools/crictl" ]; then
    if ! command -v go >/dev/null; then
      log "go not found: crictl not built, the crictl interop tests will be unavailable"
      return 0
    fi
    log "building crictl $crictl_version (go install sigs.k8s.io/cri-tools/cmd/crictl, minutes when cold)"
    mkdir -p "$tools"
    local bin
    bin=$(mktemp -d "$tools/.build.XXXXXX")
    if GOBIN=$bin go install -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
      "sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version" >&2; then
      mv "$bin/crictl" "$tools/crictl"
    else
      log "crictl build failed: the crictl interop tests will be unavailable"
    fi
    rm -rf "$bin"
  fi
  [ -x "$tools/crictl" ] && ln -sfn "$tools/crictl" "$dir/crictl"
  return 0
}

if [ -f "$out/.complete" ]; then
  ensure_crictl "$out"
  log "images cached in $out"
  echo "$out"
  exit 0
fi

mkdir -p "$base"
work=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# oci_layout NAME ROOTFS CONFIG_JSON_TEMPLATE OUT_TAR
# Packs ROOTFS as one gzip layer and writes an OCI image-layout tar whose index names the
# image through the io.containerd.image.name annotation. The template's @DIFF_ID@ is
# replaced by the layer's uncompressed digest. Reproducible: fixed mtimes, owners, order.
oci_layout() {
  local name=$1 rootfs=$2 config_tmpl=$3 out_tar=$4
  local dir
  dir=$(mktemp -d "$work/layout.XXXXXX")
  mkdir -p "$dir/blobs/sha256"

  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
    -C "$rootfs" -cf "$dir/layer.tar" .
  local diff_id layer_digest layer_size
  diff_id=$(sha256sum "$dir/layer.tar" | cut -d' ' -f1)
  gzip -n -9 "$dir/layer.tar"
  layer_digest=$(sha256sum "$dir/layer.tar.gz" | cut -d' ' -f1)
  layer_size=$(stat -c %s "$dir/layer.tar.gz")
  mv "$dir/layer.tar.gz" "$dir/blobs/sha256/$layer_digest"

  printf '%s' "${config_tmpl//@DIFF_ID@/sha256:$diff_id}" >"$dir/config.json"
  local config_digest config_size
  config_digest=$(sha256sum "$dir/config.json" | cut -d' ' -f1)
  config_size=$(stat -c %s "$dir/config.json")
  mv "$dir/config.json" "$dir/blobs/sha256/$config_digest"

  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$dir/manifest.json"
  local manifest_digest manifest_size
  manifest_digest=$(sha256sum "$dir/manifest.json" | cut -d' ' -f1)
  manifest_size=$(stat -c %s "$dir/manifest.json")
  mv "$dir/manifest.json" "$dir/blobs/sha256/$manifest_digest"

  printf '{"imageLayoutVersion":"1.0.0"}' >"$dir/oci-layout"
  printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest_digest" "$manifest_size" "$name" "${name##*:}" >"$dir/index.json"

  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -C "$dir" -cf "$out_tar" oci-layout index.json blobs
}

mkdir -p "$work/out"

# --- pause -----------------------------------------------------------------------------
log "building $pause_image"
cat >"$work/pause.c" <<'EOF'
/* nodekit pause: holds a pod sandbox's namespaces, reaps orphans, exits on a signal. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction sa = {0};
  sa.sa_handler = stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = reap;
  sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) {
    pause();
  }
  return 1;
}
EOF
mkdir -p "$work/pause-root"
gcc -Os -static -o "$work/pause-root/pause" "$work/pause.c"
strip "$work/pause-root/pause"
oci_layout "$pause_image" "$work/pause-root" \
  '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["@DIFF_ID@"]}}' \
  "$work/out/pause.tar"

# --- busybox ---------------------------------------------------------------------------
log "building $busybox_image"
# Root downloads it: the cache under $HOME is out of reach of apt's _apt sandbox user.
download_busybox() { (cd "$work" && apt-get download -q -o APT::Sandbox::User=root busybox-static >&2); }
# Stale package lists point at a superseded .deb: refresh once and retry.
download_busybox || { apt-get update -qq >&2 && download_busybox; }
dpkg-deb -x "$work"/busybox-static_*.deb "$work/deb"
root=$work/busybox-root
mkdir -p "$root/bin" "$root/etc" "$root/tmp" "$root/root" "$root/proc" "$root/sys" "$root/dev"
chmod 1777 "$root/tmp"
cp "$work/deb/bin/busybox" "$root/bin/busybox"
# Hard links, not symlinks: busybox picks the applet from argv[0] either way, and hard
# links survive tools that do not follow symlinks inside layers.
"$root/bin/busybox" --list-full | while read -r applet; do
  [ "$applet" = bin/busybox ] && continue
  mkdir -p "$root/$(dirname "$applet")"
  ln -f "$root/bin/busybox" "$root/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
oci_layout "$busybox_image" "$root" \
  '{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"]},"rootfs":{"type":"layers","diff_ids":["@DIFF_ID@"]}}' \
  "$work/out/busybox.tar"

printf 'pause\t%s\tpause.tar\nbusybox\t%s\tbusybox.tar\n' "$pause_image" "$busybox_image" >"$work/out/images.tsv"
touch "$work/out/.complete"
rm -rf "$out"
mv "$work/out" "$out"
ensure_crictl "$out"
# Images from older versions of this script are dead weight.
find "$base" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name ".build.*" -exec rm -rf {} +
log "images built in $out"
echo "$out"
