#!/usr/bin/env python3
"""Load generator and report for scripts/soak.sh (standard library only).

    soak.py bucket --endpoint URL --bucket B
        Creates bucket B on the local S3 server at URL (an unsigned path-style
        request; moto accepts those).
    soak.py gen --out DIR --count N [--seed S]
        N workspace trees DIR/tree-NN (deterministic): two of every three are ~200
        small text files, the third has ~20 text files and 3-5 random files of
        1-4 MiB. Writes DIR/trees.json (name, kind, bytes, [path, size] per file).
    soak.py phase1 --mnt M --pid P --trees J --puts F --count 40 --out R
        COUNT first accesses at once to COUNT different cold checkpoints (half
        `ls -R`, half `cat` of one file), sampling the daemon's threads every 10 ms.
    soak.py phase2 --mnt M --pid P --trees J --puts F --seconds S --workers W --out DIR
                   [--moto-pid P] [--cache-dir D]
        W reader processes for S seconds: random checkpoint, random file, stat, then
        a 4 KiB pread at a random offset (open + pread + close), each timed with
        perf_counter_ns; the daemon's RSS, threads, descriptors, CPU and cache size
        on disk sampled every second, its thread states every 100 ms, and a paced
        control probe on a local directory.
    soak.py seal --mnt-a A --mnt-b B --seconds S --out R
        Both mounts repeatedly stage a ~100-file workspace and `mv` it into commit/;
        in about half of the rounds both seal an identical tree at the same moment.
    soak.py many --endpoint URL --bucket B --prefix P --count N --out R
        N tiny distinct real checkpoints (<sha256>.tar.gz, with sha256/size metadata)
        uploaded with 16 threads, by plain HTTP PUTs to the local server.
    soak.py probe --mnt M --pid P --many R --count 100 --mount-seconds S --out R2
        On a mount of that prefix: `ls MNT | wc -l`, stat of COUNT random checkpoint
        directories, a verified read of 3 of them, and the daemon's RSS and threads.
    soak.py report --work DIR ...
        The Markdown report (tables and PASS/FAIL summary) on stdout.

Times in the op logs are wall-clock nanoseconds (time.time_ns), so that they can be
matched with the daemon log's timestamps; latencies are perf_counter_ns deltas.
"""

import argparse
import datetime
import errno
import gzip
import hashlib
import http.client
import io
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

MIB = 1 << 20
MTIME = 1_700_000_000
WORDS = ("fn let mut pub struct enum impl match use mod return if else for while in "
         "self value index count buffer reader writer config path name size offset "
         "data entry node cache store client request response error stream chunk "
         "digest key checkpoint archive header").split()


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


# --- small helpers -------------------------------------------------------------------

def pct(values, p):
    """Nearest-rank percentile of an unsorted list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    k = max(1, math.ceil(p / 100.0 * len(s)))
    return s[k - 1]


def proc_status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM", "Threads", "State"):
                    out[key] = rest.strip()
    except OSError:
        return None
    return out


def kib(value):
    return int(value.split()[0]) if value else 0


def threads_of(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


def fds_of(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


STATUS_RE = re.compile(
    r"# checkpoints: (\d+); cache: (\d+) bytes in (\d+) checkpoints; downloads: (\d+); "
    r"loaded from cache: (\d+)")


def read_status(mnt):
    """The counters line of MNT/.status, as a dict (empty on failure)."""
    try:
        with open(os.path.join(mnt, ".status"), "rb") as f:
            head = f.read(8192).decode("utf-8", "replace")
    except OSError:
        return {}
    m = STATUS_RE.search(head)
    if not m:
        return {}
    waiting = re.search(r"# loads waiting for a loader: (\d+)", head)
    return {
        "checkpoints": int(m.group(1)),
        "cache_bytes": int(m.group(2)),
        "cache_entries": int(m.group(3)),
        "downloads": int(m.group(4)),
        "reuses": int(m.group(5)),
        "waiting": int(waiting.group(1)) if waiting else 0,
    }


def load_checkpoints(trees_path, puts_path):
    """[(sha, kind, [(path, size), ...])] in put order."""
    with open(trees_path) as f:
        trees = {t["name"]: t for t in json.load(f)}
    out = []
    with open(puts_path) as f:
        for line in f:
            name, sha, _size = line.split()
            t = trees[name]
            out.append((sha, t["kind"], [tuple(x) for x in t["files"]]))
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


# --- bucket ----------------------------------------------------------------------------

_conn = threading.local()


def s3_request(endpoint, method, path, body=b"", headers=None):
    """One unsigned path-style request to the local S3 server (moto accepts them and
    files them under its default account, the same as the test credentials'); one
    keep-alive connection per thread. Returns (status, body)."""
    host = urllib.parse.urlsplit(endpoint).netloc
    conn = getattr(_conn, "c", None)
    for attempt in range(5):
        if conn is None:
            conn = _conn.c = http.client.HTTPConnection(host, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status >= 500 and attempt < 4:
                time.sleep(0.2 * (attempt + 1))
                continue
            return resp.status, data
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = _conn.c = None
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise RuntimeError("unreachable")


def cmd_bucket(a):
    status, data = s3_request(a.endpoint, "PUT", f"/{a.bucket}")
    if status != 200:
        sys.exit(f"creating bucket {a.bucket}: HTTP {status}: {data[:200]!r}")


# --- gen -------------------------------------------------------------------------------

def text_bytes(rng, size):
    out = []
    n = 0
    while n < size:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10))) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


def fix_times(root):
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            os.utime(os.path.join(dirpath, name), (MTIME, MTIME), follow_symlinks=False)
        os.utime(dirpath, (MTIME, MTIME))


def write_text_tree(root, rng, nfiles, subdirs, min_size, max_size):
    files = []
    for i in range(nfiles):
        d = rng.choice(subdirs)
        rel = f"{d}/f{i:04d}.{rng.choice(('rs', 'py', 'md', 'txt', 'json'))}"
        size = rng.randint(min_size, max_size)
        os.makedirs(os.path.join(root, d), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(text_bytes(rng, size))
        files.append([rel, size])
    return files


def cmd_gen(a):
    os.makedirs(a.out, exist_ok=True)
    rng = random.Random(a.seed)
    trees = []
    for i in range(a.count):
        name = f"tree-{i:02d}"
        root = os.path.join(a.out, name)
        os.makedirs(root)
        subdirs = [f"src/m{j}" for j in range(8)] + ["docs", "tests", "src"]
        if i % 3 == 2:
            kind = "blobs"
            files = write_text_tree(root, rng, 20, subdirs, 200, 8192)
            os.makedirs(os.path.join(root, "data"))
            for j in range(rng.randint(3, 5)):
                size = rng.randint(1 * MIB, 4 * MIB)
                rel = f"data/blob{j}.bin"
                with open(os.path.join(root, rel), "wb") as f:
                    f.write(rng.randbytes(size))
                files.append([rel, size])
        else:
            kind = "text"
            files = write_text_tree(root, rng, rng.randint(180, 220), subdirs, 100, 8192)
        fix_times(root)
        trees.append({"name": name, "kind": kind, "bytes": sum(s for _, s in files),
                      "files": files})
    write_json(os.path.join(a.out, "trees.json"), trees)
    total = sum(t["bytes"] for t in trees)
    log(f"generated {a.count} trees, {total / MIB:.1f} MiB")


# --- phase 1 ---------------------------------------------------------------------------

def cmd_phase1(a):
    cps = load_checkpoints(a.trees, a.puts)
    rng = random.Random(7)
    chosen = rng.sample(cps, a.count)
    idle_threads = threads_of(a.pid)
    before = read_status(a.mnt)
    start = threading.Barrier(a.count + 1)
    results = [None] * a.count
    procs = [None] * a.count
    rng_files = [random.Random(i).choice(f)[0] for i, (_, _, f) in enumerate(chosen)]

    def access(i, sha, kind, files):
        if i % 2 == 0:
            argv, what = ["ls", "-R", os.path.join(a.mnt, sha)], "ls -R"
        else:
            path = max(files, key=lambda x: x[1])[0] if kind == "blobs" else rng_files[i]
            argv, what = ["cat", os.path.join(a.mnt, sha, path)], "cat"
        start.wait()
        t0 = time.perf_counter_ns()
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs[i] = p
        _, err = p.communicate()
        results[i] = {"what": what, "sha": sha, "kind": kind, "rc": p.returncode,
                      "err": err.decode("utf-8", "replace").strip()[-300:],
                      "seconds": (time.perf_counter_ns() - t0) / 1e9}

    ts = [threading.Thread(target=access, args=(i, *cp)) for i, cp in enumerate(chosen)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    peak, samples = 0, []
    deadline = t0 + a.timeout
    timed_out = False
    while any(t.is_alive() for t in ts):
        n = threads_of(a.pid)
        if n is None:
            break
        peak = max(peak, n)
        samples.append(n)
        if time.perf_counter() > deadline:
            timed_out = True
            for p in procs:
                if p is not None and p.poll() is None:
                    p.kill()
            break
        time.sleep(0.01)
    for t in ts:
        t.join(30)
    elapsed = time.perf_counter() - t0
    after = read_status(a.mnt)
    secs = [r["seconds"] for r in results if r]
    failed = [r for r in results if r and r["rc"] != 0]
    out = {
        "count": a.count, "elapsed": elapsed, "timed_out": timed_out,
        "idle_threads": idle_threads, "peak_threads": peak,
        "threads_after": threads_of(a.pid),
        "median_access": pct(secs, 50), "max_access": max(secs) if secs else None,
        "min_access": min(secs) if secs else None,
        "failed": failed, "results": results,
        "downloads": after.get("downloads", 0) - before.get("downloads", 0),
        "status_after": after,
    }
    write_json(a.out, out)
    log(f"phase 1: {a.count} accesses in {elapsed:.2f} s; threads idle {idle_threads}, "
        f"peak {peak}; {len(failed)} failed")


# --- phase 2 ---------------------------------------------------------------------------

def reader(mnt, cps, seed, deadline_wall, path):
    sched0 = schedstat("/proc/thread-self/schedstat")
    rng = random.Random(seed)
    out = open(path, "w", buffering=1 << 16)
    buf = []
    perf = time.perf_counter_ns
    parent = os.getppid()
    while time.time() < deadline_wall and os.getppid() == parent:
        ci = rng.randrange(len(cps))
        sha, _kind, files = cps[ci]
        rel, size = files[rng.randrange(len(files))]
        p = os.path.join(mnt, sha, rel)
        w = time.time_ns()
        t = perf()
        e = 0
        try:
            os.stat(p)
        except OSError as ex:
            e = ex.errno or -1
        buf.append(f"s {ci} {w} {perf() - t} {e}\n")
        off = rng.randrange(max(1, size - 4096 + 1))
        w = time.time_ns()
        t = perf()
        e = 0
        try:
            fd = os.open(p, os.O_RDONLY)
            try:
                data = os.pread(fd, 4096, off)
            finally:
                os.close(fd)
            if len(data) != min(4096, size - off):
                e = -2  # short read
        except OSError as ex:
            e = ex.errno or -1
        buf.append(f"r {ci} {w} {perf() - t} {e}\n")
        if len(buf) >= 256:
            out.write("".join(buf))
            out.flush()
            buf.clear()
    out.write("".join(buf))
    out.close()
    sched1 = schedstat("/proc/thread-self/schedstat")
    with open(path.replace("ops-", "sched-"), "w") as f:
        f.write(" ".join(str(b - a) for a, b in zip(sched0, sched1)) + "\n")


def control(root, deadline_wall, path):
    """The same stat + 4 KiB read on files of a local directory (same disk), paced at
    100 pairs a second, and how late each 10 ms sleep between them wakes up: what the
    machine alone costs an op."""
    rng = random.Random(99)
    files = []
    for i in range(200):
        p = os.path.join(root, f"c{i:03d}")
        with open(p, "wb") as f:
            f.write(rng.randbytes(8192))
        files.append(p)
    perf = time.perf_counter_ns
    lines = []
    while time.time() < deadline_wall:
        p = rng.choice(files)
        w = time.time_ns()
        t = perf()
        os.stat(p)
        lines.append(f"s 0 {w} {perf() - t} 0\n")
        w = time.time_ns()
        t = perf()
        fd = os.open(p, os.O_RDONLY)
        os.pread(fd, 4096, rng.randrange(4097))
        os.close(fd)
        lines.append(f"r 0 {w} {perf() - t} 0\n")
        # How late a sleeping thread gets a CPU back: what each wake-up of a FUSE
        # round trip (the daemon's thread, then the caller) can cost on this machine.
        t = perf()
        time.sleep(0.01)
        lines.append(f"w 0 {w} {perf() - t - 10_000_000} 0\n")
    with open(path, "w") as f:
        f.write("".join(lines))


def thread_states(pid):
    """{"name state": count} over the daemon's threads (state from /proc/PID/task/TID/stat:
    R running, S sleeping, D in uninterruptible I/O)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        name = text[text.index("(") + 1:text.rindex(")")]
        state = text[text.rindex(")") + 2]
        key = f"{re.sub(r'-[0-9]+$', '-N', name)} {state}"
        out[key] = out.get(key, 0) + 1
    return out


def schedstat(path):
    """(run_ns, wait_ns, timeslices) from a schedstat file: time on a CPU, time
    runnable but waiting for one, and the number of times it got one."""
    try:
        with open(path) as f:
            return tuple(int(x) for x in f.read().split()[:3])
    except (OSError, ValueError):
        return (0, 0, 0)


def daemon_schedstat(pid):
    """{thread name: [run_ns, wait_ns, slices]} summed over the daemon's threads."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = re.sub(r"-[0-9]+$", "-N", f.read().strip())
        except OSError:
            continue
        st = schedstat(f"/proc/{pid}/task/{tid}/schedstat")
        acc = out.setdefault(name, [0, 0, 0])
        for i in range(3):
            acc[i] += st[i]
    return out


class TaskSampler(threading.Thread):
    """Samples the daemon's thread states every 100 ms; take() returns the counts
    gathered since the last call."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.counts, self.lock = pid, {}, threading.Lock()
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.1):
            states = thread_states(self.pid)
            with self.lock:
                for k, v in states.items():
                    self.counts[k] = self.counts.get(k, 0) + v

    def take(self):
        with self.lock:
            out, self.counts = self.counts, {}
        return out


def disk_usage(cache_dir):
    """Bytes allocated (st_blocks) under the cache directory, by kind: verified
    entries (checkpoints/<sha256>), loads in progress (checkpoints/partial-*), evicted
    entries not yet deleted (checkpoints/trash-*) and the rest (tmp/ and so on); the
    staging area and the log are not the cache's."""
    out = {"entries": 0, "partial": 0, "trash": 0, "other": 0}
    for dirpath, dirs, files in os.walk(cache_dir):
        rel = os.path.relpath(dirpath, cache_dir)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != "staging"]
            files = [f for f in files if f != "ckptfs.log"]
        parts = rel.split(os.sep)
        if parts[0] == "checkpoints" and len(parts) > 1:
            kind = ("partial" if parts[1].startswith("partial-") else
                    "trash" if parts[1].startswith("trash-") else "entries")
        else:
            kind = "other"
        for name in dirs + files:
            try:
                size = os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
            if rel == "checkpoints":
                kind_here = ("partial" if name.startswith("partial-") else
                             "trash" if name.startswith("trash-") else "entries")
                out[kind_here] += size
            else:
                out[kind] += size
    return out


def sample(pid, mnt, t0_wall, tasks=None, cache_dir=None):
    st = proc_status(pid)
    if st is None:
        return None
    s = read_status(mnt)
    return {
        "tasks": tasks.take() if tasks else thread_states(pid),
        "disk": disk_usage(cache_dir) if cache_dir else None,
        "t": time.time() - t0_wall, "wall": time.time(),
        "rss_kib": kib(st.get("VmRSS")), "hwm_kib": kib(st.get("VmHWM")),
        "threads": threads_of(pid), "fds": fds_of(pid), "cpu": cpu_of(pid),
        "downloads": s.get("downloads"), "cache_bytes": s.get("cache_bytes"),
        "cache_entries": s.get("cache_entries"), "waiting": s.get("waiting"),
    }


def cmd_phase2(a):
    cps = load_checkpoints(a.trees, a.puts)
    os.makedirs(a.out, exist_ok=True)
    t0_wall = time.time()
    deadline = t0_wall + a.seconds
    ctx = multiprocessing.get_context("fork")
    workers = []
    for w in range(a.workers):
        p = ctx.Process(target=reader,
                        args=(a.mnt, cps, 1000 + w, deadline, os.path.join(a.out, f"ops-{w:02d}.txt")))
        p.start()
        workers.append(p)
    croot = os.path.join(a.out, "control")
    os.makedirs(croot, exist_ok=True)
    probe = ctx.Process(target=control, args=(croot, deadline, os.path.join(a.out, "control.txt")))
    probe.start()
    samples = []
    i = 0
    died = False
    tasks = TaskSampler(a.pid)
    tasks.start()
    sched0 = daemon_schedstat(a.pid)
    moto0 = cpu_of(a.moto_pid) if a.moto_pid else None
    while True:
        s = sample(a.pid, a.mnt, t0_wall, tasks, a.cache_dir)
        if s is None:
            died = True
            log("phase 2: the daemon is gone")
            break
        samples.append(s)
        if i % 5 == 0:
            log(f"phase 2: t={s['t']:5.1f}s rss {s['rss_kib'] / 1024:.1f} MiB, threads {s['threads']}, "
                f"fds {s['fds']}, downloads {s['downloads']}, cache {((s['cache_bytes'] or 0) / MIB):.1f} MiB "
                f"in {s['cache_entries']} checkpoints, waiting loads {s['waiting']}")
        i += 1
        if time.time() >= deadline:
            break
        time.sleep(max(0.0, t0_wall + i - time.time()))
    sched1 = daemon_schedstat(a.pid)
    moto1 = cpu_of(a.moto_pid) if a.moto_pid else None
    moto_cores = (moto1 - moto0) / (time.time() - t0_wall) if moto0 is not None and moto1 is not None else None
    # Readers finish the op they are in; a reader stuck in the file system for 60 s
    # more is killed (it is our own child) and reported.
    stuck = 0
    grace = time.time() + 60
    for p in workers:
        p.join(max(0.0, grace - time.time()))
    for p in workers:
        if p.is_alive():
            stuck += 1
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)
    probe.join(30)
    if probe.is_alive():
        os.kill(probe.pid, signal.SIGKILL)
        probe.join(5)
    shutil.rmtree(croot, ignore_errors=True)
    time.sleep(1)
    end = sample(a.pid, a.mnt, t0_wall)
    write_json(os.path.join(a.out, "phase2.json"), {
        "seconds": a.seconds, "workers": a.workers, "t0_wall": t0_wall,
        "samples": samples, "after": end, "loadavg_end": list(os.getloadavg()), "stuck_workers": stuck, "daemon_died": died,
        "exitcodes": [p.exitcode for p in workers], "moto_cores": moto_cores,
        "daemon_sched": {k: [b - a for a, b in zip(sched0.get(k, [0, 0, 0]), v)]
                         for k, v in sched1.items()},
    })
    log(f"phase 2 done ({stuck} readers stuck)")


# --- phase 3 ---------------------------------------------------------------------------

STRERROR = {os.strerror(n): errno.errorcode[n] for n in errno.errorcode}


def build_workspace(root, seed, nfiles):
    """A ~nfiles workspace; the same seed gives the same tree (bytes, modes, times)."""
    rng = random.Random(seed)
    os.mkdir(root)
    dirs = ["src", "src/core", "src/util", "tests", "docs"]
    for d in dirs:
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for i in range(nfiles):
        rel = f"{rng.choice(dirs)}/file{i:03d}.txt"
        with open(os.path.join(root, rel), "wb") as f:
            f.write(text_bytes(rng, rng.randint(100, 20000)))
        os.chmod(os.path.join(root, rel), 0o644)
    for d in dirs:
        os.chmod(os.path.join(root, d), 0o755)
    fix_times(root)


def seal_worker(which, mnt, plan, barrier, results, stop_at, nfiles, crashes):
    try:
        seal_rounds(which, mnt, plan, barrier, results, stop_at, nfiles)
    except Exception as e:  # a bug in the soak, not a seal failure
        crashes.append(f"mount {which}: {e!r}")
        barrier.abort()
        raise


def seal_rounds(which, mnt, plan, barrier, results, stop_at, nfiles):
    for r, identical, delay in plan:
        try:
            barrier.wait(timeout=300)
        except threading.BrokenBarrierError:
            return
        if time.time() >= stop_at:
            barrier.abort()
            return
        name = f"soak-r{r:03d}-{which}"
        staged = os.path.join(mnt, "staging", name)
        rec = {"round": r, "mount": which, "identical": identical, "name": name}
        try:
            build_workspace(staged, f"same-{r}" if identical else f"{which}-{r}", nfiles)
        except OSError as e:
            rec.update(ok=False, phase="staging", errno=errno.errorcode.get(e.errno, str(e.errno)),
                       err=str(e))
            results.append(rec)
            barrier.abort()
            return
        try:
            barrier.wait(timeout=300)  # both mv at the same moment
        except threading.BrokenBarrierError:
            return
        if not identical:
            time.sleep(delay)
        t = time.perf_counter()
        p = subprocess.run(["mv", staged, os.path.join(mnt, "commit") + "/"],
                           capture_output=True, text=True)
        rec["seconds"] = time.perf_counter() - t
        rec["wall_end"] = time.time()
        if p.returncode == 0:
            link = os.path.join(mnt, "commit", name)
            try:
                target = os.readlink(link)
                sha = target.rsplit("/", 1)[-1]
                ok = (target == f"../{sha}" and re.fullmatch(r"[0-9a-f]{64}", sha) is not None
                      and not os.path.exists(staged)
                      and sorted(os.listdir(os.path.join(mnt, sha))) == ["docs", "src", "tests"])
                rec.update(ok=ok, sha=sha, target=target)
                if not ok:
                    rec["err"] = "sealed but commit/NAME, staging/NAME or <sha256>/ not as expected"
            except OSError as e:
                rec.update(ok=False, err=f"after the mv: {e}")
        else:
            msg = p.stderr.strip()
            reason = msg.rsplit(": ", 1)[-1] if ": " in msg else msg
            rec.update(ok=False, err=msg, errno=STRERROR.get(reason, "unclear"),
                       staged_kept=os.path.isdir(staged))
            shutil.rmtree(staged, ignore_errors=True)
        results.append(rec)


def cmd_seal(a):
    rng = random.Random(11)
    plan = [(r, rng.random() < 0.5, rng.uniform(0, 0.2)) for r in range(10000)]
    barrier = threading.Barrier(2)
    results = []
    crashes = []
    stop_at = time.time() + a.seconds
    ts = [threading.Thread(target=seal_worker,
                           args=(w, m, plan, barrier, results, stop_at, a.files, crashes))
          for w, m in (("a", a.mnt_a), ("b", a.mnt_b))]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join(a.seconds + 600)
    elapsed = time.perf_counter() - t0
    by_round = {}
    for rec in results:
        by_round.setdefault(rec["round"], {})[rec["mount"]] = rec
    same_sha = diff_sha = 0
    for r, pair in by_round.items():
        if len(pair) == 2 and pair["a"].get("identical") and pair["a"].get("ok") and pair["b"].get("ok"):
            if pair["a"]["sha"] == pair["b"]["sha"]:
                same_sha += 1
            else:
                diff_sha += 1
    write_json(a.out, {"elapsed": elapsed, "results": results, "same_sha": same_sha,
                       "diff_sha": diff_sha, "rounds": len(by_round),
                       "shas": sorted({r["sha"] for r in results if r.get("sha")})})
    if crashes:
        sys.exit(f"phase 3 broke: {crashes}")
    ok = sum(1 for r in results if r.get("ok"))
    log(f"phase 3: {len(by_round)} rounds, {len(results)} seals, {ok} ok, {elapsed:.1f} s")


# --- phase 4 ---------------------------------------------------------------------------

def tiny_checkpoint(i):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        d = tarfile.TarInfo("src")
        d.type, d.mode, d.mtime = tarfile.DIRTYPE, 0o755, MTIME
        tar.addfile(d)
        body = f"turn {i}\n".encode()
        f = tarfile.TarInfo("src/turn.txt")
        f.size, f.mode, f.mtime = len(body), 0o644, MTIME
        tar.addfile(f, io.BytesIO(body))
    return gzip.compress(buf.getvalue(), mtime=0)


def cmd_many(a):
    def put(i):
        body = tiny_checkpoint(i)
        sha = hashlib.sha256(body).hexdigest()
        status, data = s3_request(a.endpoint, "PUT", f"/{a.bucket}/{a.prefix}/{sha}.tar.gz", body, {
            "Content-Type": "application/gzip",
            "x-amz-meta-sha256": sha, "x-amz-meta-size": str(len(body))})
        if status != 200:
            raise RuntimeError(f"PUT {sha}.tar.gz: HTTP {status}: {data[:200]!r}")
        return sha, i

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        names = list(pool.map(put, range(a.count)))
    elapsed = time.perf_counter() - t0
    write_json(a.out, {"count": a.count, "upload_seconds": elapsed,
                       "checkpoints": [[sha, i] for sha, i in names]})
    log(f"phase 4: {a.count} checkpoints uploaded in {elapsed:.1f} s")


def cmd_probe(a):
    with open(a.many) as f:
        many = json.load(f)
    cps = many["checkpoints"]
    rng = random.Random(5)
    t = time.perf_counter()
    p = subprocess.run(f"ls '{a.mnt}' | wc -l", shell=True, capture_output=True, text=True, check=True)
    ls_seconds = time.perf_counter() - t
    ls_count = int(p.stdout.strip())
    lat = []
    errors = 0
    t = time.perf_counter()
    for sha, _ in rng.sample(cps, a.count):
        s = time.perf_counter_ns()
        try:
            os.stat(os.path.join(a.mnt, sha))
        except OSError:
            errors += 1
        lat.append((time.perf_counter_ns() - s) / 1e6)
    stat_seconds = time.perf_counter() - t
    st_mid = read_status(a.mnt)
    reads_ok = 0
    for sha, i in rng.sample(cps, 3):
        try:
            with open(os.path.join(a.mnt, sha, "src", "turn.txt"), "rb") as f:
                reads_ok += f.read() == f"turn {i}\n".encode()
        except OSError as e:
            log(f"phase 4: reading {sha[:12]}/src/turn.txt: {e}")
    st = proc_status(a.pid) or {}
    write_json(a.out, {
        "count": many["count"], "upload_seconds": many["upload_seconds"],
        "mount_seconds": a.mount_seconds, "ls_seconds": ls_seconds, "ls_count": ls_count,
        "stat_count": a.count, "stat_seconds": stat_seconds, "stat_errors": errors,
        "stat_p50_ms": pct(lat, 50), "stat_p99_ms": pct(lat, 99), "stat_max_ms": max(lat),
        "downloads_after_stats": st_mid.get("downloads"), "reads_ok": reads_ok,
        "rss_kib": kib(st.get("VmRSS")), "hwm_kib": kib(st.get("VmHWM")),
        "threads": threads_of(a.pid), "fds": fds_of(a.pid),
    })
    log(f"phase 4: ls | wc -l = {ls_count} in {ls_seconds:.3f} s; {a.count} stats in "
        f"{stat_seconds:.3f} s; RSS {kib(st.get('VmRSS')) / 1024:.1f} MiB")


# --- report ----------------------------------------------------------------------------

LOG_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z")
DUR = re.compile(r"^([0-9.]+)(ns|µs|us|ms|s)$")


def log_time(line):
    m = LOG_TS.match(line)
    if not m:
        return None
    text = m.group(1)
    base, _, frac = text.partition(".")
    dt = datetime.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def parse_duration(text):
    m = DUR.match(text)
    if not m:
        return 0.0
    scale = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}[m.group(2)]
    return float(m.group(1)) * scale


def daemon_events(path):
    """(loads, evictions, warnings) from a ckptfs.log: loads as (sha, start, end) wall
    seconds, evictions as (sha, wall), warnings as (wall, line)."""
    loads, evictions, warnings = [], [], []
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError:
        return loads, evictions, warnings
    with f:
        for line in f:
            t = log_time(line)
            if t is None:
                continue
            if "checkpoint verified" in line:
                sha = re.search(r"checkpoint=([0-9a-f]{64})", line)
                el = re.search(r"elapsed=(\S+)", line)
                if sha:
                    d = parse_duration(el.group(1)) if el else 0.0
                    loads.append((sha.group(1), t - d, t))
            elif "evicted from the cache" in line:
                sha = re.search(r"checkpoint=([0-9a-f]{64})", line)
                evictions.append((sha.group(1) if sha else "", t))
            elif " WARN " in line or " ERROR " in line:
                warnings.append((t, line.strip()))
    return loads, evictions, warnings


def read_ops(dirpath, shas):
    ops = []  # (kind, sha, start_wall_s, lat_ms, errno)
    for name in sorted(os.listdir(dirpath)):
        if not name.startswith("ops-"):
            continue
        with open(os.path.join(dirpath, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 5:
                    continue
                k, ci, w, lat, e = parts
                ops.append((k, shas[int(ci)], int(w) / 1e9, int(lat) / 1e6, int(e)))
    return ops


def classify(ops, loads):
    """Marks each op cold when a load of its checkpoint overlapped it. The daemon logs
    "checkpoint verified" before it wakes the requests that wait, so an op that waited
    for a load (queued or running) ends after the load's logged end; an op that began
    after that end found the checkpoint loaded."""
    by_sha = {}
    for sha, s, e in loads:
        by_sha.setdefault(sha, []).append((s, e))
    out = []
    for k, sha, w, lat, e in ops:
        end = w + lat / 1000.0
        cold = any(s <= end and e >= w for s, e in by_sha.get(sha, ()))
        out.append((k, sha, w, lat, e, cold))
    return out


def fmt(x, digits=2):
    if x is None:
        return "n/a"
    return f"{x:.{digits}f}"


def verdict(ok):
    return "**PASS**" if ok else "**FAIL**"


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def parse_size(text):
    """64MiB, 64M, 1GiB, 1048576 (binary multiples, as ckptfs reads them)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.I)
    if not m:
        raise ValueError(f"not a size: {text!r}")
    return int(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower())


def cmd_report(a):
    W = a.work
    res = os.path.join(W, "results")
    with open(os.path.join(res, "params.json")) as f:
        P = json.load(f)
    cps = load_checkpoints(os.path.join(W, "trees.json"), os.path.join(W, "puts.txt"))
    shas = [c[0] for c in cps]
    with open(os.path.join(res, "phase1.json")) as f:
        p1 = json.load(f)
    with open(os.path.join(res, "phase2", "phase2.json")) as f:
        p2 = json.load(f)
    with open(os.path.join(res, "phase3.json")) as f:
        p3 = json.load(f)
    with open(os.path.join(res, "phase4.json")) as f:
        p4 = json.load(f)
    loads, evictions, warnings = daemon_events(P["log_a"])
    ops = classify(read_ops(os.path.join(res, "phase2"), shas), loads)
    ctl = {"s": [], "r": [], "w": []}
    try:
        with open(os.path.join(res, "phase2", "control.txt")) as f:
            for line in f:
                k, _, _, lat, _ = line.split()
                ctl[k].append(int(lat) / 1e6)
    except OSError:
        pass
    t0 = p2["t0_wall"]
    seconds = p2["seconds"]
    samples = p2["samples"]
    out = []
    say = out.append

    with open(os.path.join(W, "trees.json")) as f:
        trees = json.load(f)
    trees_bytes = sum(t["bytes"] for t in trees)
    P["n_text"] = sum(t["kind"] == "text" for t in trees)
    P["n_blobs"] = sum(t["kind"] == "blobs" for t in trees)
    P["cache_bytes"] = parse_size(P["cache_size"])
    say(f"### Soak: {len(cps)} checkpoints, {p2['workers']} readers for {seconds} s, "
        f"two mounts sealing, a prefix of {p4['count']:,} checkpoints")
    say("")
    say(f"Machine: {P['machine']}. Load average at the start: {P['loadavg']}.")
    say(f"Store: moto on 127.0.0.1. Checkpoints: {P['n_text']} of ~200 small text files, "
        f"{P['n_blobs']} with 20 text files and 3-5 random files of 1-4 MiB; "
        f"{trees_bytes / MIB:.1f} MiB of files, {P['archive_bytes'] / MIB:.1f} MiB of archives "
        f"(`ckptfs put`, {P['put_seconds']:.1f} s for all {len(cps)}). Mount: "
        f"`--cache-size {P['cache_size']}` (the working set is "
        f"{trees_bytes / P['cache_bytes']:.1f}x the cache), `--loaders {P['loaders']}`, "
        f"`--threads {P['threads']}`.")
    say("")

    # Phase 1
    say(f"#### Phase 1: {p1['count']} first accesses at once")
    say("")
    ev1 = [e for e in evictions if e[1] <= P["phase1_end"]]
    rows = [
        ("accesses, each to a different cold checkpoint",
         f"{p1['count']} ({sum(1 for r in p1['results'] if r and r['what'] == 'ls -R')} `ls -R`, "
         f"{sum(1 for r in p1['results'] if r and r['what'] == 'cat')} `cat` of one file)"),
        ("time until all finished (s)", fmt(p1["elapsed"])),
        ("single access: fastest / median / slowest (s)",
         f"{fmt(p1['min_access'])} / {fmt(p1['median_access'])} / {fmt(p1['max_access'])}"),
        ("daemon threads: idle before / peak during (sampled every 10 ms) / after",
         f"{p1['idle_threads']} / {p1['peak_threads']} / {p1['threads_after']}"),
        ("downloads / evictions during the phase", f"{p1['downloads']} / {len(ev1)}"),
        ("failed accesses", str(len(p1["failed"])) + (
            ": " + "; ".join(f"{r['what']} {r['sha'][:12]}: {r['err'][:120]}" for r in p1["failed"][:3])
            if p1["failed"] else "")),
    ]
    say(md_table(("measurement", "value"), rows))
    say("")

    # Phase 2
    stats = [o for o in ops if o[0] == "s"]
    reads = [o for o in ops if o[0] == "r"]
    p2_start, p2_end = t0, t0 + seconds
    loads2 = [l for l in loads if p2_start <= l[2] <= p2_end + 5]
    ev2 = [e for e in evictions if p2_start <= e[1] <= p2_end + 5]
    say(f"#### Phase 2: {p2['workers']} readers over {len(cps)} checkpoints for {seconds} s")
    say("")
    say("Each reader loops: pick a checkpoint and a file in it at random, `stat` it, then "
        "`open` + 4 KiB `pread` at a random offset + `close` (\"read\"). An op is *cold* "
        "when a load of its checkpoint (from the daemon log: \"checkpoint verified\", "
        "its time and elapsed) overlapped it: it waited for a download; the others are "
        "*warm*. Latencies in ms; RSS, threads and descriptors are the largest of the "
        "window's one-second samples.")
    say("")
    rows = []
    win = 5
    nwin = int(math.ceil(seconds / win))
    for wi in range(nwin):
        a0, a1 = t0 + wi * win, t0 + min(seconds, (wi + 1) * win)
        wops = [o for o in ops if a0 <= o[2] + o[3] / 1000 < a1]
        ws = [o[3] for o in wops if o[0] == "s"]
        wr = [o[3] for o in wops if o[0] == "r"]
        wsw = [o[3] for o in wops if o[0] == "s" and not o[5]]
        wrw = [o[3] for o in wops if o[0] == "r" and not o[5]]
        smp = [s for s in samples if a0 - t0 <= s["t"] < a1 - t0 + 0.5]
        nl = sum(1 for l in loads if a0 <= l[2] < a1)
        ne = sum(1 for e in evictions if a0 <= e[1] < a1)
        rows.append((
            f"{wi * win}–{min(seconds, (wi + 1) * win)}",
            f"{len(wops) / (a1 - a0):.0f}",
            fmt(pct(ws, 50)), fmt(pct(ws, 99)), fmt(pct(wsw, 99)),
            fmt(pct(wr, 50)), fmt(pct(wr, 99)), fmt(pct(wrw, 99)),
            f"{sum(1 for o in wops if o[5])}", nl, ne,
            fmt(max((s["rss_kib"] for s in smp), default=0) / 1024, 1),
            max((s["threads"] for s in smp), default="n/a"),
            max((s["fds"] for s in smp), default="n/a"),
        ))
    # One line per second as well, into the work directory (kept with BENCH_KEEP=1).
    with open(os.path.join(W, "per-second.tsv"), "w") as f:
        f.write("t\tops\tstat_p50_ms\tstat_p99_ms\tstat_warm_p99_ms\tread_p50_ms\tread_p99_ms\t"
                "read_warm_p99_ms\tcold_ops\trss_kib\tthreads\tfds\tdownloads\tcache_bytes\n")
        for sec in range(seconds):
            a0 = t0 + sec
            sops = [o for o in ops if a0 <= o[2] + o[3] / 1000 < a0 + 1]
            smp = next((x for x in samples if sec <= x["t"] < sec + 1), {})

            def col(kind, warm=False):
                return [o[3] for o in sops if o[0] == kind and not (warm and o[5])]
            f.write("\t".join(str(x) for x in (
                sec, len(sops), fmt(pct(col("s"), 50), 3), fmt(pct(col("s"), 99), 3),
                fmt(pct(col("s", True), 99), 3), fmt(pct(col("r"), 50), 3), fmt(pct(col("r"), 99), 3),
                fmt(pct(col("r", True), 99), 3), sum(1 for o in sops if o[5]), smp.get("rss_kib"),
                smp.get("threads"), smp.get("fds"), smp.get("downloads"), smp.get("cache_bytes"))) + "\n")
    say(md_table(("t (s)", "ops/s", "stat p50", "stat p99", "stat p99 warm", "read p50",
                  "read p99", "read p99 warm", "cold ops", "loads", "evictions", "RSS MiB",
                  "threads", "fds"), rows))
    say("")
    sw = [o[3] for o in stats if not o[5]]
    rw = [o[3] for o in reads if not o[5]]
    sc = [o[3] for o in stats if o[5]]
    rc = [o[3] for o in reads if o[5]]
    errs = {}
    for o in ops:
        if o[4]:
            key = errno.errorcode.get(o[4], "short read" if o[4] == -2 else str(o[4]))
            errs[key] = errs.get(key, 0) + 1
    reader_wait = 0
    for name in os.listdir(os.path.join(res, "phase2")):
        if name.startswith("sched-"):
            with open(os.path.join(res, "phase2", name)) as f:
                reader_wait += int(f.read().split()[1])
    task_sum = {}
    n_task_samples = 10 * len(samples)
    for smp in samples:
        for k, v in smp.get("tasks", {}).items():
            task_sum[k] = task_sum.get(k, 0) + v
    last = samples[-1] if samples else {}
    first = samples[0] if samples else {}
    cpu = ((last.get("cpu") or 0) - (first.get("cpu") or 0)) / max(1e-9, last.get("t", 0) - first.get("t", 0))
    rows = [
        ("ops (stat + read), ops/s", f"{len(ops):,}, {len(ops) / seconds:.0f}"),
        ("stat p50 / p99 / max, all (ms)", f"{fmt(pct([o[3] for o in stats], 50))} / "
         f"{fmt(pct([o[3] for o in stats], 99))} / {fmt(max((o[3] for o in stats), default=None))}"),
        ("stat p50 / p99 / max, warm (ms)", f"{fmt(pct(sw, 50))} / {fmt(pct(sw, 99))} / {fmt(max(sw, default=None))}"),
        ("warm stats answered by the kernel's cache (under 0.1 ms) / the others: p50 / p99 (ms)",
         f"{sum(1 for x in sw if x < 0.1):,} / {sum(1 for x in sw if x >= 0.1):,}: "
         f"{fmt(pct([x for x in sw if x >= 0.1], 50))} / {fmt(pct([x for x in sw if x >= 0.1], 99))}"),
        ("stat p50 / p99, cold (ms)", f"{fmt(pct(sc, 50))} / {fmt(pct(sc, 99))} ({len(sc):,} cold stats)"),
        ("read p50 / p99 / max, warm (ms)", f"{fmt(pct(rw, 50))} / {fmt(pct(rw, 99))} / {fmt(max(rw, default=None))}"),
        ("read p50 / p99, cold (ms)", f"{fmt(pct(rc, 50))} / {fmt(pct(rc, 99))} ({len(rc):,} cold reads)"),
        ("control: the same stat / read on a local directory, paced at 100/s, p50 / p99 (ms)",
         f"stat {fmt(pct(ctl['s'], 50), 3)} / {fmt(pct(ctl['s'], 99))}, "
         f"read {fmt(pct(ctl['r'], 50), 3)} / {fmt(pct(ctl['r'], 99))}"),
        ("control: how late a 10 ms sleep wakes up (scheduling delay), p50 / p99 / max (ms)",
         f"{fmt(pct(ctl['w'], 50), 3)} / {fmt(pct(ctl['w'], 99))} / {fmt(max(ctl['w'], default=None))}"),
        ("loads / evictions during the phase", f"{len(loads2)} / {len(ev2)}"),
        ("daemon threads running (R) or in disk I/O (D): average number, by thread name (sampled every 100 ms)",
         ", ".join(f"{k} {v / max(1, n_task_samples):.2f}"
                   for k, v in sorted(task_sum.items(), key=lambda x: -x[1]) if not k.endswith(" S"))
         or "none seen"),
        ("waiting for a CPU (schedstat run-queue time over the phase): daemon threads",
         ", ".join(f"{k} ran {v[0] / 1e9:.1f} s, waited {v[1] / 1e9:.1f} s ({v[1] / max(1, v[2]) / 1e6:.2f} ms per wake-up)"
                   for k, v in sorted(p2.get("daemon_sched", {}).items(), key=lambda x: -x[1][1])[:4])),
        ("waiting for a CPU: the readers", f"{reader_wait / max(1, len(ops)) / 1e6:.2f} ms per op on average "
         f"({reader_wait / 1e9:.1f} s in all)"),
        ("load time p50 / max (s, from the log)",
         f"{fmt(pct([l[2] - l[1] for l in loads2], 50))} / {fmt(max((l[2] - l[1] for l in loads2), default=None))}"),
        ("errors", ", ".join(f"{k} {v}" for k, v in sorted(errs.items())) or "none"),
        ("readers stuck at the end (killed)", str(p2["stuck_workers"])),
        ("daemon CPU, moto CPU (cores busy, utime + stime); load average at the end",
         f"{fmt(cpu)}, {fmt(p2.get('moto_cores'))}; {' '.join(f'{x:.2f}' for x in p2.get('loadavg_end', []))}"),
        ("RSS first / last sample, VmHWM at the end (MiB)",
         f"{fmt(first.get('rss_kib', 0) / 1024, 1)} / {fmt(last.get('rss_kib', 0) / 1024, 1)}, "
         f"{fmt((p2['after'] or {}).get('hwm_kib', 0) / 1024, 1)}"),
        ("cache: `.status` bytes / the cache directory on disk (staging/ and the log excepted), largest samples (MiB)",
         f"{fmt(max((x.get('cache_bytes') or 0 for x in samples), default=0) / MIB, 1)} / "
         f"{fmt(max((sum((x.get('disk') or {}).values()) for x in samples), default=0) / MIB, 1)} "
         f"(--cache-size {P['cache_size']}); on disk at that sample: " + ", ".join(
             f"{k} {v / MIB:.1f}" for k, v in (max(samples, key=lambda x: sum((x.get('disk') or {}).values()),
                                                   default={}).get("disk") or {}).items())),
        ("threads first / max / last sample", f"{first.get('threads')} / "
         f"{max((s['threads'] for s in samples), default='n/a')} / {last.get('threads')}"),
        ("descriptors first / max / last sample, 1 s after the readers stopped",
         f"{first.get('fds')} / {max((s['fds'] for s in samples), default='n/a')} / {last.get('fds')}, "
         f"{(p2['after'] or {}).get('fds')}"),
    ]
    say(md_table(("phase 2, whole run", "value"), rows))
    say("")

    # Phase 3
    seals = p3["results"]
    ok = [r for r in seals if r.get("ok")]
    failed = [r for r in seals if not r.get("ok")]
    ferr = {}
    for r in failed:
        ferr[r.get("errno", "unclear")] = ferr.get(r.get("errno", "unclear"), 0) + 1
    ident = sorted({r["round"] for r in seals if r["identical"]})
    st_ok = [r["seconds"] for r in ok]
    say(f"#### Phase 3: two mounts sealing into the same store at once ({P['seal_seconds']} s)")
    say("")
    rows = [
        ("rounds (each: both mounts stage ~{} files, then `mv staging/NAME commit/`)".format(P["seal_files"]),
         f"{p3['rounds']}, {len(ident)} with an identical tree in both mounts at the same moment"),
        ("seals: ok / failed", f"{len(ok)} / {len(failed)}" + (
            " (" + ", ".join(f"{k} {v}" for k, v in sorted(ferr.items())) + ")" if failed else "")),
        ("identical rounds where both seals gave the same sha256 / a different one",
         f"{p3['same_sha']} / {p3['diff_sha']}"),
        ("seal time p50 / max (s)", f"{fmt(pct(st_ok, 50))} / {fmt(max(st_ok, default=None))}"),
        ("`ckptfs verify` of the whole store afterwards",
         f"exit {P['verify_rc']}: {P['verify_ok']} ok, {P['verify_failed']} failed "
         f"({P['verify_total']} checkpoints, expected {len(cps) + len(p3['shas'])}), {P['verify_seconds']:.1f} s"),
        ("mount B peak RSS (VmHWM, MiB)", fmt(P["hwm_b_kib"] / 1024, 1)),
    ]
    say(md_table(("measurement", "value"), rows))
    if failed:
        say("")
        say("Failed seals: " + "; ".join(
            f"round {r['round']} mount {r['mount']}: {r.get('err', '')[:160]}" for r in failed[:5]))
    say("")

    # Phase 4
    say(f"#### Phase 4: a prefix of {p4['count']:,} checkpoints")
    say("")
    rows = [
        ("upload of the tiny checkpoints (16 threads, plain HTTP PUT; s)", fmt(p4["upload_seconds"], 1)),
        ("`ckptfs mount` until ready (s)", fmt(p4["mount_seconds"], 3)),
        ("first `ls MNT \\| wc -l` (s)", f"{fmt(p4['ls_seconds'], 3)} ({p4['ls_count']:,} lines)"),
        (f"`stat` of {p4['stat_count']} random checkpoint directories: total (s)",
         fmt(p4["stat_seconds"], 3)),
        ("  per stat p50 / p99 / max (ms)",
         f"{fmt(p4['stat_p50_ms'], 3)} / {fmt(p4['stat_p99_ms'], 3)} / {fmt(p4['stat_max_ms'], 3)}"),
        ("downloads after the stats (`.status`)", str(p4["downloads_after_stats"])),
        ("3 random checkpoints read back and compared", f"{p4['reads_ok']} / 3 ok"),
        ("daemon RSS / VmHWM (MiB)", f"{fmt(p4['rss_kib'] / 1024, 1)} / {fmt(p4['hwm_kib'] / 1024, 1)}"),
        ("daemon threads / descriptors", f"{p4['threads']} / {p4['fds']}"),
    ]
    say(md_table(("measurement", "value"), rows))
    say("")

    # Summary
    bound = P["idle_threads_a"] + 2 * P["loaders"]
    peak_t = max(p1["peak_threads"], max((s["threads"] for s in samples), default=0))
    hwms = {"mount A (phases 1-3)": P["hwm_a_kib"], "mount B (phase 3)": P["hwm_b_kib"],
            f"{p4['count']:,}-checkpoint mount": p4["hwm_kib"]}
    max_hwm = max(hwms.values())
    fd_first, fd_last = first.get("fds") or 0, last.get("fds") or 0
    fd_ok = fd_last <= fd_first + P["fd_slack"]
    p99w = pct(sw, 99)
    seal_ok = (all(r.get("ok") or r.get("errno", "unclear") != "unclear" for r in seals)
               and p3["diff_sha"] == 0 and P["verify_rc"] == 0
               and P["verify_total"] == len(cps) + len(p3["shas"]))
    warm_win = [pct([o[3] for o in ops if o[0] == "s" and not o[5]
                     and t0 + i * win <= o[2] + o[3] / 1000 < t0 + (i + 1) * win], 99) or 0
                for i in range(nwin)]
    rows = [
        ("p99 `stat` < 10 ms while loads and evictions run (warm stats; cold ones wait for a download)",
         f"{fmt(p99w)} ms over {len(sw):,} warm stats, with {len(loads2)} loads and {len(ev2)} "
         f"evictions during the phase; worst 5-s window {fmt(max(warm_win, default=None))} ms",
         verdict(p99w is not None and p99w < 10 and len(loads2) > 0 and len(ev2) > 0)),
        ("  (the same over all stats, cold included)",
         f"{fmt(pct([o[3] for o in stats], 99))} ms", "info"),
        (f"threads bounded by the pool: peak ≤ idle ({P['idle_threads_a']}) + 2 × loaders ({P['loaders']}) = {bound}",
         f"phase 1 peak {p1['peak_threads']} ({p1['count']} first accesses), phase 2 peak "
         f"{max((s['threads'] for s in samples), default='n/a')}, {p4['count']:,}-checkpoint mount {p4['threads']}",
         verdict(peak_t <= bound and p4["threads"] <= bound)),
        ("RSS ≤ 150 MiB (VmHWM of each daemon)",
         ", ".join(f"{k} {v / 1024:.1f} MiB" for k, v in hwms.items()),
         verdict(max_hwm <= 150 * 1024)),
        (f"descriptors flat: last phase-2 sample ≤ first + {P['fd_slack']}",
         f"first {fd_first}, last {fd_last}, max {max((s['fds'] for s in samples), default='n/a')}",
         verdict(fd_ok)),
        ("seals: each ok or a clear errno; identical trees give one sha256; `ckptfs verify` passes",
         f"{len(ok)} ok, {len(failed)} failed, verify exit {P['verify_rc']}", verdict(seal_ok)),
    ]
    say("#### Summary")
    say("")
    say(md_table(("target", "measured", "result"), rows))
    warn_kinds = {}
    for log_path in (P["log_a"], P["log_b"]):
        for _, line in daemon_events(log_path)[2]:
            kind = re.sub(r"\d+", "N", line.split(" ", 1)[1].strip())[:90]
            warn_kinds[kind] = warn_kinds.get(kind, 0) + 1
    if warn_kinds:
        say("")
        say("Warnings in the logs of mounts A and B: " + "; ".join(
            f"{n} × `{k}`" for k, n in sorted(warn_kinds.items(), key=lambda x: -x[1])[:5]))
    print("\n".join(out))


# --- main ------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("bucket")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p = sub.add_parser("gen")
    p.add_argument("--out", required=True)
    p.add_argument("--count", type=int, default=50)
    p.add_argument("--seed", type=int, default=42)
    for name in ("phase1", "phase2"):
        p = sub.add_parser(name)
        p.add_argument("--mnt", required=True)
        p.add_argument("--pid", type=int, required=True)
        p.add_argument("--trees", required=True)
        p.add_argument("--puts", required=True)
        p.add_argument("--out", required=True)
        if name == "phase1":
            p.add_argument("--count", type=int, default=40)
            p.add_argument("--timeout", type=float, default=600)
        else:
            p.add_argument("--seconds", type=int, default=120)
            p.add_argument("--workers", type=int, default=16)
            p.add_argument("--moto-pid", type=int)
            p.add_argument("--cache-dir")
    p = sub.add_parser("seal")
    p.add_argument("--mnt-a", required=True)
    p.add_argument("--mnt-b", required=True)
    p.add_argument("--seconds", type=int, default=30)
    p.add_argument("--files", type=int, default=100)
    p.add_argument("--out", required=True)
    p = sub.add_parser("many")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--count", type=int, default=10000)
    p.add_argument("--out", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--mnt", required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--many", required=True)
    p.add_argument("--count", type=int, default=100)
    p.add_argument("--mount-seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("--work", required=True)
    a = ap.parse_args()
    {"bucket": cmd_bucket, "gen": cmd_gen, "phase1": cmd_phase1, "phase2": cmd_phase2,
     "seal": cmd_seal, "many": cmd_many, "probe": cmd_probe, "report": cmd_report}[a.cmd](a)


if __name__ == "__main__":
    main()
