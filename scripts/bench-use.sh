#!/usr/bin/env bash
# Benchmark: using a mounted turn, and working in staging/, side by side with the same
# work on a local directory (the tree extracted to the disk the cache is on). Every
# row is a ratio ckptfs / local, measured in one run; the per-operation latencies of
# the daemon's .status follow each table, to show where the time goes.
#
#   cold open      mount + ls -lR of a checkpoint never seen (empty cache), against
#                  the one-pass stream a user would write instead:
#                  tee >(sha256sum) <object | tar -xzf - ; ls -lR
#   reading        after the cold open, on the same mount: the first full read
#                  (tar -cf - . | cat), a second grep -r, a second tar -cf, 1,000
#                  random small files read whole (cat), ls -lR; on the default mount,
#                  the read-only mount and (BENCH_PASSTHROUGH=1) the passthrough mount
#                  and (BENCH_SHARED=1) a default mount shared with other users
#   big file       dd bs=1M of a 1 GiB file, first and second pass, per mount kind
#   staging/       tar -xf of the tree, a second grep -r, sed -i on 500 files, rm -rf,
#                  cp -a from a local directory, a 512 MiB sequential write (dd)
#
# Corpora (scripts/lib/gen_corpus.py): repo (source-like, 20,000 files, 150 MiB),
# many (100,000 tiny files), big (one 1 GiB file). The local directory store is used,
# so that the figures are the mount's own, not the store's.
#
# The cache, the staging directory, the store and every local comparison live on one
# filesystem: by default (as root) a fresh ext4 made for the run in a file of the work
# directory (mkfs.ext4 defaults, journal included), so that both sides start from the
# same clean disk. On an ext4 without a journal, as some VM images have, creating
# files soon after many were deleted slows down by several times (ext4 skips inodes
# freed in the last minutes), which would weigh on whichever side comes second.
#
# Environment:
#   BENCH_CORPORA       which corpora, in order (default "repo many big")
#   BENCH_RUNS          runs per measurement; the median is reported (default 3)
#   BENCH_STAGING       corpora whose tree is also worked on in staging/ (default "repo")
#   BENCH_PASSTHROUGH=1 also measure the mount with --passthrough
#   BENCH_SHARED=1      also measure the default mount with --allow-other (which checks
#                       directory opens and private checkpoints' entries in the daemon)
#   BENCH_FS            "fresh" (default as root) or "here" (the work directory's own disk)
#   BENCH_HALT_POLL_NS  on a KVM guest, as root: let idle CPUs poll this long (e.g.
#                       200000) before halting, for the run only (scripts/lib/bench.sh)
#   BENCH_DIR, BENCH_KEEP, CKPTFS_BIN   as for the other benchmarks (scripts/lib/bench.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_CORPORA="${BENCH_CORPORA:-repo many big}"
BENCH_STAGING="${BENCH_STAGING:-repo}"
BENCH_PASSTHROUGH="${BENCH_PASSTHROUGH:-0}"
BENCH_SHARED="${BENCH_SHARED:-0}"
READS=1000
CKPTFS_GLOBAL=(--max-archive-size 2GiB)

bench_init use
bench_deps
bench_data_dir 24G
bench_halt_poll
MNT="$WORK/mnt"
CACHE="$DATA/cache"
LOCAL_DIR="$DATA/local"
STORE="$DATA/store"
TABLE="$WORK/table.md"
LAT="$WORK/latencies.md"
: >"$TABLE"
: >"$LAT"
mkdir -p "$MNT"

row() { md_row "$@" >>"$TABLE"; }

# Seconds a command takes, its output discarded.
secs() {
    local t0 t1
    t0="$(now_ns)"
    "$@" >/dev/null 2>&1 || { echo "command failed: $*" >&2; return 1; }
    t1="$(now_ns)"
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f\n", (b - a) / 1e9 }'
}

# The work of each reading step, on directory $1.
full_read() { tar -cf - -C "$1" . | cat >/dev/null; }
grep_all() { grep -r -c zzqqxx-not-there "$1" >/dev/null || true; }
random_reads() { (cd "$1" && xargs -d '\n' -a "$PICKS" cat >/dev/null); }
list_all() { ls -lR "$1" >/dev/null; }

latencies() {
    {
        echo
        echo "$1:"
        echo '```'
        grep '^# latency' "$MNT/.status" | sed 's/^# latency //'
        echo '```'
    } >>"$LAT"
}

# Cold open of checkpoint $SHA: ckptfs (fresh cache) against the one-pass stream.
cold_open() {
    local mode="$1" s
    rm -rf "$CACHE"
    mount_ckptfs "$STORE" "$MNT" "$CACHE" --cache-size 8GiB "${MODE_ARGS[@]}"
    s="$(secs ls -lR "$MNT/$SHA/")"
    record "${CORPUS}_${mode}_cold" "$s"
}

stream_open() {
    local s
    rm -rf "$LOCAL_DIR/stream"
    mkdir -p "$LOCAL_DIR/stream"
    s="$(secs bash -c "tee >(sha256sum >'$WORK/sum') <'$STORE/$SHA.tar.gz' \
        | tar -xzf - -C '$LOCAL_DIR/stream' && ls -lR '$LOCAL_DIR/stream'")"
    record "${CORPUS}_stream" "$s"
    rm -rf "$LOCAL_DIR/stream"
}

# The reading steps on mount kind $1 (default, ro, passthrough); the mount is up.
reading() {
    local mode="$1" ck="$MNT/$SHA" step
    record "${CORPUS}_${mode}_first" "$(secs full_read "$ck")"
    record "${CORPUS}_ex_first" "$(secs full_read "$EX")"
    grep_all "$ck"
    grep_all "$EX"
    for step in grep_all full_read random_reads list_all; do
        record "${CORPUS}_${mode}_$step" "$(secs "$step" "$ck")"
        record "${CORPUS}_ex_$step" "$(secs "$step" "$EX")"
    done
}

big_reads() {
    local mode="$1" pass
    for pass in 1 2; do
        record "big_${mode}_dd$pass" "$(dd if="$MNT/$SHA/big.bin" of=/dev/null bs=1M 2>&1 \
            | sed -n 's/.* copied, \([0-9.e+-]*\) s, .*/\1/p')"
    done
}

# Work in staging/ against the same work in a local directory, corpus tree $1.
staging_work() {
    local tree="$1" ws="$MNT/staging/w" loc="$LOCAL_DIR/w" list="$WORK/sedlist" kind dir
    mkdir -p "$ws"
    for kind in local staging; do
        dir="$loc"
        [ "$kind" = staging ] && dir="$ws"
        mkdir -p "$dir"
        record "st_${kind}_untar" "$(secs tar -xf "$DATA/tree.tar" -C "$dir")"
        grep_all "$dir"
        record "st_${kind}_grep" "$(secs grep_all "$dir")"
        (cd "$dir" && find . -type f -name '*.py' | sort | sed -n '1,500p') >"$list"
        record "st_${kind}_sed" "$(secs bash -c "cd '$dir' && xargs -a '$list' sed -i s/return/retorn/")"
        record "st_${kind}_rm" "$(secs rm -rf "$dir")"
        mkdir -p "$dir"
        record "st_${kind}_cpa" "$(secs cp -a "$tree/." "$dir/")"
        record "st_${kind}_write" "$(secs dd if=/dev/zero of="$dir/big" bs=1M count=512)"
        rm -rf "$dir"
    done
}

bench_corpus() {
    CORPUS="$1"
    local tree="$DATA/corpus/$CORPUS" run mode modes
    mkdir -p "$DATA/corpus"
    case "$CORPUS" in
        repo) "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$tree" --mb 150 --files 20000 ;;
        many) "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py tiny "$tree" --files 100000 ;;
        big) "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py bigfile "$tree" --mb 1024 ;;
        *) die "unknown corpus $CORPUS" ;;
    esac
    log "$CORPUS: $(wc -l <"$tree.files") files, $(human "$(cat "$tree.bytes")")"
    rm -rf "$STORE"
    "$CKPTFS" "${CKPTFS_GLOBAL[@]}" put "$STORE" "$tree" --member-cache-size 0 \
        --temp-dir "$WORK/tmp" >"$WORK/put.out" 2>"$WORK/put.err" \
        || { cat "$WORK/put.err" >&2; die "ckptfs put failed"; }
    read -r SHA _ <"$WORK/put.out"
    EX="$LOCAL_DIR/$CORPUS"
    rm -rf "$EX"
    mkdir -p "$EX"
    tar -xzf "$STORE/$SHA.tar.gz" -C "$EX"
    PICKS="$WORK/picks"
    if [ "$CORPUS" != big ]; then
        "$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py pick "$tree.files" "$READS" \
            --max-size 524288 >"$PICKS"
    fi
    modes=(default ro)
    [ "$BENCH_PASSTHROUGH" = 1 ] && modes+=(passthrough)
    [ "$BENCH_SHARED" = 1 ] && modes+=(shared)
    for run in $(seq 1 "$BENCH_RUNS"); do
        stream_open
        for mode in "${modes[@]}"; do
            MODE_ARGS=()
            [ "$mode" = ro ] && MODE_ARGS=(--read-only)
            [ "$mode" = passthrough ] && MODE_ARGS=(--passthrough)
            [ "$mode" = shared ] && MODE_ARGS=(--allow-other)
            cold_open "$mode"
            if [ "$CORPUS" = big ]; then
                big_reads "$mode"
            else
                reading "$mode"
            fi
            [ "$run" = "$BENCH_RUNS" ] && latencies "$CORPUS, $mode mount, cold open and reading (run $run)"
            unmount_wait "$MNT" "$CKPT_PID"
        done
        if [ "$CORPUS" = big ]; then
            for pass in 1 2; do
                record "big_ex_dd$pass" "$(dd if="$EX/big.bin" of=/dev/null bs=1M 2>&1 \
                    | sed -n 's/.* copied, \([0-9.e+-]*\) s, .*/\1/p')"
            done
        fi
        log "$CORPUS run $run/$BENCH_RUNS done"
    done
    if [[ " $BENCH_STAGING " == *" $CORPUS "* ]]; then
        tar -cf "$DATA/tree.tar" -C "$tree" .
        for run in $(seq 1 "$BENCH_RUNS"); do
            rm -rf "$CACHE"
            MODE_ARGS=()
            mount_ckptfs "$STORE" "$MNT" "$CACHE"
            staging_work "$tree"
            [ "$run" = "$BENCH_RUNS" ] && latencies "$CORPUS, staging/ work (run $run)"
            unmount_wait "$MNT" "$CKPT_PID"
            log "$CORPUS staging run $run/$BENCH_RUNS done"
        done
        rm -f "$DATA/tree.tar"
    fi
    rows "$CORPUS" "${modes[@]}"
    rm -rf "$tree" "$tree.files" "$tree.bytes" "$EX" "$CACHE" "$STORE"
}

# What each row measures: "step;label;target" (a label may hold "\|", Markdown's |).
READING_ROWS=(
    "first;first full read: tar -cf - . \\| cat (s);≤ 2.5 (ro ≤ 2)"
    "grep_all;second grep -r (s);≤ 1.5 (ro ≤ 1.2)"
    "full_read;second tar -cf (s);≤ 1.5 (ro ≤ 1.2)"
    "random_reads;$READS random small files, cat (s);≤ 2.5 (ro ≤ 2)"
    "list_all;ls -lR (s);≤ 1.3"
)
STAGING_ROWS=(
    "untar;tar -xf of the tree (s);≤ 2"
    "grep;second grep -r (s);≤ 1.5"
    "sed;sed -i on 500 files (s);≤ 2"
    "rm;rm -rf of the tree (s);≤ 2"
    "cpa;cp -a of the tree from a local directory (s);≤ 2"
    "write;512 MiB sequential write, dd bs=1M (s);≤ 1.25"
)

# One row per "step;label;target": the medians of $1STEP (ckptfs) and $2STEP (local),
# under the names $3 (mount kind) and $4 (what it is compared with).
rows_of() {
    local mine="$1" theirs="$2" kind="$3" against="$4" spec step label target v a
    shift 4
    for spec in "$@"; do
        IFS=';' read -r step label target <<<"$spec"
        v="$(med "$mine$step")"; a="$(med "$theirs$step")"
        row "$c" "$kind" "$label" "$(f2 "$v")" "$against" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "$target"
    done
}

# Table rows for corpus $1 and mount kinds $2...
rows() {
    local c="$1" mode v a step label target; shift
    for mode in "$@"; do
        v="$(med "${c}_${mode}_cold")"; a="$(med "${c}_stream")"
        row "$c" "$mode" "cold open: mount + ls -lR (s)" "$(f2 "$v")" "one-pass stream + ls -lR" "$(f2 "$a")" "**$(ratio "$v" "$a")**" "≤ 0.5"
        if [ "$c" = big ]; then
            for pass in 1 2; do
                v="$(mbps 1073741824 "$(med "big_${mode}_dd$pass")")"
                a="$(mbps 1073741824 "$(med "big_ex_dd$pass")")"
                row "$c" "$mode" "dd bs=1M of the 1 GiB file, pass $pass (MiB/s)" "$v" "the extracted file" "$a" "**$(ratio "$v" "$a")**" "≥ 0.9"
            done
            continue
        fi
        rows_of "${c}_${mode}_" "${c}_ex_" "$mode" "the extracted tree" "${READING_ROWS[@]}"
    done
    if [[ " $BENCH_STAGING " == *" $c "* ]]; then
        rows_of st_staging_ st_local_ "staging/" "a local directory" "${STAGING_ROWS[@]}"
    fi
}

for corpus in $BENCH_CORPORA; do
    bench_corpus "$corpus"
done

echo
echo "### Using a turn, and working in staging/, vs a local directory"
echo
echo "Median of $BENCH_RUNS runs, local directory store, release build. Mount kinds:" \
    "default (files opened through the daemon), ro (--read-only: the kernel opens" \
    "files), passthrough (--passthrough), shared (the default mount with --allow-other)." \
    "Local: the tree extracted (tar -xzf) to the disk that holds the cache, read once" \
    "before; staging/ work against the same work in a directory of that disk."
echo "Machine: $(machine_line); data on $([ "$BENCH_FS" = fresh ] && echo "a fresh ext4 (loop device, direct I/O: $(cat /sys/block/"$(basename "$DATA_LOOP")"/loop/dio 2>/dev/null || echo "?"))" || echo "the work directory's disk")."
echo
md_header "corpus" "mount" "measurement" "ckptfs" "local" "local's value" "ratio" "target"
cat "$TABLE"
echo
echo "#### Per-operation latencies (the daemon's .status, last run)"
cat "$LAT"
