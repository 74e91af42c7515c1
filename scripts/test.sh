#!/usr/bin/env bash
# The project's test command (see README): installs what the tests need, starts a
# local S3 server (moto) and a checksum-checking one (s3s-fs), then runs rustfmt,
# clippy, the whole cargo test suite and, for a whole run, pjdfstest on staging/
# (scripts/conformance.sh).
# Extra arguments go to `cargo test`, e.g. `bash scripts/test.sh store::`.
set -euo pipefail
cd "$(dirname "$0")/.."
CKPTFS_ROOT="$PWD"
# shellcheck source=scripts/lib/moto.sh
source scripts/lib/moto.sh
# shellcheck source=scripts/lib/s3s.sh
source scripts/lib/s3s.sh

# FUSE tests mount under .tmp/tests/; lazily unmount whatever a crashed test left there.
unmount_leftovers() {
    [ -r /proc/self/mountinfo ] || return 0
    command -v fusermount3 >/dev/null 2>&1 || return 0
    local mnt
    # Field 5 is the mount point (octal-escaped); the fs type follows the " - " marker.
    awk -v root="$CKPTFS_TMP/tests/" '{
            for (i = 7; i <= NF; i++) if ($i == "-") break
            if ($(i + 1) ~ /^fuse/ && index($5, root) == 1) print $5
        }' /proc/self/mountinfo | sort -r | while read -r mnt; do
        mnt="$(printf '%b' "$mnt")"
        echo "==> unmounting leftover FUSE mount $mnt" >&2
        fusermount3 -u -z "$mnt" || true
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    unmount_leftovers || true
    moto_stop || true
    s3s_stop || true
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# fuse3 for the mounts; GNU time to measure the peak memory of commands under test;
# Chromium to load `ckptfs report`'s pages as a browser does.
missing=()
command -v fusermount3 >/dev/null 2>&1 || missing+=(fuse3)
[ -x /usr/bin/time ] || missing+=(time)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing ${missing[*]}" >&2
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi

mkdir -p "$CKPTFS_TMP"
unmount_leftovers
venv_setup
moto_start
s3s_setup
s3s_start

export CKPTFS_TEST_S3_ENDPOINT="$MOTO_ENDPOINT"
export CKPTFS_TEST_S3S_ENDPOINT="$S3S_ENDPOINT"
export CKPTFS_TEST_PYTHON="$CKPTFS_VENV/bin/python"
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
export AWS_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true

echo "==> cargo fmt --check" >&2
cargo fmt --check
echo "==> cargo clippy --all-targets -- -D warnings" >&2
cargo clippy --all-targets -- -D warnings
echo "==> cargo test $*" >&2
cargo test "$@"
# The POSIX conformance of staging/ (pjdfstest, about 7 minutes), for whole runs only.
if [ $# -eq 0 ]; then
    if [ -f "${PJDFSTEST_SRC:-$CKPTFS_ROOT/../shared/pjdfstest}/pjdfstest.c" ]; then
        echo "==> scripts/conformance.sh (pjdfstest on staging/)" >&2
        CKPTFS_BIN="$PWD/target/debug/ckptfs" bash scripts/conformance.sh --no-reference
    else
        echo "==> NOTE: no pjdfstest source (../shared/pjdfstest or PJDFSTEST_SRC); conformance not run" >&2
    fi
fi
