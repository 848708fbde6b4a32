"""Which objects to pack (issue 27): per object, a whole file of its own against a record in a pack.

For object sizes from 4 KiB to 16 MiB, on the cache's filesystem, the two ways the cache holds an
object whole, each by the system calls the cache makes:

* fill: a whole file is a temp file created, preallocated, written with ``pwrite`` and renamed into
  place (_fills.py ``WholeWriter``); a record is one ``pwritev`` (header + payload) appended to an
  open pack (_packs.py);
* hit (epoch 2, page cache warm): a whole file is ``open``, ``fstat``, ``pread``, ``close`` (what
  ``Cache.export`` and a dataset's former hit path did); a record is one ``pread`` on a pack kept open.

What packing saves is the per-file part; it matters while it is a sizeable share of the time the
bytes themselves take.  The threshold (``PACK_MAX_OBJECT``) is where the file's overhead falls to a
few percent of the hit.  Medians of ``--repeat`` passes, CPU time (process) and wall time.

    flock /work/bench.lock .venv/bin/python benchmarks/pack_threshold.py [--dir DIR] [--total 256M]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
HEADER = 64


def run(folder: str, size: int, count: int) -> dict[str, float]:
    data = os.urandom(size)
    header = os.urandom(HEADER)
    files = os.path.join(folder, "files")
    os.makedirs(files)
    times: dict[str, tuple[float, float]] = {}

    def timed(name: str, fn) -> None:
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        times[name] = ((time.process_time() - c0) / count, (time.perf_counter() - w0) / count)

    def fill_files() -> None:
        for i in range(count):
            tmp = os.path.join(folder, f"t{i}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            os.posix_fallocate(fd, 0, size)
            os.pwrite(fd, data, 0)
            os.close(fd)
            os.rename(tmp, os.path.join(files, f"{i:08d}.w"))

    pack = os.open(os.path.join(folder, "p.pack"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def fill_pack() -> None:
        off = 0
        for _ in range(count):
            os.pwritev(pack, [header, data], off)
            off += HEADER + size

    def hit_files() -> None:
        for i in range(count):
            fd = os.open(os.path.join(files, f"{i:08d}.w"), os.O_RDONLY | os.O_CLOEXEC)
            os.fstat(fd)
            os.pread(fd, size, 0)
            os.close(fd)

    def hit_pack() -> None:
        off = 0
        for _ in range(count):
            os.pread(pack, size, off + HEADER)
            off += HEADER + size

    timed("fill file", fill_files)
    timed("fill record", fill_pack)
    hit_files()
    hit_pack()                                     # (both in the page cache, as in epoch 2)
    timed("hit file", hit_files)
    timed("hit record", hit_pack)
    os.close(pack)
    shutil.rmtree(files)
    os.unlink(os.path.join(folder, "p.pack"))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=None, help="where to write (the cache's filesystem; default: /tmp)")
    ap.add_argument("--total", default="256M", help="bytes written per size and way")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from manyfiles._core.units import parse_size

    total = parse_size(args.total)
    base = tempfile.mkdtemp(prefix="mf-packsize-", dir=args.dir)
    print(f"{machine_line()}; load {os.getloadavg()[0]:.2f}; {args.repeat} passes, "
          f"{total >> 20} MiB per size")
    print()
    print("| object | objects | fill: file / record (us CPU) | hit: file / record (us CPU) | hit (wall us) "
          "file / record | file overhead / record hit |")
    print("|---:|---:|---:|---:|---:|---:|")
    try:
        for size in SIZES:
            count = max(200, total // size)
            passes = []
            for rep in range(args.repeat):
                folder = os.path.join(base, f"{size}-{rep}")
                os.makedirs(folder)
                passes.append(run(folder, size, count))
                shutil.rmtree(folder)
            med = {k: (statistics.median(p[k][0] for p in passes), statistics.median(p[k][1] for p in passes))
                   for k in passes[0]}
            overhead = (med["hit file"][0] - med["hit record"][0]) / med["hit record"][0]
            print(f"| {size >> 10:,} KiB | {count:,} | {med['fill file'][0] * 1e6:.1f} / "
                  f"{med['fill record'][0] * 1e6:.1f} | {med['hit file'][0] * 1e6:.1f} / "
                  f"{med['hit record'][0] * 1e6:.1f} | {med['hit file'][1] * 1e6:.1f} / "
                  f"{med['hit record'][1] * 1e6:.1f} | {overhead * 100:+.0f}% |", flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
