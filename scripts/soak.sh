#!/usr/bin/env bash
# Soak (load) test of the mount against a local S3 server (moto), on loopback only:
#   setup    50 checkpoints put with `ckptfs put` (two thirds ~200 small text files,
#            one third with 3-5 random files of 1-4 MiB), mounted with a cache much
#            smaller than the working set, so that eviction runs under load;
#   phase 1  40 first accesses at once (`ls -R` or `cat`), each to a different cold
#            checkpoint: time until all finish, peak daemon threads;
#   phase 2  16 reader processes for SOAK_SECONDS: random checkpoint, random file,
#            stat + 4 KiB read at a random offset, each timed; the daemon's RSS,
#            threads, descriptors, CPU and cache size on disk sampled every second;
#   phase 3  a second mount of the same store; both stage ~100-file workspaces and
#            `mv` them into commit/ for SOAK_SEAL_SECONDS, half the time an identical
#            tree in both at the same moment; then `ckptfs verify` of the store;
#   phase 4  a second prefix of 10,000 tiny real checkpoints: mount time, first
#            `ls MNT | wc -l`, stat of 100 random checkpoint directories, RSS.
# Prints the report (Markdown tables and a PASS/FAIL summary against the targets) on
# stdout, progress on stderr. Exits 0 whether targets pass or fail (it is a
# measurement); non-zero only if the soak itself could not run. See BENCHMARKS.md,
# "Soak (load)". The load generator and the report are scripts/lib/soak.py.
#
#   bash scripts/soak.sh          # as root; 120 s of readers, about 4 minutes in all
#   SOAK_SECONDS=20 SOAK_SEAL_SECONDS=10 SOAK_MANY=1000 bash scripts/soak.sh   # a quick trial
#
# Runs as root (FUSE mounts, /proc of the daemons). On exit, also on failure or
# Ctrl-C, it unmounts what it mounted and stops the daemons and moto it started, by
# PID.
#
# Environment:
#   SOAK_SECONDS       phase 2 duration (default 120)
#   SOAK_SEAL_SECONDS  phase 3 duration (default 30)
#   SOAK_CHECKPOINTS   checkpoints in the store (default 50)
#   SOAK_FIRST         concurrent first accesses in phase 1 (default 40)
#   SOAK_READERS       reader processes in phase 2 (default 16)
#   SOAK_MANY          checkpoints in the phase 4 prefix (default 10000)
#   SOAK_CACHE_SIZE    --cache-size of the mounts (default 64MiB)
#   SOAK_LOADERS       --loaders (default as ckptfs: half the cores, 2 to 16)
#   SOAK_THREADS       --threads (default 4)
#   BENCH_DIR          work directory (default REPO/.tmp/bench; this uses BENCH_DIR/soak)
#   BENCH_KEEP=1       keep the work directory (op logs, samples, daemon logs)
#   CKPTFS_BIN         use this binary instead of building target/release/ckptfs
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/bench.sh
source scripts/lib/bench.sh

SOAK_SECONDS="${SOAK_SECONDS:-120}"
SOAK_SEAL_SECONDS="${SOAK_SEAL_SECONDS:-30}"
SOAK_CHECKPOINTS="${SOAK_CHECKPOINTS:-50}"
SOAK_FIRST="${SOAK_FIRST:-40}"
SOAK_READERS="${SOAK_READERS:-16}"
SOAK_MANY="${SOAK_MANY:-10000}"
SOAK_CACHE_SIZE="${SOAK_CACHE_SIZE:-64MiB}"
SOAK_THREADS="${SOAK_THREADS:-4}"
# ckptfs's own default: half the cores, at least 2, at most 16.
SOAK_LOADERS="${SOAK_LOADERS:-$(awk -v c="$(nproc)" 'BEGIN { l = int(c / 2); if (l < 2) l = 2; if (l > 16) l = 16; print l }')}"
# Phase 2 passes the descriptor target if its last sample is at most this many above
# its first.
FD_SLACK=8
CKPTFS_GLOBAL=()
[ "$(id -u)" = 0 ] || die "run as root (FUSE mounts and /proc of the daemons)"
[ "$SOAK_FIRST" -le "$SOAK_CHECKPOINTS" ] || die "SOAK_FIRST must not exceed SOAK_CHECKPOINTS"

bench_init soak

# What the soak needs: fuse3 (apt), the venv with moto (scripts/lib/moto.sh), and
# the release binary (or CKPTFS_BIN). No awscli: soak.py talks to moto itself.
soak_deps() {
    local pkgs=()
    command -v fusermount3 >/dev/null 2>&1 || pkgs+=(fuse3)
    [ -x /usr/bin/time ] || pkgs+=(time)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3 python3-venv)
    command -v mountpoint >/dev/null 2>&1 || pkgs+=(util-linux)
    command -v timeout >/dev/null 2>&1 || pkgs+=(coreutils)
    if [ "${#pkgs[@]}" -gt 0 ]; then
        log "installing ${pkgs[*]} (apt)"
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >&2
    fi
    venv_setup
    if [ -n "${CKPTFS_BIN:-}" ]; then
        CKPTFS="$CKPTFS_BIN"
    else
        log "cargo build --release"
        (cd "$BENCH_ROOT" && cargo build --release --quiet) >&2
        CKPTFS="${CARGO_TARGET_DIR:-$BENCH_ROOT/target}/release/ckptfs"
    fi
    [ -x "$CKPTFS" ] || die "no ckptfs binary at $CKPTFS"
}

soak_deps
PY="$CKPTFS_VENV/bin/python"
SOAK_PY=("$PY" scripts/lib/soak.py)
moto_start
export AWS_ENDPOINT_URL="$MOTO_ENDPOINT"
BUCKET="soak-$$"
"${SOAK_PY[@]}" bucket --endpoint "$MOTO_ENDPOINT" --bucket "$BUCKET"
STORE="s3://$BUCKET/ckpt"
MOUNT_OPTS=(--cache-size "$SOAK_CACHE_SIZE" --loaders "$SOAK_LOADERS" --threads "$SOAK_THREADS")
MNT_A="$WORK/mnt-a"
MNT_B="$WORK/mnt-b"
MNT_C="$WORK/mnt-many"
RESULTS="$WORK/results"
LOADAVG="$(cut -d' ' -f1-3 /proc/loadavg)"
now_s() { date +%s.%N; }

# Each Python phase runs under `timeout`, which signals its whole process group
# (the readers of phase 2 included) when the limit passes or when it is itself
# stopped, so that neither a hung file system nor Ctrl-C leaves load behind.
PHASE_PID=""
phase() {
    local limit="$1"; shift
    local rc=0
    timeout -k 10 "$limit" "${SOAK_PY[@]}" "$@" &
    PHASE_PID=$!
    wait "$PHASE_PID" || rc=$?
    PHASE_PID=""
    if [ "$rc" = 124 ]; then
        die "soak.py $1 did not finish within $limit s"
    fi
    [ "$rc" = 0 ] || die "soak.py $1 failed ($rc)"
}
# On exit, stop a phase still running (by its PID) before bench_cleanup unmounts and
# stops the daemons and moto.
soak_cleanup() {
    local status=$?
    set +e
    if [ -n "$PHASE_PID" ] && kill -0 "$PHASE_PID" 2>/dev/null; then
        kill -TERM "$PHASE_PID" 2>/dev/null
        wait "$PHASE_PID" 2>/dev/null
    fi
    (exit "$status")   # bench_cleanup takes the exit status from $?
    bench_cleanup
}
trap soak_cleanup EXIT

# --- setup: 50 checkpoints -------------------------------------------------------------
log "generating $SOAK_CHECKPOINTS workspaces"
"${SOAK_PY[@]}" gen --out "$WORK/trees" --count "$SOAK_CHECKPOINTS"
mv "$WORK/trees/trees.json" "$WORK/trees.json"
log "ckptfs put of $SOAK_CHECKPOINTS checkpoints into $STORE"
: >"$WORK/puts.txt"
t0="$(now_ns)"
for tree in "$WORK"/trees/tree-*; do
    "$CKPTFS" put "$STORE" "$tree" --temp-dir "$WORK/tmp" >"$WORK/put.out" 2>"$WORK/put.err" \
        || { cat "$WORK/put.err" >&2; die "ckptfs put $tree failed"; }
    read -r sha size <"$WORK/put.out"
    echo "$(basename "$tree") $sha $size" >>"$WORK/puts.txt"
done
PUT_S="$(awk -v a="$t0" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')"
rm -rf "$WORK/trees"
ARCHIVE_BYTES="$(awk '{ s += $3 } END { print s }' "$WORK/puts.txt")"
[ "$(cut -d' ' -f2 "$WORK/puts.txt" | sort -u | wc -l)" = "$SOAK_CHECKPOINTS" ] \
    || die "the $SOAK_CHECKPOINTS workspaces did not give $SOAK_CHECKPOINTS distinct checkpoints"

# The daemon's PID comes from the mount's "(daemon pid N, ...)" line (mount_ckptfs);
# check it against /proc: a ckptfs process whose arguments name this mount point.
check_pid() {
    local pid="$1" mnt="$2"
    tr '\0' '\n' <"/proc/$pid/cmdline" | grep -qxF "$mnt" \
        || die "process $pid is not the daemon of $mnt"
}

log "mounting $STORE on $MNT_A (cache $SOAK_CACHE_SIZE, loaders $SOAK_LOADERS, threads $SOAK_THREADS)"
run_begin
mount_ckptfs "$STORE" "$MNT_A" "$WORK/cache-a" "${MOUNT_OPTS[@]}"
PID_A="$CKPT_PID"
check_pid "$PID_A" "$MNT_A"
sleep 1
IDLE_THREADS_A="$(ls "/proc/$PID_A/task" | wc -l)"
log "daemon A pid $PID_A, $IDLE_THREADS_A threads idle"

# --- phase 1: 40 first accesses at once ------------------------------------------------
log "phase 1: $SOAK_FIRST first accesses at once"
phase 900 phase1 --mnt "$MNT_A" --pid "$PID_A" --trees "$WORK/trees.json" --puts "$WORK/puts.txt" \
    --count "$SOAK_FIRST" --timeout 600 --out "$RESULTS/phase1.json"
PHASE1_END="$(now_s)"

# --- phase 2: 16 readers ---------------------------------------------------------------
log "phase 2: $SOAK_READERS readers for $SOAK_SECONDS s"
phase "$((SOAK_SECONDS + 180))" phase2 --mnt "$MNT_A" --pid "$PID_A" --trees "$WORK/trees.json" \
    --puts "$WORK/puts.txt" --seconds "$SOAK_SECONDS" --workers "$SOAK_READERS" --moto-pid "$MOTO_PID" \
    --cache-dir "$WORK/cache-a" --out "$RESULTS/phase2"

# --- phase 3: two mounts sealing -------------------------------------------------------
log "phase 3: a second mount on $MNT_B; both seal for $SOAK_SEAL_SECONDS s"
mount_ckptfs "$STORE" "$MNT_B" "$WORK/cache-b" "${MOUNT_OPTS[@]}"
PID_B="$CKPT_PID"
check_pid "$PID_B" "$MNT_B"
phase "$((SOAK_SEAL_SECONDS + 600))" seal --mnt-a "$MNT_A" --mnt-b "$MNT_B" \
    --seconds "$SOAK_SEAL_SECONDS" --out "$RESULTS/phase3.json"
HWM_B="$(vmhwm "$PID_B")"
unmount_wait "$MNT_B" "$PID_B"
log "ckptfs verify $STORE"
t0="$(now_ns)"
VERIFY_RC=0
"$CKPTFS" verify "$STORE" >"$WORK/verify.out" 2>"$WORK/verify.err" || VERIFY_RC=$?
VERIFY_S="$(awk -v a="$t0" -v b="$(now_ns)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')"
VERIFY_OK="$(grep -c ' ok$' "$WORK/verify.out" || true)"
VERIFY_FAILED="$(grep -c ' FAILED' "$WORK/verify.out" || true)"
VERIFY_TOTAL="$(wc -l <"$WORK/verify.out")"
[ "$VERIFY_RC" = 0 ] || { log "ckptfs verify exited $VERIFY_RC:"; head -n 20 "$WORK/verify.out" "$WORK/verify.err" >&2; }
HWM_A="$(vmhwm "$PID_A")"
unmount_wait "$MNT_A" "$PID_A"

# --- phase 4: a prefix of 10,000 checkpoints -------------------------------------------
log "phase 4: $SOAK_MANY checkpoints under s3://$BUCKET/many"
phase 1200 many --endpoint "$MOTO_ENDPOINT" --bucket "$BUCKET" --prefix many --count "$SOAK_MANY" \
    --out "$RESULTS/many.json"
run_begin
mount_ckptfs "s3://$BUCKET/many" "$MNT_C" "$WORK/cache-c" "${MOUNT_OPTS[@]}"
PID_C="$CKPT_PID"
check_pid "$PID_C" "$MNT_C"
phase 300 probe --mnt "$MNT_C" --pid "$PID_C" --many "$RESULTS/many.json" --count 100 \
    --mount-seconds "$(step_secs mount)" --out "$RESULTS/phase4.json"
unmount_wait "$MNT_C" "$PID_C"
moto_stop

# --- report ----------------------------------------------------------------------------
# Everything the report needs besides the phases' own results.
"$PY" - "$RESULTS/params.json" \
    machine="$(machine_line)" loadavg="$LOADAVG" cache_size="$SOAK_CACHE_SIZE" \
    loaders="$SOAK_LOADERS" threads="$SOAK_THREADS" archive_bytes="$ARCHIVE_BYTES" \
    put_seconds="$PUT_S" idle_threads_a="$IDLE_THREADS_A" phase1_end="$PHASE1_END" \
    seal_seconds="$SOAK_SEAL_SECONDS" seal_files=100 verify_rc="$VERIFY_RC" \
    verify_ok="$VERIFY_OK" verify_failed="$VERIFY_FAILED" verify_total="$VERIFY_TOTAL" \
    verify_seconds="$VERIFY_S" hwm_a_kib="$HWM_A" hwm_b_kib="$HWM_B" fd_slack="$FD_SLACK" \
    log_a="$WORK/cache-a/ckptfs.log" log_b="$WORK/cache-b/ckptfs.log" <<'PY'
import json, sys
params = {}
for arg in sys.argv[2:]:
    key, _, value = arg.partition("=")
    for kind in (int, float, str):
        try:
            params[key] = kind(value)
            break
        except ValueError:
            pass
json.dump(params, open(sys.argv[1], "w"), indent=1)
PY
echo
"${SOAK_PY[@]}" report --work "$WORK" | tee "$WORK/report.md"
