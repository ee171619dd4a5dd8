#!/usr/bin/env bash
# Regenerates the replace block of upstream/go.mod from k8s.io/kubernetes's own go.mod.
#
# k8s.io/kubernetes requires each of its staging modules (k8s.io/api, k8s.io/client-go, ...)
# at v0.0.0 and points them at ./staging/src/... with replace lines that only work inside its
# own repository. A module that requires k8s.io/kubernetes must pin each of those modules to
# the published version instead. The list is taken from the downloaded go.mod, never typed.
#
# Usage: gen-replace.sh [MODULE_DIR...]   (default: upstream/ and every module nested in it)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ "$#" -eq 0 ]; then
  set -- "$here" $(find "$here" -mindepth 2 -name go.mod -printf '%h\n' | sort)
fi

k8s_version=${K8S_VERSION:-v1.37.2}
staging_version="v0.${k8s_version#v1.}"

modfile=$(go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@${k8s_version}")
mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/src/.*#\1#p' "$modfile" | sort -u)
if [ "${#staging[@]}" -eq 0 ]; then
  echo "gen-replace: no staging replace lines found in $modfile" >&2
  exit 1
fi

args=()
for m in "${staging[@]}"; do
  args+=("-replace=${m}=${m}@${staging_version}")
done
for dir in "$@"; do
  (cd "$dir" && go mod edit "${args[@]}")
  echo "gen-replace: $dir: pinned ${#staging[@]} staging modules to ${staging_version}" >&2
done
