#!/usr/bin/env bash
# Installs ckptfs as a package would: the binary, the mount helper that makes
# `mount -t fuse.ckptfs` and /etc/fstab work, shell completions and manual pages.
#
#   bash scripts/install.sh                             # build, install under /usr/local
#   DESTDIR=/tmp/pkg PREFIX=/usr bash scripts/install.sh   # stage a package's tree
#   CKPTFS_BIN=path/to/ckptfs bash scripts/install.sh     # install that binary, no build
#
# Without CKPTFS_BIN it runs `cargo build --release --locked` (into CARGO_TARGET_DIR
# when set). Files go under ${DESTDIR}${PREFIX} (PREFIX defaults to /usr/local):
#
#   bin/ckptfs
#   sbin/mount.fuse.ckptfs                      -> ../bin/ckptfs
#   share/bash-completion/completions/ckptfs
#   share/zsh/site-functions/_ckptfs
#   share/fish/vendor_completions.d/ckptfs.fish
#   share/man/man1/ckptfs.1, ckptfs-mount.1, ...
#
# Which paths mount(8) finds: it runs /sbin/mount.fuse.ckptfs when that exists (with
# PREFIX=/usr on a merged-/usr system /usr/sbin is /sbin), and otherwise fuse3's
# mount.fuse3, which runs `ckptfs` from the fixed PATH
# /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin. PREFIX=/usr and
# PREFIX=/usr/local both work; under any other PREFIX link
# /usr/local/bin/ckptfs (or /sbin/mount.fuse.ckptfs) to the installed binary.
#
# Running it again installs the same files again, and exits 0.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${PREFIX:-/usr/local}"
DESTDIR="${DESTDIR:-}"
case "$PREFIX" in
/*) ;;
*)
    echo "install.sh: PREFIX must be an absolute path (got $PREFIX)" >&2
    exit 2
    ;;
esac
root="$DESTDIR$PREFIX"

if [ -n "${CKPTFS_BIN:-}" ]; then
    bin="$CKPTFS_BIN"
else
    echo "==> cargo build --release --locked" >&2
    cargo build --release --locked --manifest-path "$repo/Cargo.toml"
    # A relative CARGO_TARGET_DIR is relative to the current directory, as for cargo.
    bin="${CARGO_TARGET_DIR:-$repo/target}/release/ckptfs"
fi
if [ ! -x "$bin" ]; then
    echo "install.sh: $bin is not an executable ckptfs binary" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

installed() { echo "installed $1"; }

put() { # MODE SOURCE RELATIVE-DESTINATION
    install -D -m "$1" "$2" "$root/$3"
    installed "$root/$3"
}

put 0755 "$bin" bin/ckptfs

install -d -m 0755 "$root/sbin"
ln -sfn ../bin/ckptfs "$root/sbin/mount.fuse.ckptfs"
installed "$root/sbin/mount.fuse.ckptfs -> ../bin/ckptfs"

"$bin" completions bash >"$work/ckptfs.bash"
"$bin" completions zsh >"$work/_ckptfs"
"$bin" completions fish >"$work/ckptfs.fish"
put 0644 "$work/ckptfs.bash" share/bash-completion/completions/ckptfs
put 0644 "$work/_ckptfs" share/zsh/site-functions/_ckptfs
put 0644 "$work/ckptfs.fish" share/fish/vendor_completions.d/ckptfs.fish

"$bin" man --out-dir "$work/man"
for page in "$work"/man/*.1; do
    put 0644 "$page" "share/man/man1/$(basename "$page")"
done
