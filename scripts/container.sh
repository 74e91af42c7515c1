#!/usr/bin/env bash
# ckptfs with podman containers: on demand, as root; not part of the test suite.
#
#   bash scripts/container.sh                      # binary: $CKPTFS_BIN, else target/release/ckptfs,
#                                                  # else target/debug/ckptfs (it builds nothing)
#   CKPTFS_CONTAINER_CHMOD_FUSE=1 bash scripts/container.sh   # also run scenario A rootless (see below)
#
# Scenario A: ckptfs mounts inside a container (--device /dev/fuse --cap-add SYS_ADMIN):
#   put a workspace into a store bind-mounted at /store, mount it, ls, cat, diff -r,
#   seal a new turn through staging/ + mv into commit/, verify, unmount. Rootful, and
#   rootless (a user made with useradd) where this machine allows it.
# Scenario B: ckptfs mounts on the host and the mount point is bound into a container
#   (-v MNT:/ckpt:ro), the sandbox that must not write its own history: it browses and
#   cats; creating a file in a checkpoint, mkdir in staging/, mv into commit/ ... are
#   all refused, and the store (every object and sidecar, hashed) and the staged
#   workspace are the same afterwards. Also with `ckptfs mount --read-only`, and from a
#   rootless container.
# One line per check: PASS, FAIL or SKIP (with the reason); exit 1 on any FAIL. The
# trap unmounts, stops the daemons and podman's pause process by PID, removes the
# containers (--rm, and by name if interrupted), the user it made and the temp dir.
#
# The root filesystem: no container registry is reachable, so no image is pulled.
# The rootfs is made in a second from what is on the machine: busybox (static, from
# Debian's busybox-static: the host's if /bin/busybox is static, else that .deb
# downloaded with `apt-get download` and unpacked, so the host's busybox is left
# alone), the ckptfs binary, fusermount3, the shared libraries `ldd` names for both,
# a two-line /etc/passwd, and the scenario scripts; `podman run --rootfs DIR`. No
# mmdebstrap/debootstrap: that would download ~100 packages from the Debian mirror
# (minutes) to get a shell and coreutils that busybox already gives, and the image
# would still need ckptfs copied in. Busybox's tools are enough here (diff -r follows
# symlinks, which is fine for these checks). The binary is copied once into the
# rootfs and the host side uses that copy too, so a build replacing target/ during
# the run changes nothing.
#
# What this machine needed (found by running it; the script probes, it does not assume):
# - --ulimit nofile=H:H --ulimit nproc=4096:4096. By default (and with `--ulimit host`)
#   podman asks for RLIMIT_NOFILE and RLIMIT_NPROC above the hard limits its runtime
#   inherits, and raising a hard limit needs CAP_SYS_RESOURCE, which root lacks in this
#   sandbox: "crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted".
# - runc, not crun: the cgroups here are v1 plus a v2 hierarchy with a controller
#   (hybrid), which crun 1.8 refuses ("cgroups in hybrid mode not supported, drop all
#   controllers from cgroupv2"). The script tries crun, then runc, and says why.
# - --network none (no netavark/iptables needed), --tmpfs /tmp (the rootfs belongs to
#   the host's root; a rootless container's root may not write into it).
#
# FUSE and containers (what scenario B found):
# - Rootful container, no user namespace: its root is the host's root, who made the
#   mount, so it needs no --allow-other. The bind is made from the host's namespace
#   when the container starts, so mount first, then start the container (mounts made
#   on the host later do not propagate into it: "/" is not a shared mount here).
# - Rootless container (or --userns): its processes are the user's uid and subuids on
#   the host, and FUSE refuses every uid but the mounting one unless the mount has
#   allow_other: podman fails with "stat MNT: permission denied". So the host mount
#   needs `--allow-other` (the daemon runs as root, so /etc/fuse.conf's
#   user_allow_other is not needed); the container then sees the files as nobody's.
# - Rootless podman keeps a pause process (catatonit -P) that holds its user and mount
#   namespaces from the first rootless command on. That mount namespace is a copy of
#   the host's at that moment, and "/" is not a shared mount, so a FUSE mount made on
#   the host afterwards is NOT seen: the container silently gets the empty directory
#   under the mount point (no error!). And the pause process's copy keeps every FUSE
#   mount that existed when it started alive: after `fusermount3 -u` on the host the
#   daemon goes on serving until the pause process exits. The script therefore stops
#   the pause process (by its PID file) before and after each rootless run, and every
#   container checks that /ckpt really is fuse.ckptfs.
# - Rootless scenario A needs the user to open /dev/fuse. Here /dev/fuse is 0600 root
#   (Debian's udev makes it 0666; no udev runs on this machine), so it is SKIPped unless
#   CKPTFS_CONTAINER_CHMOD_FUSE=1, which makes it 0666 for the run and restores the
#   mode on exit. With it, a rootless container mounts, seals and unmounts as root in
#   its user namespace (FUSE mounts are allowed there; no fusermount3 needed).
# - Rootless containers get a rootfs whose "/" belongs to the user (their root), as an
#   image in the user's storage would: with "/" the host root's (nobody, 65534, in the
#   user namespace) ckptfs refuses its cache directory: "/tmp: is in /, which belongs
#   to uid 65534; refusing to use it" (its security model, rightly).
# - Rootless podman runs with --root/--runroot/--tmpdir in the temp dir, so the pause
#   process it starts is this run's (--tmpdir/pause.pid) and stopped by PID: with the
#   user's defaults, podman keeps the paths its database recorded on its first run and
#   would join a pause process left by an earlier run that was killed.
set -uo pipefail
umask 022
cd "$(dirname "$0")/.."
repo=$PWD

if [[ $EUID -ne 0 ]]; then
    echo "scripts/container.sh: run as root (podman rootful, FUSE, useradd)" >&2
    exit 2
fi

# --- the binary --------------------------------------------------------------
if [[ -n ${CKPTFS_BIN:-} ]]; then
    bin=$CKPTFS_BIN
elif [[ -x $repo/target/release/ckptfs ]]; then
    bin=$repo/target/release/ckptfs
elif [[ -x $repo/target/debug/ckptfs ]]; then
    bin=$repo/target/debug/ckptfs
else
    echo "scripts/container.sh: no ckptfs binary: cargo build, or set CKPTFS_BIN" >&2
    exit 2
fi
[[ -x $bin ]] || { echo "scripts/container.sh: $bin is not executable" >&2; exit 2; }
bin=$(realpath "$bin")

# --- reporting ---------------------------------------------------------------
npass=0 nfail=0 nskip=0
pass() { echo "PASS  $*"; npass=$((npass + 1)); }
fail() { echo "FAIL  $*"; nfail=$((nfail + 1)); }
skip() { echo "SKIP  $*"; nskip=$((nskip + 1)); }
note() { echo "----  $*"; }
# check LABEL CMD...: PASS if CMD succeeds, FAIL with its output otherwise
check() {
    local label=$1 out
    shift
    if out=$("$@" 2>&1); then pass "$label"; else fail "$label: $(tr '\n' ' ' <<<"$out")"; fi
}

# --- packages ------------------------------------------------------------------
need=()
command -v podman >/dev/null || need+=(podman)
command -v fusermount3 >/dev/null || need+=(fuse3)
command -v runc >/dev/null || need+=(runc)
command -v newuidmap >/dev/null || need+=(uidmap)
if ((${#need[@]})); then
    note "installing ${need[*]} from Debian's packages"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q podman fuse3 runc uidmap >/dev/null ||
        { echo "FAIL  apt-get install podman fuse3 runc uidmap" ; exit 1; }
fi

# --- state for the trap ------------------------------------------------------------
work=$(mktemp -d /tmp/ckptfs-container.XXXXXX)
chmod 0755 "$work" # the rootless user reads the rootfs and the workspace through it
tag="ckptfs-ct-$$"
MOUNTS=()   # host mount points made here
DAEMONS=()  # host daemon pids
CONTAINERS_ROOT=() CONTAINERS_RL=()
rl_user="" rl_created=0 rl_dir="$work/rootless" rl_home=""
fuse_mode_saved=""

rl() { # run a command as the rootless user, with a runtime dir of ours (5 minutes at most)
    (cd / && timeout 300 runuser -u "$rl_user" -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
        HOME="$rl_home" XDG_RUNTIME_DIR="$rl_dir/run" USER="$rl_user" LOGNAME="$rl_user" "$@")
}
# Rootless podman with its storage, run and tmp directories in $work: its state (and so
# where it keeps the pause process's PID, --tmpdir/pause.pid) is this run's alone. With
# the user's defaults, podman keeps using the paths its database recorded on the first
# run, and a pause process left by an earlier, killed run would be joined: a namespace
# older than the mount, see the top.
rlpodman() {
    rl podman --root "$rl_dir/root" --runroot "$rl_dir/run" --tmpdir "$rl_dir/tmp" "$@"
}
kill_pid() { # PID: TERM, wait up to 10 s, then KILL
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
}
stop_pause() { # rootless podman's pause process, which holds a copy of the mounts
    local f="$rl_dir/tmp/pause.pid" pid
    [[ -n $rl_user && -f $f ]] || return 0
    pid=$(cat "$f" 2>/dev/null)
    [[ $pid =~ ^[0-9]+$ ]] && [[ $(stat -c %U "/proc/$pid" 2>/dev/null) == "$rl_user" ]] && kill_pid "$pid"
    rm -f "$f"
}
cleanup() {
    local m c p
    for c in "${CONTAINERS_ROOT[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1; done
    for c in "${CONTAINERS_RL[@]}"; do rlpodman rm -f -t 0 "$c" >/dev/null 2>&1; done
    stop_pause
    for m in "${MOUNTS[@]}"; do
        if mountpoint -q "$m"; then fusermount3 -u "$m" 2>/dev/null || fusermount3 -u -z "$m" 2>/dev/null; fi
    done
    for p in "${DAEMONS[@]}"; do # normally gone with its mount; only ours, by its binary
        [[ $(readlink "/proc/$p/exe" 2>/dev/null) == "$work/rootfs/usr/bin/ckptfs" ]] && kill_pid "$p"
    done
    [[ -n $fuse_mode_saved ]] && chmod "$fuse_mode_saved" /dev/fuse
    if ((rl_created)); then
        userdel -r "$rl_user" >/dev/null 2>&1 || echo "warning: userdel $rl_user failed" >&2
    fi
    if grep -q " $work" /proc/self/mounts; then
        echo "warning: something is still mounted under $work; left in place" >&2
    else
        rm -rf --one-file-system "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- the root filesystem -----------------------------------------------------------
rootfs=$work/rootfs
mkdir -p "$rootfs"/{bin,usr/bin,etc,tmp,proc,sys,dev,root,store,ckpt,ws}
busybox=""
if [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1; then
    busybox=/bin/busybox # static already
else
    note "fetching busybox-static's .deb (the host's busybox is not static; it is left alone)"
    mkdir -p "$work/deb"
    (cd "$work/deb" && { apt-get download -q busybox-static >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get download -q busybox-static >/dev/null; }; }) &&
        dpkg-deb -x "$work"/deb/busybox-static_*.deb "$work/deb/x" && busybox=$work/deb/x/bin/busybox
fi
[[ -x $busybox ]] || { echo "FAIL  no static busybox for the rootfs"; exit 1; }
cp "$busybox" "$rootfs/bin/busybox"
for a in $("$busybox" --list); do [[ $a == busybox ]] || ln -s busybox "$rootfs/bin/$a"; done
cp "$bin" "$rootfs/usr/bin/ckptfs"
cp "$(command -v fusermount3)" "$rootfs/usr/bin/fusermount3"
chmod 0755 "$rootfs/usr/bin/fusermount3" # no setuid bit in there
while read -r lib; do
    cp -L --parents "$lib" "$rootfs/"
done < <(ldd "$bin" "$(command -v fusermount3)" 2>/dev/null |
    awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// && $1 !~ /:$/ {print $1}' | sort -u)
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
ln -s /proc/self/mounts "$rootfs/etc/mtab"
ckptfs=$rootfs/usr/bin/ckptfs # the host side uses the same copy

# The checks that run inside the containers (busybox sh). Each prints PASS/FAIL lines.
cat >"$rootfs/lib.sh" <<'EOF'
fails=0
pass() { echo "PASS  [$SCEN] $*"; }
fail() { echo "FAIL  [$SCEN] $*"; fails=$((fails + 1)); }
check() { label=$1; shift; if out=$("$@" 2>&1); then pass "$label"; else fail "$label: $(echo $out)"; return 1; fi; }
must() { check "$@" || exit 1; } # what the rest depends on
# refused LABEL CMD...: CMD must fail with EROFS, EACCES or EPERM (ENOENT too where told)
refused() {
    label=$1; shift
    if out=$("$@" 2>&1); then fail "$label: it succeeded"; return; fi
    case "$out" in
    *"Read-only file system"* | *"Permission denied"* | *"Operation not permitted"*) pass "$label: refused ($(echo $out))" ;;
    *"No such file or directory"*) if [ -n "${ENOENT_OK:-}" ]; then pass "$label: refused ($(echo $out))"; else fail "$label: $(echo $out)"; fi ;;
    *) fail "$label: failed another way: $(echo $out)" ;;
    esac
}
EOF

cat >"$rootfs/scenario-a.sh" <<'EOF'
. /lib.sh
ws=/tmp/ws mnt=/tmp/mnt cache=/tmp/cache
mkdir -p $ws/src $mnt
echo 'print("turn 1")' >$ws/hello.py
echo 'fn main() {}' >$ws/src/lib.rs
ln -s hello.py $ws/link.py
head -c 100000 /dev/urandom >$ws/data.bin # a file of its own in the cache (>= 16 KiB)
check "$(ckptfs --version 2>&1 | head -1) runs in the container as $(id -u):$(id -g)" true
must "put the workspace into /store" sh -c "ckptfs put /store $ws >/tmp/put.out"
sha1=$(cut -d' ' -f1 /tmp/put.out)
must "mount /store on $mnt" sh -c "ckptfs mount /store $mnt --cache-dir $cache >/tmp/mount.out 2>&1 || { cat /tmp/mount.out; exit 1; }"
pid=$(sed -n 's/.*daemon pid \([0-9][0-9]*\).*/\1/p' /tmp/mount.out)
check "$mnt is a fuse.ckptfs mount" grep -q " $mnt fuse.ckptfs " /proc/mounts
check "ls: the checkpoint $sha1 and latest -> it" sh -c "ls $mnt | grep -qx '$sha1' && [ \"\$(readlink $mnt/latest)\" = '$sha1' ]"
check "ls latest/ shows the workspace" sh -c "[ \"\$(ls $mnt/latest/ | tr '\n' ' ')\" = 'data.bin hello.py link.py src ' ]"
check "cat latest/hello.py" sh -c "[ \"\$(cat $mnt/latest/hello.py)\" = 'print(\"turn 1\")' ]"
check "diff -r workspace latest/" diff -r $ws $mnt/latest/
echo 'print("turn 2")' >$ws/hello.py
echo 'new' >$ws/src/new.txt
check "stage turn-2: mkdir staging/turn-2, cp -a" sh -c "mkdir $mnt/staging/turn-2 && cp -a $ws/. $mnt/staging/turn-2/"
must "seal: mv staging/turn-2 commit/" mv $mnt/staging/turn-2 $mnt/commit/
sha2=$(readlink $mnt/commit/turn-2 | sed 's#^\.\./##')
must "commit/turn-2 -> ../<a new checkpoint> ($sha2)" sh -c "[ -n '$sha2' ] && [ '$sha2' != '$sha1' ] && [ -d $mnt/$sha2 ]"
check "the new checkpoint holds the staged files (diff -r)" diff -r $ws $mnt/$sha2/
check "staging/turn-2 is gone after the seal" test ! -e $mnt/staging/turn-2
i=0; while [ "$(readlink $mnt/latest)" != "$sha2" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
check "latest -> the new checkpoint" test "$(readlink $mnt/latest)" = "$sha2"
check "by-time/ lists 2 turns" test "$(ls $mnt/by-time | wc -l)" -eq 2
check ".status names the seal" grep -q "seal turn-2: sealed as $sha2" $mnt/.status
check "ckptfs ls /store: 2 checkpoints" test "$(ckptfs ls /store | wc -l)" -eq 2
check "ckptfs verify /store" ckptfs verify /store
check "unmount: fusermount3 -u $mnt" fusermount3 -u $mnt
i=0; while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
check "the daemon (pid $pid) exited after the unmount" sh -c "! kill -0 '$pid' 2>/dev/null"
check "no fuse.ckptfs mount left in the container" sh -c "! grep -q fuse.ckptfs /proc/mounts"
[ $fails -eq 0 ]
EOF

# MODE=staging: the host mount has staging/ (the host staged staging/pre);
# MODE=readonly: `ckptfs mount --read-only` (no staging/ nor commit/)
cat >"$rootfs/scenario-b.sh" <<'EOF'
. /lib.sh
check "running as uid $(id -u) in the container" true
must "/ckpt is the ckptfs mount (not the empty directory under it)" sh -c "grep ' /ckpt fuse.ckptfs ' /proc/mounts"
# SHA1, SHA2: the store's two turns (the host may have sealed more)
check "ls /ckpt: latest, by-time/, both turns" sh -c "[ -L /ckpt/latest ] && ls /ckpt | grep -qx '$SHA1' && ls /ckpt | grep -qx '$SHA2' && [ \$(ls /ckpt/by-time | wc -l) -eq $NTURNS ]"
check "cat /ckpt/<turn 2>/hello.py" sh -c "[ \"\$(cat /ckpt/$SHA2/hello.py)\" = 'print(\"turn 2\")' ]"
check "diff -r /ws /ckpt/<turn 2>/" diff -r /ws /ckpt/$SHA2/
check "browse: the first turn through by-time/" sh -c "[ \"\$(cat /ckpt/by-time/\$(ls /ckpt/by-time | head -1)/hello.py)\" = 'print(\"turn 1\")' ]"
check "cat /ckpt/.status" sh -c "grep -q '^# checkpoints: $NTURNS' /ckpt/.status"
refused "create a file in a checkpoint" sh -c "echo x >/ckpt/$SHA2/new.txt"
refused "append to a checkpoint's file" sh -c "echo x >>/ckpt/$SHA2/hello.py"
refused "truncate a checkpoint's file" sh -c ": >/ckpt/$SHA2/hello.py"
refused "rm a checkpoint's file" rm -f /ckpt/$SHA2/hello.py
refused "chmod a checkpoint's file" chmod 0777 /ckpt/$SHA2/hello.py
refused "mkdir in the mount's root" mkdir /ckpt/x
if [ "$MODE" = staging ]; then
    check "staging/pre (staged by the host) is readable" grep -q 'staged by the host' /ckpt/staging/pre/note.txt
    refused "mkdir /ckpt/staging/x" mkdir /ckpt/staging/x
    refused "write into staging/pre" sh -c 'echo x >/ckpt/staging/pre/evil.txt'
    refused "change staging/pre/note.txt" sh -c 'echo x >>/ckpt/staging/pre/note.txt'
    refused "seal: mv /ckpt/staging/pre /ckpt/commit/" mv /ckpt/staging/pre /ckpt/commit/
    refused "mv a directory of the container into commit/" sh -c 'mkdir /tmp/w && echo x >/tmp/w/f && mv /tmp/w /ckpt/commit/'
    refused "ln -s into commit/" ln -s ../x /ckpt/commit/y
else
    check "no staging/ nor commit/ (--read-only)" sh -c '[ ! -e /ckpt/staging ] && [ ! -e /ckpt/commit ]'
    ENOENT_OK=1 refused "mkdir /ckpt/staging/x" mkdir /ckpt/staging/x
    ENOENT_OK=1 refused "ln -s into commit/" ln -s ../x /ckpt/commit/y
fi
[ $fails -eq 0 ]
EOF

# --- running containers ------------------------------------------------------
hard_nofile=$(ulimit -Hn)
[[ $hard_nofile == unlimited ]] && hard_nofile=1048576
base_args=(--network none --ulimit "nofile=$hard_nofile:$hard_nofile" --ulimit nproc=4096:4096
    --tmpfs /tmp:rw,mode=1777 --env PATH=/usr/bin:/bin)
runtime=""
for rt in ${CKPTFS_PODMAN_RUNTIME:-crun runc}; do
    command -v "$rt" >/dev/null || continue
    if out=$(timeout 120 podman --runtime "$rt" run --rm "${base_args[@]}" --rootfs "$rootfs" /bin/true 2>&1); then
        runtime=$rt
        break
    fi
    note "podman with $rt does not run here: $(tr '\n' ' ' <<<"$out")"
done
if [[ -z $runtime ]]; then
    fail "podman runs no container here (see above)"
    echo "$npass passed, $nfail failed, $nskip skipped"
    exit 1
fi
note "podman $(podman --version | awk '{print $3}'), runtime $runtime, rootfs $(du -sh "$rootfs" | cut -f1) (busybox, $("$ckptfs" --version | head -1), fusermount3, libc)"

# run_ct LABEL WHO ARGS...: podman run as root (WHO=root) or as the rootless user;
# prints the container's lines (its PASS/FAIL as they are) and counts them
n_ct=0
run_ct() {
    local label=$1 who=$2 name out rc line
    shift 2
    n_ct=$((n_ct + 1))
    name="$tag-$n_ct"
    out=$work/ct-$n_ct.log
    if [[ $who == root ]]; then
        CONTAINERS_ROOT+=("$name")
        timeout 300 podman --runtime "$runtime" run --rm --name "$name" "${base_args[@]}" "$@" >"$out" 2>&1
    else
        CONTAINERS_RL+=("$name")
        rlpodman --runtime "$runtime" run --rm --name "$name" "${base_args[@]}" "$@" >"$out" 2>&1
    fi
    rc=$?
    while IFS= read -r line; do
        case $line in
        PASS*) echo "$line"; npass=$((npass + 1)) ;;
        FAIL*) echo "$line"; nfail=$((nfail + 1)) ;;
        *'is not a shared mount'*) ;; # rootless podman's warning; see the top
        *) echo "      | $line" ;;
        esac
    done <"$out"
    if ((rc != 0)) && ! grep -q '^FAIL' "$out"; then fail "[$label] the container exited $rc"; fi
    return $rc
}

objects() { find "$1" -maxdepth 1 -name '*.tar.gz' | wc -l; }
fingerprint() { # names and bytes of every file under $1 (but the staging graveyard)
    (cd "$1" && find . -path ./.ckptfs-graveyard -prune -o -print | LC_ALL=C sort |
        while IFS= read -r f; do
            if [[ -f $f ]]; then echo "$f $(sha256sum <"$f")"; else echo "$f"; fi
        done) | sha256sum | cut -c1-16
}
# host_mount STORE MNT CACHE [ARGS...]: the daemon's pid in $mpid
host_mount() {
    local store=$1 mnt=$2 cache=$3 out
    shift 3
    mkdir -p "$mnt"
    MOUNTS+=("$mnt") # first: a signal may end the script as soon as the mount returns
    if out=$("$ckptfs" mount "$store" "$mnt" --cache-dir "$cache" "$@" 2>&1); then
        mpid=$(sed -n 's/.*daemon pid \([0-9][0-9]*\).*/\1/p' <<<"$out")
        [[ -n $mpid ]] && DAEMONS+=("$mpid")
        return 0
    fi
    echo "$out"
    return 1
}
# host_umount LABEL MNT PID: fusermount3 -u, and the daemon must exit
host_umount() {
    local label=$1 mnt=$2 pid=$3 i
    check "[$label] host: fusermount3 -u $mnt" fusermount3 -u "$mnt"
    for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    check "[$label] host: the daemon (pid $pid) exited" bash -c "! kill -0 $pid 2>/dev/null"
}

# --- the rootless user ---------------------------------------------------------
rl_why=""
if ! command -v useradd >/dev/null; then
    rl_why="no useradd"
else
    rl_user=${CKPTFS_CONTAINER_USER:-ckptfs-podman}
    if ! id "$rl_user" >/dev/null 2>&1; then
        rl_created=1 # first, as for the mounts
        if ! useradd -m -s /usr/sbin/nologin "$rl_user" 2>"$work/useradd.err"; then
            rl_created=0
            rl_why="useradd $rl_user failed: $(cat "$work/useradd.err")"
        fi
    fi
fi
if [[ -z $rl_why ]]; then
    rl_home=$(getent passwd "$rl_user" | cut -d: -f6)
    mkdir -p "$rl_dir"/{root,run,tmp} && chown "$rl_user:" "$rl_dir"/{root,run,tmp} && chmod 0700 "$rl_dir"/{root,run,tmp}
    # The rootless containers get a rootfs whose "/" is the user's (their root), as an
    # image in the user's storage would have: ckptfs refuses a cache directory under a
    # directory of another owner ("/tmp: is in /, which belongs to uid 65534"), and the
    # host's root, who owns $rootfs, is nobody (65534) in the user's namespace. The
    # files are hard links to $rootfs's.
    rootfs_rl=$work/rootfs-rl
    if ! cp -al "$rootfs" "$rootfs_rl" || ! chown "$rl_user:" "$rootfs_rl"; then
        rl_why="cannot make $rootfs_rl"
    elif ! grep -q "^$rl_user:" /etc/subuid || ! grep -q "^$rl_user:" /etc/subgid; then
        rl_why="$rl_user has no /etc/subuid or /etc/subgid range (rootless podman needs one)"
    elif ! out=$(rlpodman --runtime "$runtime" run --rm "${base_args[@]}" --rootfs "$rootfs_rl" /bin/true 2>&1); then
        rl_why="rootless podman does not run here: $(grep -v 'shared mount' <<<"$out" | tr '\n' ' ')"
    fi
    stop_pause
fi
[[ -z $rl_why ]] && note "rootless: user $rl_user ($(id -u "$rl_user")), subuids $(grep "^$rl_user:" /etc/subuid | cut -d: -f2-)"

# === Scenario A: the mount inside the container ======================================
echo "== A: ckptfs mounts inside a rootful container (--device /dev/fuse --cap-add SYS_ADMIN)"
storeA=$work/store-a
mkdir -p "$storeA"
run_ct A root --device /dev/fuse --cap-add SYS_ADMIN -v "$storeA:/store" --env SCEN=A \
    --rootfs "$rootfs" /bin/sh /scenario-a.sh
check "[A] host: the store holds 2 objects" test "$(objects "$storeA")" -eq 2
check "[A] host: ckptfs verify of the store the container wrote" "$ckptfs" verify "$storeA"
check "[A] host: no mount left behind" bash -c "! grep -q ' $work' /proc/self/mounts"

echo "== A-rootless: the same in a rootless container (user $rl_user)"
if [[ -n $rl_why ]]; then
    skip "[A-rootless] $rl_why"
else
    if ! rl test -r /dev/fuse -a -w /dev/fuse; then
        if [[ ${CKPTFS_CONTAINER_CHMOD_FUSE:-} == 1 ]]; then
            fuse_mode_saved=$(stat -c %a /dev/fuse)
            chmod 0666 /dev/fuse
            note "/dev/fuse was $fuse_mode_saved, made 0666 for this run (CKPTFS_CONTAINER_CHMOD_FUSE=1); restored on exit"
        fi
    fi
    if ! rl test -r /dev/fuse -a -w /dev/fuse; then
        skip "[A-rootless] /dev/fuse is $(stat -c '%a %U' /dev/fuse) on this machine (no udev to make it 0666), so a rootless container cannot open it (mount: Permission denied); CKPTFS_CONTAINER_CHMOD_FUSE=1 makes it 0666 for the run"
    else
        storeArl=$work/store-a-rootless
        mkdir -p "$storeArl" && chown "$rl_user:" "$storeArl"
        run_ct A-rootless rl --device /dev/fuse --cap-add SYS_ADMIN -v "$storeArl:/store" \
            --env SCEN=A-rootless --rootfs "$rootfs_rl" /bin/sh /scenario-a.sh
        stop_pause
        check "[A-rootless] host: the store holds 2 objects, the user's" \
            bash -c "[ $(objects "$storeArl") -eq 2 ] && [ -z \"\$(find '$storeArl' ! -user '$rl_user')\" ]"
        check "[A-rootless] host: ckptfs verify" "$ckptfs" verify "$storeArl"
    fi
    [[ -n $fuse_mode_saved ]] && chmod "$fuse_mode_saved" /dev/fuse && fuse_mode_saved=""
fi

# === Scenario B: the mount on the host, bound read-only into the sandbox ================
storeB=$work/store-b wsB=$work/ws-b
mkdir -p "$wsB/src"
echo 'print("turn 1")' >"$wsB/hello.py"
echo 'fn main() {}' >"$wsB/src/lib.rs"
ln -s hello.py "$wsB/link.py"
sha1B=$("$ckptfs" put "$storeB" "$wsB" 2>/dev/null | cut -d' ' -f1)
sleep 1.1 # by-time/ names are per second; keep the turns apart
echo 'print("turn 2")' >"$wsB/hello.py"
sha2B=$("$ckptfs" put "$storeB" "$wsB" 2>/dev/null | cut -d' ' -f1)
check "[B] host: a store of 2 turns ($sha1B, $sha2B)" test "$(objects "$storeB")" -eq 2 -a -n "$sha2B"
b_env() { echo --env "SHA1=$sha1B" --env "SHA2=$sha2B" --env "NTURNS=$(objects "$storeB")"; }

# b_writable LABEL WHO MOUNT-ARGS: mount with staging/, stage staging/pre on the host,
# run the container on MNT:/ckpt:ro, then check nothing changed
b_writable() {
    local label=$1 who=$2 d before_store before_staging before_n
    shift 2
    d=$work/$label
    mkdir -p "$d"
    if ! host_mount "$storeB" "$d/mnt" "$d/cache" --staging-dir "$d/staging" "$@"; then
        fail "[$label] host: ckptfs mount $*"
        return 1
    fi
    pass "[$label] host: ckptfs mount ${*:-(no options)} (daemon pid $mpid)"
    local pid=$mpid
    check "[$label] host: stage staging/pre through the mount" \
        bash -c "mkdir '$d/mnt/staging/pre' && echo 'staged by the host' >'$d/mnt/staging/pre/note.txt'"
    before_store=$(fingerprint "$storeB") before_staging=$(fingerprint "$d/staging") before_n=$(objects "$storeB")
    [[ $who == rl ]] && stop_pause # a new pause process, made after the mount, sees it
    local rfs=$rootfs
    [[ $who == rl ]] && rfs=$rootfs_rl
    run_ct "$label" "$who" -v "$d/mnt:/ckpt:ro" -v "$wsB:/ws:ro" --env SCEN="$label" --env MODE=staging $(b_env) \
        --rootfs "$rfs" /bin/sh /scenario-b.sh
    [[ $who == rl ]] && stop_pause # its copy of the mount would keep the daemon alive
    check "[$label] host: no new object in the store ($before_n before and after)" test "$(objects "$storeB")" -eq "$before_n"
    check "[$label] host: the store's files are byte for byte the same" test "$(fingerprint "$storeB")" = "$before_store"
    check "[$label] host: the staging directory is the same" test "$(fingerprint "$d/staging")" = "$before_staging"
    if [[ $label == B1 ]]; then # the refusals were the container's: the host can seal
        check "[$label] host: mv staging/pre commit/ on the host seals a checkpoint" \
            bash -c "mv '$d/mnt/staging/pre' '$d/mnt/commit/' && [ \$(find '$storeB' -maxdepth 1 -name '*.tar.gz' | wc -l) -eq $((before_n + 1)) ]"
    fi
    host_umount "$label" "$d/mnt" "$pid"
}

echo "== B1: host mount (no --allow-other), rootful container, -v MNT:/ckpt:ro"
b_writable B1 root

echo "== B2: host mount --read-only, rootful container, -v MNT:/ckpt (no :ro)"
d=$work/B2
mkdir -p "$d"
if host_mount "$storeB" "$d/mnt" "$d/cache" --read-only; then
    pass "[B2] host: ckptfs mount --read-only (daemon pid $mpid)"
    pid=$mpid
    before_store=$(fingerprint "$storeB")
    run_ct B2 root -v "$d/mnt:/ckpt" -v "$wsB:/ws:ro" --env SCEN=B2 --env MODE=readonly $(b_env) \
        --rootfs "$rootfs" /bin/sh /scenario-b.sh
    check "[B2] host: the store's files are byte for byte the same" test "$(fingerprint "$storeB")" = "$before_store"
    host_umount B2 "$d/mnt" "$pid"
else
    fail "[B2] host: ckptfs mount --read-only"
fi

echo "== B3: rootless container (user $rl_user), -v MNT:/ckpt:ro"
if [[ -n $rl_why ]]; then
    skip "[B3] $rl_why"
else
    # without --allow-other, the user's uids may not even stat the mount point
    d=$work/B3-no-allow-other
    mkdir -p "$d"
    if host_mount "$storeB" "$d/mnt" "$d/cache" --read-only; then
        pid=$mpid
        stop_pause
        out=$(rlpodman --runtime "$runtime" run --rm --name "$tag-noallow" "${base_args[@]}" \
            -v "$d/mnt:/ckpt:ro" --rootfs "$rootfs_rl" /bin/ls /ckpt 2>&1)
        rc=$?
        stop_pause
        if ((rc != 0)) && grep -qi 'permission denied' <<<"$out"; then
            pass "[B3] without --allow-other a rootless container cannot use the mount: $(grep -i 'permission denied' <<<"$out" | head -1 | sed 's/.*error mounting/error mounting/')"
        else
            fail "[B3] without --allow-other, expected podman to fail with permission denied; rc $rc: $(tr '\n' ' ' <<<"$out")"
        fi
        host_umount B3 "$d/mnt" "$pid"
    else
        fail "[B3] host: ckptfs mount --read-only"
    fi
    b_writable B3 rl --allow-other

    # the pitfall stop_pause avoids: a pause process older than the mount hides it
    d=$work/B3-stale
    mkdir -p "$d"
    stop_pause
    rlpodman --runtime "$runtime" run --rm "${base_args[@]}" --rootfs "$rootfs_rl" /bin/true >/dev/null 2>&1
    if host_mount "$storeB" "$d/mnt" "$d/cache" --read-only --allow-other; then
        pid=$mpid
        seen=$(rlpodman --runtime "$runtime" run --rm --name "$tag-stale" "${base_args[@]}" \
            -v "$d/mnt:/ckpt:ro" --rootfs "$rootfs_rl" /bin/sh -c 'grep -c " /ckpt fuse.ckptfs " /proc/mounts; ls -A /ckpt | wc -l' 2>/dev/null | tr '\n' ' ')
        stop_pause
        note "[B3] with a pause process older than the mount, the container's /ckpt shows (fuse mounts, entries): $seen(0 0: the empty directory under the mount point)"
        host_umount B3 "$d/mnt" "$pid"
    fi
fi

check "[all] host: no mount left under $work" bash -c "! grep -q ' $work' /proc/self/mounts"
echo "$npass passed, $nfail failed, $nskip skipped"
((nfail == 0))
