#!/usr/bin/env bash
# Regenerates the replace block of upstream/go.mod from k8s.io/kubernetes's own go.mod.
#
# k8s.io/kubernetes requires each of its staging modules (k8s.io/api, k8s.io/client-go, ...)
# at v0.0.0 and points them at ./staging/src/... with replace lines that only work inside its
# own repository. A module that requires k8s.io/kubernetes must pin each of those modules to
# the published version instead. The list is taken from the downloaded go.mod, never typed.
set -euo pipefail
cd "$(dirname "$0")"

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
go mod edit "${args[@]}"
echo "gen-replace: pinned ${#staging[@]} staging modules to ${staging_version}" >&2
