#!/usr/bin/env bash
# Benchmark: capture through the mount (SPEC section 4, "Capture through the mount"),
# side by side with what a user would do instead, against a local S3 server (moto):
#   seal:     mv MNT/staging/NAME MNT/commit/      (archive + hash + upload + index)
#     vs      tar -czf - -C DIR . | tee >(sha256sum >sum) >x.tar.gz
#             aws s3 cp x.tar.gz s3://BUCKET/<sha>.tar.gz --metadata sha256=...,size=...
#   reseal:   the same tree sealed again under a new name (found "already present")
#   staging:  cp -a DIR/. MNT/staging/NAME/    vs  cp -a DIR/. LOCALDIR/  (same disk)
#   big file: dd of=MNT/staging/big bs=1M conv=fsync, read back twice with dd,
#             vs the same in LOCALDIR
# on a deterministic source-like tree. Prints Markdown tables on stdout (progress on
# stderr). See BENCHMARKS.md, section 3.
#
# Environment:
#   BENCH_MB      tree size in MiB (default 500)
#   BENCH_FILES   number of files (default 40 per MiB: 20,000 for 500 MiB)
#   BENCH_BIG_MB  size of the large staged file in MiB (default 1024)
#   BENCH_RUNS    runs per measurement; the median is reported (default 3)
#   BENCH_DIR     work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1  keep the work directory
#   CKPTFS_BIN    use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_MB="${BENCH_MB:-500}"
BENCH_FILES="${BENCH_FILES:-$(awk -v m="$BENCH_MB" 'BEGIN { printf "%d", m * 40 }')}"
BENCH_BIG_MB="${BENCH_BIG_MB:-1024}"
CKPTFS_GLOBAL=()

bench_init capture
bench_deps ""
bench_moto

TREE="$WORK/tree"
MNT="$WORK/mnt"
CACHE="$WORK/cache"       # the daemon's cache; staging/ lives in it (same disk as LOCAL)
LOCAL="$WORK/local"       # the local directory the staging writes are compared with
mkdir -p "$MNT"

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_BYTES="$(cat "$TREE.bytes")"
TREE_FILES="$(wc -l <"$TREE.files")"
BIG_BYTES=$((BENCH_BIG_MB * 1048576))
# Both sides start from a tree in the page cache: read it once now.
tar -cf - -C "$TREE" . >/dev/null

# The user's pipeline, archive step: one pass over the tree, hashed on the way out.
# lastpipe runs tee in this shell, so that `wait $!` can wait for the process
# substitution: without it the command may return before sha256sum has written its
# line (and /usr/bin/time would not count its CPU or memory).
# shellcheck disable=SC2016 # expanded by the inner shell
PIPE_ARCHIVE='shopt -s lastpipe; set -o pipefail
tar -czf - -C "$1" . | tee >(sha256sum >"$2") >"$3" || exit
wait $!'

# Flush dirty pages of the work dir's file system, so that a timed write does not pay
# for the previous step's writeback (untimed).
settle() { sync -f "$WORK" 2>/dev/null || sync; }

# dd's own elapsed seconds ("... copied, 1.23 s, ...").
dd_secs() {
    local out
    out="$(dd "$@" 2>&1)" || { echo "$out" >&2; return 1; }
    sed -n 's/.* copied, \([0-9.e+-]*\) s, .*/\1/p' <<<"$out"
}

# Large-file I/O in one directory: write BENCH_BIG_MB MiB with fsync, read it twice.
big_io() {
    local side="$1" f="$2/big"
    settle
    record "${side}_ddw_s" "$(dd_secs if=/dev/zero of="$f" bs=1M count="$BENCH_BIG_MB" conv=fsync)"
    record "${side}_ddr1_s" "$(dd_secs if="$f" of=/dev/null bs=1M)"
    record "${side}_ddr2_s" "$(dd_secs if="$f" of=/dev/null bs=1M)"
    rm -f "$f"
}

# cp -a of the tree into a new directory; records its seconds under KEY.
copy_tree() {
    local key="$1" dest="$2"
    mkdir "$dest"
    settle
    run_begin
    tm cp cp -a "$TREE/." "$dest/"
    record "$key" "$(step_secs cp)"
}

one_ckptfs() {
    local bucket="$1" run="$2"
    local name="ws-$run-$$" again="ws-$run-$$-again"
    local sha sha2 c0 c1 secs meta msha msize
    rm -rf "$CACHE" "$LOCAL"
    mkdir -p "$LOCAL"
    run_begin
    mount_ckptfs "s3://$bucket/ckpt" "$MNT" "$CACHE"
    local pid="$CKPT_PID"

    # --- staging writes vs a local directory (alternating which goes first) --------
    if [ $((run % 2)) = 1 ]; then
        copy_tree ck_cp_s "$MNT/staging/$name"; copy_tree loc_cp_s "$LOCAL/tree"
    else
        copy_tree loc_cp_s "$LOCAL/tree"; copy_tree ck_cp_s "$MNT/staging/$name"
    fi
    rm -rf "$LOCAL/tree"
    if [ "$run" = 1 ]; then
        diff -r -q "$TREE" "$MNT/staging/$name" >&2 || die "the staged copy differs from the tree"
    fi

    # --- the seal --------------------------------------------------------------------
    settle
    HWM_RESET=1
    reset_hwm "$pid" || HWM_RESET=0
    c0="$(proc_cpu "$pid")"
    run_begin
    tm seal mv "$MNT/staging/$name" "$MNT/commit/"
    c1="$(proc_cpu "$pid")"
    secs="$(step_secs seal)"
    record ck_seal_s "$secs"
    record ck_seal_hwm "$(vmhwm "$pid")"
    record ck_seal_cores "$(awk -v a="$c0" -v b="$c1" -v s="$secs" 'BEGIN { printf "%.2f", (b - a) / s }')"
    sha="$(readlink "$MNT/commit/$name")"
    sha="${sha##*/}"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "commit/$name does not link to a checkpoint: '$sha'"
    [ ! -e "$MNT/staging/$name" ] || die "staging/$name is still there after the seal"
    # The object and its metadata, as any reader will see them (untimed).
    meta="$("$AWS" s3api head-object --bucket "$bucket" --key "ckpt/$sha.tar.gz" \
        --query '[ContentLength, Metadata.sha256, Metadata.size]' --output text)"
    read -r CK_SIZE msha msize <<<"$meta"
    if [ "$msha" != "$sha" ] || [ "$msize" != "$CK_SIZE" ]; then
        die "sealed object ckpt/$sha.tar.gz: metadata sha256=$msha size=$msize, length $CK_SIZE"
    fi

    # --- the same tree again: "already present" --------------------------------------
    mkdir "$MNT/staging/$again"
    cp -a "$TREE/." "$MNT/staging/$again/"
    settle
    run_begin
    tm reseal mv "$MNT/staging/$again" "$MNT/commit/"
    record ck_reseal_s "$(step_secs reseal)"
    sha2="$(readlink "$MNT/commit/$again")"
    [ "${sha2##*/}" = "$sha" ] || die "the same tree sealed twice gave $sha and ${sha2##*/}"

    if [ "$run" = 1 ]; then
        diff -r -q "$TREE" "$MNT/$sha" >&2 || die "the sealed checkpoint differs from the tree"
    fi

    # --- large-file I/O in staging vs the local directory ----------------------------
    if [ $((run % 2)) = 1 ]; then
        big_io ck "$MNT/staging"; big_io loc "$LOCAL"
    else
        big_io loc "$LOCAL"; big_io ck "$MNT/staging"
    fi

    unmount_wait "$MNT" "$pid"
    rm -rf "$CACHE" "$LOCAL"
}

one_pipeline() {
    local bucket="$1" run="$2" sha size
    rm -f "$WORK/x.tar.gz" "$WORK/sum.out"
    settle
    run_begin
    tm archive bash -c "$PIPE_ARCHIVE" pipe-archive "$TREE" "$WORK/sum.out" "$WORK/x.tar.gz"
    sha="$(awk '{ print $1 }' "$WORK/sum.out")"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "no digest from the pipeline: '$sha'"
    size="$(stat -c %s "$WORK/x.tar.gz")"
    tm upload "$AWS" s3 cp --only-show-errors "$WORK/x.tar.gz" "s3://$bucket/pipe/$sha.tar.gz" \
        --metadata "sha256=$sha,size=$size"
    read -r s r <<<"$(run_total)"
    record pipe_s "$s"; record pipe_rss "$r"
    record pipe_cores "$(awk -v s="$s" '{ c += $4 } END { printf "%.2f", c / s }' "$STEPS")"
    local st
    for st in archive upload; do
        record "pipe_${st}_s" "$(step_secs "$st")"; record "pipe_${st}_rss" "$(step_rss "$st")"
        record "pipe_${st}_cores" "$(awk -v c="$(step_cpu "$st")" -v s="$(step_secs "$st")" \
            'BEGIN { printf "%.2f", c / s }')"
    done
    if [ "$run" = 1 ]; then
        sha256sum "$WORK/x.tar.gz" | awk '{ print $1 }' | grep -qx "$sha" \
            || die "the pipeline's digest is not the archive's"
    fi
    PIPE_SIZE="$size"
    rm -f "$WORK/x.tar.gz"
}

for run in $(seq 1 "$BENCH_RUNS"); do
    # A fresh bucket per run: the seal must upload, not find the object present.
    bucket="bench-capture-$run-$$"
    "$AWS" s3 mb "s3://$bucket" >/dev/null
    # Alternate which side goes first, so that neither always meets a fresher moto.
    if [ $((run % 2)) = 1 ]; then
        log "run $run/$BENCH_RUNS: ckptfs, then the pipeline"
        one_ckptfs "$bucket" "$run"; one_pipeline "$bucket" "$run"
    else
        log "run $run/$BENCH_RUNS: the pipeline, then ckptfs"
        one_pipeline "$bucket" "$run"; one_ckptfs "$bucket" "$run"
    fi
    # moto keeps objects in memory: drop this run's bucket.
    "$AWS" s3 rb --force "s3://$bucket" >/dev/null
    log "run $run: seal $(tail -n 1 "$RES/ck_seal_s") s (reseal $(tail -n 1 "$RES/ck_reseal_s") s)," \
        "pipeline $(tail -n 1 "$RES/pipe_s") s; cp -a staging $(tail -n 1 "$RES/ck_cp_s") s," \
        "local $(tail -n 1 "$RES/loc_cp_s") s; dd write staging $(tail -n 1 "$RES/ck_ddw_s") s," \
        "local $(tail -n 1 "$RES/loc_ddw_s") s"
done

# --- tables ---------------------------------------------------------------------------
mb="$(human "$TREE_BYTES")"
big="$(human "$BIG_BYTES")"
hwm_note="daemon VmHWM, reset just before the seal"
[ "${HWM_RESET:-0}" = 1 ] || hwm_note="daemon VmHWM since the mount (could not reset it)"

echo
echo "### Capture through the mount vs tar | tee sha256sum + aws s3 cp (moto)"
echo
echo "Tree: $TREE_FILES files, $mb (source-like, seed 42). Archives: ckptfs seal $(human "$CK_SIZE")," \
    "tar -czf $(human "$PIPE_SIZE"). Median of $BENCH_RUNS runs; tree in the page cache;" \
    "fresh bucket, cache dir and mount per run. Ratios are ckptfs / alternative."
echo "Machine: $(machine_line)."
echo
md_header "measurement" "ckptfs" "alternative" "alternative's value" "ratio" "target"
v="$(med ck_seal_s)"; a="$(med pipe_s)"
md_row "seal $mb: \`mv staging/NAME commit/\` (s)" "$(f2 "$v")" \
    "\`tar -czf - \\| tee >(sha256sum) > x.tar.gz\` + \`aws s3 cp\`" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 1"
md_row "seal throughput (MiB/s of tree)" "$(mbps "$TREE_BYTES" "$v")" "the pipeline" \
    "$(mbps "$TREE_BYTES" "$a")" "$(ratio "$(mbps "$TREE_BYTES" "$v")" "$(mbps "$TREE_BYTES" "$a")")" ""
v="$(med ck_seal_hwm)"; a="$(med pipe_rss)"
md_row "seal peak RSS (MiB): $hwm_note" "$(mib "$v")" "largest pipeline step (%M)" "$(mib "$a")" "$(ratio "$v" "$a")" ""
v="$(med ck_seal_cores)"; a="$(med pipe_cores)"
md_row "seal CPU: cores busy (daemon utime+stime / wall)" "$(f2 "$v")" "pipeline CPU (user+sys) / wall" \
    "$(f2 "$a")" "$(ratio "$v" "$a")" ""
v="$(med ck_reseal_s)"; a="$(med pipe_archive_s)"
md_row "reseal, already present (s): same tree, new name" "$(f2 "$v")" \
    "the pipeline's archive + hash step alone (no upload)" "$(f2 "$a")" "$(ratio "$v" "$a")" ""
v="$(mbps "$TREE_BYTES" "$(med ck_cp_s)")"; a="$(mbps "$TREE_BYTES" "$(med loc_cp_s)")"
md_row "\`cp -a DIR/. staging/NAME/\` (MiB/s)" "$v" "\`cp -a DIR/. LOCALDIR/\` (same disk)" "$a" "**$(ratio "$v" "$a")**" "≥ 0.5"
v="$(mbps "$BIG_BYTES" "$(med ck_ddw_s)")"; a="$(mbps "$BIG_BYTES" "$(med loc_ddw_s)")"
md_row "write $big to staging/big (MiB/s, dd bs=1M conv=fsync)" "$v" "the same in LOCALDIR" "$a" "**$(ratio "$v" "$a")**" "≈ 1"
v="$(mbps "$BIG_BYTES" "$(med ck_ddr1_s)")"; a="$(mbps "$BIG_BYTES" "$(med loc_ddr1_s)")"
md_row "read staging/big, pass 1 (MiB/s, dd bs=1M)" "$v" "the same in LOCALDIR" "$a" "**$(ratio "$v" "$a")**" "≈ 1"
v="$(mbps "$BIG_BYTES" "$(med ck_ddr2_s)")"; a="$(mbps "$BIG_BYTES" "$(med loc_ddr2_s)")"
md_row "read staging/big, pass 2 (MiB/s, dd bs=1M)" "$v" "the same in LOCALDIR" "$a" "**$(ratio "$v" "$a")**" "≈ 1"
echo
echo "Seconds behind the rates (median): cp -a staging $(f2 "$(med ck_cp_s)"), local $(f2 "$(med loc_cp_s)");" \
    "dd write staging $(f2 "$(med ck_ddw_s)"), local $(f2 "$(med loc_ddw_s)")."
echo
echo "Pipeline steps (median):"
echo
md_header "step" "seconds" "peak RSS MiB" "cores busy"
for st in archive upload; do
    md_row "$st" "$(f2 "$(med "pipe_${st}_s")")" "$(mib "$(med "pipe_${st}_rss")")" "$(f2 "$(med "pipe_${st}_cores")")"
done
