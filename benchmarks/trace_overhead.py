"""What ``--trace`` costs: each command with and without the I/O log, in one run, on the same data.

Workloads (targets from issue 6): fastls on a 1,000,000-entry folder (<= 5%), shard migration of
200,000 files (<= 2%), s3pull of 2,000 small objects from a local versitygw (<= 2%).  Each one runs
as the real CLI process, plain and with ``--trace FILE``, interleaved (ABBA) so that machine noise
spreads over both; the table shows medians and the traced/plain ratio.  ``strace -f`` tracing the
same syscalls is the outside peer: what logging the operations costs when done by another process.
A micro row gives the cost of one ``record()`` call and of a traced ``_fsops.rename``.

    .venv/bin/python benchmarks/trace_overhead.py                         # everything
    .venv/bin/python benchmarks/trace_overhead.py --only ls,micro --repeat 9
    .venv/bin/python benchmarks/trace_overhead.py --ls-n 1000000 --shard-n 200000 --s3-n 2000

Data lives in /work/bench-data/trace (outside the repo; --clean removes it at the end).  The s3pull
row needs versitygw in .cache/go/bin (see docs/s3pull.md); without it the row is reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line, make_flat

ROOT = Path(__file__).resolve().parent.parent
DATA = Path("/work/bench-data/trace")
BIN = Path(sys.executable).parent
GOBIN = ROOT / ".cache" / "go" / "bin"
KEY, SECRET = "benchkey", "benchsecret"
TARGETS = {"fastls": 1.05, "shard": 1.02, "s3pull": 1.02}


def run(cmd: list[str], env: dict | None = None) -> None:
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr.decode()[-400:]}")


CPU: dict[str, float] = {}
"""Median CPU seconds (user + system, this process and its finished children) per ``label/variant``."""


def _cpu() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def interleaved(variants: dict[str, Callable[[], None]], repeat: int, setup: Callable[[], None] | None = None,
                label: str = "") -> dict[str, float]:
    """Median wall time of each variant; the order alternates every round (ABBA...).

    CPU time (less sensitive to the other processes on a shared machine) goes to ``CPU``.
    """
    times: dict[str, list[float]] = {k: [] for k in variants}
    cpus: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(repeat):
        for name in names if i % 2 == 0 else names[::-1]:
            if setup is not None:
                setup()
            c0 = _cpu()
            t0 = time.perf_counter()
            variants[name]()
            dt = time.perf_counter() - t0
            times[name].append(dt)
            cpus[name].append(_cpu() - c0)
            print(f"  {label} {name}: {dt:.3f} s, cpu {cpus[name][-1]:.3f} s", file=sys.stderr, flush=True)
    for k, v in cpus.items():
        CPU[f"{label}/{k}"] = statistics.median(v)
    return {k: statistics.median(v) for k, v in times.items()}


def trace_stats(path: Path) -> tuple[int, int, int]:
    """(records, dropped, bytes on disk incl. worker files) of a trace."""
    from manyfiles import trace

    ts = trace.load([path])
    size = sum(os.path.getsize(f.path) for f in ts.files)
    return len(ts), ts.dropped, size


def strace_cmd(syscalls: str, log: Path) -> list[str]:
    return ["strace", "-f", "-qq", "-e", f"trace={syscalls}", "-o", str(log)]


# --- workloads ------------------------------------------------------------------------------------


def bench_ls(n: int, repeat: int, with_strace: bool) -> dict:
    folder = make_flat(DATA / f"flat-{n}", n)
    t = DATA / "ls.mft"
    cmd = [str(BIN / "fastls"), str(folder)]
    variants = {
        "plain": lambda: run(cmd),
        "--trace": lambda: run([*cmd[:1], "--trace", str(t), *cmd[1:]]),
    }
    if with_strace:
        variants["strace -e getdents64"] = lambda: run([*strace_cmd("getdents64", DATA / "strace.log"), *cmd])
    med = interleaved(variants, repeat, label="fastls")
    # The library call alone (no process start-up): what a notebook user pays.
    from manyfiles import listing
    from manyfiles.trace import iotrace

    def lib_traced() -> None:
        with iotrace.tracing(DATA / "ls-lib.mft"):
            listing.count(str(folder))

    lib = interleaved({"count() plain": lambda: listing.count(str(folder)), "count() traced": lib_traced},
                      repeat, label="listing.count")
    return {"title": f"fastls, {n:,} entries (ext4, warm cache)", "label": "fastls", "med": med, "lib": lib,
            "stats": trace_stats(t), "unit": n}


def bench_shard(n: int, repeat: int, with_strace: bool) -> dict:
    from manyfiles import listing
    from manyfiles.shard import revert

    root = DATA / f"shard-{n}"
    if (root / ".manyfiles-shard.json").exists():
        revert(root, workers=4)
    if not root.exists() or listing.count(str(root)) != n:
        shutil.rmtree(root, ignore_errors=True)
        make_flat(root, n)
        for marker in root.glob(".complete-*"):
            marker.unlink()
    t = DATA / "shard.mft"

    def to_flat() -> None:
        if (root / ".manyfiles-shard.json").exists():
            rep = revert(root, workers=4)
            assert rep.ok, rep.failures[:3]

    cmd = [str(BIN / "shard"), "apply", "-q", str(root)]
    # Warm-up cycle, untimed: a freshly created folder is easier to migrate than one that has
    # been through apply + revert, and every timed run must start from the same state.
    run(cmd)
    to_flat()
    variants = {
        "plain": lambda: run(cmd),
        "--trace": lambda: run([*cmd[:2], "--trace", str(t), *cmd[2:]]),
    }
    if with_strace:
        variants["strace -e rename*,mkdir*"] = lambda: run(
            [*strace_cmd("rename,renameat,renameat2,mkdir,mkdirat", DATA / "strace.log"), *cmd])
    med = interleaved(variants, repeat, setup=to_flat, label="shard apply")
    to_flat()
    return {"title": f"shard apply, {n:,} files (ext4, default 2:2 layout, 4 workers)",
            "label": "shard apply", "med": med, "stats": trace_stats(t), "unit": n}


def start_versitygw() -> tuple[subprocess.Popen, str] | None:
    import socket

    exe = GOBIN / "versitygw"
    if not exe.exists():
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (DATA / "gw").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROOT_ACCESS_KEY": KEY, "ROOT_SECRET_KEY": SECRET}
    proc = subprocess.Popen([str(exe), "--port", f"127.0.0.1:{port}", "--keep-alive", "--quiet", "posix",
                             str(DATA / "gw")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError("versitygw did not start")


def bench_s3(n: int, repeat: int, with_strace: bool) -> dict | None:
    started = start_versitygw()
    if started is None:
        print(f"s3pull row skipped: {GOBIN / 'versitygw'} missing", file=sys.stderr)
        return None
    proc, endpoint = started
    try:
        import boto3

        env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
               "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required"}
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                         aws_secret_access_key=SECRET)
        bucket = "trace-overhead"
        with contextlib.suppress(c.exceptions.ClientError):
            c.create_bucket(Bucket=bucket)
        pages = c.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        have = sum(len(p.get("Contents", ())) for p in pages)
        if have != n:
            for i in range(n):
                c.put_object(Bucket=bucket, Key=f"small/obj-{i:06d}.bin", Body=os.urandom(1024 + i % 3072))
        dest = DATA / "dest"
        t = DATA / "s3.mft"

        def fresh() -> None:
            shutil.rmtree(dest, ignore_errors=True)

        cmd = [str(BIN / "s3pull"), "-q", f"s3://{bucket}/", str(dest)]
        variants = {
            "plain": lambda: run(cmd, env),
            "--trace": lambda: run([*cmd[:2], "--trace", str(t), *cmd[2:]], env),
        }
        if with_strace:
            variants["strace -e network,openat"] = lambda: run(
                [*strace_cmd("%network,openat,rename", DATA / "strace.log"), *cmd], env)
        med = interleaved(variants, repeat, setup=fresh, label="s3pull")
        fresh()
        return {"title": f"s3pull, {n:,} objects of 1-4 KiB (local versitygw, same 2 cores)",
                "label": "s3pull", "med": med, "stats": trace_stats(t), "unit": n}
    finally:
        proc.terminate()
        proc.wait()


def micro() -> list[tuple[str, float]]:
    """ns per record() call, and per _fsops.rename with tracing off / on."""
    from manyfiles._core import fsops as _fsops
    from manyfiles.trace import iotrace

    rows = []
    folder = DATA / "micro"
    folder.mkdir(parents=True, exist_ok=True)
    a, b = str(folder / "a"), str(folder / "b")
    open(a, "w").close()

    def flip(k: int) -> None:
        for _ in range(k):
            _fsops.rename(a, b)
            _fsops.rename(b, a)

    k = 20000
    plain = min(timeit.repeat(lambda: flip(k), number=1, repeat=5)) / (2 * k)
    with iotrace.tracing(DATA / "micro.mft") as tr:
        traced = min(timeit.repeat(lambda: flip(k), number=1, repeat=5)) / (2 * k)
        n = 200000
        rec = min(timeit.repeat("r('rename', '/some/dir/name', 0, 0, 123456789, 4567, 0)",
                                globals={"r": tr.record}, number=n, repeat=5)) / n
    rows += [("record() call", rec * 1e9), ("_fsops.rename, tracing off", plain * 1e9),
             ("_fsops.rename, tracing on", traced * 1e9)]
    return rows


# --- report ---------------------------------------------------------------------------------------


def report(results: list[dict], micro_rows: list[tuple[str, float]] | None) -> None:
    print(f"\nMachine: {machine_line()}\n")
    print("| workload | plain s | --trace s | overhead (wall) | overhead (cpu) | target | met | records "
          "| dropped | trace size |")
    print("|---|---:|---:|---:|---:|---:|:-:|---:|---:|---:|")
    for r in results:
        key = r["title"].split(",")[0].split()[0]
        plain, traced = r["med"]["plain"], r["med"]["--trace"]
        ratio = traced / plain
        cpu_ratio = CPU[f"{r['label']}/--trace"] / CPU[f"{r['label']}/plain"]
        target = TARGETS[key]
        records, dropped, size = r["stats"]
        met = "yes" if ratio <= target else "no"
        print(f"| {r['title']} | {plain:.3f} | {traced:.3f} | {100 * (ratio - 1):+.1f}% | "
              f"{100 * (cpu_ratio - 1):+.1f}% | <= {100 * (target - 1):.0f}% | {met} "
              f"| {records:,} | {dropped:,} | {size / 1e6:.1f} MB |")
    for r in results:
        print(f"\n### {r['title']}\n")
        print("| variant | median s | x plain | median cpu s | x plain |")
        print("|---|---:|---:|---:|---:|")
        base = r["med"]["plain"]
        cbase = CPU[f"{r['label']}/plain"]
        for name, secs in r["med"].items():
            cpu = CPU[f"{r['label']}/{name}"]
            print(f"| {name} | {secs:.3f} | {secs / base:.3f} | {cpu:.3f} | {cpu / cbase:.3f} |")
        if "lib" in r:
            lp, lt = r["lib"]["count() plain"], r["lib"]["count() traced"]
            cp, ct = CPU["listing.count/count() plain"], CPU["listing.count/count() traced"]
            print(f"| in-process `listing.count()` plain | {lp:.3f} | 1.000 | {cp:.3f} | 1.000 |")
            print(f"| in-process `listing.count()` inside `tracing()` | {lt:.3f} | {lt / lp:.3f} "
                  f"| {ct:.3f} | {ct / cp:.3f} |")
    if micro_rows:
        print("\n### per call (best of 5)\n")
        print("| what | ns |")
        print("|---|---:|")
        for name, ns in micro_rows:
            print(f"| {name} | {ns:.0f} |")
    sys.stdout.flush()


def main() -> None:
    global DATA
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="ls,shard,s3,micro", help="comma list of ls, shard, s3, micro")
    ap.add_argument("--repeat", type=int, default=7, help="runs per variant (fastls, s3pull)")
    ap.add_argument("--shard-repeat", type=int, default=3, help="runs per variant for shard (slow)")
    ap.add_argument("--ls-n", type=int, default=1_000_000)
    ap.add_argument("--shard-n", type=int, default=200_000)
    ap.add_argument("--s3-n", type=int, default=2000)
    ap.add_argument("--no-strace", action="store_true", help="skip the strace peer rows")
    ap.add_argument("--data", type=Path, default=DATA, help="data folder (default %(default)s)")
    ap.add_argument("--clean", action="store_true", help="remove the data folder at the end")
    args = ap.parse_args()
    DATA = args.data
    only = set(args.only.split(","))
    with_strace = not args.no_strace and shutil.which("strace") is not None
    DATA.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        if "ls" in only:
            results.append(bench_ls(args.ls_n, args.repeat, with_strace))
        if "shard" in only:
            results.append(bench_shard(args.shard_n, args.shard_repeat, with_strace))
        if "s3" in only:
            r = bench_s3(args.s3_n, args.repeat, with_strace)
            if r is not None:
                results.append(r)
        report(results, micro() if "micro" in only else None)
    finally:
        if args.clean:
            shutil.rmtree(DATA, ignore_errors=True)


if __name__ == "__main__":
    main()
