"""Many processes filling and reading one cache at once (issue 27): no "database is locked", no wrong
byte, every counter consistent.

N processes (default 8) share one cache directory for ``--seconds``, each a random mix of: whole
reads of small files (packed), of larger ones (whole files), range reads of big ones (blocks: the
cache is opened with a small ``verify_whole_max``), batches of a ``mf.Dataset`` over the small files
(the hit path), rewrites of files (a new version, renamed over the old one), evictions (``max_size``
is well under the data, so fills and evictions never stop) and, now and then, a ``verify``.  Every file
says what it is: its first 16 bytes are its number and version, the rest follows from them, so a
reader checks any version it gets, and a mix of two versions is caught.

At the end, the cache must hold: the sum of every process's own counters (``Cache.process_stats``)
equal to the index's; the index's ``entries`` and ``bytes`` equal to its rows and to what the files
and packs take on disk; ``cache verify`` clean; every file read back exactly.

    flock /work/bench.lock .venv/bin/python benchmarks/cache_stress.py --seconds 600 --processes 8
    .venv/bin/python benchmarks/cache_stress.py --seconds 15 --json      (what tests/cache runs)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

KiB, MiB = 1 << 10, 1 << 20
HEADER = struct.Struct("<QQ")            # file number, version
SHAPES = {"small": (400, 1 * KiB, 200 * KiB), "medium": (24, 1100 * KiB, 3 * MiB),
          "big": (3, 6 * MiB, 9 * MiB)}
PROCESS_COUNTERS = ("hits", "misses", "hit_bytes", "miss_bytes", "object_hits", "object_misses", "fills",
                    "fill_bytes", "fills_dropped", "corrupt")


def content(number: int, version: int, size: int) -> bytes:
    body = random.Random(f"{number}:{version}").randbytes(max(0, size - HEADER.size))
    return (HEADER.pack(number, version) + body)[:size]


def check(data: bytes, size: int | None = None) -> bool:
    """Is ``data`` exactly some version of the file it says it is (whole, or its first bytes)?"""
    if len(data) < HEADER.size:
        return False
    number, version = HEADER.unpack_from(data)
    return data == content(number, version, len(data) if size is None else size)[:len(data)]


def make_files(root: Path, scale: float) -> dict[str, list]:
    """The files by shape: [path, number, size]; every file at version 0."""
    rng = random.Random(0)
    out: dict[str, list] = {}
    number = 0
    for shape, (count, lo, hi) in SHAPES.items():
        folder = root / shape
        folder.mkdir(parents=True, exist_ok=True)
        out[shape] = []
        for i in range(max(1, int(count * scale))):
            size = rng.randint(lo, hi)
            p = folder / f"{i:04d}.bin"
            p.write_bytes(content(number, 0, size))
            out[shape].append([str(p), number, size])
            number += 1
    return out


# -- one process ------------------------------------------------------------------------------------

def worker(cache_dir: str, files_json: str, seconds: float, seed: int, max_size: int) -> None:
    import manyfiles as mf

    files = json.loads(Path(files_json).read_text())
    rng = random.Random(seed)
    counts: Counter = Counter()
    errors: Counter = Counter()
    locked = 0
    cache = mf.Cache(cache_dir, max_size=max_size, min_free=0, verify_whole_max=2 * MiB, block_size=256 * KiB)
    ds = mf.Dataset(os.path.dirname(files["small"][0][0]), cache=cache)
    deadline = time.monotonic() + seconds

    def read_whole(shape: str) -> None:
        path = rng.choice(files[shape])[0]
        data = cache.get_bytes(path)
        counts["reads"] += 1
        counts["wrong"] += not check(data)

    def read_ranges() -> None:
        path = rng.choice(files["big"])[0]
        with cache.open(path, buffering=0) as f:
            head = f.read(HEADER.size)
            counts["reads"] += 1
            if not check(head):
                counts["wrong"] += 1
                return
            number, version = HEADER.unpack(head)
            truth = content(number, version, f.size)
            for _ in range(4):
                at = rng.randrange(0, f.size)
                n = rng.choice([100, 4096, 300 * KiB])
                f.seek(at)
                counts["wrong"] += f.read(n) != truth[at:at + n]

    def verify() -> None:       # (while the others read and fill: what it finds wrong is reported)
        report = cache.verify()
        counts["verify_corrupt"] += report.corrupt
        for f in report.failures:
            errors[f"verify: {f.reason}"[:160]] += 1

    def dataset_batch() -> None:
        batch = rng.sample(range(len(ds)), min(32, len(ds)))
        for s in ds.__getitems__(batch):
            counts["reads"] += 1
            counts["wrong"] += not check(s.data)

    def rewrite() -> None:
        path, number, size = rng.choice(files["small"] + files["medium"])
        version = rng.randrange(1, 1 << 30)
        data = content(number, version, size)
        # A new inode with a modification time of its own, renamed over the file: never rewritten in
        # place, where two writers within one tick of the file clock, at the same size, make two
        # contents of one version (the limit docs/cache.md names; tests/cache covers what a reader
        # sees of one rewrite in place).
        stamp = time.time_ns() // 1000 * 1000 + os.getpid() % 1000
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.utime(tmp, ns=(stamp, stamp))
        os.replace(tmp, path)
        counts["rewrites"] += 1

    ops = [(0.45, lambda: read_whole("small")), (0.15, lambda: read_whole("medium")), (0.08, read_ranges),
           (0.2, dataset_batch), (0.06, rewrite),
           (0.04, lambda: cache.evict([rng.choice(files["small"])[0] for _ in range(5)])),
           (0.015, lambda: cache.evict(to_size=max_size // 2)), (0.05, verify)]
    weights = [w for w, _ in ops]
    while time.monotonic() < deadline:
        op = rng.choices(ops, weights)[0][1]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                op()
            except (mf.ObjectChanged, mf.NotFound):     # a file rewritten under the reader: refused, right
                counts["changed"] += 1
            except Exception as exc:        # counted, reported: the run says what went wrong
                text = f"{type(exc).__name__}: {exc}"
                locked += "locked" in text
                errors[text[:160]] += 1
        for w in caught:
            text = str(w.message)
            locked += "locked" in text
            if "changed" not in text:
                errors[f"warning: {text[:150]}"] += 1
    totals: Counter = Counter()
    for c in {id(cache): cache, id(ds.cache): ds.cache}.values():     # (the dataset opens its own)
        c.close()
        totals.update(c._store.counters.totals)
    print(json.dumps({"pid": os.getpid(), "counts": counts, "errors": errors, "locked": locked,
                      "totals": totals}))


# -- the run ------------------------------------------------------------------------------------------

def consistency(cache_dir: str, processes: list[dict]) -> dict:
    """What the index says against what the processes counted and what is on disk."""
    import sqlite3

    import manyfiles as mf
    from manyfiles.cache import _format as fmt

    with contextlib.closing(sqlite3.connect(os.path.join(cache_dir, fmt.INDEX))) as db:
        counters = dict(db.execute("SELECT name, value FROM counters").fetchall())
        rows = db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        files_bytes = db.execute("SELECT COALESCE(SUM(disk_bytes), 0) FROM entries "
                                 "WHERE pack IS NULL").fetchone()[0]
        packs_bytes = db.execute("SELECT COALESCE(SUM(size), 0) FROM packs").fetchone()[0]
        pack_ids = [r[0] for r in db.execute("SELECT id FROM packs")]
    on_disk_files = sum(os.path.getsize(os.path.join(d, f))
                        for d, _, fs in os.walk(os.path.join(cache_dir, fmt.BLOCKS)) for f in fs)
    on_disk_packs = sum(os.path.getsize(os.path.join(cache_dir, fmt.pack_relpath(p))) for p in pack_ids)
    out = {"index": {k: counters.get(k, 0) for k in ("entries", "bytes", *PROCESS_COUNTERS)},
           "rows": rows, "row_bytes": files_bytes + packs_bytes, "disk_bytes": on_disk_files + on_disk_packs}
    summed = {k: sum(p["totals"].get(k, 0) for p in processes) for k in PROCESS_COUNTERS}
    out["processes"] = summed
    out["mismatches"] = [k for k in PROCESS_COUNTERS if summed[k] != counters.get(k, 0)]
    if counters.get("entries") != rows:
        out["mismatches"].append("entries")
    if not counters.get("bytes") == files_bytes + packs_bytes == on_disk_files + on_disk_packs:
        out["mismatches"].append("bytes")
    out["unbacked"] = unbacked(cache_dir)
    verify = subprocess.run([os.path.join(os.path.dirname(sys.executable), "manyfiles"), "cache", "verify",
                             "--dir", cache_dir, "--json"], capture_output=True, text=True)
    out["verify_exit"] = verify.returncode
    out["verify"] = json.loads(verify.stdout) if verify.stdout.strip() else verify.stderr
    del mf
    return out


def unbacked(cache_dir: str) -> list[str]:
    """Entries of the index whose bytes are not on disk (a whole file, a pack or a block missing)."""
    import sqlite3

    from manyfiles.cache import _format as fmt
    from manyfiles.cache._index import bits_set

    out = []
    with contextlib.closing(sqlite3.connect(os.path.join(cache_dir, fmt.INDEX))) as db:
        rows = db.execute("SELECT objid, source, whole, pack, present FROM entries").fetchall()
    for objid, source, whole, pack, present in rows:
        if pack is not None:
            missing = [fmt.pack_relpath(pack)]
        elif whole:
            missing = [fmt.whole_relpath(objid)]
        else:
            missing = [fmt.block_relpath(objid, i) for i in bits_set(present)]
        missing = [m for m in missing if not os.path.exists(os.path.join(cache_dir, m))]
        if missing:
            out.append(f"{source.decode(errors='replace')}: {', '.join(missing)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--scale", type=float, default=1.0, help="files per shape, times this")
    ap.add_argument("--max-size", type=int, default=48 * MiB,
                    help="the cache's max_size (keep it under the data)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed at the end)")
    ap.add_argument("--json", action="store_true", help="print one JSON summary line")
    ap.add_argument("--worker", nargs=4, metavar=("CACHE", "FILES", "SECONDS", "SEED"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        cache_dir, files_json, seconds, seed = args.worker
        worker(cache_dir, files_json, float(seconds), int(seed), args.max_size)
        return
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="mf-stress-"))
    try:
        t0 = time.monotonic()
        files = make_files(work / "src", args.scale)
        data = sum(size for shape in files.values() for _, _, size in shape)
        (work / "files.json").write_text(json.dumps(files))
        cache_dir = str(work / "cache")
        shutil.rmtree(cache_dir, ignore_errors=True)
        procs = [subprocess.Popen([sys.executable, __file__, "--max-size", str(args.max_size), "--worker",
                                   cache_dir, str(work / "files.json"), str(args.seconds), str(seed)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for seed in range(args.processes)]
        results, crashed = [], []
        stderr: Counter = Counter()
        for p in procs:
            out, err = p.communicate()
            if p.returncode == 0 and out.strip():
                results.append(json.loads(out.strip().splitlines()[-1]))
            else:
                crashed.append(err.strip().splitlines()[-3:])
            stderr.update(line.split(": ", 1)[-1][:150] for line in err.splitlines() if "Warning" in line)
        summary = {"processes": args.processes, "seconds": args.seconds, "data_bytes": data,
                   "max_size": args.max_size, "crashed": crashed,
                   "reads": sum(r["counts"].get("reads", 0) for r in results),
                   "wrong": sum(r["counts"].get("wrong", 0) for r in results),
                   "changed": sum(r["counts"].get("changed", 0) for r in results),
                   "rewrites": sum(r["counts"].get("rewrites", 0) for r in results),
                   "locked": sum(r["locked"] for r in results),
                   "errors": sum((Counter(r["errors"]) for r in results), Counter()),
                   "stderr_warnings": stderr}
        summary.update(consistency(cache_dir, results))
        # every file read back exactly (the version it is now), by a process of its own
        import manyfiles as mf

        with mf.Cache(cache_dir, verify_whole_max=2 * MiB) as cache:
            summary["final_wrong"] = sum(cache.get_bytes(path) != Path(path).read_bytes()
                                         for shape in files.values() for path, _, _ in shape)
        summary["wall_s"] = round(time.monotonic() - t0, 1)
        summary["load"] = round(os.getloadavg()[0], 2)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    ok = (not summary["crashed"] and summary["wrong"] == summary["final_wrong"] == summary["locked"] == 0
          and not summary["mismatches"] and summary["verify_exit"] == 0 and not summary["errors"]
          and not summary["unbacked"])
    summary["ok"] = ok
    if args.json:
        print(json.dumps(summary))
    else:
        for k, v in summary.items():
            print(f"{k:>14}: {v}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
