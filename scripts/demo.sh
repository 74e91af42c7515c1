#!/usr/bin/env bash
# The README's first command: shows ckptfs's main job on a local store, start to end:
# capture a workspace, list and verify it, mount the store, browse it, capture a new
# turn through the mount, and restore it. Cleans up after itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v fusermount3 >/dev/null 2>&1; then
    echo "==> installing fuse3" >&2
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q fuse3
fi
echo "==> building ckptfs" >&2
cargo build --quiet
ckptfs="$PWD/target/debug/ckptfs"

work=$(mktemp -d)
mnt="$work/mnt"
cleanup() {
    fusermount3 -u "$mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/workspace/src" "$mnt"
step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@"; }

echo 'print("hello from turn 1")' >"$work/workspace/hello.py"
echo 'fn main() {}' >"$work/workspace/src/lib.rs"
ln -s hello.py "$work/workspace/link.py"

cd "$work"
step "$ckptfs" put store workspace
step "$ckptfs" ls store
step "$ckptfs" verify store
step "$ckptfs" mount store mnt --cache-dir cache
step ls -l mnt/
step ls -l mnt/latest/
step cat mnt/latest/hello.py
step cat mnt/.status

echo 'print("hello from turn 2")' >workspace/hello.py
step mkdir mnt/staging/turn-2
step cp -a workspace/. mnt/staging/turn-2/
step mv mnt/staging/turn-2 mnt/commit/
step readlink mnt/commit/turn-2
step diff -r --no-dereference workspace mnt/commit/turn-2/
step ls mnt/by-time/
step "$ckptfs" get store "$(readlink mnt/latest | cut -c1-12)" restored
step cat restored/hello.py
step fusermount3 -u mnt
printf '\nDone: a capture, a listing, a verification, a mount, a capture through the mount and a verified restore.\n'
