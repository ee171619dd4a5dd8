#!/usr/bin/env bash
# Installs the host packages nodekit's tests use, only when missing, on Debian 12 as root.
# containerd, runc, CNI plugins and the image tools are installed by setup-containerd.sh.
set -euo pipefail

# package:command that proves it is installed
wanted=(
  nftables:nft
  iptables:iptables-legacy
  conntrack:conntrack
  iproute2:ip
  util-linux:nsenter
  gcc:gcc
  git:git
)
missing=()
for w in "${wanted[@]}"; do
  command -v "${w#*:}" >/dev/null 2>&1 || missing+=("${w%%:*}")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup-host: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup-host: all host packages present"
fi
