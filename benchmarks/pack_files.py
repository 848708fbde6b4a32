"""How many files a cache of many small objects takes (issue 27: 1,000,000 small objects in at most
2,000 files).

Makes ``--objects`` small local files (once, kept in ``--src``), warms them into a fresh cache
(``cache warm``'s library call, ``--jobs`` threads), then counts the files in the cache directory
and checks the cache (``verify``).  Prints one Markdown row.

    flock /work/bench.lock .venv/bin/python benchmarks/pack_files.py --objects 1000000 --size 4K
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "benchmarks" / "_data" / "pack_files"


def make(src: Path, n: int, size: int) -> None:
    marker = src.parent / f".made-{n}x{size}"
    if marker.exists():
        return
    shutil.rmtree(src, ignore_errors=True)
    body = os.urandom(size)
    for i in range(n):
        d = src / f"{i // 1000:04d}"
        if i % 1000 == 0:
            d.mkdir(parents=True)
        with open(d / f"{i:07d}.bin", "wb") as f:
            f.write(i.to_bytes(8, "little") + body[8:])
    marker.touch()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--objects", type=int, default=1_000_000)
    ap.add_argument("--size", default="4K")
    ap.add_argument("--jobs", type=int, default=8)
    args = ap.parse_args()
    import manyfiles as mf
    from manyfiles._core.units import parse_size

    size = parse_size(args.size)
    src, cache_dir = DATA / "src", DATA / "cache"
    t0 = time.perf_counter()
    make(src, args.objects, size)
    made = time.perf_counter() - t0
    shutil.rmtree(cache_dir, ignore_errors=True)
    t0 = time.perf_counter()
    with mf.Cache(cache_dir) as cache:
        report = cache.warm([str(src)], jobs=args.jobs)
        cache.flush()
        warmed = time.perf_counter() - t0
        stats = cache.stats()
        files = [os.path.join(d, f) for d, _, fs in os.walk(cache_dir) for f in fs]
        on_disk = sum(os.path.getsize(p) for p in files)
        t0 = time.perf_counter()
        checked = cache.verify()
        verified = time.perf_counter() - t0
    print(f"{machine_line()}; load {os.getloadavg()[0]:.2f}; source files made in {made:.0f} s")
    print()
    print("| objects | cached | files in the cache | packs | bytes on disk | warm s | verify s | verify ok |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    packs = sum(p.endswith(".pack") for p in files)
    print(f"| {args.objects:,} x {args.size} | {stats.entries:,} ({report.fetched:,} fetched) | "
          f"{len(files):,} | {packs:,} | {on_disk / 2**30:.2f} GiB | {warmed:.0f} | {verified:.0f} | "
          f"{checked.ok} |")
    shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
