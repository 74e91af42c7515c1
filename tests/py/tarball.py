"""Writes a .tar.gz of a directory tree with Python's tarfile, as another writer of
checkpoints would (used by the mount tests).

Usage: tarball.py SRC OUT {pax,gnu}

Members are the entries of SRC, sorted, named relative to SRC (no "./" prefix), so
that parent directories come before their contents. Symlinks are stored as links,
hard links as hard links (tarfile's default).
"""

import os
import sys
import tarfile

FORMATS = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT}


def main():
    src, out, fmt = sys.argv[1], sys.argv[2], sys.argv[3]
    with tarfile.open(out, "w:gz", format=FORMATS[fmt]) as tar:
        for name in sorted(os.listdir(src)):
            tar.add(os.path.join(src, name), arcname=name)


if __name__ == "__main__":
    main()
