#!/usr/bin/env bash
# Builds the container images upstream's conformance tests ask for (test/utils/image/manifest.go
# at v1.37.2), under the exact names the tests use, with no registry reachable. Each is an OCI
# image-layout tar (one gzip layer, reproducible) that `nodekit load` or `ctr images import`
# takes, cached by content under ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/e2e-images/<key>.
#
#   registry.k8s.io/e2e-test-images/agnhost:2.66.1   upstream's agnhost (hack/build-e2e.sh builds
#                                                    it from k8s.io/kubernetes/test/images/agnhost,
#                                                    static) on the project's busybox, as /agnhost,
#                                                    with the dig/getent, curl and nc stand-ins
#   registry.k8s.io/e2e-test-images/agnhost:2.55     STAND-IN: the same 2.66.1 binary, its own digest
#   registry.k8s.io/e2e-test-images/busybox:1.37.0-2 the project's busybox image (hack/setup-containerd.sh)
#                                                    with its binary swapped for hack/build-busybox.sh's:
#                                                    the same Debian 1.35 busybox, whose ash keeps
#                                                    environment entries such as data-1=value-1 for
#                                                    its children as upstream's 1.37 does; every
#                                                    applet also linked into /bin as upstream's
#   registry.k8s.io/e2e-test-images/kitten:1.8       the agnhost 2.66.1 image above with upstream's
#   registry.k8s.io/e2e-test-images/nautilus:1.8     picture and data.json in /, CMD test-webserver
#   registry.k8s.io/e2e-test-images/nginx:1.27.0-2   STAND-IN: busybox httpd serving
#   registry.k8s.io/e2e-test-images/nginx:1.28.0-2   STAND-IN  /usr/share/nginx/html on port 80
#   registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1
#                                                    STAND-IN: busybox with dig and getent
#   registry.k8s.io/e2e-test-images/nonewprivs:1.4   upstream's nnp program (k8s.io/kubernetes/test/
#                                                    images/nonewprivs, static), setuid root, on busybox
#   registry.k8s.io/pause:3.10.2                     the project's pause (hack/setup-containerd.sh)
#   registry.k8s.io/e2e-test-images/sample-apiserver:1.29.2
#                                                    k8s.io/sample-apiserver v0.37.2 (upstream builds the
#                                                    image from v0.33.7), static, as /sample-apiserver,
#                                                    its ENTRYPOINT, on the project's busybox
#   registry.k8s.io/etcd:3.7.0-0                     etcd v3.7.0's own server command (go.etcd.io/etcd/
#                                                    server/v3, static) as /usr/local/bin/etcd, on busybox
# The last two serve the Aggregator spec; both build in the small nested module hack/aggregator
# (their versions pinned there, apart from upstream/e2e, whose build list keys e2e.test).
# The etcd peer (upstream/cmd/etcd) cannot stand in: it takes only the flags the harness
# passes, while the spec runs etcd --listen-client-urls URL --advertise-client-urls URL.
# The DNS specs run `dig` and `getent` in the agnhost and glibc-dns-testing images, which
# busybox lacks: upstream/e2e/cmd/dig is a small stand-in for both (static Go), put in
# /usr/bin of those images. Many specs (lifecycle hooks, Services) exec `curl` in agnhost:
# upstream/e2e/cmd/curl is a static Go stand-in taking the options they pass, in /usr/bin.
# The Service reachability checks run netcat-openbsd's `nc -v -t -w 2 HOST PORT`, which
# busybox's nc refuses: upstream/e2e/cmd/nc stands in for it, in /usr/bin (busybox's nc
# applet link there is replaced).
# docs/conformance.md says how each stand-in differs from the image it replaces.
#
# Prints the image folder on stdout; it holds images.tsv ("<role>\t<image name>\t<tar file>" per
# line, tar files relative to the folder) and the tars. Everything else goes to stderr.
# Needs root (the busybox layer's hard links and owners), tar, gzip, sha256sum and jq.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "build-e2e-images: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root"
  exit 1
fi

registry=registry.k8s.io/e2e-test-images
e2e_test=$("$root/hack/build-e2e.sh")
agnhost=$(dirname "$e2e_test")/agnhost
base_images=${NODEKIT_IMAGES_DIR:-$("$root/hack/setup-containerd.sh")}
base_tar() { awk -v r="$1" '$1 == r {print $3}' "$base_images/images.tsv"; }
e2e_busybox=$("$root/hack/build-busybox.sh")
busybox_tar=$base_images/$(base_tar busybox)
pause_tar=$base_images/$(base_tar pause)
pause_name=$(awk '$1 == "pause" {print $2}' "$base_images/images.tsv")
if [ "$pause_name" != registry.k8s.io/pause:3.10.2 ]; then
  log "$base_images/images.tsv names the pause image $pause_name, the tests ask for registry.k8s.io/pause:3.10.2"
  exit 1
fi
k8s_src=$(cd "$root/upstream/e2e" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)

# The key covers everything that decides the images' bytes.
# The agnhost images' shell is Debian's dynamically linked busybox with glibc (see
# add_plain_shell below); their package hashes are part of the key.
deb_sha() { apt-cache show --no-all-versions "$1" 2>/dev/null | awk '/^SHA256:/ {print $2; exit}'; }
shell_debs="$(deb_sha busybox) $(deb_sha libc6)"
key=$( (echo "$shell_debs"; cat "$0" "$root"/upstream/e2e/cmd/dig/main.go "$root"/upstream/e2e/cmd/curl/main.go "$root"/upstream/e2e/cmd/nc/main.go "$root"/upstream/e2e/go.sum "$root"/hack/aggregator/go.mod "$root"/hack/aggregator/go.sum; go version
  sha256sum "$agnhost" "$busybox_tar" "$e2e_busybox" "$pause_tar" "$k8s_src"/test/images/agnhost/porter/localhost.* "$k8s_src"/test/images/{kitten,nautilus}/html/*) |
  sha256sum | cut -c1-16)
base=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/e2e-images
out=$base/$key
if [ -f "$out/.complete" ]; then
  log "images cached in $out"
  touch "$out" # in use: kept by the pruning below
  echo "$out"
  exit 0
fi

mkdir -p "$base"
work=$(mktemp -d "$base/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out"

# pack NAME ROOTFS CONFIG OUT_TAR: ROOTFS as one gzip layer in an OCI image-layout tar whose
# index names the image with the io.containerd.image.name annotation (what ctr import reads).
# CONFIG is the image config's "config" object. Fixed mtimes, owners and order: reproducible.
pack() {
  local name=$1 rootfs=$2 config=$3 out_tar=$4
  local d
  d=$(mktemp -d "$work/layout.XXXXXX")
  mkdir -p "$d/blobs/sha256"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -C "$rootfs" -cf "$d/layer.tar" .
  local diff_id
  diff_id=$(sha256sum "$d/layer.tar" | cut -d' ' -f1)
  gzip -n -9 "$d/layer.tar"
  blob() { # blob FILE -> prints "digest size" and moves FILE into blobs/
    local dg sz
    dg=$(sha256sum "$1" | cut -d' ' -f1)
    sz=$(stat -c %s "$1")
    mv "$1" "$d/blobs/sha256/$dg"
    echo "$dg $sz"
  }
  local layer cfg man
  layer=$(blob "$d/layer.tar.gz")
  jq -cn --argjson c "$config" --arg diff "sha256:$diff_id" \
    '{architecture:"amd64",os:"linux",config:$c,rootfs:{type:"layers",diff_ids:[$diff]}}' | tr -d '\n' >"$d/config.json"
  cfg=$(blob "$d/config.json")
  jq -cn --arg cd "sha256:${cfg% *}" --argjson cs "${cfg#* }" --arg ld "sha256:${layer% *}" --argjson ls "${layer#* }" \
    '{schemaVersion:2,mediaType:"application/vnd.oci.image.manifest.v1+json",
      config:{mediaType:"application/vnd.oci.image.config.v1+json",digest:$cd,size:$cs},
      layers:[{mediaType:"application/vnd.oci.image.layer.v1.tar+gzip",digest:$ld,size:$ls}]}' | tr -d '\n' >"$d/manifest.json"
  man=$(blob "$d/manifest.json")
  printf '{"imageLayoutVersion":"1.0.0"}' >"$d/oci-layout"
  jq -cn --arg md "sha256:${man% *}" --argjson ms "${man#* }" --arg n "$name" --arg t "${name##*:}" \
    '{schemaVersion:2,manifests:[{mediaType:"application/vnd.oci.image.manifest.v1+json",digest:$md,size:$ms,
      annotations:{"io.containerd.image.name":$n,"org.opencontainers.image.ref.name":$t}}]}' | tr -d '\n' >"$d/index.json"
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$d" -cf "$out_tar" oci-layout index.json blobs
  rm -rf "$d"
}

# unpack_busybox DIR: the project's busybox image's single layer, unpacked into DIR.
unpack_busybox() {
  local dir=$1 manifest layer
  mkdir -p "$dir"
  manifest=$(tar -xOf "$busybox_tar" index.json | jq -r '.manifests[0].digest | sub("sha256:"; "")')
  layer=$(tar -xOf "$busybox_tar" "blobs/sha256/$manifest" | jq -r '.layers[0].digest | sub("sha256:"; "")')
  tar -xOf "$busybox_tar" "blobs/sha256/$layer" | tar -xz -C "$dir"
  [ -x "$dir/bin/sh" ] || { log "$busybox_tar has no /bin/sh"; exit 1; }
}
path_env='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'

log "building the dig/getent stand-in (upstream/e2e/cmd/dig)"
(cd "$root/upstream/e2e" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/dig" ./cmd/dig)
log "building the curl stand-in (upstream/e2e/cmd/curl)"
(cd "$root/upstream/e2e" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/curl" ./cmd/curl)
log "building the netcat stand-in (upstream/e2e/cmd/nc)"
(cd "$root/upstream/e2e" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/nc" ./cmd/nc)
# Debian's busybox-static is built with a "standalone shell": its sh runs its own applet for
# any command with an applet's name, whatever PATH says, so the nc stand-in (and any other
# tool of the real image that shares an applet's name) would never run. The agnhost images
# get Debian's dynamically linked busybox instead (the same 1.35 applets, a plain PATH
# lookup) with the glibc it needs (libc, libresolv, the loader), from the two packages.
log "fetching Debian's busybox and libc6 for the agnhost images' shell"
mkdir -p "$work/debs" "$work/shell"
(cd "$work/debs" && apt-get download -q -o APT::Sandbox::User=root busybox libc6 >&2)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/shell"; done
# add_plain_shell ROOTFS: busybox's every applet link now runs the dynamic build.
add_plain_shell() {
  # cp writes into /bin/busybox's inode, which every applet link of the layer shares.
  cp "$work/shell/bin/busybox" "$1/bin/busybox"
  mkdir -p "$1/lib/x86_64-linux-gnu" "$1/lib64"
  for lib in libc.so.6 libresolv.so.2 ld-linux-x86-64.so.2; do
    cp -L "$work/shell/lib/x86_64-linux-gnu/$lib" "$1/lib/x86_64-linux-gnu/$lib"
  done
  ln -sf ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$1/lib64/ld-linux-x86-64.so.2"
}
# add_dns_tools ROOTFS: dig and getent (one binary, picked by name) in /usr/bin.
add_dns_tools() {
  mkdir -p "$1/usr/bin"
  rm -f "$1/usr/bin/dig" "$1/usr/bin/getent"
  cp "$work/dig" "$1/usr/bin/dig"
  ln "$1/usr/bin/dig" "$1/usr/bin/getent"
}

# --- busybox 1.37.0-2 ------------------------------------------------------------------
name=$registry/busybox:1.37.0-2
log "building $name"
unpack_busybox "$work/busybox"
# The ConfigMap and Secret env specs read data-1=value-1 back through `sh -c env`:
# Debian's ash would drop it (see hack/build-busybox.sh). The rebuilt binary has the same
# applets, so every applet link of the layer (hard links to one inode) now runs it.
"$work/busybox/bin/busybox" --list-full | sort >"$work/applets.want"
cp "$e2e_busybox" "$work/busybox/bin/busybox"
"$work/busybox/bin/busybox" --list-full | sort | cmp -s - "$work/applets.want" ||
  { log "$e2e_busybox has other applets than $busybox_tar's busybox"; exit 1; }
# Upstream's image is the official busybox, every applet in /bin; Debian's layout puts
# some in /sbin and /usr/{s,}bin, and specs run e.g. /bin/sysctl: link those into /bin too.
for applet in "$work"/busybox/{sbin,usr/bin,usr/sbin}/*; do
  [ "$applet" -ef "$work/busybox/bin/busybox" ] || continue
  [ -e "$work/busybox/bin/${applet##*/}" ] || ln "$work/busybox/bin/busybox" "$work/busybox/bin/${applet##*/}"
done
pack "$name" "$work/busybox" "{\"Env\":[$path_env],\"Cmd\":[\"sh\"]}" "$work/out/busybox.tar"
printf 'busybox\t%s\tbusybox.tar\n' "$name" >>"$work/out/images.tsv"

# --- agnhost 2.66.1 and the 2.55 stand-in -----------------------------------------------
# As upstream's image lays it out: /agnhost and /agnhost-2, /uploads, porter's TLS pair in /,
# the user and group the image defines (uid 1000, gid 50000); ENTRYPOINT /agnhost, CMD pause.
for tag in 2.66.1 2.55; do
  name=$registry/agnhost:$tag
  log "building $name"
  r=$work/agnhost-$tag
  unpack_busybox "$r"
  cp "$agnhost" "$r/agnhost"
  add_plain_shell "$r"
  add_dns_tools "$r"
  cp "$work/curl" "$r/usr/bin/curl"
  rm -f "$r/usr/bin/nc" "$r/bin/nc"
  cp "$work/nc" "$r/usr/bin/nc"
  ln -s agnhost "$r/agnhost-2"
  mkdir -p "$r/uploads"
  cp "$k8s_src"/test/images/agnhost/porter/localhost.crt "$k8s_src"/test/images/agnhost/porter/localhost.key "$r/"
  chmod 0644 "$r/localhost.crt" "$r/localhost.key"
  echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$r/etc/passwd"
  printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$r/etc/group"
  mkdir -p "$r/home/user-defined-in-image" && chown 1000:1000 "$r/home/user-defined-in-image"
  # Upstream's agnhost (and so kitten and nautilus) is built on Alpine, whose
  # /etc/os-release the ImageVolume spec reads through an image volume, looking for
  # "Alpine Linux". This one says what the image is, and what it stands in for.
  rm -f "$r/etc/os-release"
  printf '%s\n' 'NAME="nodekit agnhost stand-in"' 'ID=nodekit-agnhost-stand-in' \
    'PRETTY_NAME="nodekit stand-in for an agnhost image upstream builds on Alpine Linux"' \
    'HOME_URL="https://github.com/nodekit-dev/nodekit/blob/main/docs/conformance.md"' >"$r/etc/os-release"
  # The stand-in gets a file of its own so its image (and image ID) differs from 2.66.1's,
  # as the tests that switch a pod between the two expect.
  echo "nodekit stand-in for agnhost $tag: agnhost $(cat "$k8s_src/test/images/agnhost/VERSION")" >"$r/NODEKIT_IMAGE"
  pack "$name" "$r" "{\"Env\":[$path_env],\"Entrypoint\":[\"/agnhost\"],\"Cmd\":[\"pause\"],\"ExposedPorts\":{\"80/tcp\":{},\"8080/tcp\":{},\"8081/tcp\":{},\"9376/tcp\":{},\"5000/tcp\":{}}}" \
    "$work/out/agnhost-$tag.tar"
  printf 'agnhost-%s\t%s\tagnhost-%s.tar\n' "$tag" "$name" "$tag" >>"$work/out/images.tsv"
done

# --- kitten and nautilus 1.8 -------------------------------------------------------------
# As upstream's Dockerfiles build them: the agnhost 2.66.1 image with the picture and its
# data.json (from the module's test/images/<name>/html) in /, command test-webserver.
for pic in kitten nautilus; do
  name=$registry/$pic:1.8
  log "building $name"
  r=$work/$pic
  cp -a "$work/agnhost-2.66.1" "$r"
  rm -f "$r/NODEKIT_IMAGE"
  cp "$k8s_src/test/images/$pic/html/$pic.jpg" "$k8s_src/test/images/$pic/html/data.json" "$r/"
  chmod 0644 "$r/$pic.jpg" "$r/data.json"
  pack "$name" "$r" "{\"Env\":[$path_env],\"Entrypoint\":[\"/agnhost\"],\"Cmd\":[\"test-webserver\"],\"ExposedPorts\":{\"80/tcp\":{}}}" \
    "$work/out/$pic.tar"
  printf '%s\t%s\t%s.tar\n' "$pic" "$name" "$pic" >>"$work/out/images.tsv"
done

# --- nginx stand-ins -------------------------------------------------------------------
# busybox httpd in the foreground on port 80, serving nginx's document root and index page.
for tag in 1.27.0-2 1.28.0-2; do
  name=$registry/nginx:$tag
  log "building $name (stand-in)"
  r=$work/nginx-$tag
  unpack_busybox "$r"
  mkdir -p "$r/usr/share/nginx/html" "$r/etc/nginx"
  printf '<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n<body><h1>Welcome to nginx!</h1><p>nodekit stand-in (busybox httpd) for %s</p></body></html>\n' "$name" \
    >"$r/usr/share/nginx/html/index.html"
  echo "nodekit stand-in for nginx $tag: busybox httpd" >"$r/NODEKIT_IMAGE"
  pack "$name" "$r" "{\"Env\":[$path_env],\"Cmd\":[\"httpd\",\"-f\",\"-v\",\"-p\",\"80\",\"-h\",\"/usr/share/nginx/html\"],\"ExposedPorts\":{\"80/tcp\":{}},\"StopSignal\":\"SIGTERM\"}" \
    "$work/out/nginx-$tag.tar"
  printf 'nginx-%s\t%s\tnginx-%s.tar\n' "$tag" "$name" "$tag" >>"$work/out/images.tsv"
done

# --- glibc-dns-testing stand-in ---------------------------------------------------------
# Upstream's is Debian with dnsutils; the specs run `sh -c` probe scripts with dig and getent.
name=$registry/glibc-dns-testing:2.1.1
log "building $name (stand-in)"
r=$work/glibc-dns-testing
unpack_busybox "$r"
add_dns_tools "$r"
echo "nodekit stand-in for glibc-dns-testing 2.1.1: busybox with a Go dig/getent" >"$r/NODEKIT_IMAGE"
pack "$name" "$r" "{\"Env\":[$path_env],\"Cmd\":[\"sh\"]}" "$work/out/glibc-dns-testing.tar"
printf 'glibc-dns-testing\t%s\tglibc-dns-testing.tar\n' "$name" >>"$work/out/images.tsv"

# --- nonewprivs 1.4 --------------------------------------------------------------------
# As its Dockerfile: /usr/local/bin/nnp, setuid (the layer's owner is root), CMD nnp.
name=$registry/nonewprivs:1.4
log "building $name"
r=$work/nonewprivs
unpack_busybox "$r"
mkdir -p "$r/usr/local/bin"
(cd "$root/upstream/e2e" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$r/usr/local/bin/nnp" k8s.io/kubernetes/test/images/nonewprivs)
chmod 4755 "$r/usr/local/bin/nnp"
pack "$name" "$r" "{\"Env\":[$path_env],\"Cmd\":[\"nnp\"]}" "$work/out/nonewprivs.tar"
printf 'nonewprivs\t%s\tnonewprivs.tar\n' "$name" >>"$work/out/images.tsv"

# --- sample-apiserver 1.29.2 and etcd 3.7.0-0 ---------------------------------------------
# As upstream's images: /sample-apiserver, ENTRYPOINT /sample-apiserver (test/images/
# sample-apiserver/Dockerfile); /usr/local/bin/etcd, CMD /usr/local/bin/etcd (etcd's image).
name=$registry/sample-apiserver:1.29.2
log "building $name (k8s.io/sample-apiserver, hack/aggregator)"
r=$work/sample-apiserver
unpack_busybox "$r"
(cd "$root/hack/aggregator" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$r/sample-apiserver" k8s.io/sample-apiserver)
pack "$name" "$r" "{\"Env\":[$path_env],\"Entrypoint\":[\"/sample-apiserver\"]}" "$work/out/sample-apiserver.tar"
printf 'sample-apiserver\t%s\tsample-apiserver.tar\n' "$name" >>"$work/out/images.tsv"

name=registry.k8s.io/etcd:3.7.0-0
log "building $name (go.etcd.io/etcd/server/v3, hack/aggregator)"
r=$work/etcd
unpack_busybox "$r"
mkdir -p "$r/usr/local/bin" "$r/var/lib/etcd"
(cd "$root/hack/aggregator" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$r/usr/local/bin/etcd" go.etcd.io/etcd/server/v3)
pack "$name" "$r" "{\"Env\":[$path_env],\"Cmd\":[\"/usr/local/bin/etcd\"],\"ExposedPorts\":{\"2379/tcp\":{},\"2380/tcp\":{}}}" "$work/out/etcd.tar"
printf 'etcd\t%s\tetcd.tar\n' "$name" >>"$work/out/images.tsv"

# --- pause -----------------------------------------------------------------------------
cp "$pause_tar" "$work/out/pause.tar"
printf 'pause\t%s\tpause.tar\n' "$pause_name" >>"$work/out/images.tsv"

touch "$work/out/.complete"
rm -rf "$out"
mv "$work/out" "$out"
# Images from older versions of this script are dead weight once nothing has used them
# for a day; younger ones may belong to another checkout running its own version beside
# this one (its conformance run reads them while it goes).
find "$base" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name ".build.*" -mtime +0 -exec rm -rf {} +
log "images built in $out"
echo "$out"
