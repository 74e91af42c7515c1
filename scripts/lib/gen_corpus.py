#!/usr/bin/env python3
"""Deterministic benchmark corpora for scripts/bench-*.sh.

    gen_corpus.py source DIR --mb N [--files N] [--seed S]
        A source-like workspace: nested directories, many code-like text files
        (a few KiB to a few hundred KiB, ~70% of the bytes, gzip to about a quarter)
        and some random binary blobs (1-6 MiB, incompressible, ~30% of the bytes).
        Default file count: 40 per MiB (20,000 for 500 MiB).
    gen_corpus.py bigfile DIR --mb N [--seed S]
        One file, DIR/big.bin, of N MiB of pseudo-random bytes.
    gen_corpus.py tiny DIR --files N [--seed S]
        N tiny text files (16-512 bytes), 100 per directory, two levels deep.

DIR must not exist. Every file and directory gets the same fixed mtime, so the same
arguments always give the same tree (byte for byte, names, sizes and times).
Also written, beside DIR (not inside): DIR.files, one line per regular file,
"<size>\t<relative path>", and DIR.bytes, the total of the sizes.

    gen_corpus.py pick LISTFILE COUNT --max-size BYTES [--seed S]
        Prints COUNT relative paths chosen (with replacement, fixed seed) among the
        files of LISTFILE (a DIR.files) no larger than BYTES.
"""

import argparse
import os
import random
import sys

MTIME = 1_700_000_000  # 2023-11-14T22:13:20Z
MIB = 1 << 20

WORDS = (
    "self return if else elif for while in not and or None True False def class "
    "import from as with try except finally raise yield lambda pass break continue "
    "fn let mut pub struct enum impl trait match use mod crate super const static "
    "async await move ref where type unsafe dyn Box Vec String Option Some Ok Err "
    "Result usize u64 i32 u8 str bool self.state value index count buffer reader "
    "writer config path name size offset length data entry node parent child cache "
    "store client request response error context handle stream chunk digest key "
    "len push pop insert remove get set new open close read write flush seek "
    "map filter collect iter into from_str to_string unwrap expect clone as_ref "
    "println format assert_eq debug info warn trace span checkpoint archive header"
).split()
PUNCT = ["(", ")", "{", "}", "[", "]", ";", ",", ".", "::", "->", "=>", "=", "==",
         "+", "-", "*", "&", "!", ":", "<", ">", "\"", "'", "#", "//", "0", "1", "42"]
EXTS = [".rs", ".py", ".ts", ".go", ".c", ".h", ".md", ".toml", ".json", ".txt"]
BIN_EXTS = [".bin", ".png", ".so", ".pack", ".db"]


def code_lines(rng, count):
    """A pool of code-like lines; files are made of lines drawn from it."""
    lines = []
    for _ in range(count):
        indent = " " * (4 * rng.choice((0, 1, 1, 2, 2, 2, 3, 3, 4)))
        n = rng.randint(1, 12)
        toks = []
        for _ in range(n):
            toks.append(rng.choice(WORDS) if rng.random() < 0.7 else rng.choice(PUNCT))
            if rng.random() < 0.15:
                toks.append("x%d" % rng.randint(0, 9999))
        lines.append(indent + " ".join(toks) + "\n")
    return lines


def fix_times(root):
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            os.utime(os.path.join(dirpath, name), (MTIME, MTIME), follow_symlinks=False)
        os.utime(dirpath, (MTIME, MTIME))


def dir_tree(rng, count, top_names):
    """count relative directory paths, nested 1-5 levels deep."""
    dirs = []
    for i in range(count):
        if not dirs or rng.random() < 0.25:
            parent = rng.choice(top_names)
        else:
            parent = rng.choice(dirs)
        if parent.count("/") >= 4:
            parent = rng.choice(top_names)
        dirs.append("%s/%s_%d" % (parent, rng.choice(WORDS).replace(".", "_"), i))
    return list(top_names) + dirs


def write_file(root, rel, data, listing):
    path = os.path.join(root, rel)
    with open(path, "wb") as f:
        f.write(data)
    listing.append((len(data), rel))


def gen_source(root, total_mb, files, rng):
    total = int(total_mb * MIB)
    bin_target = int(total * 0.30)
    blobs = []
    while sum(blobs) < bin_target:
        blobs.append(rng.randint(1 * MIB, 6 * MIB))
    if blobs:
        # Trim the last blob so that the binary part is ~30%.
        excess = sum(blobs) - bin_target
        blobs[-1] = max(64 * 1024, blobs[-1] - excess)
    text_total = total - sum(blobs)
    n_text = max(1, files - len(blobs))
    # Log-uniform sizes between 1 KiB and 300 KiB, then scaled to the text total
    # (clamped so that the spread stays "a few KiB to a few hundred KiB").
    raw = [2 ** rng.uniform(10, 18.2) for _ in range(n_text)]
    scale = text_total / sum(raw)
    sizes = [max(64, int(r * scale)) for r in raw]

    top = ["src", "tests", "docs", "vendor", "assets", "tools"]
    dirs = dir_tree(rng, max(1, files // 15), top)
    for d in dirs:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    pool = code_lines(rng, 20000)
    avg_line = sum(map(len, pool)) / len(pool)
    listing = []
    for i, size in enumerate(sizes):
        d = rng.choice(dirs)
        rel = "%s/%s_%d%s" % (d, rng.choice(WORDS).replace(".", "_"), i, rng.choice(EXTS))
        # A file is a run of consecutive-ish lines from a random spot in the pool,
        # which keeps some repetition inside gzip's window, like real code.
        k = max(1, int(size / avg_line) + 1)
        start = rng.randrange(len(pool))
        chosen = [pool[(start + j * rng.choice((1, 1, 1, 7, 13))) % len(pool)] for j in range(k)]
        data = "".join(chosen).encode()[:size]
        write_file(root, rel, data, listing)
    for i, size in enumerate(blobs):
        d = rng.choice(dirs)
        rel = "%s/blob_%d%s" % (d, i, rng.choice(BIN_EXTS))
        write_file(root, rel, rng.randbytes(size), listing)
    return listing


def gen_bigfile(root, total_mb, rng):
    size = int(total_mb * MIB)
    path = os.path.join(root, "big.bin")
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 16 * MIB)
            f.write(rng.randbytes(n))
            left -= n
    return [(size, "big.bin")]


def gen_tiny(root, files, rng):
    listing = []
    pool = code_lines(rng, 2000)
    for i in range(files):
        d = "d%03d/e%02d" % (i // 10000, (i // 100) % 100)
        if i % 100 == 0:
            os.makedirs(os.path.join(root, d), exist_ok=True)
        size = rng.randint(16, 512)
        data = "".join(rng.choice(pool) for _ in range(size // 20 + 1)).encode()[:size]
        write_file(root, "%s/f%06d.txt" % (d, i), data, listing)
    return listing


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=["source", "bigfile", "tiny", "pick"])
    p.add_argument("dir")
    p.add_argument("count", nargs="?", type=int)
    p.add_argument("--mb", type=float, default=0)
    p.add_argument("--files", type=int, default=0)
    p.add_argument("--max-size", type=int, default=1 << 62)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args()
    rng = random.Random(a.seed)

    if a.kind == "pick":
        with open(a.dir) as f:
            rows = [line.rstrip("\n").split("\t", 1) for line in f]
        small = [rel for size, rel in rows if int(size) <= a.max_size]
        if not small:
            sys.exit("no file of at most %d bytes in %s" % (a.max_size, a.dir))
        for rel in rng.choices(small, k=a.count):
            print(rel)
        return

    root = a.dir.rstrip("/")
    os.makedirs(root)
    if a.kind == "source":
        files = a.files or max(10, int(a.mb * 40))
        listing = gen_source(root, a.mb, files, rng)
    elif a.kind == "bigfile":
        listing = gen_bigfile(root, a.mb, rng)
    else:
        listing = gen_tiny(root, a.files, rng)
    fix_times(root)
    listing.sort(key=lambda x: x[1])
    with open(root + ".files", "w") as f:
        for size, rel in listing:
            f.write("%d\t%s\n" % (size, rel))
    with open(root + ".bytes", "w") as f:
        f.write("%d\n" % sum(s for s, _ in listing))


if __name__ == "__main__":
    main()
