# shellcheck shell=bash
# A second S3 server for the tests: s3s-fs, which (unlike moto) checks the
# x-amz-checksum-sha256 of what it receives, on PutObject, UploadPart and
# CompleteMultipartUpload. The tests that a body damaged in transit is refused run
# against it; everything else uses moto (s3s-fs has no ListMultipartUploads).
#
# Source this file (after moto.sh, for free_port), then:
#   s3s_setup   build s3s-fs into $CKPTFS_TMP/tools (once; about 3 minutes on 2 cores)
#   s3s_start   start it on a free 127.0.0.1 port over a fresh directory; sets S3S_PID
#               and S3S_ENDPOINT; it accepts the credentials testing/testing
#   s3s_stop    stop the server started by s3s_start (by its PID only)
#
# Version 0.17.0 declares rust-version 1.96 but builds and runs on 1.95; it is the
# first to check part checksums (0.14.1, the newest that declares 1.95, checks only
# PutObject and stores a refused object anyway).

S3S_VERSION="0.17.0"
S3S_TOOLS="${S3S_TOOLS:-$CKPTFS_TMP/tools}"
S3S_PID=""
S3S_ENDPOINT=""
S3S_DATA=""

s3s_setup() {
    if [ -x "$S3S_TOOLS/bin/s3s-fs" ] && "$S3S_TOOLS/bin/s3s-fs" --version 2>/dev/null | grep -q "$S3S_VERSION"; then
        return 0
    fi
    echo "==> building s3s-fs $S3S_VERSION into $S3S_TOOLS (checks upload checksums)" >&2
    CARGO_TARGET_DIR="$CKPTFS_TMP/tools-target" cargo install --quiet s3s-fs \
        --version "$S3S_VERSION" --ignore-rust-version --features binary --locked \
        --root "$S3S_TOOLS"
    rm -rf "$CKPTFS_TMP/tools-target"
}

s3s_start() {
    S3S_DATA="$(mktemp -d "$CKPTFS_TMP/s3s-data.XXXXXX")"
    local port i
    port="$(free_port)"
    "$S3S_TOOLS/bin/s3s-fs" --host 127.0.0.1 --port "$port" \
        --access-key testing --secret-key testing "$S3S_DATA" >"$CKPTFS_TMP/s3s.log" 2>&1 &
    S3S_PID=$!
    S3S_ENDPOINT="http://127.0.0.1:$port"
    for i in $(seq 1 100); do
        if ! kill -0 "$S3S_PID" 2>/dev/null; then
            echo "s3s-fs exited:" >&2
            tail -n 20 "$CKPTFS_TMP/s3s.log" >&2 || true
            return 1
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "==> s3s-fs pid $S3S_PID at $S3S_ENDPOINT (log: $CKPTFS_TMP/s3s.log)" >&2
            return 0
        fi
        sleep 0.1
    done
    echo "s3s-fs did not start on port $port" >&2
    return 1
}

s3s_stop() {
    if [ -n "$S3S_PID" ] && kill -0 "$S3S_PID" 2>/dev/null; then
        kill "$S3S_PID" 2>/dev/null || true
        wait "$S3S_PID" 2>/dev/null || true
    fi
    [ -n "$S3S_DATA" ] && rm -rf "$S3S_DATA"
    S3S_PID=""
    S3S_ENDPOINT=""
    S3S_DATA=""
}
