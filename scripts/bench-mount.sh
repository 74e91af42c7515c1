#!/usr/bin/env bash
# Benchmark: the read-only mount (`ckptfs mount`), side by side with what a user would
# do instead: download + sha256sum + tar -xzf and work on the extracted directory, or
# mount the .tar.gz with ratarmount. Three corpora:
#   source  a source-like tree (default 20,000 files, 150 MiB)
#   big     one file of random data (default 1 GiB)
#   tiny    many tiny files (default 100,000)
# Each is put once into a local directory store and into S3 (moto). Prints one
# Markdown table on stdout (progress on stderr). See BENCHMARKS.md.
#
# Environment:
#   BENCH_CORPORA     which corpora, in order (default "source big tiny")
#   BENCH_SRC_MB      source tree size in MiB (default 150)
#   BENCH_SRC_FILES   source tree file count (default 20000)
#   BENCH_BIG_MB      size of the single file in MiB (default 1024)
#   BENCH_TINY_FILES  number of tiny files (default 100000)
#   BENCH_READS       random small-file reads per pass (default 1000)
#   BENCH_RUNS        runs per measurement; the median is reported (default 3)
#   BENCH_DIR         work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1      keep the work directory
#   CKPTFS_BIN        use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_CORPORA="${BENCH_CORPORA:-source big tiny}"
BENCH_SRC_MB="${BENCH_SRC_MB:-150}"
BENCH_SRC_FILES="${BENCH_SRC_FILES:-20000}"
BENCH_BIG_MB="${BENCH_BIG_MB:-1024}"
BENCH_TINY_FILES="${BENCH_TINY_FILES:-100000}"
BENCH_READS="${BENCH_READS:-1000}"
# A 1 GiB file of random data compresses to slightly more than 1 GiB, over the
# default archive limit (--max-archive-size 1GiB): raise it for this benchmark.
CKPTFS_GLOBAL=(--max-archive-size "$((BENCH_BIG_MB + 1024))MiB")
CACHE_SIZE=64GiB

bench_init mount
bench_deps ratarmount
bench_moto
BUCKET="bench-mount-$$"
"$AWS" s3 mb "s3://$BUCKET" >/dev/null

MNT="$WORK/mnt"
RMNT="$WORK/rmnt"
EX="$WORK/extracted"
DL="$WORK/download.tar.gz"
CACHE="$WORK/cache"
RM_INDEX="$WORK/ratarmount.index.sqlite"
mkdir -p "$MNT" "$RMNT"

TABLE="$WORK/table.md"
: >"$TABLE"
# Table rows: the first row of a corpus names it in full, later rows by its short name.
TROW_LAST=""
trow() {
    local label="$1"; shift
    if [ "$label" = "$TROW_LAST" ]; then
        md_row "$CORPUS" "$@" >>"$TABLE"
    else
        md_row "**$label**" "$@" >>"$TABLE"
        TROW_LAST="$label"
    fi
}

# dd's own elapsed seconds for reading a file to the end.
dd_secs() {
    dd if="$1" of=/dev/null bs=1M 2>&1 | sed -n 's/.* copied, \([0-9.e+-]*\) s, .*/\1/p'
}

RM_PID=""
# Start ratarmount in the foreground (in the background of this shell) and wait
# until its mount is up; RM_MOUNT_S is the time that took (index build included).
ratarmount_start() {
    local t0 t1
    t0="$(now_ns)"
    /usr/bin/time -f '%e %M' -o "$WORK/ratarmount.time" \
        "$RATARMOUNT" -f --index-file "$RM_INDEX" "$DL" "$RMNT" >"$WORK/ratarmount.log" 2>&1 &
    RM_PID=$!
    BENCH_PIDS+=("$RM_PID")
    BENCH_MOUNTS+=("$RMNT")
    until mountpoint -q "$RMNT"; do
        if ! kill -0 "$RM_PID" 2>/dev/null; then
            cat "$WORK/ratarmount.log" >&2
            die "ratarmount exited before mounting"
        fi
        sleep 0.01
    done
    t1="$(now_ns)"
    RM_MOUNT_S="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", (b - a) / 1e9 }')"
}

# Unmount ratarmount and wait for it; RM_RSS is its peak RSS (KiB) over its life.
ratarmount_stop() {
    unmount_wait "$RMNT"
    wait "$RM_PID" 2>/dev/null || true
    _forget_pid "$RM_PID"
    RM_RSS="$(tail -n 1 "$WORK/ratarmount.time" | awk '{ print $2 }')"
}

# One cold pass with ckptfs: fresh cache, mount, ls -lR of the checkpoint.
# Leaves the mount up when $3 is "keep".
cold_ckptfs() {
    local store_kind="$1" store="$2" keep="${3:-}" s r
    rm -rf "$CACHE"
    run_begin
    mount_ckptfs "$store" "$MNT" "$CACHE" --cache-size "$CACHE_SIZE"
    tm ls ls -lR "$MNT/$SHA/" >/dev/null
    read -r s r <<<"$(run_total)"
    record "ck_cold_${store_kind}_s" "$s"
    record "ck_mountcmd_${store_kind}_s" "$(step_secs mount)"
    record "ck_hwm_${store_kind}" "$(vmhwm "$CKPT_PID")"
    log "  ckptfs $store_kind steps (label s rss_kib): $(paste -sd' ' "$STEPS")"
    if [ "$keep" != keep ]; then
        unmount_wait "$MNT" "$CKPT_PID"
        rm -rf "$CACHE"
    fi
}

# One cold pass of the pipeline: (download +) sha256sum + tar -xzf + ls -lR.
cold_pipeline() {
    local store_kind="$1" archive got s r
    rm -rf "$EX" "$DL"
    mkdir "$EX"
    run_begin
    if [ "$store_kind" = s3 ]; then
        tm download "$AWS" s3 cp --only-show-errors "s3://$BUCKET/$CORPUS/$SHA.tar.gz" "$DL"
        archive="$DL"
    else
        archive="$LOCAL/$SHA.tar.gz"
    fi
    tm sha256sum sha256sum "$archive" >"$WORK/sum.out"
    got="$(awk '{ print $1 }' "$WORK/sum.out")"
    [ "$got" = "$SHA" ] || die "archive does not hash to its name"
    tm untar tar -xzf "$archive" -C "$EX"
    tm ls ls -lR "$EX" >/dev/null
    read -r s r <<<"$(run_total)"
    record "pipe_cold_${store_kind}_s" "$s"
    record "pipe_cold_${store_kind}_rss" "$r"
    log "  pipeline $store_kind steps (label s rss_kib): $(paste -sd' ' "$STEPS")"
}

bench_corpus() {
    CORPUS="$1"
    local tree="$WORK/corpus/$CORPUS" desc run sk
    mkdir -p "$WORK/corpus"
    case "$CORPUS" in
        source)
            log "generating corpus source: $BENCH_SRC_FILES files, $BENCH_SRC_MB MiB"
            "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$tree" \
                --mb "$BENCH_SRC_MB" --files "$BENCH_SRC_FILES" ;;
        big)
            log "generating corpus big: one $BENCH_BIG_MB MiB file"
            "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py bigfile "$tree" --mb "$BENCH_BIG_MB" ;;
        tiny)
            log "generating corpus tiny: $BENCH_TINY_FILES files"
            "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py tiny "$tree" --files "$BENCH_TINY_FILES" ;;
        *) die "unknown corpus $CORPUS" ;;
    esac
    local bytes files
    bytes="$(cat "$tree.bytes")"
    files="$(wc -l <"$tree.files")"

    LOCAL="$WORK/stores/$CORPUS"
    local s3="s3://$BUCKET/$CORPUS" sha2 size
    log "$CORPUS: ckptfs put into the local store and S3"
    "$CKPTFS" "${CKPTFS_GLOBAL[@]}" put "$LOCAL" "$tree" --temp-dir "$WORK/tmp" >"$WORK/put.out" 2>"$WORK/put.err" \
        || { cat "$WORK/put.err" >&2; die "ckptfs put failed"; }
    read -r SHA size <"$WORK/put.out"
    "$CKPTFS" "${CKPTFS_GLOBAL[@]}" put "$s3" "$tree" --temp-dir "$WORK/tmp" >"$WORK/put.out" 2>"$WORK/put.err" \
        || { cat "$WORK/put.err" >&2; die "ckptfs put failed"; }
    read -r sha2 _ <"$WORK/put.out"
    [ "$SHA" = "$sha2" ] || die "the two puts of $CORPUS gave different digests"
    desc="$CORPUS: $files files, $(human "$bytes"), archive $(human "$size")"
    log "$desc, sha256 $SHA"

    # --- cold: first access --------------------------------------------------------
    for run in $(seq 1 "$BENCH_RUNS"); do
        for sk in local s3; do
            local store="$LOCAL" keep=""
            [ "$sk" = s3 ] && store="$s3"
            # The last S3 run leaves its mount and extracted directory for the warm tests.
            [ "$sk" = s3 ] && [ "$run" = "$BENCH_RUNS" ] && keep=keep
            if [ $((run % 2)) = 1 ]; then
                cold_ckptfs "$sk" "$store" "$keep"; cold_pipeline "$sk"
            else
                cold_pipeline "$sk"; cold_ckptfs "$sk" "$store" "$keep"
            fi
        done
        log "$CORPUS cold run $run/$BENCH_RUNS: ckptfs local $(tail -n 1 "$RES/ck_cold_local_s") s," \
            "s3 $(tail -n 1 "$RES/ck_cold_s3_s") s; pipeline local $(tail -n 1 "$RES/pipe_cold_local_s") s," \
            "s3 $(tail -n 1 "$RES/pipe_cold_s3_s") s"
    done
    local pid="$CKPT_PID" ck="$MNT/$SHA"

    # --- warm: second and later passes on the same mount ----------------------------
    for run in $(seq 1 "$BENCH_RUNS"); do
        run_begin; tm find find "$ck" >/dev/null; record ck_find_s "$(run_total | cut -d' ' -f1)"
        run_begin; tm find find "$EX" >/dev/null; record ex_find_s "$(run_total | cut -d' ' -f1)"
        run_begin; tm ls ls -lR "$ck" >/dev/null; record ck_lslr_s "$(run_total | cut -d' ' -f1)"
        run_begin; tm ls ls -lR "$EX" >/dev/null; record ex_lslr_s "$(run_total | cut -d' ' -f1)"
    done
    if [ "$CORPUS" = big ]; then
        local pass
        for pass in 1 2; do
            record ck_dd${pass}_s "$(dd_secs "$ck/big.bin")"
            record ex_dd${pass}_s "$(dd_secs "$EX/big.bin")"
        done
    fi
    local picks="$WORK/picks"
    if [ "$CORPUS" != big ]; then
        "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py pick "$tree.files" "$BENCH_READS" \
            --max-size 524288 >"$picks"
        for run in $(seq 1 "$BENCH_RUNS"); do
            run_begin; (cd "$ck" && tm reads xargs -d '\n' -a "$picks" cat >/dev/null)
            record ck_reads_s "$(run_total | cut -d' ' -f1)"
            run_begin; (cd "$EX" && tm reads xargs -d '\n' -a "$picks" cat >/dev/null)
            record ex_reads_s "$(run_total | cut -d' ' -f1)"
        done
    fi
    record ck_hwm_after "$(vmhwm "$pid")"
    unmount_wait "$MNT" "$pid"

    # --- restart: mount again over the kept cache -----------------------------------
    for run in $(seq 1 "$BENCH_RUNS"); do
        run_begin
        mount_ckptfs "$s3" "$MNT" "$CACHE" --cache-size "$CACHE_SIZE"
        tm ls ls -lR "$ck/" >/dev/null
        record ck_restart_s "$(run_total | cut -d' ' -f1)"
        if [ "$run" = "$BENCH_RUNS" ]; then
            log "$CORPUS: checking the mount against the extracted tree (diff -r)"
            diff -r -q "$ck" "$EX" >&2 || die "the mount differs from tar -xzf's tree"
        fi
        unmount_wait "$MNT" "$CKPT_PID"
    done

    # --- ratarmount on the downloaded archive ---------------------------------------
    for run in $(seq 1 "$BENCH_RUNS"); do
        rm -f "$RM_INDEX"
        ratarmount_start
        record rm_mount_s "$RM_MOUNT_S"
        run_begin; tm ls ls -lR "$RMNT/" >/dev/null; record rm_lslr1_s "$(run_total | cut -d' ' -f1)"
        record rm_first_s "$(awk -v a="$RM_MOUNT_S" -v b="$(run_total | cut -d' ' -f1)" 'BEGIN { print a + b }')"
        if [ "$run" = 1 ]; then
            if [ "$CORPUS" != big ]; then
                for _ in $(seq 1 "$BENCH_RUNS"); do
                    run_begin; (cd "$RMNT" && tm reads xargs -d '\n' -a "$picks" cat >/dev/null)
                    record rm_reads_s "$(run_total | cut -d' ' -f1)"
                done
            else
                record rm_dd_s "$(dd_secs "$RMNT/big.bin")"
            fi
        fi
        ratarmount_stop
        record rm_rss "$RM_RSS"
    done
    for run in $(seq 1 "$BENCH_RUNS"); do
        ratarmount_start
        run_begin; tm ls ls -lR "$RMNT/" >/dev/null
        record rm_remount_s "$(awk -v a="$RM_MOUNT_S" -v b="$(run_total | cut -d' ' -f1)" 'BEGIN { print a + b }')"
        ratarmount_stop
    done

    # --- rows ------------------------------------------------------------------------
    local c v a
    c="$desc"
    v="$(med ck_cold_local_s)"; a="$(med pipe_cold_local_s)"
    trow "$c" "cold, local store: mount + ls -lR (s)" "$(f2 "$v")" "sha256sum + tar -xzf + ls -lR" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 0.8"
    v="$(med ck_cold_s3_s)"; a="$(med pipe_cold_s3_s)"
    trow "$c" "cold, S3: mount + ls -lR (s)" "$(f2 "$v")" "aws s3 cp + sha256sum + tar -xzf + ls -lR" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 0.8"
    v="$(med ck_hwm_local)"; a="$(med pipe_cold_local_rss)"
    trow "$c" "peak RSS, cold local (MiB): daemon VmHWM after first access" "$(mib "$v")" "largest pipeline step" "$(mib "$a")" "$(ratio "$v" "$a")" ""
    v="$(med ck_hwm_s3)"; a="$(med pipe_cold_s3_rss)"
    trow "$c" "peak RSS, cold S3 (MiB): daemon VmHWM after first access" "$(mib "$v")" "largest pipeline step" "$(mib "$a")" "$(ratio "$v" "$a")" ""
    v="$(med ck_find_s)"; a="$(med ex_find_s)"
    trow "$c" "warm: find (s)" "$(f2 "$v")" "find on the extracted dir" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 1.5"
    v="$(med ck_lslr_s)"; a="$(med ex_lslr_s)"
    trow "$c" "warm: ls -lR (s)" "$(f2 "$v")" "ls -lR on the extracted dir" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 1.5"
    if [ "$CORPUS" = big ]; then
        local pass
        for pass in 1 2; do
            v="$(mbps "$bytes" "$(med ck_dd${pass}_s)")"; a="$(mbps "$bytes" "$(med ex_dd${pass}_s)")"
            trow "$c" "cat big.bin, pass $pass (MiB/s, dd bs=1M)" "$v" "the extracted file" "$a" "**$(ratio "$v" "$a")**" "≥ 0.9"
        done
        v="$(mbps "$bytes" "$(med ck_dd1_s)")"; a="$(mbps "$bytes" "$(med rm_dd_s)")"
        trow "$c" "cat big.bin, pass 1 (MiB/s, dd bs=1M)" "$v" "ratarmount, first read" "$a" "$(ratio "$v" "$a")" ""
    else
        v="$(med ck_reads_s)"; a="$(med rm_reads_s)"
        trow "$c" "$BENCH_READS random small-file reads (s)" "$(f2 "$v")" "ratarmount" "$(f2 "$a")" "**$(ratio "$v" "$a")**" ""
        a="$(med ex_reads_s)"
        trow "$c" "$BENCH_READS random small-file reads (s)" "$(f2 "$v")" "the extracted dir" "$(f2 "$a")" "$(ratio "$v" "$a")" ""
    fi
    v="$(med ck_mountcmd_local_s)"; a="$(med rm_mount_s)"
    trow "$c" "mount command, local archive (s)" "$(f2 "$v")" "ratarmount first mount (builds its index)" "$(f2 "$a")" "$(ratio "$v" "$a")" ""
    v="$(med ck_cold_local_s)"; a="$(med rm_first_s)"
    trow "$c" "first mount + ls -lR, local archive (s)" "$(f2 "$v")" "ratarmount first mount + ls -lR" "$(f2 "$a")" "$(ratio "$v" "$a")" ""
    v="$(med ck_restart_s)"; a="$(med rm_remount_s)"
    trow "$c" "remount over the kept cache + ls -lR (s)" "$(f2 "$v")" "ratarmount remount with its index + ls -lR" "$(f2 "$a")" "$(ratio "$v" "$a")" ""
    v="$(med ck_hwm_after)"; a="$(med rm_rss)"
    trow "$c" "peak RSS over the whole session (MiB)" "$(mib "$v")" "ratarmount" "$(mib "$a")" "$(ratio "$v" "$a")" ""

    # Free disk and moto's memory before the next corpus.
    rm -rf "$tree" "$tree.files" "$tree.bytes" "$LOCAL" "$EX" "$DL" "$CACHE" "$RM_INDEX" "$picks"
    "$AWS" s3 rm --recursive --only-show-errors "$s3/" >/dev/null
    rm -f "$RES"/*
}

for corpus in $BENCH_CORPORA; do
    bench_corpus "$corpus"
done

echo
echo "### ckptfs mount vs download + tar -xzf, and vs ratarmount"
echo
echo "Median of $BENCH_RUNS runs. Cold: fresh cache dir, fresh mount (ckptfs) / fresh" \
    "download and extraction (pipeline); the archive is in the page cache (local store)" \
    "or in moto's memory (S3) for both. Warm: later passes on the same mount / the same" \
    "extracted dir. Ratios are ckptfs / alternative."
echo "Machine: $(machine_line)."
echo
md_header "corpus" "measurement" "ckptfs" "alternative" "alternative's value" "ratio" "target"
cat "$TABLE"
