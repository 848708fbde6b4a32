"""The read cache (manyfiles.cache) against no cache and fsspec's filecache/blockcache, same run, same data.

Parts (each prints markdown tables of medians and same-run ratios):

* ``seed``: FILES files of SIZE read by one thread each (10 x 100 MiB by default; the issue's
  shape is 10 x 500 MiB: ``--size 500M``), from S3 (versitygw behind toxiproxy, +LATENCY ms per
  response) and from sshfs (loopback, +LATENCY/2 ms each way).  Sequential first read (cold
  cache; ``--page-cache cold``: the page cache dropped before it, so the origin reads its disk),
  reread (page cache warm, then one pass with it dropped: the cache reads its disk), then random
  4 KiB reads (IOPS) on the warm caches.  Validation modes side by side: "manyfiles" asks the
  origin at every open (a HEAD), as "fsspec filecache (check)" does (``check_files=True``: its
  ``ukey``, a HEAD); "manyfiles (ttl)" does not, as fsspec's filecache by default.
* ``ml``: OBJECTS objects of 100 KiB from S3 (+LATENCY ms): epoch 1 (cold) and epoch 2 through
  the cache (same process, and a new Cache as after a restart), against reading the same
  files from local disk (versitygw's own backing files) and against no cache.
* ``hit``: the CPU cost of a cache hit above reading the same bytes from a local file.

Needs versitygw and toxiproxy-server in .cache/go/bin (or ~/go/bin) and ``pip install fsspec s3fs``
in the project's venv; sshfs comes from benchmarks/_sshfs.py (apt-get).  Data goes to
/work/bench-data/cache (deleted at the end unless --keep).

    .venv/bin/python benchmarks/cache.py --part seed --size 100M --repeat 3
    .venv/bin/python benchmarks/cache.py --part ml --objects 20000 --repeat 3
    .venv/bin/python benchmarks/cache.py --part hit
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import manyfiles as mf
from _common import drop_caches, machine_line
from manyfiles.cache import Cache
from manyfiles.s3 import ClientSettings

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(os.environ.get("CACHE_BENCH_DATA", "/work/bench-data/cache"))
KEY, SECRET = "benchkey", "benchsecret"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
FILLED: list = []       # getrusage once a cache's fills finished (its close), for the first read's CPU
CHUNK = 1 * MiB


# the name ``go install`` gives a tool, when it is not the name we call it by
_BUILT_AS = {"toxiproxy-server": "server"}


def _go_bin(name: str) -> str:
    """``name`` from .cache/go/bin or ~/go/bin (linked into .cache/go/bin under ``name`` when it was
    built under another, so that benchmarks/s3pull.py finds it there too)."""
    mine = ROOT / ".cache" / "go" / "bin"
    for d in (mine, Path.home() / "go" / "bin"):
        for built in (name, _BUILT_AS.get(name, name)):
            if (d / built).exists():
                if d != mine or built != name:
                    mine.mkdir(parents=True, exist_ok=True)
                    with contextlib.suppress(FileExistsError):
                        (mine / name).symlink_to(d / built)
                return str(d / built)
    sys.exit(f"{name} not found: GOBIN={ROOT / '.cache/go/bin'} go install (see docs/cache.md)")


# -- servers ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def s3_with_latency(latency_ms: int) -> Iterator[tuple[str, str]]:
    """versitygw on DATA/gw, toxiproxy in front adding ``latency_ms`` to every response.
    Yields (direct endpoint, endpoint with latency)."""
    import s3pull

    s3pull.DATA = DATA
    s3pull.GOBIN = Path(_go_bin("versitygw")).parent
    _go_bin("versitygw")
    s3pull.GOBIN = ROOT / ".cache" / "go" / "bin"
    gw, port = s3pull.start_versitygw()
    tox = None
    try:
        _go_bin("toxiproxy-server")
        tox = s3pull.Toxiproxy(port)
        tox.set_latency(latency_ms)
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{tox.port}"
    finally:
        if tox is not None:
            tox.stop()
        gw.terminate()
        gw.wait()


def client(endpoint: str, pool: int = 64):
    """(ClientSettings, boto3 client) for ``endpoint``."""
    os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_DEFAULT_REGION="us-east-1",
                      AWS_REQUEST_CHECKSUM_CALCULATION="when_required")
    settings = ClientSettings(endpoint_url=endpoint, region="us-east-1")
    return settings, settings.client(pool=pool)


def fsspec_fs(kind: str, storage: Path, endpoint: str | None, check: bool = False):
    """fsspec's ``filecache`` (whole files) or ``blockcache`` over s3fs (endpoint) or local files;
    ``check``: ``check_files=True`` (the origin's ``ukey`` asked at every open)."""
    import fsspec

    extra = {"check_files": True} if check else {}
    if endpoint is None:
        return fsspec.filesystem(kind, target_protocol="file", cache_storage=str(storage), **extra)
    opts = {"key": KEY, "secret": SECRET,
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
    return fsspec.filesystem(kind, target_protocol="s3", target_options=opts, cache_storage=str(storage),
                             **extra)


# -- measuring -------------------------------------------------------------------------------------

def threaded(fn: Callable[[object], int], items: list, threads: int) -> tuple[float, int]:
    """Run fn over items on ``threads`` threads; (wall seconds, sum of returns)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(fn, items))
    return time.perf_counter() - t0, total


def read_stream(f) -> int:
    n = 0
    while chunk := f.read(CHUNK):
        n += len(chunk)
    return n


def random_reads(opener: Callable[[str], object], paths: list[str], size: int, reads: int,
                 threads: int) -> float:
    """IOPS of ``reads`` random 4 KiB reads per path, one thread per path."""
    def one(path: str) -> int:
        rng = random.Random(path)
        f = opener(path)
        try:
            for _ in range(reads):
                pos = rng.randrange(0, size - 4096)
                f.seek(pos)
                if len(f.read(4096)) != 4096:
                    raise RuntimeError(f"{path}: short read at {pos}")
        finally:
            f.close()
        return reads
    secs, n = threaded(one, paths, threads)
    return n / secs


class Ranged:
    """No-cache random reads on S3: one ranged GET per read (what a reader without a cache does)."""

    def __init__(self, s3c, bucket: str, key: str) -> None:
        self.s3c, self.bucket, self.key, self.pos = s3c, bucket, key, 0

    def seek(self, pos: int) -> None:
        self.pos = pos

    def read(self, n: int) -> bytes:
        rng = f"bytes={self.pos}-{self.pos + n - 1}"
        return self.s3c.get_object(Bucket=self.bucket, Key=self.key, Range=rng)["Body"].read()

    def close(self) -> None:
        pass


def median_of(repeat: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(repeat))


def table(title: str, rows: list[tuple[str, float]], unit: str, baseline: str,
          higher_is_better: bool) -> None:
    base = dict(rows)[baseline]
    print(f"\n### {title}\n\n| method | {unit} | x {baseline} |\n|---|---:|---:|")
    for name, v in rows:
        ratio = v / base if higher_is_better else base / v
        print(f"| {name} | {v:,.1f} | {ratio:.2f} |")
    sys.stdout.flush()


# -- seed-shaped -----------------------------------------------------------------------------------

def part_seed(args) -> None:
    size, nfiles = args.size, args.files
    src = DATA / "seed-src"
    src.mkdir(parents=True, exist_ok=True)
    for i in range(nfiles):
        p = src / f"file-{i:02d}.bin"
        if not p.exists() or p.stat().st_size != size:
            with open(p, "wb") as f:
                for _ in range(size // MiB):
                    f.write(os.urandom(MiB))
    names = sorted(os.listdir(src))
    if "s3" in args.origins:
        with s3_with_latency(args.latency) as (direct, slow):
            settings, s3c = client(slow)
            _, admin = client(direct)
            with contextlib.suppress(Exception):
                admin.create_bucket(Bucket="seed-bench")
            for n in names:
                admin.upload_file(str(src / n), "seed-bench", n)
            urls = [f"s3://seed-bench/{n}" for n in names]
            seed_runs("S3 (versitygw + toxiproxy)", args, urls, size, settings, slow,
                      nocache_open=lambda u: s3c.get_object(Bucket="seed-bench", Key=_key(u))["Body"],
                      nocache_random=lambda u: Ranged(s3c, "seed-bench", _key(u)))
    if "sshfs" in args.origins:
        from _sshfs import sshfs_mount

        with sshfs_mount(src, latency_ms=args.latency / 2) as mnt:
            paths = [str(mnt / n) for n in names]
            # fsspec's blockcache over local files fails on close (LocalFileOpener.closed has no
            # setter, fsspec 2026.9.0): it is left out of the sshfs runs.
            seed_runs("sshfs (loopback)", args, paths, size, None, None,
                      nocache_open=_open_file, nocache_random=_open_file, methods=METHODS[:5])


# "manyfiles (ttl)": Cache(ttl=3600), no validation per open (HEAD) within the hour: what fsspec's
# filecache does by default (it never asks the origin again), so the reread compares like with like;
# "manyfiles" validates every open with a HEAD, as "fsspec filecache (check)" (check_files=True).
METHODS = ("no cache", "manyfiles", "manyfiles (ttl)", "fsspec filecache", "fsspec filecache (check)",
           "fsspec blockcache")


def seed_runs(origin: str, args, srcs: list[str], size: int, settings, endpoint: str | None,
              nocache_open: Callable, nocache_random: Callable, methods: tuple[str, ...] = METHODS) -> None:
    total = size * len(srcs)
    threads = len(srcs)
    methods = tuple(m for m in methods if m in args.methods.split(","))
    first: dict[str, list[float]] = {m: [] for m in methods}
    reread: dict[str, list[float]] = {m: [] for m in methods}
    dropped: dict[str, list[float]] = {m: [] for m in methods}
    first_cpu: dict[str, list[float]] = {m: [] for m in methods}
    warm: dict[str, tuple] = {}
    failed: dict[str, str] = {}
    for rep in range(args.repeat):
        for name in methods:             # interleaved; a fresh cache directory per repetition
            storage = Path(tempfile.mkdtemp(prefix="mf-cache-bench-", dir=DATA))
            open_first, between, open_again, close = _openers(name, storage, settings, endpoint,
                                                              nocache_open)
            try:
                if args.page_cache == "cold":
                    drop_caches()
                ru0 = resource.getrusage(resource.RUSAGE_SELF)
                secs, n = threaded(lambda s, o=open_first: _read_all(o, s), srcs, threads)
                assert n == total, (name, n, total)
                first[name].append(total / secs / MiB)
                FILLED.clear()
                ru1 = resource.getrusage(resource.RUSAGE_SELF)
                between()                    # not timed: e.g. a new Cache object, as a new process would
                ru1 = FILLED[0] if FILLED else ru1      # the read and its fills (done by then)
                first_cpu[name].append((ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                                       / (total / GiB))
                os.sync()                    # the first read's writes on disk: no writeback under the reread
                # a pass over a warm cache takes ~0.1 s: time several, so one stall does not decide
                secs = 0.0
                for _ in range(args.reread_passes):
                    dt, n = threaded(lambda s, o=open_again: _read_all(o, s), srcs, threads)
                    assert n == total, (name, n, total)
                    secs += dt
                reread[name].append(args.reread_passes * total / secs / MiB)
                drop_caches()                # one more pass with nothing in the page cache
                dt, n = threaded(lambda s, o=open_again: _read_all(o, s), srcs, threads)
                assert n == total, (name, n, total)
                dropped[name].append(total / dt / MiB)
            except Exception as exc:         # a peer that breaks is reported, the others go on
                failed[name] = f"{type(exc).__name__}: {exc}"
                print(f"  {origin}: {name} failed: {failed[name]}", file=sys.stderr, flush=True)
                methods = tuple(m for m in methods if m != name)
                close()
                shutil.rmtree(storage, ignore_errors=True)
                continue
            print(f"  {origin} rep {rep}: {name} first {first[name][-1]:.0f} MiB/s "
                  f"(client CPU {first_cpu[name][-1]:.2f} s/GiB), "
                  f"reread {reread[name][-1]:.0f} MiB/s, page cache dropped {dropped[name][-1]:.0f} MiB/s",
                  file=sys.stderr, flush=True)
            if rep == args.repeat - 1:
                warm[name] = (open_again, close, storage)
            else:
                close()
                shutil.rmtree(storage, ignore_errors=True)
    table(f"{origin}: first read (cold cache), {len(srcs)} x {size // MiB} MiB, {threads} threads",
          [(k, statistics.median(v)) for k, v in first.items() if v], "MiB/s", "no cache", True)
    print(f"\n### {origin}: client CPU of the first read and its fills (this process), s per GiB\n\n"
          "| method | s/GiB | per repetition |\n|---|---:|---|")
    for k, v in first_cpu.items():
        if v:
            print(f"| {k} | {statistics.median(v):.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    table(f"{origin}: reread, {len(srcs)} x {size // MiB} MiB, {threads} threads",
          [(k, statistics.median(v)) for k, v in reread.items() if v], "MiB/s", "no cache", True)
    table(f"{origin}: reread with the page cache dropped (one pass), {len(srcs)} x {size // MiB} MiB",
          [(k, statistics.median(v)) for k, v in dropped.items() if v], "MiB/s", "no cache", True)
    for name, why in failed.items():
        print(f"\n{name} failed: {why}")
    iops = {}
    for name in methods:
        opener = nocache_random if name == "no cache" else warm[name][0]
        reads = args.nocache_reads if name == "no cache" else args.reads
        iops[name] = median_of(args.repeat, lambda o=opener, r=reads: random_reads(o, srcs, size, r, threads))
        print(f"  {origin}: random 4 KiB {name}: {iops[name]:,.0f} IOPS", file=sys.stderr, flush=True)
    table(f"{origin}: random 4 KiB reads on the warm cache, {threads} threads", list(iops.items()), "IOPS",
          "no cache", True)
    for _, close, storage in warm.values():
        close()
        shutil.rmtree(storage, ignore_errors=True)


def _openers(name: str, storage: Path, settings, endpoint: str | None, nocache_open: Callable):
    """(open for the first read, step between the reads, open for the reread, close) of one method."""
    if name == "no cache":
        return nocache_open, lambda: None, nocache_open, lambda: None
    if name.startswith("manyfiles"):
        ttl = 3600 if "ttl" in name else 0
        caches = [Cache(storage / "c", settings=settings, ttl=ttl)]

        def between() -> None:
            t0 = time.perf_counter()
            caches[0].close()               # the lazy fills finish here
            fills_done = time.perf_counter() - t0
            FILLED.append(resource.getrusage(resource.RUSAGE_SELF))     # the CPU to here (not verify's)
            caches[0] = Cache(storage / "c", settings=settings, ttl=ttl)
            s = caches[0].stats()
            v = caches[0].verify()
            print(f"  {name} after the first read: {s.fills} blocks filled, {s.fills_dropped} dropped, "
                  f"{s.misses} misses; fills finished {fills_done:.2f} s after the read; "
                  f"{v.verified} objects verified whole, {v.unverifiable} unverifiable, {v.unverified} not",
                  file=sys.stderr, flush=True)

        return (lambda s: mf.open(s, cache=caches[0])), between, (lambda s: mf.open(s, cache=caches[0])), \
            (lambda: caches[0].close())
    kind = name.split()[1]
    check = "(check)" in name
    fs_path = (lambda s: s[5:]) if endpoint else (lambda s: s)
    fss = [fsspec_fs(kind, storage, endpoint, check)]

    def new_instance() -> None:
        fss[0] = fsspec_fs(kind, storage, endpoint, check)

    def open_file(s: str):
        return fss[0].open(fs_path(s), "rb")

    return open_file, new_instance, open_file, lambda: None


def _key(url: str) -> str:
    return url.split("/", 3)[3]


def _open_file(path: str):
    return open(path, "rb")


def _read_all(opener: Callable, s: str) -> int:
    f = opener(s)
    try:
        return read_stream(f)
    finally:
        f.close()


# -- ML-shaped -------------------------------------------------------------------------------------

def part_ml(args) -> None:
    n, size = args.objects, args.object_size
    with s3_with_latency(args.latency) as (direct, slow):
        settings, s3c = client(slow)
        _, admin = client(direct)
        with contextlib.suppress(Exception):
            admin.create_bucket(Bucket="ml-bench")
        keys = [f"train/{i // 1000:03d}/sample-{i:06d}.bin" for i in range(n)]
        pages = admin.get_paginator("list_objects_v2").paginate(Bucket="ml-bench")
        have = sum(len(p.get("Contents", ())) for p in pages)
        if have != n:
            body = os.urandom(size)
            threaded(lambda k: admin.put_object(Bucket="ml-bench", Key=k, Body=body) and 1, keys, 32)
        local = [str(DATA / "gw" / "ml-bench" / k) for k in keys]
        assert all(os.path.getsize(p) == size for p in local[:10])
        urls = [f"s3://ml-bench/{k}" for k in keys]
        rows: dict[str, list[float]] = {}
        notes: list[str] = []
        for rep in range(args.repeat):
            storage = Path(tempfile.mkdtemp(prefix="mf-cache-ml-", dir=DATA))
            nocache, _ = threaded(lambda k: len(s3c.get_object(Bucket="ml-bench", Key=k)["Body"].read()),
                                  keys, args.remote_threads)
            cache = Cache(storage / "c", settings=settings, ttl=3600)
            e1, got = threaded(lambda u, c=cache: len(c.get_bytes(u)), urls, args.remote_threads)
            assert got == n * size
            cache.flush()
            after1 = cache.stats()
            e2, got = threaded(lambda u, c=cache: len(c.get_bytes(u)), urls, args.local_threads)
            assert got == n * size
            cache.close()
            with Cache(storage / "c", settings=settings, ttl=3600) as restarted:
                e2r, got = threaded(lambda u: len(restarted.get_bytes(u)), urls, args.local_threads)
                assert got == n * size
                after2 = restarted.stats()
            missed = after2.misses - after1.misses
            notes.append(f"rep {rep}: epoch 1 misses {after1.misses:,}, fills dropped "
                         f"{after1.fills_dropped:,}; epoch 2 (both) misses {missed:,}, "
                         f"hit ratio of the epoch-2 reads {(after2.hits - after1.hits) / (2 * n):.1%}")
            drop_caches()
            local_cold, _ = threaded(_read_file, local, args.local_threads)
            local_warm, _ = threaded(_read_file, local, args.local_threads)
            for name, secs in (("no cache (boto3 GET)", nocache), ("epoch 1 (cold cache)", e1),
                               ("epoch 2 (same process)", e2), ("epoch 2 (after restart)", e2r),
                               ("local files, page cache cold", local_cold),
                               ("local files, page cache warm", local_warm)):
                rows.setdefault(name, []).append(secs)
            line = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in rows.items())
            print(f"  ml rep {rep}: {line}", file=sys.stderr, flush=True)
            shutil.rmtree(storage, ignore_errors=True)
    med = [(k, statistics.median(v)) for k, v in rows.items()]
    print(f"\n### ML-shaped: {n:,} objects of {size // KiB} KiB, +{args.latency} ms "
          f"({args.remote_threads} threads remote, {args.local_threads} local)\n")
    print("| read | median s | objects/s | x epoch 1 | x local (warm) |\n|---|---:|---:|---:|---:|")
    d = dict(med)
    for k, v in med:
        print(f"| {k} | {v:.2f} | {n / v:,.0f} | {d['epoch 1 (cold cache)'] / v:.2f} | "
              f"{v / d['local files, page cache warm']:.2f} |")
    print("\n" + "\n".join(f"* {line}" for line in notes))


def _read_file(p: str) -> int:
    with open(p, "rb") as f:
        return len(f.read())


# -- hit cost --------------------------------------------------------------------------------------

def part_hit(args) -> None:
    folder = DATA / "hit-src"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(args.hit_objects):
        p = folder / f"f{i:05d}"
        if not p.exists():
            p.write_bytes(os.urandom(args.hit_size))
        paths.append(str(p))
    storage = Path(tempfile.mkdtemp(prefix="mf-cache-hit-", dir=DATA))
    with Cache(storage / "c") as c:
        c.warm(paths, jobs=4)
    caches = {"validate": Cache(storage / "c"), "ttl": Cache(storage / "c", ttl=3600)}
    for c in caches.values():        # warm the memo and the page cache
        for p in paths:
            c.get_bytes(p)
    from manyfiles.cache._format import object_id, whole_relpath
    from manyfiles.cache._origin import FileOrigin

    blocks = []
    for p in paths:
        o = FileOrigin(p)
        blocks.append(str(storage / "c" / whole_relpath(object_id(o.source, o.stat().validator))))

    def local_read():
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                f.read()

    def block_read():
        for b in blocks:
            with open(b, "rb", buffering=0) as f:
                f.read()

    def get_bytes(c):
        return lambda: [c.get_bytes(p) for p in paths]

    def mf_open(c):
        def run():
            for p in paths:
                with mf.open(p, cache=c) as f:
                    f.read()
        return run

    methods = {"local file read (open/read/close)": local_read,
               "the cache's whole file read (open/read/close)": block_read,
               "get_bytes, validate on open (stat)": get_bytes(caches["validate"]),
               "get_bytes, ttl (no stat)": get_bytes(caches["ttl"]),
               "mf.open + read, validate on open": mf_open(caches["validate"]),
               "mf.open + read, ttl": mf_open(caches["ttl"])}
    cpu: dict[str, list[float]] = {k: [] for k in methods}
    for _ in range(args.repeat):
        for k, fn in methods.items():
            t0 = time.process_time()
            fn()
            cpu[k].append((time.process_time() - t0) / len(paths) * 1e6)
    base = statistics.median(cpu["local file read (open/read/close)"])
    print(f"\n### Hit cost: {len(paths):,} cached {args.hit_size // KiB} KiB files, one thread, "
          "CPU us per read\n")
    print("| read | CPU us | us above the local read |\n|---|---:|---:|")
    for k, v in cpu.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.1f} | {m - base:+.1f} |")
    for c in caches.values():
        c.close()
    shutil.rmtree(storage, ignore_errors=True)


def main() -> int:
    from manyfiles._core.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", action="append", choices=["seed", "ml", "hit"], required=True)
    p.add_argument("--files", type=int, default=10)
    p.add_argument("--size", type=parse_size, default="100M")
    p.add_argument("--origins", default="s3,sshfs")
    p.add_argument("--latency", type=int, default=20, help="ms added to every S3 response / sshfs round trip")
    p.add_argument("--reads", type=int, default=3000, help="random reads per thread on a cache")
    p.add_argument("--reread-passes", type=int, default=5, help="seed: timed passes of the reread")
    p.add_argument("--methods", default=",".join(METHODS), help="seed: the methods to run (comma-separated)")
    p.add_argument("--page-cache", choices=["warm", "cold"], default="warm",
                   help="seed: the first read with the page cache as it is (warm) or dropped before it")
    p.add_argument("--nocache-reads", type=int, default=100, help="random reads per thread without a cache")
    p.add_argument("--objects", type=int, default=20000)
    p.add_argument("--object-size", type=parse_size, default="100K")
    p.add_argument("--remote-threads", type=int, default=32)
    p.add_argument("--local-threads", type=int, default=4)
    p.add_argument("--hit-objects", type=int, default=5000)
    p.add_argument("--hit-size", type=parse_size, default="4K")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the generated data in " + str(DATA))
    args = p.parse_args()
    DATA.mkdir(parents=True, exist_ok=True)
    print(f"{machine_line()}; load average {os.getloadavg()[0]:.2f} at start", flush=True)
    try:
        for part in args.part:
            {"seed": part_seed, "ml": part_ml, "hit": part_hit}[part](args)
    finally:
        print(f"\nload average {os.getloadavg()[0]:.2f} at the end", flush=True)
        if not args.keep:
            shutil.rmtree(DATA, ignore_errors=True)
    return 0


if __name__ == "__main__":
    threading.excepthook = lambda a: print(f"thread {a.thread}: {a.exc_value!r}", file=sys.stderr)
    sys.exit(main())
