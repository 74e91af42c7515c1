#!/usr/bin/env bash
# Benchmark: `ckptfs report` of a long history. A workspace (bench-turns.sh's tree)
# is captured, then changed in BENCH_TURNS turns of about 1% each (change_tree), each
# put with --parent into a local directory store. Side by side, in one run:
#   report     ckptfs report STORE OUT: every turn downloaded and verified, a page
#              per turn with its diffs against the turn before
#   by hand    what a reviewer would run instead for the same diffs and the same
#              check: per turn, sha256sum of the object, tar -xzf into a directory,
#              diff -ruN against the turn before (into one file per turn)
#   one more   one more turn, then the report again into the same OUT (only the new
#              turn is computed; the others are verified again), against the by-hand
#              steps for that one turn
# Prints a Markdown table on stdout (progress on stderr). See BENCHMARKS.md, section 8.
#
# Environment:
#   BENCH_MB      workspace size in MiB (default 300)
#   BENCH_FILES   number of files (default 6000)
#   BENCH_TURNS   turns in the history (default 50)
#   BENCH_DIR     work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1  keep the work directory
#   CKPTFS_BIN    use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
# shellcheck source=scripts/lib/turns.sh
source scripts/lib/turns.sh

BENCH_MB="${BENCH_MB:-300}"
BENCH_FILES="${BENCH_FILES:-6000}"
BENCH_TURNS="${BENCH_TURNS:-50}"

bench_init report
bench_deps ""

TREE="$WORK/tree"
STORE="$WORK/store"
OUT="$WORK/out"
HAND="$WORK/hand"
mkdir -p "$HAND"

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"

SHAS=()
put_turn() {
    local parent=() sha
    [ "${#SHAS[@]}" -gt 0 ] && parent=(--parent "${SHAS[-1]}")
    sha="$("$CKPTFS" -q put "$STORE" "$TREE" --cache-dir "$WORK/members" "${parent[@]}" | awk '{ print $1 }')"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "put gave no digest"
    SHAS+=("$sha")
}

log "turn 1 of $BENCH_TURNS"
put_turn
for turn in $(seq 2 "$BENCH_TURNS"); do
    log "turn $turn of $BENCH_TURNS"
    change_tree "$TREE" "$turn"
    put_turn
done
STORE_BYTES="$(du -sb "$STORE" | awk '{ print $1 }')"

# The by-hand review of turn I (0-based) against turn I-1: check the object's digest,
# extract it, diff it with the one before, drop the one before.
BYHAND='set -euo pipefail
store="$1" hand="$2" i="$3" sha="$4"
obj="$(find "$store" -name "$sha.tar.gz" | head -n 1)"
echo "$sha  $obj" | sha256sum --check --quiet
mkdir -p "$hand/$i"
tar -xzf "$obj" -C "$hand/$i"
if [ "$i" -gt 0 ]; then
    diff -ruN "$hand/$((i - 1))" "$hand/$i" >"$hand/$i.diff" || [ $? -eq 1 ]
    rm -rf "${hand:?}/$((i - 1))"
fi'

run_begin
log "ckptfs report of $BENCH_TURNS turns"
tm report "$CKPTFS" report "$STORE" "$OUT" --temp-dir "$WORK/tmp" 2>"$WORK/report.err"
grep -q " $BENCH_TURNS computed" "$WORK/report.err" || { cat "$WORK/report.err" >&2; die "report did not compute every turn"; }
log "by hand: sha256sum, tar -xzf, diff -ruN for $BENCH_TURNS turns"
for i in "${!SHAS[@]}"; do
    tm byhand bash -c "$BYHAND" byhand "$STORE" "$HAND" "$i" "${SHAS[$i]}"
done
REPORT_S="$(step_secs report)"
REPORT_RSS="$(step_rss report)"
BYHAND_S="$(step_secs byhand)"
OUT_BYTES="$(du -sb "$OUT" | awk '{ print $1 }')"
DIFF_BYTES="$(cat "$HAND"/*.diff | wc -c)"

log "one more turn"
change_tree "$TREE" "$((BENCH_TURNS + 1))"
put_turn
run_begin
tm again "$CKPTFS" report "$STORE" "$OUT" --temp-dir "$WORK/tmp" 2>"$WORK/again.err"
grep -q " 1 computed, $BENCH_TURNS taken" "$WORK/again.err" || { cat "$WORK/again.err" >&2; die "the second report did not compute only the new turn"; }
last=$((${#SHAS[@]} - 1))
tm byhand_one bash -c "$BYHAND" byhand "$STORE" "$HAND" "$last" "${SHAS[$last]}"
# The report checks every turn again; by hand, that is a sha256sum of each object.
VERIFY_ALL='set -euo pipefail
for sha in "${@:2}"; do
    obj="$(find "$1" -name "$sha.tar.gz" | head -n 1)"
    echo "$sha  $obj"
done | sha256sum --check --quiet'
tm verify_all bash -c "$VERIFY_ALL" verify "$STORE" "${SHAS[@]}"
AGAIN_S="$(step_secs again)"
ONE_S="$(step_secs byhand_one)"
ONE_ALL_S="$(awk -v a="$ONE_S" -v b="$(step_secs verify_all)" 'BEGIN { printf "%.4f", a + b }')"

machine_line
echo
echo "#### ckptfs report vs sha256sum + tar -xzf + diff -ruN, one run"
echo
echo "Workspace: $(human "$(cat "$TREE.bytes")"), $BENCH_FILES files; $BENCH_TURNS turns of about 1% each, put with --parent into a local directory store ($(human "$STORE_BYTES")). Release build."
echo
md_header "step" "ckptfs" "by hand" "ratio"
md_row "$BENCH_TURNS turns: verify, diff, write the pages (s)" "$REPORT_S" "$BYHAND_S" "**$(ratio "$REPORT_S" "$BYHAND_S")**"
md_row "one more turn, into the same report (s)" "$AGAIN_S" "$ONE_S (that turn only)" "**$(ratio "$AGAIN_S" "$ONE_S")**"
md_row "the same, by hand also checking every object again (s)" "$AGAIN_S" "$ONE_ALL_S" "**$(ratio "$AGAIN_S" "$ONE_ALL_S")**"
echo
echo "Report: $(human "$OUT_BYTES") in $((BENCH_TURNS + 2)) pages and their bodies; the by-hand diffs: $(human "$DIFF_BYTES"). Peak memory of the report: $(mib "$REPORT_RSS") MiB. The second run computed 1 turn and verified all $((BENCH_TURNS + 1)) again."
