"""shard benchmark: `shard apply` (flat -> ab/cd/<name>) vs a naive Python loop vs the C rename floor.

    python benchmarks/shard.py                                  # ext4 + tmpfs, 1M files, 3 runs
    python benchmarks/shard.py --fs ext4 --files 200000 --repeat 5
    python benchmarks/shard.py --fs tmpfs --workers 1,2,4
    python benchmarks/shard.py --sshfs --files 200000           # list one bucket vs the flat folder

Peers, on the same data in the same run (the data is reverted to flat between runs):

* ``naive python``  os.listdir, then per file md5 + os.makedirs(exist_ok) + os.rename
* ``C floor``       benchmarks/rename_floor.c: the same mkdir + renameat calls, plan precomputed
* ``C floor+sync``  the same followed by syncfs(), which `shard apply` also does before it
                    drops its journal
* ``manyfiles wN``  ``manyfiles.shard.apply(root, workers=N)``: listing, hashing, journal,
                    no-replace renames, syncfs
* ``manyfiles w1, journal not fsync'd``: journal overhead = its ratio to ``manyfiles w1``

Warm cache (the files were just created or moved).  Data under /work/bench-data/shard and
/dev/shm/mf-bench-shard, deleted at the end unless --keep.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HERE, compile_c, machine_line, make_flat, print_table
from manyfiles import listing
from manyfiles.shard import Layout, apply, revert

BASES = {"ext4": Path("/work/bench-data/shard"), "tmpfs": Path("/dev/shm/mf-bench-shard")}


def naive(root: Path) -> None:
    """What people write first: one makedirs + one rename per file, paths built each time."""
    r = str(root)
    for name in os.listdir(r):
        h = hashlib.md5(name.encode()).hexdigest()
        d = os.path.join(r, h[:2], h[2:4])
        os.makedirs(d, exist_ok=True)
        os.rename(os.path.join(r, name), os.path.join(d, name))


def write_plan(root: Path, plan_path: Path) -> None:
    lay = Layout()
    names = os.listdir(os.fsencode(root))
    rows = sorted((lay.bucket_rel(n), n) for n in names)
    with open(plan_path, "wb") as f:
        for bucket, name in rows:
            f.write(bucket + b"\t" + name + b"\n")


def make_data(root: Path, n: int) -> None:
    if root.exists() and (root / ".manyfiles-shard.json").exists():
        revert(root, workers=4)  # left sharded by an interrupted run
    if root.exists() and listing.count(str(root)) == n:
        return
    shutil.rmtree(root, ignore_errors=True)
    make_flat(root, n)
    for marker in root.glob(".complete-*"):
        marker.unlink()  # the generator's marker would be migrated like any file


def to_flat(root: Path) -> float:
    """Revert whatever layout the last method produced; returns the revert time."""
    desc = root / ".manyfiles-shard.json"
    if not desc.exists():  # naive and C leave no descriptor; their layout is the default one
        desc.write_bytes(Layout().to_json())
    t0 = time.perf_counter()
    rep = revert(root, workers=4)
    secs = time.perf_counter() - t0
    assert rep.ok, rep.failures[:3]
    return secs


def run_fs(fs: str, n: int, repeat: int, workers: list[int], only: set[str]) -> None:
    base = BASES[fs]
    root = base / f"flat-{n}"
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    make_data(root, n)
    print(f"\n{fs}: {n:,} files in {root} (made in {time.perf_counter() - t0:.0f} s)", flush=True)
    exe = compile_c(HERE / "rename_floor.c")
    plan_path = base / f"plan-{n}.tsv"
    write_plan(root, plan_path)

    def c_floor(sync: bool) -> Callable[[], float]:
        def run() -> float:
            out = subprocess.run([str(exe), *(["-s"] if sync else []), str(root), str(plan_path)],
                                 check=True, capture_output=True, text=True).stdout
            return float(out.split("seconds=")[1])
        return run

    def timed(fn: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return run

    all_methods: dict[str, Callable[[], float]] = {
        "naive python": timed(lambda: naive(root)),
        "C floor": c_floor(False),
        "C floor+sync": c_floor(True),
    }
    for w in workers:
        all_methods[f"manyfiles w{w}"] = timed(lambda w=w: apply(root, workers=w))
    all_methods["manyfiles w1, journal not fsync'd"] = timed(
        lambda: apply(root, workers=1, journal_sync=False))
    methods = {k: v for k, v in all_methods.items() if not only or k in only}

    times: dict[str, list[float]] = {k: [] for k in methods}
    reverts: list[float] = []
    for rep in range(repeat):
        for name, fn in methods.items():  # interleaved, so machine noise hits every method alike
            secs = fn()
            times[name].append(secs)
            back = to_flat(root)
            if name.startswith("manyfiles"):
                reverts.append(back)
            print(f"  run {rep + 1}/{repeat} {name:36s} {secs:7.2f} s  ({n / secs:,.0f} files/s); "
                  f"revert {back:.2f} s", flush=True)
    rows = [(k, statistics.median(v)) for k, v in times.items()]
    base_name = "C floor+sync" if "C floor+sync" in times else rows[0][0]
    print_table(f"shard apply, {fs}, {n:,} files, median of {repeat} ({machine_line()})", rows,
                base_name, unit_count=n, unit="file")
    naive_t = dict(rows).get("naive python", rows[0][1])
    print("\n| method | files/s | x naive (speed-up) |\n|---|---:|---:|")
    for k, v in rows:
        print(f"| {k} | {n / v:,.0f} | {naive_t / v:.2f} |")
    if reverts:
        print(f"\nrevert (manyfiles, 4 workers) median {statistics.median(reverts):.2f} s "
              f"= {n / statistics.median(reverts):,.0f} files/s", flush=True)
    journal_share(root, n)
    plan_path.unlink()


def journal_share(root: Path, n: int) -> None:
    """Time spent in journal writes and fsyncs inside one `apply`, via the I/O trace hook.

    Same-run and inside one process, so machine noise cannot flip the answer the way it can
    between two separately timed runs.
    """
    from manyfiles.shard.journal import JOURNAL
    from manyfiles.trace import iotrace

    class Sum:
        journal_ns = 0
        ops = 0

        def record(self, op, path, offset, length, start_ns, dur_ns, result) -> None:
            if path == JOURNAL:
                self.journal_ns += dur_ns
                self.ops += 1

    rec = Sum()
    iotrace.TRACER = rec
    try:
        t0 = time.perf_counter()
        apply(root, workers=1)
        total = time.perf_counter() - t0
    finally:
        iotrace.TRACER = None
    to_flat(root)
    print(f"\njournal share (manyfiles w1, traced): {rec.ops} journal writes+fsyncs took "
          f"{rec.journal_ns / 1e9:.3f} s of {total:.2f} s = {100 * rec.journal_ns / 1e9 / total:.2f}% "
          f"of the migration ({n:,} files)", flush=True)


def run_sshfs(n: int, repeat: int) -> None:
    """List one bucket of the tree vs the whole flat folder through a fresh sshfs mount."""
    from _sshfs import remount, sshfs_mount

    base = BASES["ext4"]
    root = base / f"flat-{n}"
    make_data(root, n)
    lay = Layout()
    some = next(iter(os.listdir(root)))
    bucket = lay.bucket_rel(os.fsencode(some)).decode()
    res: dict[str, list[float]] = {}

    def measure(label: str, rel: str) -> None:
        with sshfs_mount(root) as mnt:
            for _ in range(repeat):
                for backend, fn in (("manyfiles.listdir", listing.listdir), ("os.listdir", os.listdir)):
                    remount(mnt)
                    t = time.perf_counter()
                    fn(str(mnt / rel) if rel else str(mnt))
                    res.setdefault(f"{label}, {backend}", []).append(time.perf_counter() - t)

    measure(f"flat folder ({n:,} entries)", "")
    apply(root, workers=4)
    count = len(os.listdir(root / bucket))
    measure(f"one bucket {bucket} ({count} entries)", bucket)
    to_flat(root)
    rows = [(k, statistics.median(v)) for k, v in res.items()]
    print_table(f"sshfs (loopback), freshly mounted, median of {repeat} ({machine_line()})", rows,
                f"flat folder ({n:,} entries), manyfiles.listdir")


def run_sshfs_apply(n: int, repeat: int) -> None:
    """`shard apply`/`revert` *through* an sshfs mount with 1 and 4 workers (a network filesystem)."""
    from _sshfs import sshfs_mount

    root = BASES["tmpfs"] / f"sshfs-apply-{n}"
    make_data(root, n)
    res: dict[str, list[float]] = {}
    with sshfs_mount(root) as mnt:
        for _ in range(repeat):
            for w in (1, 4):
                t = time.perf_counter()
                rep = apply(mnt, workers=w)
                res.setdefault(f"apply w{w}", []).append(time.perf_counter() - t)
                assert rep.ok and rep.moved == n
                t = time.perf_counter()
                assert revert(mnt, workers=w).ok
                res.setdefault(f"revert w{w}", []).append(time.perf_counter() - t)
    shutil.rmtree(root, ignore_errors=True)
    rows = [(k, statistics.median(v)) for k, v in res.items()]
    print_table(f"shard through sshfs, {n:,} files, median of {repeat} ({machine_line()})", rows, "apply w1",
                unit_count=n, unit="file")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fs", choices=["ext4", "tmpfs", "both", "none"], default="both")
    ap.add_argument("--files", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--methods", default="", help="comma-separated subset of the method names to run")
    ap.add_argument("--sshfs", action="store_true", help="also the sshfs listing comparison")
    ap.add_argument("--sshfs-apply", type=int, default=0, metavar="N",
                    help="also apply/revert N files through an sshfs mount with 1 and 4 workers")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--base-ext4", default=str(BASES["ext4"]), help="where the ext4 data goes")
    ap.add_argument("--base-tmpfs", default=str(BASES["tmpfs"]), help="where the tmpfs data goes")
    args = ap.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    BASES.update(ext4=Path(args.base_ext4), tmpfs=Path(args.base_tmpfs))
    print(f"# shard benchmark: {machine_line()}")
    fss = ["ext4", "tmpfs"] if args.fs == "both" else [] if args.fs == "none" else [args.fs]
    try:
        for fs in fss:
            only = {m.strip() for m in args.methods.split(",") if m.strip()}
            run_fs(fs, args.files, args.repeat, workers, only)
        if args.sshfs:
            run_sshfs(args.files, args.repeat)
        if args.sshfs_apply:
            run_sshfs_apply(args.sshfs_apply, args.repeat)
    finally:
        if not args.keep:
            for fs in [*fss, *(["ext4"] if args.sshfs else [])]:
                shutil.rmtree(BASES[fs] / f"flat-{args.files}", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
