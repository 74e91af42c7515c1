#!/usr/bin/env bash
# Installs ckptfs as a package would: the binary, the mount helper that makes
# `mount -t fuse.ckptfs` and /etc/fstab work, shell completions and manual pages.
#
#   bash scripts/install.sh                             # build, install under /usr/local
#   DESTDIR=/tmp/pkg PREFIX=/usr bash scripts/install.sh   # stage a package's tree
#   CKPTFS_BIN=path/to/ckptfs bash scripts/install.sh     # install that binary, no build
#
# Without CKPTFS_BIN it runs `cargo build --release --locked` (into CARGO_TARGET_DIR
# when set), which takes minutes. Files go under ${DESTDIR}${PREFIX} (PREFIX
# defaults to /usr/local, which needs root):
#
#   bin/ckptfs                                  (stripped: the release build keeps
#                                                line tables for profiling)
#   share/bash-completion/completions/ckptfs
#   share/zsh/site-functions/_ckptfs
#   share/fish/vendor_completions.d/ckptfs.fish
#   share/man/man1/ckptfs.1, ckptfs-mount.1, ...
#
# and the mount helper, where mount(8) looks for it: /sbin/mount.fuse.ckptfs (under
# DESTDIR), a link to PREFIX/bin/ckptfs. With PREFIX=/usr it is usr/sbin's (/sbin on
# a merged-/usr system), a relative link. mount(8) runs it for `mount -t
# fuse.ckptfs` and fstab lines whatever PREFIX is; without it, fuse3's mount.fuse3
# would look for `ckptfs` on its fixed PATH only
# (/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin).
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

# A stripped copy: a tenth of the size.
if command -v strip >/dev/null; then
    strip -o "$work/ckptfs" "$bin"
else
    echo "install.sh: no strip(1) (binutils); installing the binary unstripped" >&2
    cp "$bin" "$work/ckptfs"
fi
put 0755 "$work/ckptfs" bin/ckptfs

if [ "$PREFIX" = /usr ]; then
    helper_dir="$root/sbin" target=../bin/ckptfs
else
    helper_dir="$DESTDIR/sbin" target="$PREFIX/bin/ckptfs"
fi
install -d -m 0755 "$helper_dir"
ln -sfn "$target" "$helper_dir/mount.fuse.ckptfs"
installed "$helper_dir/mount.fuse.ckptfs -> $target"

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
