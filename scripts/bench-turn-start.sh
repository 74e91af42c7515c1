#!/usr/bin/env bash
# Benchmark: starting a turn from the last one, `cp -a MNT/<sha256>/. MNT/staging/NAME/`,
# side by side with what it is compared to, in one run:
#   ckptfs cp     cp -a MNT/<sha256>/. MNT/staging/NAME/   (copy_file_range: the daemon
#                 has the kernel copy between the cache's file and the staged one)
#   ckptfs tar    tar -cf - -C MNT/<sha256> . | tar -xpf - -C MNT/staging/NAME
#                 (every byte read and written through FUSE requests, as cp did before)
#   local cp      cp -a TREE/. LOCALDIR/NAME/   (two directories of the same disk)
# on a source-like tree put into a local directory store (no S3: nothing here touches
# the store once the checkpoint is loaded). The checkpoint is loaded and its files read
# once before the runs, so both sources are in the page cache. Prints a Markdown table
# on stdout (progress on stderr). See BENCHMARKS.md, section 6.
#
# Environment:
#   BENCH_MB      tree size in MiB (default 300)
#   BENCH_FILES   number of files (default 6000)
#   BENCH_RUNS    runs per measurement; the median is reported (default 3)
#   BENCH_DIR     work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1  keep the work directory
#   CKPTFS_BIN    use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_MB="${BENCH_MB:-300}"
BENCH_FILES="${BENCH_FILES:-6000}"
CKPTFS_GLOBAL=()

bench_init turn-start
bench_deps ""

TREE="$WORK/tree"
STORE="$WORK/store"
MNT="$WORK/mnt"
CACHE="$WORK/cache"     # the daemon's cache; staging/ lives in it (same disk as LOCAL)
LOCAL="$WORK/local"
mkdir -p "$LOCAL"

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_BYTES="$(cat "$TREE.bytes")"
TREE_FILES="$(wc -l <"$TREE.files")"
SHA="$("$CKPTFS" put "$STORE" "$TREE" 2>/dev/null | awk '{ print $1 }')"
[[ "$SHA" =~ ^[0-9a-f]{64}$ ]] || die "put gave no digest: '$SHA'"

mount_ckptfs "$STORE" "$MNT" "$CACHE"
PID="$CKPT_PID"
SRC="$MNT/$SHA"
# Load the checkpoint and read every file once (untimed): both sources warm.
tar -cf - -C "$SRC" . >/dev/null
tar -cf - -C "$TREE" . >/dev/null

settle() { sync -f "$WORK" 2>/dev/null || sync; }
copies() { awk '/^# latency copy_file_range:/ { print $4; f = 1 } END { if (!f) print 0 }' "$MNT/.status"; }

ck_cp() {
    local dest="$MNT/staging/cp-$1"
    mkdir "$dest"; settle; run_begin
    tm ck_cp cp -a "$SRC/." "$dest/"
    record ck_cp_s "$(step_secs ck_cp)"
    [ "$1" != 1 ] || diff -r -q "$TREE" "$dest" >&2 || die "the copy differs from the tree"
    rm -rf "$dest"
}
ck_tar() {
    local dest="$MNT/staging/tar-$1"
    mkdir "$dest"; settle; run_begin
    # shellcheck disable=SC2016 # expanded by the inner shell
    tm ck_tar bash -c 'set -o pipefail; tar -cf - -C "$1" . | tar -xpf - -C "$2"' tar "$SRC" "$dest"
    record ck_tar_s "$(step_secs ck_tar)"
    rm -rf "$dest"
}
local_cp() {
    local dest="$LOCAL/cp-$1"
    mkdir "$dest"; settle; run_begin
    tm local_cp cp -a "$TREE/." "$dest/"
    record local_cp_s "$(step_secs local_cp)"
    rm -rf "$dest"
}

C0="$(copies)"
for run in $(seq 1 "$BENCH_RUNS"); do
    # Rotate the order, so that no side always follows the same one.
    case $((run % 3)) in
    1) ck_cp "$run"; ck_tar "$run"; local_cp "$run" ;;
    2) local_cp "$run"; ck_cp "$run"; ck_tar "$run" ;;
    0) ck_tar "$run"; local_cp "$run"; ck_cp "$run" ;;
    esac
    log "run $run/$BENCH_RUNS: ckptfs cp $(tail -n 1 "$RES/ck_cp_s") s, ckptfs tar" \
        "$(tail -n 1 "$RES/ck_tar_s") s, local cp $(tail -n 1 "$RES/local_cp_s") s"
done
COPIES=$(($(copies) - C0))
unmount_wait "$MNT" "$PID"

mb="$(human "$TREE_BYTES")"
cp_v="$(mbps "$TREE_BYTES" "$(med ck_cp_s)")"
tar_v="$(mbps "$TREE_BYTES" "$(med ck_tar_s)")"
loc_v="$(mbps "$TREE_BYTES" "$(med local_cp_s)")"
echo
echo "### Starting a turn from a checkpoint: cp -a into staging/ vs cp -a between local directories"
echo
echo "Tree: $TREE_FILES files, $mb (source-like, seed 42). Median of $BENCH_RUNS runs; both" \
    "sources in the page cache; staging/ and LOCALDIR on the same disk. $COPIES copy_file_range" \
    "requests reached the daemon over the $BENCH_RUNS \`cp -a\` runs. Ratios are ckptfs / local."
echo "Machine: $(machine_line)."
echo
md_header "measurement" "MiB/s" "seconds" "ratio to local cp" "target"
md_row "\`cp -a MNT/<sha256>/. MNT/staging/NAME/\` (copy_file_range)" "$cp_v" "$(f2 "$(med ck_cp_s)")" \
    "**$(ratio "$cp_v" "$loc_v")**" "≥ 1"
md_row "\`tar -c MNT/<sha256> \\| tar -x -C MNT/staging/NAME\` (read + write requests)" "$tar_v" \
    "$(f2 "$(med ck_tar_s)")" "$(ratio "$tar_v" "$loc_v")" ""
md_row "\`cp -a TREE/. LOCALDIR/NAME/\` (local disk)" "$loc_v" "$(f2 "$(med local_cp_s)")" "1.00" ""
