#!/usr/bin/env bash
# Benchmark: what turn N+1 costs. A workspace is captured, then changed in BENCH_TURNS
# turns, each editing about 1% of its files and adding and removing a few, against a
# local S3 server (moto). Side by side, in one run:
#   put        ckptfs put of each turn with the member cache of the turns before
#              (--cache-dir), vs a full put (empty member cache), vs the user's
#              pipeline: tar -czf - | tee >(sha256sum) > x.tar.gz + aws s3 cp
#   seal       through a mount: cp -a MNT/<last>/. MNT/staging/NAME/, one file
#              changed, mv MNT/staging/NAME MNT/commit/, vs the full put; also the
#              first seal of a replica that only downloaded the turns (once the copy's
#              priming of its member cache ended), and one without a member cache;
#              and the seal of a workspace copied in from outside the mount, on a
#              replica that opened turn N (which primed its member cache)
#   copy       that cp -a (copy_file_range between the cache and staging/) vs cp -a
#              between two local directories of the same disk
#   uploaded   bytes sent per turn, as a share of the object; also for one more turn
#              whose changes sit together in the tree rather than all over it
#   cache      the mount's cache after reading every turn, vs one turn unpacked
#   open N+1   first `ls -R` of turn N+1 on a fresh mount whose cache holds turn N,
#              vs with an empty cache
# Prints Markdown tables on stdout (progress on stderr). See BENCHMARKS.md, section 6.
#
# Environment:
#   BENCH_MB      workspace size in MiB (default 300)
#   BENCH_FILES   number of files (default 6000)
#   BENCH_TURNS   turns after the first capture (default 5)
#   BENCH_DIR     work directory (default REPO/.tmp/bench); removed at exit
#   BENCH_KEEP=1  keep the work directory
#   CKPTFS_BIN    use this binary instead of building target/release/ckptfs
#   BENCH_STORE=s3s  the store is s3s-fs on 127.0.0.1 instead of moto (built into
#                 REPO/.tmp/tools once, as for bench-put.sh): it copies parts with a
#                 local file copy, as S3 copies them in the store, where moto reads
#                 the whole source for each copied part (and assembles the object
#                 by copying every part into a new file: no faster here)
#   BENCH_STORE=local  a local directory store: ckptfs's own work, the store's taken
#                 out (the pipeline then writes its archive there; nothing is sent)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh
# shellcheck source=scripts/lib/turns.sh
source scripts/lib/turns.sh

BENCH_MB="${BENCH_MB:-300}"
BENCH_FILES="${BENCH_FILES:-6000}"
BENCH_TURNS="${BENCH_TURNS:-5}"
# shellcheck disable=SC2034 # used by mount_ckptfs in scripts/lib/bench.sh
CKPTFS_GLOBAL=()

bench_init turns
bench_deps ""
if [ "${BENCH_STORE:-moto}" = local ]; then
    STORE_NAME="a local directory store"
elif [ "${BENCH_STORE:-moto}" = s3s ]; then
    bench_s3s
    STORE_NAME="s3s-fs"
else
    bench_moto
    STORE_NAME="moto"
fi

TREE="$WORK/tree"
MNT="$WORK/mnt"
LOCAL="$WORK/local"
TMPD="$WORK/tmp"
mkdir -p "$LOCAL" "$TMPD"
if [ "${BENCH_STORE:-moto}" = local ]; then
    STORE="$WORK/store"
    mkdir -p "$STORE"
else
    BUCKET="bench-turns-$$"
    "$AWS" s3 mb "s3://$BUCKET" >/dev/null
    STORE="s3://$BUCKET/ckpt"
fi
remove_object() {
    case "$STORE" in
        s3://*) "$AWS" s3 rm --only-show-errors "$STORE/$1" ;;
        *) rm -f "$STORE/$1" ;;
    esac
}

log "generating a source-like tree: $BENCH_MB MiB, $BENCH_FILES files"
"$CKPTFS_VENV/bin/python" scripts/lib/gen_corpus.py source "$TREE" --mb "$BENCH_MB" --files "$BENCH_FILES"
TREE_BYTES="$(cat "$TREE.bytes")"
TREE_FILES="$(wc -l <"$TREE.files")"
tar -cf - -C "$TREE" . >/dev/null

settle() { sync -f "$WORK" 2>/dev/null || sync; }

# ckptfs put with a member cache dir; records seconds under KEY, the members reused
# and compressed, and prints the digest.
ck_put() {
    local key="$1" cache="$2" sha
    settle
    run_begin
    tm "$key" "$CKPTFS" -v put "$STORE" "$TREE" --temp-dir "$TMPD" --cache-dir "$cache" \
        >"$WORK/put.out" 2>"$WORK/put.err" || { cat "$WORK/put.err" >&2; die "put failed"; }
    record "${key}_s" "$(step_secs "$key")"
    record "${key}_reused" "$(sed -n 's/.* reused=\([0-9]*\).*/\1/p' "$WORK/put.err" | tail -n 1)"
    record "${key}_compressed" "$(sed -n 's/.* compressed=\([0-9]*\).*/\1/p' "$WORK/put.err" | tail -n 1)"
    record "${key}_sent" "$(sed -n 's/.* sent=\([0-9]*\).*/\1/p' "$WORK/put.err" | tail -n 1)"
    sha="$(awk '{ print $1 }' "$WORK/put.out")"
    [[ "$sha" =~ ^[0-9a-f]{64}$ ]] || die "put gave no digest"
    record "${key}_object" "$(awk '{ print $2 }' "$WORK/put.out")"
    echo "$sha"
}

# shellcheck disable=SC2016 # expanded by the inner shell
PIPE='shopt -s lastpipe; set -o pipefail
tar -czf - -C "$1" . | tee >(sha256sum >"$2") >"$3" || exit
wait $!'
pipeline() {
    local sha size
    rm -f "$WORK/x.tar.gz"
    settle
    run_begin
    tm archive bash -c "$PIPE" pipe "$TREE" "$WORK/sum.out" "$WORK/x.tar.gz"
    sha="$(awk '{ print $1 }' "$WORK/sum.out")"
    size="$(stat -c %s "$WORK/x.tar.gz")"
    if [ -n "${BUCKET:-}" ]; then
        tm upload "$AWS" s3 cp --only-show-errors "$WORK/x.tar.gz" "s3://$BUCKET/pipe/$sha-$RANDOM.tar.gz" \
            --metadata "sha256=$sha,size=$size"
    fi
    record pipe_s "$(run_total | awk '{ print $1 }')"
    rm -f "$WORK/x.tar.gz"
}

# --- put: turn 0, then each turn with the cache of the turns before, a full put of
# the same tree (empty member cache: what every turn cost before), and the pipeline.
SHAS=()
log "turn 0: first capture"
SHAS+=("$(ck_put first "$WORK/members")")
for turn in $(seq 1 "$BENCH_TURNS"); do
    change_tree "$TREE" "$turn"
    tar -cf - -C "$TREE" . >/dev/null
    # Alternate which goes first. The full put finds the object already there (the
    # turn's put stored it) or stores it: delete it so that both upload.
    if [ $((turn % 2)) = 1 ]; then
        sha="$(ck_put turn "$WORK/members")"
        remove_object "$sha.tar.gz"
        rm -rf "$WORK/empty"; full_sha="$(ck_put full "$WORK/empty")"
        pipeline
    else
        pipeline
        rm -rf "$WORK/empty"; full_sha="$(ck_put full "$WORK/empty")"
        remove_object "$full_sha.tar.gz"
        sha="$(ck_put turn "$WORK/members")"
    fi
    [ "$sha" = "$full_sha" ] || die "turn $turn: the member cache changed the digest ($sha vs $full_sha)"
    SHAS+=("$sha")
    log "turn $turn: put $(tail -n 1 "$RES/turn_s") s ($(tail -n 1 "$RES/turn_reused") members reused," \
        "$(tail -n 1 "$RES/turn_compressed") compressed); full put $(tail -n 1 "$RES/full_s") s;" \
        "pipeline $(tail -n 1 "$RES/pipe_s") s"
done
LAST="${SHAS[-1]}"
PREV="${SHAS[-2]}"
OBJECT="$(tail -n 1 "$RES/turn_object")"

# --- through a mount: open N+1 knowing N, the copy into staging, a one-file seal -----
mount_ckptfs "$STORE" "$MNT" "$WORK/cache-open" --cache-size 8GiB
PID="$CKPT_PID"
ls -R "$MNT/$PREV" >/dev/null
unmount_wait "$MNT" "$PID"
for run in 1 2 3; do
    for side in warm cold; do
        # A copy of the cache that holds turn N only, or an empty one.
        rm -rf "$WORK/cache-run"
        if [ "$side" = warm ]; then cp -a "$WORK/cache-open" "$WORK/cache-run"; fi
        mount_ckptfs "$STORE" "$MNT" "$WORK/cache-run" --cache-size 8GiB
        PID="$CKPT_PID"
        settle
        run_begin
        tm "open_$side" ls -R "$MNT/$LAST" >/dev/null
        record "open_${side}_s" "$(step_secs "open_$side")"
        if [ "$side" = warm ]; then
            # "rebuilt inflated": the gzip members of turn N+1 that came from turn N.
            sed -n 's/^# gzip members of downloads: \([0-9]*\) rebuilt from the cache, \([0-9]*\) inflated$/\1 \2/p' \
                "$MNT/.status" >>"$RES/open_members"
        fi
        unmount_wait "$MNT" "$PID"
    done
done

# Seconds of a Rust Duration as the daemon logs it (`7.56s`, `950ms`, `12µs`).
duration_s() {
    awk -v d="$1" 'BEGIN { v = d + 0; if (d ~ /ms$/) v /= 1e3; else if (d ~ /µs$/) v /= 1e6; else if (d ~ /ns$/) v /= 1e9; printf "%.2f", v }'
}
# The number a daemon log line gives for KEY: logged KEY LINE.
logged() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<"$2"; }

# A workspace copied in from outside the mount (the tree is turn N's), as a sandbox
# that restores its workspace itself does, on a fresh replica that only opened turn N:
# loading the newest checkpoint (turn N, before the seals below add newer ones)
# primed its members; wait for that, then seal one change.
mount_ckptfs "$STORE" "$MNT" "$WORK/cache-outside" --cache-size 8GiB
PID="$CKPT_PID"
ls -R "$MNT/$LAST" >/dev/null
for _ in $(seq 1 600); do
    grep -q "member cache primed" "$WORK/cache-outside/ckptfs.log" && break
    sleep 0.2
done
primed_line="$(grep "member cache primed" "$WORK/cache-outside/ckptfs.log" | tail -n 1)"
[ -n "$primed_line" ] || die "opening turn N never primed the member cache"
record outside_prime_s "$(duration_s "$(sed -n 's/.* elapsed=\([^ ]*\).*/\1/p' <<<"$primed_line")")"
dest="$MNT/staging/outside"
mkdir "$dest"
cp -a "$TREE/." "$dest/"
one="$(find "$dest" -name '*.txt' -type f | sort | sed -n 1p)"
echo "# sealed after a copy from outside" >>"$one"
settle
run_begin
tm seal mv "$dest" "$MNT/commit/"
record outside_seal_s "$(step_secs seal)"
sealed_line="$(grep ' sealed' "$WORK/cache-outside/ckptfs.log" | tail -n 1)"
record outside_seal_compressed "$(logged members_compressed "$sealed_line")"
unmount_wait "$MNT" "$PID"

mount_ckptfs "$STORE" "$MNT" "$WORK/cache" --cache-size 8GiB
PID="$CKPT_PID"
for sha in "${SHAS[@]}"; do tar -cf - -C "$MNT/$sha" . >/dev/null; done
CACHE_BYTES="$(du -sb "$WORK/cache/checkpoints" | awk '{ print $1 }')"
for run in 1 2 3; do
    dest="$MNT/staging/turn-$run"
    mkdir "$dest"
    settle
    run_begin
    tm copy cp -a "$MNT/$LAST/." "$dest/"
    record copy_s "$(step_secs copy)"
    if [ "$run" = 1 ]; then
        # This replica only downloaded the turns (recording their layouts); the copy
        # started putting turn N's gzip members in its member cache in the background.
        # Wait for that to end, as an agent's work on the turn would.
        for _ in $(seq 1 600); do
            grep -q "member cache primed" "$WORK/cache/ckptfs.log" && break
            sleep 0.2
        done
        primed_line="$(grep "member cache primed" "$WORK/cache/ckptfs.log" | tail -n 1)"
        [ -n "$primed_line" ] || die "the member cache was never primed"
        record prime_s "$(duration_s "$(sed -n 's/.* elapsed=\([^ ]*\).*/\1/p' <<<"$primed_line")")"
    fi
    mkdir "$LOCAL/copy-$run"
    settle
    run_begin
    tm local_copy cp -a "$TREE/." "$LOCAL/copy-$run/"
    record local_copy_s "$(step_secs local_copy)"
    rm -rf "$LOCAL/copy-$run"
    # One file changed, then sealed (in run 1, this replica's first seal).
    one="$(find "$dest" -name '*.txt' -type f | sort | sed -n "${run}p")"
    echo "# sealed in run $run" >>"$one"
    settle
    run_begin
    tm seal mv "$dest" "$MNT/commit/"
    sealed_line="$(grep ' sealed' "$WORK/cache/ckptfs.log" | tail -n 1)"
    if [ "$run" = 1 ]; then
        record first_seal_s "$(step_secs seal)"
        record first_seal_sent "$(logged sent "$sealed_line")"
        record first_seal_compressed "$(logged members_compressed "$sealed_line")"
    else
        record seal_s "$(step_secs seal)"
        record seal_sent "$(logged sent "$sealed_line")"
    fi
done
unmount_wait "$MNT" "$PID"

# The same first seal on a replica without a member cache (--member-cache-size 0): no
# layouts, nothing primed; what every replica's first seal cost before both.
mount_ckptfs "$STORE" "$MNT" "$WORK/cache-bare" --cache-size 8GiB --member-cache-size 0
PID="$CKPT_PID"
dest="$MNT/staging/bare"
mkdir "$dest"
cp -a "$MNT/$LAST/." "$dest/"
one="$(find "$dest" -name '*.txt' -type f | sort | sed -n 1p)"
echo "# sealed without a member cache" >>"$one"
settle
run_begin
tm seal mv "$dest" "$MNT/commit/"
record bare_seal_s "$(step_secs seal)"
record bare_seal_sent "$(logged sent "$(grep ' sealed' "$WORK/cache-bare/ckptfs.log" | tail -n 1)")"
unmount_wait "$MNT" "$PID"

# --- a 1% turn whose changes sit together in the tree (change_tree's clustered), as
# when a turn works on one part of the workspace: put after the scattered turns.
turn=$((BENCH_TURNS + 1))
change_tree "$TREE" "$turn" clustered
tar -cf - -C "$TREE" . >/dev/null
ck_put cluster "$WORK/members" >/dev/null
log "turn $turn (clustered): put $(tail -n 1 "$RES/cluster_s") s, sent $(tail -n 1 "$RES/cluster_sent") bytes"

# --- tables ---------------------------------------------------------------------------
mb="$(human "$TREE_BYTES")"
full="$(med full_s)"
echo
echo "### Turn N+1: put, seal and open after a 1% change, vs a full capture ($STORE_NAME)"
echo
echo "Workspace: $TREE_FILES files, $mb (source-like, seed 42); $BENCH_TURNS turns, each" \
    "editing 1% of the files and adding and removing 3. Object $(human "$OBJECT"). Medians" \
    "over the turns (the seal: 2 runs; the open and the copy: 3 runs). Ratios are to the full put."
echo "Machine: $(machine_line)."
echo
md_header "measurement" "seconds" "ratio" "target"
md_row "full put (empty member cache: every member compressed)" "$(f2 "$full")" "1.00" ""
if [ -n "${BUCKET:-}" ]; then pipe_label="\`tar -czf \\| tee >(sha256sum)\` + \`aws s3 cp\`"
else pipe_label="\`tar -czf \\| tee >(sha256sum)\` into a file"; fi
md_row "$pipe_label" "$(f2 "$(med pipe_s)")" "$(ratio "$(med pipe_s)" "$full")" ""
md_row "put of a 1% turn, member cache of the turns before ($(med turn_reused) members reused, $(med turn_compressed) compressed)" \
    "$(f2 "$(med turn_s)")" "**$(ratio "$(med turn_s)" "$full")**" "≤ 0.25"
md_row "put of a 1% turn whose changes sit together in the tree (one turn; $(med cluster_reused) members reused, $(med cluster_compressed) compressed)" \
    "$(f2 "$(med cluster_s)")" "$(ratio "$(med cluster_s)" "$full")" ""
md_row "seal of a one-file change through the mount" "$(f2 "$(med seal_s)")" "**$(ratio "$(med seal_s)" "$full")**" "≤ 0.3"
md_row "the same, first seal on a replica that only downloaded turn N ($(med first_seal_compressed) members compressed; turn N's were primed in $(f2 "$(med prime_s)") s behind the copy)" \
    "$(f2 "$(med first_seal_s)")" "$(ratio "$(med first_seal_s)" "$full")" ""
md_row "seal of a one-file change copied in from outside the mount (\`cp -a TREE/. MNT/staging/NAME/\`), on a replica that opened turn N ($(med outside_seal_compressed) members compressed; opening turn N primed its members in $(f2 "$(med outside_prime_s)") s)" \
    "$(f2 "$(med outside_seal_s)")" "**$(ratio "$(med outside_seal_s)" "$full")**" "≤ 0.3"
md_row "the same, first seal on a replica without a member cache (\`--member-cache-size 0\`)" \
    "$(f2 "$(med bare_seal_s)")" "$(ratio "$(med bare_seal_s)" "$full")" ""
rebuilt="?" inflated="?"
if [ -s "$RES/open_members" ]; then read -r rebuilt inflated < <(tail -n 1 "$RES/open_members"); fi
md_row "first \`ls -R\` of turn N+1, cache holding turn N ($rebuilt gzip members rebuilt, $inflated inflated)" "$(f2 "$(med open_warm_s)")" \
    "**$(ratio "$(med open_warm_s)" "$(med open_cold_s)")** of the empty-cache open" "≤ 0.5"
md_row "first \`ls -R\` of turn N+1, empty cache" "$(f2 "$(med open_cold_s)")" "1.00" ""
echo
echo "Runs of the open, in order (seconds): cache holding turn N $(xargs <"$RES/open_warm_s"); empty cache $(xargs <"$RES/open_cold_s")."

echo
md_header "measurement" "value" "ratio" "target"
if [ -n "${BUCKET:-}" ]; then
md_row "bytes sent per 1% turn (the rest copied in the store: \`UploadPartCopy\`)" "$(human "$(med turn_sent)")" \
    "**$(ratio "$(med turn_sent)" "$OBJECT")** of the object" "≤ 0.15"
md_row "bytes sent by the 1% turn whose changes sit together" "$(human "$(med cluster_sent)")" \
    "$(ratio "$(med cluster_sent)" "$(med cluster_object)") of the object" "≤ 0.15"
md_row "bytes sent by the seal of a one-file change" "$(human "$(med seal_sent)")" \
    "**$(ratio "$(med seal_sent)" "$OBJECT")** of the object" ""
md_row "bytes sent by that first seal on a replica (layout of turn N recorded at its download)" "$(human "$(med first_seal_sent)")" \
    "$(ratio "$(med first_seal_sent)" "$OBJECT") of the object" ""
md_row "bytes sent by that first seal without a member cache" "$(human "$(med bare_seal_sent)")" \
    "$(ratio "$(med bare_seal_sent)" "$OBJECT") of the object" ""
fi # a local store is sent nothing: it writes (or links) the whole object
md_row "mount cache after reading all $((BENCH_TURNS + 1)) turns" "$(human "$CACHE_BYTES")" \
    "**$(ratio "$CACHE_BYTES" "$TREE_BYTES")** × one turn unpacked" "≤ 1.5"
cp_v="$(mbps "$TREE_BYTES" "$(med copy_s)")"; loc_v="$(mbps "$TREE_BYTES" "$(med local_copy_s)")"
md_row "\`cp -a MNT/<sha256>/. MNT/staging/NAME/\` (MiB/s)" "$cp_v" "**$(ratio "$cp_v" "$loc_v")** of local" "≥ 1"
md_row "\`cp -a TREE/. LOCALDIR/\`, same disk (MiB/s)" "$loc_v" "1.00" ""
