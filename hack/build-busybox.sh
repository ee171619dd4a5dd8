#!/usr/bin/env bash
# Builds the busybox binary of the e2e busybox image (hack/build-e2e-images.sh:
# registry.k8s.io/e2e-test-images/busybox:1.37.0-2), whose ash must keep environment
# entries whose names are not shell identifiers, as upstream's busybox 1.37 does: the
# ConfigMap and Secret "consumable via the environment" specs give the container
# data-1=value-1 and read it back with `sh -c env`. Debian bookworm's busybox (1.35, the
# project's base busybox image) drops such entries when ash starts, so `env` never sees
# them: Debian's patch series reverts upstream's change that kept them and puts it behind
# its own option, CONFIG_FEATURE_DI_ENV_HACK, on only for the debian-installer flavour.
#
# The build: Debian's busybox source package at the version the machine's busybox-static
# binary package comes from (apt-get source, through a private deb-src list made from the
# machine's own deb entries; the machine's apt configuration is left as it is), Debian's
# patch series, then hack/busybox/*.patch; Debian's static flavour configuration
# (debian/config/pkg/static, the one busybox-static is built with: same applets, same
# standalone shell) with CONFIG_FEATURE_DI_ENV_HACK=y. About a minute on 2 cores.
#
# Cached by version under ${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/tools/busybox-<version>-<key>
# (the key covers this script, the patches and the compiler), so the base busybox image and
# nodekit's own tests, which use Debian's binary, are unaffected. Prints the binary's path on
# stdout; everything else goes to stderr. Run as root (apt, and missing build tools are
# installed with apt-get).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "build-busybox: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "must run as root"
  exit 1
fi

missing=()
for tool in gcc:gcc make:make patch:patch bzip2:bzip2 xz:xz-utils; do
  command -v "${tool%%:*}" >/dev/null || missing+=("${tool#*:}")
done
dpkg-query -W -f='${Status}' libc6-dev 2>/dev/null | grep -q "install ok installed" || missing+=(libc6-dev)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# source_version: the version of the busybox source package that the machine's
# busybox-static binary package is built from ("Source: busybox (V)" when the binary
# was rebuilt on its own, else the binary's own version).
source_version() {
  apt-cache show --no-all-versions busybox-static 2>/dev/null | awk '
    /^Source:/ && match($0, /\(.*\)/) { src = substr($0, RSTART + 1, RLENGTH - 2) }
    /^Version:/ { ver = $2 }
    END { if (src != "") print src; else if (ver != "") print ver }'
}
version=$(source_version)
if [ -z "$version" ]; then
  apt-get update -qq >&2
  version=$(source_version)
fi
[ -n "$version" ] || { log "apt-cache knows no busybox-static package"; exit 1; }

patches=("$root"/hack/busybox/*.patch)
key=$( (cat "$0" "${patches[@]}"; gcc --version | head -1) | sha256sum | cut -c1-12)
tools=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/tools
dest=$tools/busybox-${version#*:}-$key
if [ -x "$dest/busybox" ]; then
  log "busybox cached in $dest"
  echo "$dest/busybox"
  exit 0
fi

mkdir -p "$tools"
work=$(mktemp -d "$tools/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# A private apt state whose only sources are deb-src twins of the machine's deb entries
# (one-line and deb822 files alike). Root's cache is out of reach of apt's _apt sandbox
# user, so apt runs as root here.
apt_dir=$work/apt
mkdir -p "$apt_dir/sources.list.d" "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
  [ -f "$f" ] || continue
  sed -n -E 's/^[[:space:]]*deb([[:space:]])/deb-src\1/p' "$f"
done >"$apt_dir/sources.list"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed -E 's/^Types:.*$/Types: deb-src/' "$f" >"$apt_dir/sources.list.d/$(basename "$f")"
done
apt_opts=(-q -o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts="$apt_dir/sources.list.d"
  -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
log "fetching Debian's busybox source package $version"
# A source that offers no Sources index only warns here; the look-up below decides.
apt-get "${apt_opts[@]}" update >&2 || log "apt-get update of the deb-src list reported errors (see above)"
mkdir -p "$work/src"
fetch() { (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only "busybox=$version" >&2); }
if ! fetch; then
  # The machine's package lists may be older than the archive (which keeps only each
  # suite's newest source): refresh them once and build what busybox-static now is.
  log "busybox $version is not in the source index: refreshing the machine's package lists"
  apt-get update -qq >&2
  version=$(source_version)
  dest=$tools/busybox-${version#*:}-$key
  if [ -x "$dest/busybox" ]; then
    log "busybox cached in $dest"
    echo "$dest/busybox"
    exit 0
  fi
  fetch
fi

# Unpack as dpkg-source does for a "3.0 (quilt)" package: the upstream tarball, debian/
# from the Debian tarball, then debian/patches/series in order.
mkdir -p "$work/tree"
tar -xf "$(ls "$work"/src/busybox_*.orig.tar.*)" -C "$work/tree"
src=$(find "$work/tree" -mindepth 1 -maxdepth 1 -type d)
[ "$(echo "$src" | wc -l)" -eq 1 ] || { log "the upstream tarball does not hold exactly one folder"; exit 1; }
tar -xf "$(ls "$work"/src/busybox_*.debian.tar.*)" -C "$src"
while read -r name opts; do
  case $name in '' | '#'*) continue ;; esac
  [ -z "$opts" ] || { log "debian/patches/series: $name has options ($opts) this script does not apply"; exit 1; }
  patch -d "$src" -p1 -s --no-backup-if-mismatch <"$src/debian/patches/$name"
done <"$src/debian/patches/series"
for p in "${patches[@]}"; do
  log "applying hack/busybox/$(basename "$p")"
  patch -d "$src" -p1 --no-backup-if-mismatch <"$p" >&2
done

# Debian's static flavour, as its debian/rules sets it up, with the environment option on.
b=$src/build
mkdir -p "$b"
on='CONFIG_FEATURE_DI_ENV_HACK=y'
sed "s/^# CONFIG_FEATURE_DI_ENV_HACK is not set\$/$on/" "$src/debian/config/pkg/static" >"$work/want.config"
grep -qx "$on" "$work/want.config" || { log "Debian's static configuration has no FEATURE_DI_ENV_HACK line"; exit 1; }
cat "$src/debian/config/os/linux" "$work/want.config" >"$b/.config"
export KCONFIG_NOTIMESTAMP=1
log "building busybox $version (static, $(nproc) jobs)"
(yes "" || true) | make -C "$b" -f "$src/Makefile" KBUILD_SRC="$src" silentoldconfig >"$work/config.log" 2>&1 ||
  { cat "$work/config.log" >&2; exit 1; }
# As Debian's rules do: the configuration must come out of oldconfig unchanged.
diff -u "$work/want.config" "$b/.config" >&2 || { log "oldconfig changed the configuration"; exit 1; }
make -C "$b" -j"$(nproc)" all BB_EXTRA_VERSION="Debian $version, nodekit e2e" >"$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; exit 1; }

# The behaviour this build exists for, and the one the patch keeps.
bin=$b/busybox
got=$(env -i 'data-1=value-1' PATH=/usr/bin:/bin "$bin" sh -c env)
grep -qx 'data-1=value-1' <<<"$got" || { log "ash still drops data-1 from its children's environment: $got"; exit 1; }
got=$(env -i 'data-1=value-1' "$bin" sh -c 'export -p')
grep -qx 'export data' <<<"$got" || { log "export -p lists data-1 unlike busybox 1.37: $got"; exit 1; }
env -i 'data-1=value-1' "$bin" sh -c 'eval "$(export -p)"' || { log "eval of export -p fails"; exit 1; }

mkdir -p "$work/out"
cp "$bin" "$work/out/busybox"
rm -rf "$dest"
mv "$work/out" "$dest"
# Builds from older versions of this script or of the package are dead weight.
find "$tools" -mindepth 1 -maxdepth 1 -type d -name 'busybox-*' ! -path "$dest" -exec rm -rf {} +
log "busybox built in $dest"
echo "$dest/busybox"
