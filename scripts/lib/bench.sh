# shellcheck shell=bash
# Shared helpers for scripts/bench-*.sh. Source it after `set -euo pipefail`, then
# call bench_init NAME.
#
#   bench_init NAME     work dir $BENCH_DIR/NAME (BENCH_DIR defaults to REPO/.tmp/bench),
#                       EXIT trap (unmount, stop daemons and moto by PID, remove the
#                       work dir unless BENCH_KEEP=1), AWS test credentials
#   bench_deps [ratarmount]
#                       apt packages (fuse3, time) if missing, the venv (moto, boto3)
#                       plus awscli (and ratarmount) from PyPI, and the release binary
#   tm LABEL CMD...     runs CMD under /usr/bin/time -f '%e %M %U %S'; appends
#                       "LABEL seconds maxrss_kib cpu_seconds" to $STEPS (seconds from
#                       a ns clock, since %e has only 10 ms resolution; RSS is time's
#                       %M; CPU is user + system time, children included)
#   run_begin / run_total
#                       clear $STEPS / print "sum_of_seconds max_rss_kib" of its lines
#   record KEY VALUE... appends values to $RES/KEY;  med KEY prints their median
#   mount_ckptfs STORE MNT CACHE [args]   daemon mount; sets CKPT_PID
#   unmount_wait MNT [PID]                fusermount3 -u, then wait for PID to exit
#   vmhwm PID           peak RSS (KiB) of a live process, from /proc/PID/status
#   reset_hwm PID       reset that peak to the current RSS (/proc/PID/clear_refs)
#   proc_cpu PID        CPU seconds (user + system, all threads) a live process used
#   bench_halt_poll     with BENCH_HALT_POLL_NS set (root, a KVM guest's haltpoll
#                       driver): idle CPUs poll that long before halting, for the run
#                       only; the value before is put back on exit

BENCH_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CKPTFS_ROOT="$BENCH_ROOT"
BENCH_DIR="${BENCH_DIR:-$BENCH_ROOT/.tmp/bench}"
BENCH_RUNS="${BENCH_RUNS:-3}"
BENCH_KEEP="${BENCH_KEEP:-0}"

BENCH_MOUNTS=()      # mount points to unmount on exit
BENCH_PIDS=()        # processes we started (daemons) to stop on exit, by PID
WORK=""
STEPS=""
RES=""
HALT_POLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HALT_POLL_WAS=""     # guest_halt_poll_ns before bench_halt_poll, put back on exit

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

bench_init() {
    local name="$1"
    WORK="$BENCH_DIR/$name"
    # CKPTFS_TMP is where scripts/lib/moto.sh keeps moto.log.
    CKPTFS_TMP="$WORK"
    # shellcheck source=scripts/lib/moto.sh
    source "$BENCH_ROOT/scripts/lib/moto.sh"
    if [ -d "$WORK" ]; then
        _unmount_under "$WORK"
        rm -rf "$WORK"
    fi
    mkdir -p "$WORK/results" "$WORK/tmp"
    STEPS="$WORK/steps"
    RES="$WORK/results"
    : >"$STEPS"
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
    export AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
    export AWS_EC2_METADATA_DISABLED=true
    export AWS_PAGER=""
    unset AWS_PROFILE AWS_SESSION_TOKEN
    export LC_ALL=C
}

# Lazily unmount every FUSE mount under a directory (left by an earlier crashed run).
_unmount_under() {
    local root="$1" mnt
    [ -r /proc/self/mountinfo ] || return 0
    command -v fusermount3 >/dev/null 2>&1 || return 0
    awk -v root="$root/" '{
            for (i = 7; i <= NF; i++) if ($i == "-") break
            if ($(i + 1) ~ /^fuse/ && index($5 "/", root) == 1) print $5
        }' /proc/self/mountinfo | sort -r | while read -r mnt; do
        mnt="$(printf '%b' "$mnt")"
        log "unmounting leftover mount $mnt"
        fusermount3 -u -z "$mnt" 2>/dev/null || true
    done
}

bench_cleanup() {
    local status=$?
    trap - EXIT INT TERM
    set +e
    local m p
    if [ "$status" != 0 ] && [ -n "$WORK" ] && [ -d "$WORK" ]; then
        _diagnose >&2
    fi
    for m in "${BENCH_MOUNTS[@]}"; do
        if mountpoint -q "$m" 2>/dev/null; then
            fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null
        fi
    done
    for p in "${BENCH_PIDS[@]}"; do
        _stop_pid "$p"
    done
    [ -n "$HALT_POLL_WAS" ] && echo "$HALT_POLL_WAS" >"$HALT_POLL"
    [ -n "$WORK" ] && _unmount_under "$WORK"
    moto_stop 2>/dev/null
    if [ -n "$WORK" ] && [ -d "$WORK" ]; then
        if [ "$BENCH_KEEP" = 1 ]; then
            log "keeping $WORK (BENCH_KEEP=1)"
        else
            rm -rf "$WORK"
        fi
    fi
    exit "$status"
}

# True while PID runs. A zombie counts as gone: a daemon is re-parented to PID 1,
# which may take a while to reap it.
_alive() {
    [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# Stop a process we started: give it 5 s to exit by itself (after an unmount), then
# SIGTERM, then SIGKILL.
# On failure: which of our mount points are still mounted, and the end of each
# ckptfs daemon log, before the work dir goes.
_diagnose() {
    local m f
    echo "--- diagnostics (exit status $status) ---"
    for m in $(printf '%s\n' "${BENCH_MOUNTS[@]}" | sort -u); do
        if mountpoint -q "$m" 2>/dev/null; then
            echo "$m: mounted"
            [ -r "$m/.status" ] && sed 's/^/    /' "$m/.status" | head -n 20
        else
            echo "$m: NOT mounted (unmounted by someone else?)"
        fi
    done
    while IFS= read -r f; do
        echo "last lines of $f:"
        tail -n 15 "$f" | sed 's/^/    /'
    done < <(find "$WORK" -name ckptfs.log 2>/dev/null)
}

_stop_pid() {
    local pid="$1" i
    for i in $(seq 1 100); do
        _alive "$pid" || return 0
        [ "$i" = 50 ] && kill "$pid" 2>/dev/null
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}

# Drop a PID from the cleanup list once it is gone, so that a later reuse of the
# number by another process is never signalled.
_forget_pid() {
    local rest=() p
    for p in "${BENCH_PIDS[@]}"; do
        [ "$p" = "$1" ] || rest+=("$p")
    done
    BENCH_PIDS=("${rest[@]}")
}

bench_deps() {
    local want_ratarmount="${1:-}"
    local pkgs=()
    command -v fusermount3 >/dev/null 2>&1 || pkgs+=(fuse3)
    [ -x /usr/bin/time ] || pkgs+=(time)
    command -v python3 >/dev/null 2>&1 || pkgs+=(python3 python3-venv)
    command -v mountpoint >/dev/null 2>&1 || pkgs+=(util-linux)
    if [ "$want_ratarmount" = ratarmount ] && ! ldconfig -p 2>/dev/null | grep -q 'libfuse3\.so\.3'; then
        pkgs+=(libfuse3-3)
    fi
    if [ "${#pkgs[@]}" -gt 0 ]; then
        log "installing ${pkgs[*]} (apt)"
        apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${pkgs[@]}" >&2
    fi
    venv_setup
    local pip=("$CKPTFS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
    if ! "$CKPTFS_VENV/bin/aws" --version >/dev/null 2>&1; then
        log "installing awscli into $CKPTFS_VENV"
        "${pip[@]}" awscli >&2
    fi
    AWS="$CKPTFS_VENV/bin/aws"
    if [ "$want_ratarmount" = ratarmount ] && ! "$CKPTFS_VENV/bin/ratarmount" --version >/dev/null 2>&1; then
        log "installing ratarmount into $CKPTFS_VENV"
        "${pip[@]}" ratarmount >&2
    fi
    # shellcheck disable=SC2034 # used by bench-mount.sh
    RATARMOUNT="$CKPTFS_VENV/bin/ratarmount"
    if [ -n "${CKPTFS_BIN:-}" ]; then
        CKPTFS="$CKPTFS_BIN"
    else
        log "cargo build --release"
        (cd "$BENCH_ROOT" && cargo build --release --quiet) >&2
        CKPTFS="${CARGO_TARGET_DIR:-$BENCH_ROOT/target}/release/ckptfs"
    fi
    [ -x "$CKPTFS" ] || die "no ckptfs binary at $CKPTFS"
}

# The data directory of a run: with BENCH_FS=fresh (the default as root) a fresh ext4
# of SIZE made in a file of the work directory and mounted at $WORK/fs, so that both
# sides of a comparison start from the same clean disk, unmounted at exit after the
# FUSE mount $MNT; with BENCH_FS=here the work directory itself. Sets BENCH_FS and DATA.
# The loop device does direct I/O to its file (where it can), as a disk would: a plain
# loop device keeps a second copy of every block in the page cache, under the
# filesystem's own, which doubles what writing costs on a machine whose new
# page-cache pages are slow (BENCHMARKS.md section 6) and hides what O_DIRECT saves.
bench_data_dir() {
    BENCH_FS="${BENCH_FS:-$([ "$(id -u)" = 0 ] && echo fresh || echo here)}"
    DATA="$WORK"
    [ "$BENCH_FS" = fresh ] || return 0
    DATA="$WORK/fs"
    mkdir -p "$DATA"
    truncate -s "$1" "$WORK/fs.img"
    mkfs.ext4 -q -F "$WORK/fs.img"
    DATA_LOOP="$(losetup --find --show --direct-io=on "$WORK/fs.img" 2>/dev/null)" \
        || DATA_LOOP="$(losetup --find --show "$WORK/fs.img")"
    mount "$DATA_LOOP" "$DATA"
    trap _data_dir_cleanup EXIT
}

# Before the work directory goes: the FUSE mount, then the fresh filesystem.
_data_dir_cleanup() {
    local status=$?
    mountpoint -q "${MNT:-/nonexistent}" 2>/dev/null && { fusermount3 -u "$MNT" || fusermount3 -u -z "$MNT"; }
    umount "$DATA" 2>/dev/null || umount -l "$DATA" 2>/dev/null || true
    [ -n "${DATA_LOOP:-}" ] && { losetup -d "$DATA_LOOP" 2>/dev/null || true; }
    (exit "$status")
    bench_cleanup
}

# Start moto and point ckptfs and the aws CLI at it.
bench_moto() {
    moto_start
    export AWS_ENDPOINT_URL="$MOTO_ENDPOINT"
    # The first aws call compiles its modules; keep that out of every measurement.
    "$AWS" s3 ls >/dev/null
}

# The store on s3s-fs instead (built into REPO/.tmp/tools once), which copies parts in
# the store; stopped at exit with the other servers.
bench_s3s() {
    # shellcheck source=scripts/lib/s3s.sh
    source "$BENCH_ROOT/scripts/lib/s3s.sh"
    S3S_TOOLS="$BENCH_ROOT/.tmp/tools" s3s_setup
    S3S_TOOLS="$BENCH_ROOT/.tmp/tools" s3s_start
    BENCH_PIDS+=("$S3S_PID")
    export AWS_ENDPOINT_URL="$S3S_ENDPOINT"
}

now_ns() { date +%s%N; }

tm() {
    local label="$1"; shift
    local tf="$WORK/.time" t0 t1 rc=0
    t0="$(now_ns)"
    /usr/bin/time -f '%e %M %U %S' -o "$tf" "$@" || rc=$?
    t1="$(now_ns)"
    if [ "$rc" != 0 ]; then
        echo "command failed ($rc): $*" >&2
        return "$rc"
    fi
    printf '%s %s %s %s\n' "$label" \
        "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", (b - a) / 1e9 }')" \
        "$(tail -n 1 "$tf" | awk '{ print $2 }')" \
        "$(tail -n 1 "$tf" | awk '{ printf "%.2f", $3 + $4 }')" >>"$STEPS"
}

run_begin() { : >"$STEPS"; }

# "seconds rss_kib" over the steps of the current run: summed time, largest RSS.
run_total() {
    awk '{ s += $2; if ($3 > m) m = $3 } END { printf "%.4f %d\n", s, m }' "$STEPS"
}

# Seconds / RSS of one labelled step of the current run.
step_secs() { awk -v l="$1" '$1 == l { s += $2 } END { printf "%.4f\n", s }' "$STEPS"; }
step_rss() { awk -v l="$1" '$1 == l && $3 > m { m = $3 } END { printf "%d\n", m }' "$STEPS"; }
# CPU seconds (user + system) of one labelled step of the current run.
step_cpu() { awk -v l="$1" '$1 == l { s += $4 } END { printf "%.2f\n", s }' "$STEPS"; }

record() {
    local key="$1"; shift
    local v
    for v in "$@"; do echo "$v" >>"$RES/$key"; done
}

# Median of the recorded values (the lower middle one for an even count).
med() {
    [ -s "$RES/$1" ] || { echo "n/a"; return; }
    sort -g "$RES/$1" | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}

# Number formatting for the tables.
f2() { awk -v x="$1" 'BEGIN { if (x == "n/a" || x == "") print "n/a"; else printf "%.2f", x }'; }
mib() { awk -v x="$1" 'BEGIN { if (x == "n/a" || x == "") print "n/a"; else printf "%.0f", x / 1024 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "n/a" || b == "n/a" || b + 0 == 0) print "n/a"; else printf "%.2f", a / b }'; }
mbps() { awk -v bytes="$1" -v s="$2" 'BEGIN { if (s == "n/a" || s + 0 == 0) print "n/a"; else printf "%.1f", bytes / 1048576 / s }'; }

# 1234567 -> "1.2 MiB"; 2048 -> "2.0 KiB".
human() {
    awk -v b="$1" 'BEGIN {
        if (b >= 1073741824) printf "%.2f GiB", b / 1073741824
        else if (b >= 1048576) printf "%.1f MiB", b / 1048576
        else printf "%.1f KiB", b / 1024 }'
}

vmhwm() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo "n/a"; }

# Reset a live process's VmHWM to its current RSS (Linux >= 4.0), so that a later
# vmhwm covers only what happened in between. Fails if the kernel refuses.
reset_hwm() { { echo 5 >"/proc/$1/clear_refs"; } 2>/dev/null; }

# CPU seconds (utime + stime, all threads) used so far by a live process. Fields 14
# and 15 of /proc/PID/stat, counted after the ")" that ends the command name.
CLK_TCK="$(getconf CLK_TCK 2>/dev/null || echo 100)"
proc_cpu() {
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo "n/a"; return; }
    awk -v hz="$CLK_TCK" '{ printf "%.2f\n", ($12 + $13) / hz }' <<<"${stat##*) }"
}

# ckptfs mount in daemon mode; CKPT_PID is the daemon's PID (from its stderr line
# "mounted ... (daemon pid N, log ...)").
CKPT_PID=""
mount_ckptfs() {
    local store="$1" mnt="$2" cache="$3"; shift 3
    mkdir -p "$mnt"
    BENCH_MOUNTS+=("$mnt")
    tm mount "$CKPTFS" "${CKPTFS_GLOBAL[@]}" mount "$store" "$mnt" --cache-dir "$cache" "$@" \
        2>"$WORK/mount.err" || { cat "$WORK/mount.err" >&2; return 1; }
    CKPT_PID="$(sed -n 's/.*(daemon pid \([0-9][0-9]*\).*/\1/p' "$WORK/mount.err" | tail -n 1)"
    [ -n "$CKPT_PID" ] || { cat "$WORK/mount.err" >&2; die "no daemon pid in the mount output"; }
    BENCH_PIDS+=("$CKPT_PID")
}

unmount_wait() {
    local mnt="$1" pid="${2:-}" i
    for i in $(seq 1 50); do
        mountpoint -q "$mnt" || break
        fusermount3 -u "$mnt" 2>/dev/null && break
        sleep 0.2
    done
    if mountpoint -q "$mnt"; then
        log "$mnt still busy; lazy unmount"
        fusermount3 -u -z "$mnt" || true
    fi
    if [ -n "$pid" ]; then
        _stop_pid "$pid"
        _forget_pid "$pid"
    fi
    return 0
}

# Markdown table helpers: md_header "a" "b" ...; md_row "x" "y" ...
md_row() { local out="|" c; for c in "$@"; do out+=" $c |"; done; echo "$out"; }
md_header() {
    md_row "$@"
    local out="|" c; for c in "$@"; do out+=" --- |"; done; echo "$out"
}

# A wake-up of a halted virtual CPU is an interrupt between CPUs and a VM exit, and a
# FUSE request makes two (BENCHMARKS.md section 7): this measures the daemon as on a
# host whose idle CPUs poll first.
bench_halt_poll() {
    [ -n "${BENCH_HALT_POLL_NS:-}" ] || return 0
    [ -w "$HALT_POLL" ] || die "BENCH_HALT_POLL_NS needs root and the haltpoll driver ($HALT_POLL)"
    HALT_POLL_WAS="$(cat "$HALT_POLL")"
    echo "$BENCH_HALT_POLL_NS" >"$HALT_POLL"
}

machine_line() {
    local cpu mem disk
    cpu="$(awk -F': ' '/model name/ { print $2; exit }' /proc/cpuinfo)"
    mem="$(awk '/MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
    disk="$(df -hT "$WORK" | awk 'NR == 2 { print $2 " on " $1 }')"
    echo "$(nproc) CPU ($cpu), $mem RAM, kernel $(uname -r), work dir on $disk$(
        [ -r "$HALT_POLL" ] && echo ", guest_halt_poll_ns $(cat "$HALT_POLL")")"
}
