"""Training-loop reads through the cache (issue 20): mf.Dataset / mf.IterableDataset against peers.

One run, same data, same worker processes: N objects of SIZE bytes in versitygw (posix backend,
started here from ~/go/bin), read for two epochs by 4 worker processes, DataLoader-style (batches
of 32 indexes dealt round-robin to a persistent pool; the worker receives the batch's byte count,
as a training step that decodes in the worker would). Peers:

* ``mf.Dataset`` (default settings: validated by its listing) and ``mf.IterableDataset``;
* a plain boto3 loop (one ``get_object`` per item, a client per worker; the first
  ``--boto3-objects``);
* s3fs + fsspec ``filecache`` (``cat_file`` per item, a cache directory shared by the workers; the
  first ``--filecache-objects``: its cost per object grows with the files it holds);
* the same files read from local disk (``open().read()``);
* s3torchconnector: only if installed (it needs torch).

Rates are objects per second, so peers that read a subset compare per object.  Then a pyarrow
Parquet scan (``pq.read_table``) through the manyfiles fsspec filesystem against
s3fs, first read and reread.  Medians of ``--repeat`` runs (epoch 1 on an empty cache each time).

    flock /work/bench.lock .venv/bin/python benchmarks/ml.py [--objects 20000] [--size 100K] [--latency MS]

``--latency MS`` puts toxiproxy between the readers and the server, adding MS to every response, as
S3's first-byte latency does (10-30 ms from EC2); without it the server answers in well under a
millisecond and epoch 1 is bound by this machine's CPU, not by the network a cache saves.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import s3pull
from _common import machine_line

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("ML_BENCH_DATA", ROOT / "benchmarks" / "_data" / "ml"))
BUCKET = "mlbench"
BATCH = 32
PEERS = ("mf.Dataset", "mf.IterableDataset", "boto3 loop", "s3fs + filecache", "local disk")


def env() -> None:
    os.environ.update(AWS_ACCESS_KEY_ID=s3pull.KEY, AWS_SECRET_ACCESS_KEY=s3pull.SECRET,
                      AWS_DEFAULT_REGION="us-east-1", AWS_REQUEST_CHECKSUM_CALCULATION="when_required")


# -- the readers (built in each worker process) --------------------------------------------------------

class Boto3Reader:
    def __init__(self, endpoint: str, keys: list[str]) -> None:
        self.endpoint, self.keys, self.client = endpoint, keys, None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> bytes:
        if self.client is None:
            import boto3

            self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        return self.client.get_object(Bucket=BUCKET, Key=self.keys[i])["Body"].read()


class FilecacheReader:
    def __init__(self, endpoint: str, keys: list[str], storage: str) -> None:
        self.endpoint, self.keys, self.storage, self.fs = endpoint, keys, storage, None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, i: int) -> bytes:
        if self.fs is None:
            import fsspec

            self.fs = fsspec.filesystem("filecache", target_protocol="s3", cache_storage=self.storage,
                                        target_options={"client_kwargs": {"endpoint_url": self.endpoint,
                                                                          "region_name": "us-east-1"}})
        return self.fs.cat_file(f"{BUCKET}/{self.keys[i]}")


class LocalReader:
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()


def nbytes(x) -> int:
    return len(x.data) if hasattr(x, "data") else len(x)


_DS = None


def _init(ds) -> None:
    global _DS
    _DS = ds


def _batch(batch: list[int]) -> int:
    getitems = getattr(_DS, "__getitems__", None)
    items = getitems(batch) if getitems is not None else [_DS[i] for i in batch]
    return sum(nbytes(x) for x in items)


def _shard(worker: tuple[int, int]) -> int:
    return sum(nbytes(x) for x in _DS.worker(*worker))


def epochs(ds, workers: int, n: int, iterable: bool = False
           ) -> list[tuple[float, int, list[dict], tuple | None]]:
    """(seconds, bytes, counters per worker, counts) of ``n`` epochs of ``ds`` in a persistent pool of
    ``workers`` processes.  Counters per worker: ``Dataset.worker_stats()`` in that epoch, for the
    datasets that have it.  Counts, for the manyfiles datasets only (taken after the epoch, off the
    clock, once the workers' fills of that epoch are written: the next epoch is a reread): the objects
    read from the origin in that epoch (the cache's ``object_misses``) and the blocks whose fill was
    dropped (``fills_dropped``: read again from the origin in the next epoch)."""
    ctx = mp.get_context("fork")
    out = []
    gather = getattr(ds, "worker_stats", lambda: [])
    before: dict[int, dict] = {}
    counted = (0, 0)
    with ctx.Pool(workers, initializer=_init, initargs=(ds,)) as pool:
        pool.map(len, [[0]] * workers)        # the workers are up before the clock starts
        for _ in range(n):
            t0 = time.perf_counter()
            if iterable:
                got = sum(pool.map(_shard, [(w, workers) for w in range(workers)], chunksize=1))
            else:
                batches = [list(range(i, min(i + BATCH, len(ds)))) for i in range(0, len(ds), BATCH)]
                got = sum(pool.imap_unordered(_batch, batches, chunksize=1))
            secs = time.perf_counter() - t0
            now = {s["pid"]: s for s in gather()}
            delta = [{k: v - before.get(pid, {}).get(k, 0) if k != "pid" else v for k, v in s.items()}
                     for pid, s in now.items()]
            before = now
            if hasattr(ds, "cache"):
                total = settled_counts(ds)
                out.append((secs, got, delta, (total[0] - counted[0], total[1] - counted[1])))
                counted = total
            else:
                out.append((secs, got, delta, None))
    return out


def counters_line(epoch: int, stats: list[dict]) -> str:
    """One epoch's counters, summed over the workers (and the spread of their hit-path time)."""
    if not stats:
        return ""
    tot = {k: sum(s[k] for s in stats) for k in stats[0] if k != "pid"}
    per_hit = tot["hit_ns"] / max(1, tot["samples"]) / 1e3
    spread = ", ".join(f"{s['hit_ns'] / 1e9:.2f}" for s in sorted(stats, key=lambda s: s["pid"]))
    return (f"      epoch {epoch}: {tot['samples']:,} samples, {tot['hits']:,} hits ({tot['packed_hits']:,} "
            f"packed), {tot['fetched']:,} fetched; hit path {tot['hit_ns'] / 1e9:.2f} s "
            f"({per_hit:.1f} us/sample; per worker {spread}); fills queued {tot['fills_queued']:,}, "
            f"done {tot['fills_done']:,}, accounted {tot['fills']:,}, dropped {tot['fills_dropped']:,}")


def settled_counts(ds) -> tuple[int, int]:
    """The cache directory's (``object_misses``, ``fills_dropped``) once every worker's counters
    and fills reached the index: they write them about once a second while reading or filling, and
    soon after that pauses, so the counts (``fills`` too) have settled when they stay the same for 3 s."""
    cache = ds.cache
    last, since = None, time.monotonic()
    while last is None or time.monotonic() - since < 3.0:
        st = cache.stats()
        now = (st.object_misses, st.fills_dropped, st.fills)
        if now != last:
            last, since = now, time.monotonic()
        time.sleep(0.25)
    return last[0], last[1]


# -- data -------------------------------------------------------------------------------------------

def prefix(n: int, size: int) -> str:
    """The keys of one shape (a shape of its own per prefix: the local copies never mix shapes)."""
    return f"train/{n}x{size}/"


def seed(endpoint: str, n: int, size: int) -> tuple[list[str], list[str]]:
    import boto3

    keys = [f"{prefix(n, size)}{i // 1000:03d}/{i:06d}.bin" for i in range(n)]
    local = DATA / "local"
    marker = DATA / f".seeded-{n}x{size}"
    if marker.exists():
        return keys, [str(local / k) for k in keys]
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    with contextlib.suppress(Exception):     # made by an earlier run
        client.create_bucket(Bucket=BUCKET)

    def put(i: int) -> None:
        body = os.urandom(size)
        client.put_object(Bucket=BUCKET, Key=keys[i], Body=body)
        p = local / keys[i]
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body)

    with ThreadPoolExecutor(32) as pool:
        list(pool.map(put, range(n)))
    marker.touch()
    return keys, [str(local / k) for k in keys]


def seed_parquet(endpoint: str, rows: int) -> str:
    import boto3
    import pyarrow as pa
    import pyarrow.parquet as pq

    key = f"tables/events-{rows}.parquet"
    path = DATA / "events.parquet"
    if not path.exists():
        rng = __import__("random").Random(1)
        table = pa.table({"id": list(range(rows)), "x": [rng.random() for _ in range(rows)],
                          "label": [f"class-{rng.randrange(100)}" for _ in range(rows)]})
        pq.write_table(table, path, row_group_size=rows // 8)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").upload_file(str(path), BUCKET, key)
    return key


# -- the run ----------------------------------------------------------------------------------------

PEERS = ("mf.Dataset", "mf.IterableDataset", "boto3 loop", "s3fs + filecache", "local disk")


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=20_000)
    ap.add_argument("--size", default="100K")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rows", type=int, default=4_000_000, help="rows of the Parquet table")
    ap.add_argument("--filecache-objects", type=int, default=1_000,
                    help="objects s3fs+filecache reads (its cost per object grows with the files it holds)")
    ap.add_argument("--boto3-objects", type=int, default=4_000, help="objects the boto3 loop reads")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated subset of: {', '.join(PEERS)} (local disk is always run)")
    ap.add_argument("--no-parquet", action="store_true", help="skip the Parquet scan")
    ap.add_argument("--latency", type=int, default=0, metavar="MS",
                    help="toxiproxy in front of the server adds MS to every response (S3's first-byte "
                         "latency; the readers go through it, the seeding does not)")
    args = ap.parse_args()
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        ap.error(f"--peers: no such reader: {', '.join(sorted(unknown))} (known: {', '.join(PEERS)})")
    from manyfiles._core.units import parse_size

    size = parse_size(args.size)
    with serving(args.latency) as (seeding, endpoint):
        run(args, size, seeding, endpoint)


@contextlib.contextmanager
def serving(latency: int):
    """The S3 server (versitygw), with toxiproxy in front adding ``latency`` ms when asked: yields
    (the endpoint seeding writes to, the endpoint the readers read from); stopped on the way out."""
    env()
    s3pull.DATA = DATA
    DATA.mkdir(parents=True, exist_ok=True)
    gw, port = s3pull.start_versitygw()
    tox = None
    try:
        seeding = endpoint = f"http://127.0.0.1:{port}"
        if latency:
            tox = s3pull.Toxiproxy(port)
            tox.set_latency(latency)
            endpoint = f"http://127.0.0.1:{tox.port}"
        yield seeding, endpoint
    finally:
        if tox is not None:
            tox.stop()
        gw.terminate()
        gw.wait()


def run(args, size: int, seeding: str, endpoint: str) -> None:
    import manyfiles as mf
    from manyfiles.s3 import ClientSettings

    t0 = time.perf_counter()
    keys, paths = seed(seeding, args.objects, size)
    print(f"seeded {len(keys):,} x {size:,} B in {time.perf_counter() - t0:.1f} s")
    settings = ClientSettings(endpoint_url=endpoint, region="us-east-1")
    scratch = DATA / "scratch"
    train = prefix(args.objects, size)
    results: dict[str, dict[str, list[float]]] = {}

    def fresh(name: str) -> str:
        d = scratch / name
        if (d / "cache").exists():
            shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True, exist_ok=True)
        return str(d / "cache")

    # the datasets' caches: a directory per repetition (the process keeps one Cache per directory
    # open: one removed under it would count, and read, through a deleted index)
    rep = 0
    peers = {
        "mf.Dataset": lambda: mf.Dataset(f"s3://{BUCKET}/{train}", cache=fresh(f"mf-{rep}"),
                                         settings=settings),
        "mf.IterableDataset": lambda: mf.IterableDataset(f"s3://{BUCKET}/{train}", cache=fresh(f"mfi-{rep}"),
                                                         settings=settings),
        "boto3 loop": lambda: Boto3Reader(endpoint, keys[:args.boto3_objects]),
        "s3fs + filecache": lambda: FilecacheReader(endpoint, keys[:args.filecache_objects],
                                                    fresh("filecache")),
        "local disk": lambda: LocalReader(paths),
    }
    peers = {name: make for name, make in peers.items() if name in args.peers or name == "local disk"}
    try:
        import s3torchconnector  # noqa: F401
        print("s3torchconnector is installed but not wired in this run")
    except ImportError:
        print("s3torchconnector: not installed (it needs torch; not in this environment)")
    for rep in range(args.repeat):
        for name, make in peers.items():
            for d in (f"mf-{rep - 1}", f"mfi-{rep - 1}", "filecache"):  # not timed: the last run's caches
                shutil.rmtree(scratch / d, ignore_errors=True)
            t1 = time.perf_counter()
            ds = make()
            listing = time.perf_counter() - t1
            runs = epochs(ds, args.workers, 2, iterable=name == "mf.IterableDataset")
            n = len(ds) if hasattr(ds, "__len__") else len(keys)
            for (_secs, got, _stats, _reads) in runs:
                assert got == n * size, (name, got)
            r = results.setdefault(name, {"e1": [], "e2": [], "list": [], "reads2": [], "n": n})
            r["e1"].append(n / runs[0][0])
            r["e2"].append(n / runs[1][0])
            r["list"].append(listing)
            r["reads2"].append(None if runs[1][3] is None else runs[1][3][0])
            reads = "" if runs[1][3] is None else (
                f", origin reads {runs[0][3][0]:,} then {runs[1][3][0]:,}, fills dropped "
                f"{runs[0][3][1]:,} then {runs[1][3][1]:,}")
            print(f"  rep {rep + 1} {name:20s} {n:,} objects: epoch 1 {runs[0][0]:7.2f} s  epoch 2 "
                  f"{runs[1][0]:7.2f} s  (construct {listing:.2f} s{reads})", flush=True)
            for e, (_secs, _got, stats, _reads) in enumerate(runs, 1):
                if stats:
                    print(counters_line(e, stats), flush=True)
    print()
    print(f"## {args.objects:,} x {args.size} objects, {args.workers} worker processes, +{args.latency} ms "
          f"per response, medians of {args.repeat}; load {os.getloadavg()[0]:.2f}; {machine_line()}")
    print()
    fc = median(results["s3fs + filecache"]["e1"]) if "s3fs + filecache" in results else None
    local = median(results["local disk"]["e2"])
    # (on a shared machine the load changes between repetitions: a ratio within one repetition, where
    # the readers ran one after the other, is steadier than a ratio of medians taken across them)
    local_e2 = results["local disk"]["e2"]

    def ratio(a: float, b: float | None) -> str:
        return "-" if b is None else f"{a / b:.2f}x"

    print("| reader | objects | construct s | epoch 1 obj/s | epoch 2 obj/s | epoch 2 / epoch 1 "
          "| epoch 1 vs s3fs+filecache | epoch 2 vs local disk | same, median of the repetitions' ratios "
          "| epoch 2 origin reads |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in results.items():
        e1, e2 = median(r["e1"]), median(r["e2"])
        per_rep = median([a / b for a, b in zip(r["e2"], local_e2, strict=True)])
        reads = "-" if r["reads2"][0] is None else " / ".join(f"{x:,}" for x in r["reads2"])
        print(f"| {name} | {r['n']:,} | {median(r['list']):.2f} | {e1:,.0f} | {e2:,.0f} | {e2 / e1:.1f}x "
              f"| {ratio(e1, fc)} | {ratio(e2, local)} | {per_rep:.2f}x | {reads} |")
    if "mf.Dataset" in results and "mf.IterableDataset" in results:
        it, ds = results["mf.IterableDataset"]["e2"], results["mf.Dataset"]["e2"]
        ratio_it = median([a / b for a, b in zip(it, ds, strict=True)])
        print(f"\nepoch 2, mf.IterableDataset / mf.Dataset, median of the repetitions' ratios: "
              f"{ratio_it:.2f}x")
    if not args.no_parquet:
        parquet(args, seeding, endpoint, settings)


def parquet(args, seeding: str, endpoint: str, settings) -> None:
    import fsspec
    import pyarrow.parquet as pq

    key = seed_parquet(seeding, args.rows)
    url = f"s3://{BUCKET}/{key}"
    s3 = fsspec.filesystem("s3", skip_instance_cache=True,
                           client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    times: dict[str, list[float]] = {"s3fs": [], "manyfiles first read": [], "manyfiles reread": []}
    reread_reads: list[int] = []        # blocks the reread read from the origin (the cache's misses)
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        a = pq.read_table(f"{BUCKET}/{key}", filesystem=s3)
        times["s3fs"].append(time.perf_counter() - t0)
        # a directory per repetition: the process keeps one Cache per directory open, and one
        # removed under it would read through without caching
        d = DATA / "scratch" / f"pq-{rep}"
        shutil.rmtree(d, ignore_errors=True)
        fs = fsspec.filesystem("manyfiles", cache=str(d / "cache"), settings=settings,
                               skip_instance_cache=True)
        t0 = time.perf_counter()
        b = pq.read_table(url, filesystem=fs)
        times["manyfiles first read"].append(time.perf_counter() - t0)
        before = fs.cache.stats()
        t0 = time.perf_counter()
        c = pq.read_table(url, filesystem=fs)
        times["manyfiles reread"].append(time.perf_counter() - t0)
        after = fs.cache.stats()
        reread_reads.append(after.misses - before.misses)
        assert a.equals(b) and b.equals(c)
    size = (DATA / "events.parquet").stat().st_size
    print()
    print(f"## pyarrow Parquet scan, {args.rows:,} rows ({size / 1e6:.0f} MB), medians of {args.repeat}; "
          f"load {os.getloadavg()[0]:.2f}")
    print()
    print("| read | seconds | vs s3fs | origin reads (blocks) |")
    print("|---|---:|---:|---:|")
    base = median(times["s3fs"])
    for name, xs in times.items():
        reads = " / ".join(f"{x:,}" for x in reread_reads) if name == "manyfiles reread" else "-"
        print(f"| {name} | {median(xs):.3f} | {base / median(xs):.2f}x | {reads} |")


if __name__ == "__main__":
    main()
