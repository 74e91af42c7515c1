#!/usr/bin/env bash
# Remakes the README's pictures of `ckptfs report`: a small workspace captured in six
# turns into a local store, the report written, and its index and one turn page shot
# by headless Chromium into docs/report-index.png and docs/report-turn.png.
#
#   bash scripts/report-screenshots.sh          # builds target/debug/ckptfs first
#   CKPTFS_BIN=path/to/ckptfs bash scripts/report-screenshots.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
if ! command -v chromium >/dev/null 2>&1; then
    echo "==> installing chromium (apt)" >&2
    apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >&2
fi
if [ -n "${CKPTFS_BIN:-}" ]; then
    CKPTFS="$CKPTFS_BIN"
else
    cargo build --quiet
    CKPTFS="$ROOT/target/debug/ckptfs"
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
W="$WORK/w"
mkdir -p "$W/src" "$W/tests"

put() {
    local parent=()
    [ -n "${LAST:-}" ] && parent=(--parent "$LAST")
    LAST="$("$CKPTFS" -q put "$WORK/store" "$W" "${parent[@]}" | awk '{ print $1 }')"
    sleep 1.1
}

cat >"$W/src/app.py" <<'EOF'
def greet(name):
    return "hello " + name


if __name__ == "__main__":
    print(greet("world"))
EOF
printf '# app\n\nA small app.\n' >"$W/README.md"
put
cat >"$W/tests/test_app.py" <<'EOF'
from src.app import greet


def test_greet():
    assert greet("a") == "hello a"
EOF
put
cat >"$W/src/app.py" <<'EOF'
import sys


def greet(name, greeting="hello"):
    """Say hello, or something else."""
    return f"{greeting} {name}"


if __name__ == "__main__":
    print(greet(sys.argv[1] if len(sys.argv) > 1 else "world"))
EOF
put
head -c 3000 /dev/urandom >"$W/model.bin"
printf '# app\n\nA small app that greets.\n\nRun: `python -m src.app NAME`\n' >"$W/README.md"
put
mv "$W/tests/test_app.py" "$W/tests/test_greet.py"
printf 'print("scratch")\n' >"$W/scratch.py"
put
rm "$W/scratch.py"
cat >>"$W/tests/test_greet.py" <<'EOF'


def test_other_greeting():
    assert greet("b", "hi") == "hi b"
EOF
put

"$CKPTFS" report "$WORK/store" "$WORK/report"
shoot() {
    chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run \
        --user-data-dir="$WORK/profile" --window-size="$2" \
        --screenshot="$ROOT/docs/$3" "file://$1" >/dev/null 2>&1
    echo "==> docs/$3" >&2
}
mkdir -p docs
shoot "$WORK/report/index.html" 1180,820 report-index.png
shoot "$WORK/report/turns/$LAST.html" 1180,900 report-turn.png
