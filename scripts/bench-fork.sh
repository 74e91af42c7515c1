#!/usr/bin/env bash
# Benchmark: starting turn N+1 inside the mount, and sealing it, where the store is
# not the bottleneck (a local directory store). A workspace is captured and opened
# through a mount (loaded, its gzip members primed), then, in BENCH_RUNS runs, the
# order alternating:
#   fork        ckptfs fork MNT <sha256> NAME (the daemon copies the tree from its cache)
#   copy        cp -a MNT/<sha256>/. MNT/staging/NAME/ (the kernel's copy_file_range)
#   local copy  cp -a TREE/. DIR/ between two directories of the same disk: what a
#               user does instead of either
# and, in each, one file changed in the forked workspace and in the copied one, each
# sealed (mv MNT/staging/NAME MNT/commit/; the fork's seal after the daemon's capture
# of the new workspace, which records what the seal may leave unread, has ended),
# against a full put of the same tree
# (--member-cache-size 0: every file read, every member compressed). Prints Markdown
# on stdout (progress on stderr); see BENCHMARKS.md, section 6.
#
# Environment: BENCH_MB (default 300), BENCH_FILES (6000), BENCH_RUNS (3), BENCH_DIR,
# BENCH_KEEP=1, CKPTFS_BIN (as scripts/bench-turns.sh); BENCH_FS "fresh" (default as
# root: a fresh ext4 in a file of the work directory, as scripts/bench-use.sh) or
# "here".
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_MB="${BENCH_MB:-300}"
BENCH_FILES="${BENCH_FILES:-6000}"

bench_init fork
bench_deps ""
MNT="$WORK/mnt"
bench_data_dir 16G
TREE="$DATA/tree"
STORE="$DATA/store"
CACHE="$DATA/cache"
LOCAL="$DATA/local"
mkdir -p "$STORE" "$LOCAL" "$DATA/tmp"

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_FILES="$(wc -l <"$TREE.files")"
TREE_BYTES="$(find "$TREE" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')"

# Everything written so far on its way to disk, the loop file's pages on the disk
# under it included (`sync -f` of the loop filesystem leaves those to write back
# under the next step).
settle() { sync; }
f2() { awk -v x="$1" 'BEGIN { printf "%.2f", x }'; }

# A full put of TREE as it is now; records its seconds under full_s.
full_put() {
    settle
    run_begin
    tm full "$CKPTFS" put "$STORE" "$TREE" --member-cache-size 0 --temp-dir "$DATA/tmp" \
        >"$WORK/put.out" 2>"$WORK/put.err" || { cat "$WORK/put.err" >&2; die "put failed"; }
    record full_s "$(step_secs full)"
    awk '{ print $1 }' "$WORK/put.out"
}

log "turn N: put, mounted, opened"
SHA="$(full_put)"
[[ "$SHA" =~ ^[0-9a-f]{64}$ ]] || die "put gave no digest"
mount_ckptfs "$STORE" "$MNT" "$CACHE" --cache-size 8GiB
PID="$CKPT_PID"
tar -cf - -C "$MNT/$SHA" . >/dev/null
# Opening the newest turn primes its members (as a sandbox's next turn expects);
# wait for that, as an agent's first seconds of work would.
for _ in $(seq 1 600); do
    grep -q "member cache primed" "$CACHE/ckptfs.log" && break
    sleep 0.2
done
grep -q "member cache primed" "$CACHE/ckptfs.log" || die "the member cache was never primed"

# One changed file in workspace $1, then its seal; KEY's seconds are recorded.
seal_one() {
    local key="$1" name="$2" one
    one="$(find "$MNT/staging/$name" -name '*.txt' -type f | sort | sed -n 1p)"
    echo "# $name changed" >>"$one"
    settle
    run_begin
    tm "$key" mv "$MNT/staging/$name" "$MNT/commit/" || die "the seal of $name failed"
    record "${key}_s" "$(step_secs "$key")"
}

RECORDED="recorded what the forked workspace holds"
fork_run() {
    local before
    before="$(grep -c "$RECORDED" "$CACHE/ckptfs.log" || true)"
    settle
    run_begin
    tm fork "$CKPTFS" fork "$MNT" "$SHA" "fork-$1" 2>/dev/null || die "fork failed"
    record fork_s "$(step_secs fork)"
    diff -r "$MNT/$SHA" "$MNT/staging/fork-$1" >/dev/null || die "the fork differs from its checkpoint"
    # The daemon then captures the workspace in the background to record what its
    # seal may leave unread; wait for it, as an agent's work on the turn would.
    for _ in $(seq 1 600); do
        [ "$(grep -c "$RECORDED" "$CACHE/ckptfs.log" || true)" -gt "$before" ] && break
        sleep 0.1
    done
    [ "$(grep -c "$RECORDED" "$CACHE/ckptfs.log" || true)" -gt "$before" ] || die "the fork was never recorded"
    grep "$RECORDED" "$CACHE/ckptfs.log" | tail -n 1 | sed -E 's/.*elapsed=([0-9.]+)(m?s).*/\1 \2/' |
        awk '{ print ($2 == "ms") ? $1 / 1000 : $1 }' >>"$RES/record_s"
}
copy_run() {
    mkdir "$MNT/staging/copy-$1"
    settle
    run_begin
    tm copy cp -a "$MNT/$SHA/." "$MNT/staging/copy-$1/"
    record copy_s "$(step_secs copy)"
}
local_run() {
    mkdir "$LOCAL/copy-$1"
    settle
    run_begin
    tm local_copy cp -a "$TREE/." "$LOCAL/copy-$1/"
    record local_copy_s "$(step_secs local_copy)"
}

for run in $(seq 1 "$BENCH_RUNS"); do
    if [ $((run % 2)) = 1 ]; then
        fork_run "$run"; copy_run "$run"; local_run "$run"
        seal_one fork_seal "fork-$run"; seal_one copy_seal "copy-$run"
    else
        local_run "$run"; copy_run "$run"; fork_run "$run"
        seal_one copy_seal "copy-$run"; seal_one fork_seal "fork-$run"
    fi
    log "run $run: fork $(tail -n 1 "$RES/fork_s") s, cp -a into staging $(tail -n 1 "$RES/copy_s") s," \
        "local cp -a $(tail -n 1 "$RES/local_copy_s") s; seals $(tail -n 1 "$RES/fork_seal_s") s" \
        "and $(tail -n 1 "$RES/copy_seal_s") s"
done
unmount_wait "$MNT" "$PID"
# A second full put of the same tree, for the spread (the object is replaced).
rm -f "$STORE/$SHA.tar.gz"
full_put >/dev/null

full="$(med full_s)"
local_copy="$(med local_copy_s)"
echo
echo "### Starting turn N+1 in the mount: \`ckptfs fork\` vs \`cp -a\`, and its seal"
echo
echo "Workspace: $TREE_FILES files, $(human "$TREE_BYTES") (source-like, seed 42), in a local directory" \
    "store; the checkpoint opened and its members primed before the runs. Medians of $BENCH_RUNS runs" \
    "(order alternating); the seals change one file."
echo "Machine: $(machine_line); data on $([ "$BENCH_FS" = fresh ] && echo "a fresh ext4 (loop device, direct I/O: $(cat /sys/block/"$(basename "$DATA_LOOP")"/loop/dio 2>/dev/null || echo "?"))" || echo "the work directory's disk")."
echo
md_header "measurement" "seconds" "ratio" "target"
md_row "\`cp -a TREE/. DIR/\`, same disk" "$(f2 "$local_copy")" "1.00" ""
md_row "\`ckptfs fork MNT <sha256> NAME\`" "$(f2 "$(med fork_s)")" "**$(ratio "$(med fork_s)" "$local_copy")** of the local copy" "≤ 0.5"
md_row "\`cp -a MNT/<sha256>/. MNT/staging/NAME/\`" "$(f2 "$(med copy_s)")" "$(ratio "$(med copy_s)" "$local_copy") of the local copy" ""
md_row "full put of the tree (\`--member-cache-size 0\`)" "$(f2 "$full")" "1.00" ""
md_row "seal of a one-file change after a fork (its files unread but the changed one)" "$(f2 "$(med fork_seal_s)")" "**$(ratio "$(med fork_seal_s)" "$full")** of the full put" "≤ 0.15"
md_row "seal of a one-file change after \`cp -a\` from the checkpoint" "$(f2 "$(med copy_seal_s)")" "$(ratio "$(med copy_seal_s)" "$full") of the full put" ""
echo
echo "The capture that records a fork for its seal ran in the background after each fork, at the lowest" \
    "CPU priority, and the script waited for it: $(xargs <"$RES/record_s") s."
echo
echo "Runs in order (seconds): fork $(xargs <"$RES/fork_s"); cp -a into staging $(xargs <"$RES/copy_s");" \
    "local cp -a $(xargs <"$RES/local_copy_s"); seal after fork $(xargs <"$RES/fork_seal_s");" \
    "seal after cp -a $(xargs <"$RES/copy_seal_s"); full put $(xargs <"$RES/full_s")."
