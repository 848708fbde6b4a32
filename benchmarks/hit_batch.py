"""A batch of packed records in one call (issue 27): the CPU a dataset's epoch 2 spends per sample.

One process, no worker pool: N objects of SIZE in versitygw (the data of benchmarks/ml.py), read once
through ``mf.Dataset`` (fetched, packed), then read again in batches of 32, sequential (the batches
``DataLoader`` makes without ``shuffle``) and shuffled, by:

* ``__getitems__, C``: the batch read (the C core's ``pread_records``: one ``preadv`` per run of
  records lying at most ``--gap`` bytes apart in a pack, straight into the samples' bytes);
* ``__getitems__, Python``: the same batch path with the Python fallback of ``pread_records`` (one
  ``pread`` per record), as where the C core is not built;
* ``ds[i] one by one``: ``__getitem__`` per sample (the per-sample hit path the batch replaced);
* ``local files``: the same objects as separate local files, ``open().read()`` each (the peer).

CPU seconds of the process per sample (``time.process_time``, steadier than wall time on a shared
machine), medians of ``--repeat`` passes.

    flock /work/bench.lock .venv/bin/python benchmarks/hit_batch.py [--objects 20000] [--size 4K]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ml
import s3pull
from _common import machine_line

BATCH = 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=20_000)
    ap.add_argument("--size", default="4K")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gap", type=int, action="append", help="MAX_GAP values to time the C reads at "
                    "(default: the library's)")
    args = ap.parse_args()
    import manyfiles as mf
    from manyfiles._core.units import parse_size
    from manyfiles.cache import _hits
    from manyfiles.s3 import ClientSettings

    size, n = parse_size(args.size), args.objects
    ml.env()
    s3pull.DATA = ml.DATA
    gw, port = s3pull.start_versitygw()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        _keys, paths = ml.seed(endpoint, n, size)
        scratch = ml.DATA / "scratch" / "hit-batch"
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
        ds = mf.Dataset(f"s3://{ml.BUCKET}/{ml.prefix(n, size)}", cache=str(scratch / "cache"),
                        settings=ClientSettings(endpoint_url=endpoint, region="us-east-1"))
        sequential = [list(range(i, min(i + BATCH, n))) for i in range(0, n, BATCH)]
        order = list(range(n))
        random.Random(1).shuffle(order)
        shuffled = [order[i:i + BATCH] for i in range(0, n, BATCH)]
        for b in sequential:                    # epoch 1: fetched, packed behind
            ds.__getitems__(b)
        ml.settled_counts(ds)
        local = ml.LocalReader(paths)
        truth = [bytes(s.data) for b in sequential for s in ds.__getitems__(b)]
        assert truth == [local[i] for i in range(n)], "the cache reads what the local files hold"

        def with_reads(fn, gap=None):
            def run(batch):
                _hits.pread_records, _hits.MAX_GAP = fn, gap if gap is not None else default_gap
                try:
                    return ds.__getitems__(batch)
                finally:
                    _hits.pread_records, _hits.MAX_GAP = best, default_gap
            return run

        best, default_gap = _hits.pread_records, _hits.MAX_GAP
        readers = {}
        if _hits.pread_records_c is not None:
            for gap in args.gap or [default_gap]:
                readers[f"__getitems__, C (gap {gap:,} B)"] = with_reads(_hits.pread_records_c, gap)
        readers["__getitems__, Python"] = with_reads(_hits.pread_records_python)
        readers["ds[i] one by one"] = lambda b: [ds[i] for i in b]
        readers["local files"] = lambda b: [local[i] for i in b]
        cpu: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeat):
            for name, read in readers.items():
                for shape, batches in (("sequential", sequential), ("shuffled", shuffled)):
                    c0 = time.process_time()
                    for b in batches:
                        read(b)
                    cpu.setdefault((name, shape), []).append((time.process_time() - c0) / n * 1e6)
        stats = ds.worker_stats()[0]
        assert stats["fetched"] == n, "epoch 2 fetched nothing"
    finally:
        gw.terminate()
        gw.wait()
    print(f"## {n:,} x {args.size}, batches of {BATCH}, CPU us per sample, medians of {args.repeat}; "
          f"load {os.getloadavg()[0]:.2f}; {machine_line()}")
    print()
    print("| reader | sequential batches | shuffled batches | local files / this, sequential | shuffled |")
    print("|---|---:|---:|---:|---:|")
    med = {k: statistics.median(v) for k, v in cpu.items()}
    for name in readers:
        s, r = med[(name, "sequential")], med[(name, "shuffled")]
        print(f"| {name} | {s:.2f} | {r:.2f} | {med[('local files', 'sequential')] / s:.1f}x "
              f"| {med[('local files', 'shuffled')] / r:.1f}x |")


if __name__ == "__main__":
    main()
