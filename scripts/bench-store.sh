#!/usr/bin/env bash
# Benchmark: `ckptfs put` / `ckptfs get` against a local S3 server (moto), side by side
# with what a user would do instead:
#   put:  tar -czf x.tar.gz -C DIR . && sha256sum x.tar.gz &&
#         aws s3 cp x.tar.gz s3://BUCKET/<sha>.tar.gz --metadata sha256=...,size=...
#   get:  aws s3 cp s3://BUCKET/<sha>.tar.gz y.tar.gz && sha256sum y.tar.gz &&
#         tar -xzf y.tar.gz -C EMPTY_DIR
# on a deterministic source-like tree. Prints Markdown tables on stdout (progress on
# stderr). See BENCHMARKS.md.
#
# Environment:
#   BENCH_MB     tree size in MiB (default 500)
#   BENCH_FILES  number of files (default 40 per MiB: 20,000 for 500 MiB)
#   BENCH_RUNS   runs per measurement; the median is reported (default 3)
#   BENCH_DIR    work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1 keep the work directory
#   CKPTFS_BIN   use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

BENCH_MB="${BENCH_MB:-500}"
BENCH_FILES="${BENCH_FILES:-$(awk -v m="$BENCH_MB" 'BEGIN { printf "%d", m * 40 }')}"
CKPTFS_GLOBAL=()

bench_init store
bench_deps store
bench_moto

TREE="$WORK/tree"
log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_BYTES="$(cat "$TREE.bytes")"
TREE_FILES="$(wc -l <"$TREE.files")"
# Both sides start from a tree in the page cache: read it once now.
tar -cf - -C "$TREE" . >/dev/null

TMPD="$WORK/tmp"

one_ckptfs() {
    local bucket="$1" run="$2" sha
    run_begin
    tm put "$CKPTFS" put "s3://$bucket/ckpt" "$TREE" --temp-dir "$TMPD" >"$WORK/put.out" 2>"$WORK/put.err" \
        || { cat "$WORK/put.err" >&2; return 1; }
    read -r sha CK_SIZE <"$WORK/put.out"
    read -r s r <<<"$(run_total)"
    record ck_put_s "$s"; record ck_put_rss "$r"

    rm -rf "$WORK/dest"
    run_begin
    tm get "$CKPTFS" get "s3://$bucket/ckpt" "$sha" "$WORK/dest" --temp-dir "$TMPD" 2>"$WORK/get.err" \
        || { cat "$WORK/get.err" >&2; return 1; }
    read -r s r <<<"$(run_total)"
    record ck_get_s "$s"; record ck_get_rss "$r"
    if [ "$run" = 1 ]; then
        diff -r -q "$TREE" "$WORK/dest" >&2 || die "ckptfs get did not restore the tree"
    fi
    rm -rf "$WORK/dest"
}

one_pipeline() {
    local bucket="$1" run="$2" sha size got
    rm -f "$WORK/x.tar.gz"
    run_begin
    tm tar tar -czf "$WORK/x.tar.gz" -C "$TREE" .
    tm sha256sum sha256sum "$WORK/x.tar.gz" >"$WORK/sum.out"
    sha="$(awk '{ print $1 }' "$WORK/sum.out")"
    size="$(stat -c %s "$WORK/x.tar.gz")"
    tm upload "$AWS" s3 cp --only-show-errors "$WORK/x.tar.gz" "s3://$bucket/pipe/$sha.tar.gz" \
        --metadata "sha256=$sha,size=$size"
    read -r s r <<<"$(run_total)"
    record pipe_put_s "$s"; record pipe_put_rss "$r"
    for st in tar sha256sum upload; do
        record "pipe_put_${st}_s" "$(step_secs "$st")"; record "pipe_put_${st}_rss" "$(step_rss "$st")"
    done
    PIPE_SIZE="$size"
    rm -f "$WORK/x.tar.gz"

    rm -rf "$WORK/dest2" "$WORK/y.tar.gz"
    mkdir "$WORK/dest2"
    run_begin
    tm download "$AWS" s3 cp --only-show-errors "s3://$bucket/pipe/$sha.tar.gz" "$WORK/y.tar.gz"
    tm sha256sum sha256sum "$WORK/y.tar.gz" >"$WORK/sum.out"
    got="$(awk '{ print $1 }' "$WORK/sum.out")"
    [ "$got" = "$sha" ] || die "downloaded archive does not hash to its name"
    tm untar tar -xzf "$WORK/y.tar.gz" -C "$WORK/dest2"
    read -r s r <<<"$(run_total)"
    record pipe_get_s "$s"; record pipe_get_rss "$r"
    for st in download sha256sum untar; do
        record "pipe_get_${st}_s" "$(step_secs "$st")"; record "pipe_get_${st}_rss" "$(step_rss "$st")"
    done
    if [ "$run" = 1 ]; then
        diff -r -q "$TREE" "$WORK/dest2" >&2 || die "the pipeline did not restore the tree"
    fi
    rm -rf "$WORK/dest2" "$WORK/y.tar.gz"
}

for run in $(seq 1 "$BENCH_RUNS"); do
    bucket="bench-store-$run-$$"
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
    log "run $run: ckptfs put $(tail -n 1 "$RES/ck_put_s") s, get $(tail -n 1 "$RES/ck_get_s") s;" \
        "pipeline put $(tail -n 1 "$RES/pipe_put_s") s, get $(tail -n 1 "$RES/pipe_get_s") s"
done

row() {
    local op="$1" k="$2" cs cr ps pr
    cs="$(med "ck_${k}_s")"; cr="$(med "ck_${k}_rss")"
    ps="$(med "pipe_${k}_s")"; pr="$(med "pipe_${k}_rss")"
    md_row "$op" "$(f2 "$cs")" "$(f2 "$ps")" "**$(ratio "$cs" "$ps")**" \
        "$(mbps "$TREE_BYTES" "$cs")" "$(mbps "$TREE_BYTES" "$ps")" \
        "$(mib "$cr")" "$(mib "$pr")" "$(ratio "$cr" "$pr")"
}

echo
echo "### ckptfs put/get vs tar + sha256sum + aws s3 cp (moto)"
echo
echo "Tree: $TREE_FILES files, $(human "$TREE_BYTES") (source-like, seed 42)." \
    "Archives: ckptfs $(human "$CK_SIZE"), tar -czf $(human "$PIPE_SIZE")." \
    "Median of $BENCH_RUNS runs; tree in the page cache; fresh bucket per run."
echo "Machine: $(machine_line)."
echo
md_header "operation" "ckptfs s" "pipeline s" "time ratio ckptfs/pipeline" "ckptfs MiB/s" "pipeline MiB/s" \
    "ckptfs peak RSS MiB" "pipeline peak RSS MiB (largest step)" "RSS ratio"
row "put (tree → S3)" put
row "get (S3 → tree)" get
echo
echo "Pipeline steps (median seconds / peak RSS MiB):"
echo
md_header "step" "seconds" "peak RSS MiB"
for st in tar sha256sum upload; do
    md_row "put: $st" "$(f2 "$(med "pipe_put_${st}_s")")" "$(mib "$(med "pipe_put_${st}_rss")")"
done
for st in download sha256sum untar; do
    md_row "get: $st" "$(f2 "$(med "pipe_get_${st}_s")")" "$(mib "$(med "pipe_get_${st}_rss")")"
done
