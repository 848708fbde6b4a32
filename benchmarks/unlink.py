"""Deletion benchmarks: (a) the FxMark unlink shape, (b) fastrm vs rm -rf vs find -delete.

(a) ``--part fxmark``: unlink rate with W workers all in one shared directory (FxMark
    MWUM) vs each in a private directory (MWUL), on every ``--fs``.  Two drivers, run on
    the same layout: ``c`` = benchmarks/unlink_floor.c (pthreads, unlinkat; the floor) and
    ``py`` = Python threads calling ``os.unlink(name, dir_fd=fd)``, which releases the GIL
    around the syscall (what fastrm's workers do).  Only the unlink phase is timed.
(b) ``--part peers``: ``fastrm`` vs ``rm -rf`` vs ``find DIR -delete`` on a flat folder and a
    two-level hashed tree (benchmarks/_common.py make_flat / make_hashed_tree), fresh data
    for every run, order rotated each repetition, sync before and after every timed run.

Every number is the median of ``--repeat`` runs; ratios are against a peer measured in the
same run (1 worker for (a), ``rm -rf`` for (b)).

    python benchmarks/unlink.py --part fxmark --workers 1,2,4 --files 100000
    python benchmarks/unlink.py --part peers --peer-files 200000 --repeat 3 \
        --peer-fs ext4=/work/bench-data/fastrm,tmpfs=/dev/shm/fastrm-bench
    python benchmarks/unlink.py --part peers --peer-files 1000000 --repeat 1 --datasets tree
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HERE, compile_c, machine_line, make_flat, make_hashed_tree

DEFAULT_FS = "ext4=/work/bench-data/fastrm,tmpfs=/dev/shm/fastrm-bench"
FASTRM = str(Path(sys.executable).parent / "fastrm")


# -- (a) FxMark shape -----------------------------------------------------------------------


def c_unlink_rate(root: Path, mode: str, workers: int, n: int) -> float:
    exe = compile_c(HERE / "unlink_floor.c")
    root.mkdir(parents=True, exist_ok=True)
    out = subprocess.run(
        [str(exe), mode, str(root), str(workers), str(n)], check=True, capture_output=True, text=True
    ).stdout.split()
    return int(out[1]) / float(out[0])


def py_unlink_rate(root: Path, mode: str, workers: int, n: int) -> float:
    per = n // workers
    root.mkdir(parents=True, exist_ok=True)
    dirs = [root if mode == "shared" else root / f"t{i}" for i in range(workers)]
    names = [[f"t{i}-{j:08d}" for j in range(per)] for i in range(workers)]
    fds = []
    for d, batch in zip(dirs, names, strict=True):
        d.mkdir(exist_ok=True)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        for name in batch:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        fds.append(fd)
    os.sync()
    barrier = threading.Barrier(workers + 1)

    def work(i: int) -> None:
        unlink, fd = os.unlink, fds[i]
        barrier.wait()
        for name in names[i]:
            unlink(name, dir_fd=fd)
        barrier.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    barrier.wait()
    secs = time.perf_counter() - t0
    for t in threads:
        t.join()
    for fd in fds:
        os.close(fd)
    shutil.rmtree(root)
    return per * workers / secs


def run_fxmark(fss: dict[str, Path], workers: list[int], n: int, repeat: int, impls: list[str]) -> None:
    drivers = {"c": c_unlink_rate, "py": py_unlink_rate}
    print(f"\n### Unlink rate, shared vs private directory ({n:,} files, median of {repeat})\n")
    head = "".join(f" | {i} files/s | {i} x 1 worker" for i in impls)
    print(f"| fs | directory | workers{head} |")
    print("|---|---|---:" + "|---:|---:" * len(impls) + "|")
    for fs, base in fss.items():
        for mode in ("shared", "private"):
            rates: dict[tuple[str, int], float] = {}
            for w in workers:
                for impl in impls:
                    runs = []
                    for _ in range(repeat):
                        root = base / f"fxmark-{mode}"
                        shutil.rmtree(root, ignore_errors=True)
                        runs.append(drivers[impl](root, mode, w, n))
                        shutil.rmtree(root, ignore_errors=True)
                        os.sync()
                    rates[impl, w] = statistics.median(runs)
                cells = "".join(
                    f" | {rates[i, w]:,.0f} | {rates[i, w] / rates[i, workers[0]]:.2f}" for i in impls
                )
                print(f"| {fs} | {mode} | {w}{cells} |")
                sys.stdout.flush()


# -- (b) fastrm vs peers --------------------------------------------------------------------


def make(kind: str, path: Path, n: int) -> None:
    if kind == "flat":
        make_flat(path, n)
    else:
        make_hashed_tree(path, n)
    os.sync()


def run_peers(
    fs: str, base: Path, datasets: list[str], n: int, repeat: int, fastrm_workers: list[int], cold: bool
) -> None:
    from _common import drop_caches

    peers = {"rm -rf": ["rm", "-rf"], "find -delete": None}
    for w in fastrm_workers:
        peers[f"fastrm -j {w}"] = [FASTRM, "-j", str(w)]
    for kind in datasets:
        times: dict[str, list[float]] = {p: [] for p in peers}
        order = list(peers)
        for rep in range(repeat):
            for name in order[rep % len(order) :] + order[: rep % len(order)]:
                path = base / f"peers-{kind}"
                make(kind, path, n)
                if cold:
                    drop_caches()
                cmd = ["find", str(path), "-delete"] if peers[name] is None else [*peers[name], str(path)]
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True)
                times[name].append(time.perf_counter() - t0)
                assert not path.exists(), f"{name} left {path} behind"
                os.sync()
                print(
                    f"  {fs} {kind} rep {rep + 1} {name}: {times[name][-1]:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
        rows = [(p, statistics.median(t)) for p, t in times.items()]
        base_s = dict(rows)["rm -rf"]
        cache = "cold cache" if cold else "warm cache"
        label = "flat folder" if kind == "flat" else "2-level hashed tree (256 x 256 buckets)"
        print(f"\n### Delete {n:,} files, {label}, {fs}, {cache} (median of {repeat})\n")
        print("| tool | median s | files/s | speed-up vs rm -rf | runs (s) |")
        print("|---|---:|---:|---:|---|")
        for p, secs in rows:
            runs = ", ".join(f"{t:.1f}" for t in times[p])
            print(f"| {p} | {secs:.2f} | {n / secs:,.0f} | {base_s / secs:.2f}x | {runs} |")
        sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["fxmark", "peers", "all"], default="all")
    ap.add_argument("--fs", default=DEFAULT_FS, help="NAME=DIR,... for --part fxmark (default: %(default)s)")
    ap.add_argument("--workers", default="1,2,4", help="worker counts for --part fxmark")
    ap.add_argument("--files", type=int, default=100_000, help="files per --part fxmark run")
    ap.add_argument("--impl", default="c,py", help="fxmark drivers: c (pthreads), py (Python threads)")
    ap.add_argument("--peer-fs", default="ext4=/work/bench-data/fastrm", help="NAME=DIR,... for --part peers")
    ap.add_argument("--peer-files", type=int, default=200_000)
    ap.add_argument("--datasets", default="flat,tree")
    ap.add_argument("--fastrm-workers", default="1,2,8,32")
    ap.add_argument("--cold", action="store_true", help="drop caches before every timed run")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print(f"Machine: {machine_line()}; load average at start {os.getloadavg()[0]:.1f}")
    if args.part in ("fxmark", "all"):
        fss = {k: Path(v) for k, v in (item.split("=", 1) for item in args.fs.split(","))}
        run_fxmark(
            fss, [int(w) for w in args.workers.split(",")], args.files, args.repeat, args.impl.split(",")
        )
    if args.part in ("peers", "all"):
        for fs, base in (item.split("=", 1) for item in args.peer_fs.split(",")):
            run_peers(
                fs,
                Path(base),
                args.datasets.split(","),
                args.peer_files,
                args.repeat,
                [int(w) for w in args.fastrm_workers.split(",")],
                args.cold,
            )
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
