#!/usr/bin/env bash
# Runs upstream's own conformance tests (e2e.test at v1.37.2) on a two-node cluster whose
# nodes run nodekit's kubelet and kube-proxy, and records the result in docs/conformance.md.
#
#   sudo ./hack/conformance.sh            the full selection: hack/conformance/focus.txt
#   sudo ./hack/conformance.sh --smoke    the CI subset: hack/conformance/smoke.txt
#   options: --keep (leave the cluster up afterwards), --no-doc (do not touch docs/conformance.md),
#            --timeout=DURATION (stop e2e.test after this long, default 24h: the specs not
#            reached are listed as "not run"), --focus=REGEX (instead of focus.txt, the
#            [Conformance] specs whose names match REGEX, to rerun a few; implies --no-doc),
#            --parallel=N (run the specs not marked [Serial] in N Ginkgo processes, through
#            the ginkgo CLI built once from the module proxy, then the [Serial] ones alone)
#
# Steps: builds e2e.test and agnhost (hack/build-e2e.sh), the test images
# (hack/build-e2e-images.sh) and containerd 2.x (hack/build-containerd.sh), brings up `nodekit up --nodes 2 --detach` (through hack/up.sh,
# which builds nodekit, its kubelet and kube-proxy, the peers and the base images) in its
# own state dir, loads the test images into every node, runs e2e.test with the selection
# (only [Conformance] specs; hack/conformance/skip.txt's entries never run), writes the
# JUnit and Ginkgo JSON reports to the report dir, the per-test table into
# docs/conformance.md, and tears the cluster down.
#
# Environment: NODEKIT_CONFORMANCE_DIR (report dir, default /tmp/nodekit-conformance),
# NODEKIT_CONFORMANCE_NAME (cluster name, default nkconf), NODEKIT_CONFORMANCE_API_PORT
# (default 16470), NODEKIT_BIN_DIR (where hack/up.sh builds nodekit and its agents). Exits non-zero when a selected test fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { echo "conformance: $*" >&2; }

mode=full keep=0 doc=1 timeout=24h extra= parallel=1
for arg in "$@"; do
  case $arg in
    --smoke) mode=smoke ;;
    --keep) keep=1 ;;
    --no-doc) doc=0 ;;
    --timeout=*) timeout=${arg#--timeout=} ;;
    --focus=*) extra=${arg#--focus=} doc=0 ;;
    --parallel=*) parallel=${arg#--parallel=} ;;
    *) log "unknown argument $arg (want --smoke, --keep, --no-doc, --timeout=DURATION, --focus=REGEX, --parallel=N)"; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  log "run as root: nodekit up makes network namespaces and runs containerd"
  exit 1
fi
if [ ! -x "$root/hack/up.sh" ]; then
  log "hack/up.sh is not in this tree: nodekit up is needed to make the cluster"
  exit 1
fi

lists=$root/hack/conformance
name=${NODEKIT_CONFORMANCE_NAME:-nkconf}
api_port=${NODEKIT_CONFORMANCE_API_PORT:-16470}
out=${NODEKIT_CONFORMANCE_DIR:-/tmp/nodekit-conformance}/$mode
state=$out/cluster
nodekit=${NODEKIT_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/bin}/nodekit
start=$(date +%s)
# The tree under test, taken now: the checkout may move on while the specs run.
tested=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo '+changes')

# regex FILE: the file's non-comment lines joined into one alternation.
regex() { grep -v '^[[:space:]]*\(#\|$\)' "$1" | paste -sd'|' -; }
# skip_regex: skip.txt's patterns, each checked to carry a reason.
skip_regex() {
  local n=0 line
  while IFS= read -r line; do
    n=$((n + 1))
    case $line in '' | '#'* | [[:space:]]'#'*) continue ;; esac
    if [[ $line != *' # '* ]]; then
      log "$lists/skip.txt:$n: a skip needs a one-line reason after ' # '"
      return 1
    fi
    printf '%s\n' "${line% # *}" | sed 's/[[:space:]]*$//'
  done <"$lists/skip.txt" | paste -sd'|' -
}

focus=$(regex "$lists/focus.txt")
[ "$mode" = smoke ] && focus=$(regex "$lists/smoke.txt")
skip=$(skip_regex)
# Ginkgo ORs repeated --ginkgo.focus flags: one expression makes "in the list AND conformance".
# --focus replaces the list (Go's regexp has no lookahead to AND the two).
[ -n "$extra" ] && focus=$extra
selection="(?:$focus).*\\[Conformance\\]"

case $parallel in '' | *[!0-9]* | 0) log "--parallel wants a count of processes, not $parallel"; exit 2 ;; esac

e2e_test=$("$root/hack/build-e2e.sh")
images=$("$root/hack/build-e2e-images.sh")
peers=$("$root/hack/build-peers.sh")
# The nodes run containerd 2.x (hack/build-containerd.sh, from the module proxy): image
# volumes need CRI image mounts, which Debian's containerd 1.6 lacks. NODEKIT_CONTAINERD_DIR
# picks other binaries.
export NODEKIT_CONTAINERD_DIR=${NODEKIT_CONTAINERD_DIR:-$("$root/hack/build-containerd.sh")}
built=$(date +%s)

# A cluster left in $out by --keep or a crashed run holds live mounts (containerd's
# rootfs, pod volumes): stop it with nodekit down before removing anything, or refuse.
if [ -e "$state" ]; then
  log "a cluster state is left in $state: stopping it first"
  "$nodekit" down --state-dir "$state" >&2 || {
    log "nodekit down --state-dir $state failed: remove that cluster by hand, then run this again"
    exit 1
  }
fi
rm -rf "$out"
mkdir -p "$out/junit"

# Which specs are in scope: a dry run with the focus alone (no cluster needed).
"$e2e_test" --provider=skeleton --ginkgo.dry-run --ginkgo.no-color \
  --ginkgo.focus="$selection" --ginkgo.json-report="$out/scope.json" >"$out/scope.log" 2>&1 || {
  log "the dry run failed: $out/scope.log"
  exit 1
}

down() {
  if [ "$keep" = 1 ]; then
    log "cluster left up: KUBECONFIG=$state/kubeconfig; stop it with nodekit down --state-dir $state"
    return
  fi
  log "tearing the cluster down"
  "$nodekit" down --state-dir "$state" >&2 || log "nodekit down failed: see $state"
}
log "bringing up a 2-node cluster in $state"
"$root/hack/up.sh" --nodes 2 --detach --name "$name" --state-dir "$state" --api-port "$api_port" >&2
trap down EXIT
up=$(date +%s)

tars=()
while IFS=$'\t' read -r _ _ tar; do tars+=("$images/$tar"); done <"$images/images.tsv"
"$nodekit" load --state-dir "$state" "${tars[@]}" >&2
export KUBECONFIG=$state/kubeconfig

args=(--provider=skeleton --kubeconfig="$KUBECONFIG" --kubectl-path="$peers/kubectl" --report-dir="$out/junit")
rc=0
if [ "$parallel" = 1 ]; then
  cmd=("$e2e_test" "${args[@]}" --ginkgo.json-report="$out/report.json" --ginkgo.no-color
    --ginkgo.timeout="$timeout" --ginkgo.focus="$selection")
  [ -n "$skip" ] && cmd+=(--ginkgo.skip="$skip")
  log "running e2e.test ($mode selection), log in $out/e2e.log"
  # From the report dir: whatever e2e.test leaves in its working directory lands there.
  (cd "$out" && "${cmd[@]}") >"$out/e2e.log" 2>&1 || rc=$?
else
  # The ginkgo CLI at the version e2e.test is built with, cached beside the other tools.
  ginkgo_version=$(cd "$root/upstream/e2e" && go list -m -f '{{.Version}}' github.com/onsi/ginkgo/v2)
  tools=${XDG_CACHE_HOME:-$HOME/.cache}/nodekit/tools/ginkgo-$ginkgo_version
  if [ ! -x "$tools/ginkgo" ]; then
    log "building the ginkgo CLI $ginkgo_version"
    GOBIN=$tools CGO_ENABLED=0 go install "github.com/onsi/ginkgo/v2/ginkgo@$ginkgo_version" >&2
  fi
  # [Serial] is a Ginkgo label in Kubernetes' e2e (and text in the name), not Ginkgo's
  # Serial decorator, so the parallel pass filters those specs out and a second,
  # single-process pass runs only them.
  parallel_args=(--nodes="$parallel" --no-color --timeout="$timeout" --focus="$selection"
    --label-filter='!Serial' --json-report=report-parallel.json --output-dir="$out")
  [ -n "$skip" ] && parallel_args+=(--skip="$skip")
  log "running e2e.test ($mode selection) in $parallel processes, log in $out/e2e.log"
  (cd "$out" && "$tools/ginkgo" "${parallel_args[@]}" "$e2e_test" -- "${args[@]}") >"$out/e2e.log" 2>&1 || rc=$?
  cmd=("$e2e_test" "${args[@]}" --ginkgo.json-report="$out/report-serial.json" --ginkgo.no-color
    --ginkgo.timeout="$timeout" --ginkgo.focus="$selection" --ginkgo.label-filter=Serial)
  [ -n "$skip" ] && cmd+=(--ginkgo.skip="$skip")
  log "running the [Serial] specs alone, log in $out/e2e-serial.log"
  (cd "$out" && "${cmd[@]}") >"$out/e2e-serial.log" 2>&1 || rc=$?
  # One report for report.py: each pass reports the other's specs as skipped, so a spec
  # takes the state of the pass that ran it.
  python3 - "$out/report.json" "$out/report-parallel.json" "$out/report-serial.json" <<'PY'
import json, os, sys
merged, order, base = {}, [], None
for path in sys.argv[2:]:
    if not os.path.exists(path):
        continue
    with open(path) as f:
        for suite in json.load(f):
            base = base or suite
            for spec in suite.get("SpecReports") or []:
                key = (tuple(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText"), spec.get("LeafNodeType"))
                if key not in merged:
                    order.append(key)
                if key not in merged or merged[key].get("State") == "skipped":
                    merged[key] = spec
if base is not None:
    base["SpecReports"] = [merged[k] for k in order]
with open(sys.argv[1], "w") as f:
    json.dump([base] if base else [], f)
PY
fi
finished=$(date +%s)

if [ "$doc" = 1 ]; then
  header=$out/header.md
  {
    echo "### ${mode^} selection, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- e2e.test $("$e2e_test" --version 2>/dev/null | head -1 || echo v1.37.2) (hack/build-e2e.sh), peers $("$peers/kube-apiserver" --version), nodekit $tested"
    echo "- cluster: \`nodekit up --nodes 2\` (nodekit's kubelet and kube-proxy, containerd $("$NODEKIT_CONTAINERD_DIR/containerd" --version | awk '{print $3}'), runc, CoreDNS)"
    echo "- command: \`sudo ./hack/conformance.sh $*\`, that is \`e2e.test --provider=skeleton --ginkgo.focus='(?:<hack/conformance/$([ "$mode" = smoke ] && echo smoke || echo focus).txt>).*\\[Conformance\\]' --ginkgo.skip='<hack/conformance/skip.txt>'\`"
    [ "$parallel" != 1 ] && echo "- parallel: \`ginkgo --nodes=$parallel\` for the specs not marked [Serial], then the [Serial] ones in one process"
    echo "- wall time: e2e.test $((finished - up)) s; cluster up $((up - built)) s; builds $((built - start)) s"
  } >"$header"
  summary=$(python3 "$lists/report.py" "$out/scope.json" "$out/report.json" "$lists/skip.txt" \
    "$root/docs/conformance.md" "results-$mode" "$header")
  log "$summary (docs/conformance.md, reports in $out)"
fi
log "e2e.test exited $rc after $((finished - up)) s"
exit "$rc"
