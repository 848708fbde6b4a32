"""Scale-out benchmark: the same job run locally (the tool's normal call) and on Dask.

    python benchmarks/scale.py                       # tree count + s3pull, 5 rounds
    python benchmarks/scale.py --jobs tree --files 400000 --repeat 7
    flock /work/team/bench.lock .venv/bin/python benchmarks/scale.py

Methods, on the same data in the same run, rounds interleaved (A B C A B C ...) so that the
machine's load drifts alike for all of them; the table gives medians and ratios to ``local``:

* ``local``          the tool's normal library call (no Dask imported for it)
* ``in-process``     the same job split into shards, run one after another in this process:
                     the cost of sharding alone
* ``dask local:1``   shards on a LocalCluster of 1 worker process (started once, before the
                     rounds: start-up is reported on its own line)
* ``dask local:2``   the same with 2 worker processes

Jobs:

* ``overhead``  empty shards: what one shard costs each executor (no local peer; ms per shard).

* ``tree``   count every entry of a two-level hashed tree (``fastls -r --count``); local =
             ``listing.count_tree`` (the C walker, 16 threads); on Dask the first shard lists the
             top levels and the subtrees are counted by the same walker on the workers.
* ``shard``  ``shard apply`` of a flat folder on tmpfs (reverted, untimed, after each run); local
             = ``shard.apply(root)``; on Dask one shard per top bucket.
* ``s3``     s3pull of N small objects from a local S3 server (versitygw if ~/go/bin has it,
             else moto); local = ``s3.pull``; the Dask path lists in key ranges and downloads
             slices (see manyfiles.s3._cluster.pull_on_cluster).
* ``remove`` fastrm of a two-level hashed tree (recreated, untimed, after each run); local =
             ``remove_tree(root)``; ``count`` = the C walker counting the tree, which each cluster
             shard attempt does before it removes (so that a re-run counts a lost worker's work).

The goal (issue 13): the Dask path at 1 worker within 10 % of local.  This machine has 2
cores shared by the client, the workers (and the S3 server), so ``local:2`` shows the
overhead of more processes, not a speed-up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HERE, machine_line, make_flat, make_hashed_tree
from manyfiles import listing
from manyfiles.listing import _cluster as listing_cluster
from manyfiles.scale._dask import DaskExecutor
from manyfiles.scale.executor import InProcessExecutor, NoopJob

DATA = Path("/work/bench-data/scale")
SHM = Path("/dev/shm/mf-bench-scale")


def timed_rounds(methods: dict[str, Callable[[], object]], repeat: int,
                 check: Callable[[str, object], None]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {m: [] for m in methods}
    for _ in range(repeat):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            result = fn()
            times[name].append(time.perf_counter() - t0)
            check(name, result)
    return times


def table(title: str, times: dict[str, list[float]], n: int, unit: str) -> None:
    base = statistics.median(times["local"])
    print(f"\n### {title}\n")
    print(f"| method | median s | min s | {unit}/s | x local |")
    print("|---|---:|---:|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {min(ts):.3f} | {n / med:,.0f} | {med / base:.3f} |")
    ratios = [a / b for a, b in zip(times["dask local:1"], times["local"], strict=True)]
    print(f"\nper-round ratio dask local:1 / local: {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}")
    sys.stdout.flush()


def clusters() -> dict[str, object]:
    out = {}
    for n in (1, 2):
        t0 = time.perf_counter()
        executor = DaskExecutor.open(f"local:{n}")      # what --cluster local:N starts
        lc, client = executor.local_cluster, executor.client
        print(f"LocalCluster({n} workers) start-up: {time.perf_counter() - t0:.2f} s")
        out[f"dask local:{n}"] = (lc, client)
    return out


def bench_tree(files: int, repeat: int, running: dict) -> None:
    root = make_hashed_tree(DATA / f"tree-{files}", files, levels=2, width=2)
    want = sum(len(d) + len(f) for _, d, f in os.walk(root)) - 1    # the .complete marker too
    want += 1

    def local() -> int:
        return listing.count_tree(str(root)).entries      # what `fastls -r --count` runs

    methods: dict[str, Callable[[], object]] = {
        "local": local,
        "in-process": lambda: listing_cluster.count_tree(root, cluster=InProcessExecutor()).entries,
    }
    for name, (_, client) in running.items():
        methods[name] = lambda c=client: listing_cluster.count_tree(root, cluster=c).entries

    def check(name: str, result: object) -> None:
        assert result == want, (name, result, want)

    times = timed_rounds(methods, repeat, check)
    table(f"tree count, {files:,} files in a two-level hashed tree (65,536 dirs), warm, {repeat} rounds",
          times, want, "entries")


def bench_shard(files: int, repeat: int, running: dict) -> None:
    from manyfiles import shard

    root = make_flat(SHM / f"flat-{files}", files)
    want = len(os.listdir(root))        # the files and make_flat's marker

    def flatten() -> None:
        shard.revert(root)

    methods: dict[str, Callable[[], object]] = {"local": lambda: shard.apply(root).moved}
    for name, (_, client) in running.items():
        methods[name] = lambda c=client: shard.apply(root, cluster=c).moved

    def check(name: str, result: object) -> None:
        assert result == want, (name, result)
        flatten()

    times = timed_rounds(methods, repeat, check)
    table(f"shard apply, {files:,} files, tmpfs, levels 2:2 (256 top buckets, 4 shards per worker), "
          f"{repeat} rounds", times, files, "files")


def bench_remove(files: int, repeat: int, running: dict) -> None:
    """fastrm of a two-level hashed tree (recreated, untimed, after each run); ``count`` is what a
    cluster shard attempt adds before removing: the C walker counting its subtrees (its note, so
    that a re-run after a lost worker counts what that attempt removed)."""
    import manyfiles as mf

    root = DATA / f"rm-{files}"
    make_hashed_tree(root, files, levels=2, width=2)
    want = files + 1                    # the files and make_hashed_tree's marker

    methods: dict[str, Callable[[], object]] = {
        "local": lambda: mf.remove_tree(root).files,
        "count": lambda: _files(listing.count_tree(str(root))),
    }
    for name, (_, client) in running.items():
        methods[name] = lambda c=client: mf.remove_tree(root, cluster=c).files

    def check(name: str, result: object) -> None:
        assert result == want, (name, result, want)
        shutil.rmtree(root, ignore_errors=True)
        make_hashed_tree(root, files, levels=2, width=2)

    times = timed_rounds(methods, repeat, check)
    table(f"fastrm, {files:,} files in a two-level hashed tree (65,536 dirs), ext4, {repeat} rounds",
          times, want, "files")


def _files(tally: listing.TreeCount) -> int:
    return tally.entries - (tally.directories - 1)       # entries below the root but its directories


def bench_overhead(shards: int, repeat: int, running: dict) -> None:
    methods: dict[str, Callable[[], object]] = {
        "in-process": lambda: InProcessExecutor().run(NoopJob(), shards=range(shards)).items,
    }
    for name, (_, client) in running.items():
        executor = DaskExecutor(client)
        methods[name] = lambda e=executor: e.run(NoopJob(), shards=range(shards)).items

    def check(name: str, result: object) -> None:
        assert result == shards, (name, result)

    times = timed_rounds(methods, repeat, check)
    print(f"\n### executor overhead: {shards:,} empty shards, {repeat} rounds\n")
    print("| executor | median s | ms per shard |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.3f} | {med / shards * 1e3:.2f} |")
    sys.stdout.flush()


S3_KEY, S3_SECRET = "scalebenchkey", "scalebenchsecret"


def s3_server() -> tuple[subprocess.Popen, str]:
    """versitygw (posix backend) on a free port, as in benchmarks/s3pull.py; credentials in os.environ
    so that the worker processes started afterwards sign with them too."""
    exe = next((p for p in (HERE.parent / ".cache/go/bin/versitygw", Path.home() / "go/bin/versitygw")
                if p.exists()), None)
    if exe is None:
        sys.exit("versitygw missing: go install github.com/versity/versitygw/cmd/versitygw@latest")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (DATA / "gw").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROOT_ACCESS_KEY": S3_KEY, "ROOT_SECRET_KEY": S3_SECRET}
    proc = subprocess.Popen([str(exe), "--port", f"127.0.0.1:{port}", "--keep-alive", "--quiet", "posix",
                             str(DATA / "gw")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update({"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def bench_s3(objects: int, repeat: int, running: dict, endpoint: str) -> None:
    import boto3

    from manyfiles import s3

    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=S3_KEY,
                     aws_secret_access_key=S3_SECRET)
    bucket = "scale-bench"
    with contextlib.suppress(c.exceptions.ClientError):     # kept from an earlier run (--keep)
        c.create_bucket(Bucket=bucket)
    have = sum(p.get("KeyCount", 0) for p in c.get_paginator("list_objects_v2").paginate(Bucket=bucket))
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda i: c.put_object(Bucket=bucket, Key=f"d/{i * 7919 % 65536:04x}/{i:07d}",
                                             Body=os.urandom(4096)), range(have, objects)))
    settings = s3.ClientSettings(endpoint_url=endpoint, region="us-east-1")
    dest = DATA / "dest"
    source = f"s3://{bucket}/d/"
    methods: dict[str, Callable[[], object]] = {
        "local": lambda: s3.pull(source, str(dest), settings=settings).done,
    }
    for name, (_, client) in running.items():
        methods[name] = lambda c=client: s3.pull(source, str(dest), settings=settings, cluster=c).done

    def check(name: str, result: object) -> None:
        assert result == objects, (name, result)
        shutil.rmtree(dest)

    times = timed_rounds(methods, repeat, check)
    table(f"s3pull, {objects:,} x 4 KiB from versitygw on the same 2 vCPUs, {repeat} rounds", times, objects,
          "objects")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="overhead,tree,shard,s3,remove", help="comma-separated subset of those")
    ap.add_argument("--objects", type=int, default=5_000, help="objects in the S3 bucket")
    ap.add_argument("--noop-shards", type=int, default=2000, help="shards of the overhead job")
    ap.add_argument("--shard-files", type=int, default=100_000, help="files in the flat folder")
    ap.add_argument("--files", type=int, default=1_000_000, help="files in the tree")
    ap.add_argument("--remove-files", type=int, default=200_000, help="files in the tree fastrm removes")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    args = ap.parse_args()
    print(machine_line(), "| load average", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    jobs = args.jobs.split(",")
    server = s3_server() if "s3" in jobs else None      # before the workers: they inherit the keys
    running = clusters()
    try:
        if server is not None:
            bench_s3(args.objects, args.repeat, running, server[1])
        if "overhead" in jobs:
            bench_overhead(args.noop_shards, args.repeat, running)
        if "tree" in jobs:
            bench_tree(args.files, args.repeat, running)
        if "shard" in jobs:
            bench_shard(args.shard_files, args.repeat, running)
        if "remove" in jobs:
            bench_remove(args.remove_files, args.repeat, running)
    finally:
        for lc, client in running.values():
            client.close()
            lc.close()
        if server is not None:
            server[0].terminate()
            server[0].wait()
        if not args.keep:
            shutil.rmtree(DATA, ignore_errors=True)
        shutil.rmtree(SHM, ignore_errors=True)
    print("\nload average at the end", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
