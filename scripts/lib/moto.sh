# shellcheck shell=bash
# Shared helpers for scripts that need the Python tools and a local S3 server.
#
# Source this file, then:
#   venv_setup        create $CKPTFS_VENV (default: REPO/.venv) with moto[server] and boto3
#   moto_start        start moto_server on a free 127.0.0.1 port; sets MOTO_PID and
#                     MOTO_ENDPOINT (http://127.0.0.1:PORT); log in $CKPTFS_TMP/moto.log
#   moto_stop         stop the server started by moto_start (by its PID only)
#
# Nothing here touches processes it did not start.

CKPTFS_ROOT="${CKPTFS_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
CKPTFS_VENV="${CKPTFS_VENV:-$CKPTFS_ROOT/.venv}"
CKPTFS_TMP="${CKPTFS_TMP:-$CKPTFS_ROOT/.tmp}"
MOTO_PID=""
MOTO_ENDPOINT=""

# Create the virtualenv and install moto[server] and boto3 into it, unless they are
# already importable there.
venv_setup() {
    if [ ! -x "$CKPTFS_VENV/bin/python" ]; then
        echo "==> creating Python venv in $CKPTFS_VENV" >&2
        if ! python3 -m venv "$CKPTFS_VENV" 2>/dev/null; then
            # Debian's own python3 needs the venv module from a separate package.
            rm -rf "$CKPTFS_VENV"
            apt-get update -q && apt-get install -y -q python3-venv
            python3 -m venv "$CKPTFS_VENV"
        fi
    fi
    if ! "$CKPTFS_VENV/bin/python" -c 'import moto.server, boto3, flask' 2>/dev/null; then
        echo "==> installing moto[server] and boto3 into $CKPTFS_VENV" >&2
        "$CKPTFS_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
            'moto[server]' boto3
    fi
}

# Print a TCP port that was free on 127.0.0.1 a moment ago.
free_port() {
    "$CKPTFS_VENV/bin/python" - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}

# Start moto_server in the background and wait until it answers S3 requests.
moto_start() {
    mkdir -p "$CKPTFS_TMP"
    local port attempt
    for attempt in 1 2 3; do
        port="$(free_port)"
        "$CKPTFS_VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$CKPTFS_TMP/moto.log" 2>&1 &
        MOTO_PID=$!
        MOTO_ENDPOINT="http://127.0.0.1:$port"
        if _moto_wait_ready; then
            echo "==> moto_server pid $MOTO_PID at $MOTO_ENDPOINT (log: $CKPTFS_TMP/moto.log)" >&2
            return 0
        fi
        echo "moto_server did not start on port $port (attempt $attempt):" >&2
        tail -n 20 "$CKPTFS_TMP/moto.log" >&2 || true
        moto_stop
    done
    return 1
}

_moto_wait_ready() {
    local i
    for i in $(seq 1 300); do
        if ! kill -0 "$MOTO_PID" 2>/dev/null; then
            return 1
        fi
        if "$CKPTFS_VENV/bin/python" - "$MOTO_ENDPOINT" <<'PY' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(sys.argv[1] + "/", timeout=2).read()
PY
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# Stop the moto_server started by moto_start, by its PID.
moto_stop() {
    if [ -n "$MOTO_PID" ] && kill -0 "$MOTO_PID" 2>/dev/null; then
        kill "$MOTO_PID" 2>/dev/null || true
        local i
        for i in $(seq 1 50); do
            kill -0 "$MOTO_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$MOTO_PID" 2>/dev/null || true
        wait "$MOTO_PID" 2>/dev/null || true
    fi
    MOTO_PID=""
    MOTO_ENDPOINT=""
}
