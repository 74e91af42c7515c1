#!/usr/bin/env bash
# Benchmark: what `put` of turn N+1 costs where the store is not the bottleneck (a
# local directory store on the work directory's disk). A workspace is captured, then
# changed in BENCH_TURNS turns, each editing about 1% of its files and adding and
# removing 3 (scripts/lib/turns.sh), and one more turn whose changes sit together.
# Side by side, in one run, for each turn:
#   turn      ckptfs put with the member cache and records of the turns before
#   full      ckptfs put --member-cache-size 0 of the same tree (every file read,
#             every member compressed: what a put costs with no earlier work)
#   pipeline  tar -czf - | tee >(sha256sum) > STORE/x.tar.gz (s3s-fs: to a local
#             file, then aws s3 cp)
# and the share of the tree's bytes the turn's put read (from its log: the bytes it
# left unread as the last capture saw them, and those it read after all). The digests
# of turn and full must be equal. Prints Markdown on stdout (progress on stderr); see
# BENCHMARKS.md, section 6.
#
# Environment: BENCH_MB (default 300), BENCH_FILES (6000), BENCH_TURNS (5), BENCH_DIR,
# BENCH_KEEP=1, CKPTFS_BIN (as scripts/bench-turns.sh); BENCH_SETTLE, the turns' puts'
# --settle (default: put's own, 60 s, so that a turn also reads again the files the
# turns of the last minute changed; the turns here come seconds apart);
# BENCH_STORE=s3s: the store is s3s-fs on 127.0.0.1 (as the tests' second server:
# built into REPO/.tmp/tools once), which copies parts in the store; the time a put
# spends reading back an object whose copied parts only an MD5 vouched for is shown
# apart (s3s-fs 0.17 gives their SHA-256, so none is read back there).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
# shellcheck source=scripts/lib/turns.sh
source scripts/lib/turns.sh

BENCH_MB="${BENCH_MB:-300}"
BENCH_FILES="${BENCH_FILES:-6000}"
BENCH_TURNS="${BENCH_TURNS:-5}"

bench_init put
bench_deps ""

TREE="$WORK/tree"
TMPD="$WORK/tmp"
mkdir -p "$TMPD"
if [ "${BENCH_STORE:-local}" = s3s ]; then
    bench_s3s
    BUCKET="bench-put-$$"
    "$AWS" s3 mb "s3://$BUCKET" >/dev/null
    STORE="s3://$BUCKET/ckpt"
    STORE_NAME="s3s-fs on 127.0.0.1"
else
    STORE="$WORK/store"
    mkdir -p "$STORE"
    STORE_NAME="a local directory store"
fi
remove_object() {
    case "$STORE" in
        s3://*) "$AWS" s3 rm --only-show-errors "$STORE/$1" ;;
        *) rm -f "$STORE/$1" ;;
    esac
}
# Seconds between the first log lines matching two patterns (RFC 3339 times).
between() {
    local a b
    a="$(grep -m1 -- "$1" "$3" | cut -d' ' -f1)"
    b="$(grep -m1 -- "$2" "$3" | cut -d' ' -f1)"
    if [ -z "$a" ] || [ -z "$b" ]; then echo 0; return; fi
    awk -v a="$(date -d "$a" +%s.%N)" -v b="$(date -d "$b" +%s.%N)" 'BEGIN { printf "%.4f", b - a }'
}

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_FILES="$(wc -l <"$TREE.files")"
# A workspace's files are older than the seconds in which a put reads a file whatever
# its stamp says (the generator just set every file's times).
sleep "$(( ${BENCH_SETTLE:-60} + 2 ))"

settle() { sync -f "$WORK" 2>/dev/null || sync; }
file_bytes() { find "$TREE" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }
logged() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" "$2" | tail -n 1; }

# ckptfs put; KEY's seconds are recorded, the digest printed. Extra arguments go to put.
ck_put() {
    local key="$1" sha
    shift
    settle
    run_begin
    tm "$key" "$CKPTFS" -v put "$STORE" "$TREE" --temp-dir "$TMPD" "$@" \
        >"$WORK/put.out" 2>"$WORK/put.err" || { cat "$WORK/put.err" >&2; die "put failed"; }
    record "${key}_s" "$(step_secs "$key")"
    sha="$(awk '{ print $1 }' "$WORK/put.out")"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "put gave no digest"
    echo "$sha"
}

# A turn's put with the cache of the turns before, and what it read.
turn_put() {
    local key="$1" sha bytes unread again
    bytes="$(file_bytes)"
    sha="$(ck_put "$key" --cache-dir "$WORK/cache" ${BENCH_SETTLE:+--settle "$BENCH_SETTLE"})"
    unread="$(logged unread "$WORK/put.err")"
    again="$(logged read_again "$WORK/put.err")"
    record "${key}_read" "$(awk -v b="$bytes" -v u="${unread:-0}" -v a="${again:-0}" 'BEGIN { printf "%.4f", (b - u + a) / b }')"
    record "${key}_compressed" "$(logged compressed "$WORK/put.err")"
    record "${key}_reused" "$(logged reused "$WORK/put.err")"
    record "${key}_readback" "$(between "reading back an object" "outcome=stored" "$WORK/put.err")"
    echo "$sha"
}

full_put() {
    local sha="$1" full
    # The turn's put stored the object: remove it so that the full put stores it too.
    remove_object "$sha.tar.gz"
    full="$(ck_put full --member-cache-size 0)"
    [ "$full" = "$sha" ] || die "the records changed the digest ($sha vs $full)"
}

# shellcheck disable=SC2016 # expanded by the inner shell
PIPE='shopt -s lastpipe; set -o pipefail
tar -czf - -C "$1" . | tee >(sha256sum >"$2") >"$3" || exit
wait $!'
pipeline() {
    settle
    run_begin
    case "$STORE" in
        s3://*)
            tm pipe bash -c "$PIPE" pipe "$TREE" "$WORK/sum.out" "$WORK/pipe.tar.gz"
            tm upload "$AWS" s3 cp --only-show-errors "$WORK/pipe.tar.gz" "$STORE/pipe.tar.gz"
            rm -f "$WORK/pipe.tar.gz"
            ;;
        *) tm pipe bash -c "$PIPE" pipe "$TREE" "$WORK/sum.out" "$STORE/pipe.tar.gz" ;;
    esac
    record pipe_s "$(run_total | awk '{ print $1 }')"
    remove_object pipe.tar.gz
}

log "turn 0: first capture"
turn_put first >/dev/null
# Nothing changed since: what a put costs that only confirms the tree.
sha="$(turn_put same)"
full_put "$sha"
for turn in $(seq 1 "$BENCH_TURNS"); do
    change_tree "$TREE" "$turn"
    tar -cf - -C "$TREE" . >/dev/null
    if [ $((turn % 2)) = 1 ]; then
        sha="$(turn_put turn)"
        full_put "$sha"
        pipeline
    else
        pipeline
        sha="$(turn_put turn)"
        full_put "$sha"
    fi
    log "turn $turn: put $(tail -n 1 "$RES/turn_s") s, read $(tail -n 1 "$RES/turn_read") of the tree;" \
        "full put $(tail -n 1 "$RES/full_s") s; pipeline $(tail -n 1 "$RES/pipe_s") s"
done
turn=$((BENCH_TURNS + 1))
change_tree "$TREE" "$turn" clustered
tar -cf - -C "$TREE" . >/dev/null
sha="$(turn_put cluster)"
full_put "$sha"
log "turn $turn (clustered): put $(tail -n 1 "$RES/cluster_s") s, read $(tail -n 1 "$RES/cluster_read")"

full="$(med full_s)"
f2() { awk -v x="$1" 'BEGIN { printf "%.2f", x }'; }
echo
echo "### Turn N+1: put to $STORE_NAME after a 1% change, vs a full put"
echo
echo "Workspace: $TREE_FILES files, $(human "$(file_bytes)") (source-like, seed 42); \`--settle ${BENCH_SETTLE:-60}\`; $BENCH_TURNS turns," \
    "each editing 1% of the files and adding and removing 3, then one whose changes sit" \
    "together. Medians over the turns; ratios are to the full put (\`--member-cache-size 0\`) of the same tree."
echo "Machine: $(machine_line)."
echo
md_header "measurement" "seconds" "ratio" "target"
md_row "full put (no member cache: every file read, every member compressed)" "$(f2 "$full")" "1.00" ""
md_row "\`tar -czf - \\| tee >(sha256sum)\` to the store (s3s-fs: + \`aws s3 cp\`)" "$(f2 "$(med pipe_s)")" "$(ratio "$(med pipe_s)" "$full")" ""
md_row "put of a 1% turn ($(med turn_reused) members reused, $(med turn_compressed) compressed; read $(med turn_read) of the tree's bytes)" \
    "$(f2 "$(med turn_s)")" "**$(ratio "$(med turn_s)" "$full")**" "≤ 0.25"
if [ "${BENCH_STORE:-local}" = s3s ]; then
    without="$(awk -v a="$(med turn_s)" -v b="$(med turn_readback)" 'BEGIN { print a - b }')"
    md_row "of which reading the object back (copies vouched for by MD5 only; S3 needs none)" \
        "$(f2 "$(med turn_readback)")" "$(ratio "$(med turn_readback)" "$full")" ""
    md_row "the same put without the read-back" "$(f2 "$without")" "**$(ratio "$without" "$full")**" ""
fi
md_row "put of the 1% turn whose changes sit together (read $(med cluster_read) of the tree's bytes)" \
    "$(f2 "$(med cluster_s)")" "**$(ratio "$(med cluster_s)" "$full")**" "≤ 0.15"
md_row "put with nothing changed (read $(med same_read); the object is there: downloaded and verified)" \
    "$(f2 "$(med same_s)")" "$(ratio "$(med same_s)" "$full")" ""
echo
echo "Runs in order (seconds): turn $(xargs <"$RES/turn_s"); full $(xargs <"$RES/full_s"); pipeline $(xargs <"$RES/pipe_s"); share read $(xargs <"$RES/turn_read")."
