# shellcheck shell=bash
# The turns of a workspace for the benchmarks (bench-turns.sh, bench-report.sh).
# Needs $CKPTFS_VENV (scripts/lib/bench.sh's bench_deps).

# One turn: about 1% of the files get a line appended (text) or 4 KiB overwritten in
# the middle (binary), 3 new files appear and 3 go. Deterministic per turn number.
# Scattered (the default): files picked at random over the whole tree. Clustered:
# files next to each other in path order (so in the archive), the 3 that go right
# after them, the 3 new ones in the first one's directory.
change_tree() {
    local dir="$1" turn="$2" how="${3:-scattered}"
    "$CKPTFS_VENV/bin/python" - "$dir" "$turn" "$how" <<'EOF'
import os, random, sys
root, turn, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(1000 + turn)
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
count = max(1, len(files) // 100)
if how == "clustered":
    start = rng.randrange(len(files) - count - 3)
    edited = files[start:start + count]
else:
    edited = rng.sample(files, count)
for path in edited:
    if path.endswith(".bin"):
        with open(path, "r+b") as f:
            f.seek(os.path.getsize(path) // 2)
            f.write(rng.randbytes(4096))
    else:
        with open(path, "a") as f:
            f.write(f"# turn {turn}: edited\n")
if how == "clustered":
    removed, new_dir = files[start + count:start + count + 3], os.path.dirname(edited[0])
else:
    removed, new_dir = rng.sample(files, 3), root
for path in removed:
    if os.path.exists(path):
        os.remove(path)
for i in range(3):
    with open(os.path.join(new_dir, f"turn{turn}-new{i}.txt"), "w") as f:
        f.write(f"new in turn {turn}\n" * rng.randint(10, 2000))
EOF
}
