"""The client's CPU per object of `mf.Dataset`'s epoch 1, in ONE process (issue 27/33).

`benchmarks/ml.py`'s worker processes share 2 cores with the S3 server and the other readers, so
its epoch-1 seconds move with the machine's load.  This reads N objects of SIZE bytes (seeded and
served as ml.py does: versitygw, toxiproxy for ``--latency``) in batches of 32 through
``Dataset.__getitems__`` in this process alone, and prints the CPU time of the process (every
thread: the fetch, the fills) per object, epoch 1 (an empty cache each repetition) and epoch 2.
Run it once per library with ``PYTHONPATH`` to compare trees:

    flock /work/bench.lock env PYTHONPATH=src .venv/bin/python benchmarks/ml_cpu.py 8000 32K --repeat 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ml


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("objects", type=int)
    ap.add_argument("size")
    ap.add_argument("--latency", type=int, default=0, metavar="MS")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from manyfiles._core.units import parse_size

    size = parse_size(args.size)
    with ml.serving(args.latency) as (seeding, endpoint):
        ml.seed(seeding, args.objects, size)
        run(args.objects, size, endpoint, args.repeat)


def run(n: int, size: int, endpoint: str, repeat: int) -> None:
    import manyfiles as mf
    from manyfiles.s3 import ClientSettings

    print(f"library: {os.path.dirname(mf.__file__)}")
    settings = ClientSettings(endpoint_url=endpoint, region="us-east-1")
    batches = [list(range(i, min(i + ml.BATCH, n))) for i in range(0, n, ml.BATCH)]
    e1, e2 = [], []
    for rep in range(repeat):
        # a directory per repetition, removed only at the end (the process keeps each Cache open)
        d = ml.DATA / "scratch" / f"cpu-{os.getpid()}-{rep}"
        shutil.rmtree(d, ignore_errors=True)
        ds = mf.Dataset(f"s3://{ml.BUCKET}/{ml.prefix(n, size)}", cache=str(d / "cache"), settings=settings)
        per_epoch = []
        for _epoch in (1, 2):
            c0, t0 = time.process_time(), time.perf_counter()
            got = sum(len(s.data) for b in batches for s in ds.__getitems__(b))
            per_epoch.append(((time.process_time() - c0) / n * 1e6, time.perf_counter() - t0))
            assert got == n * size
            ds.cache.flush()        # (off the clock: epoch 2 reads what epoch 1 wrote)
        e1.append(per_epoch[0][0])
        e2.append(per_epoch[1][0])
        print(f"  rep {rep + 1}: epoch 1 {per_epoch[0][0]:.0f} us CPU/object ({per_epoch[0][1]:.2f} s), "
              f"epoch 2 {per_epoch[1][0]:.1f} us ({per_epoch[1][1]:.2f} s); load {os.getloadavg()[0]:.2f}",
              flush=True)
    print(f"median: epoch 1 {statistics.median(e1):.0f} us CPU/object, epoch 2 {statistics.median(e2):.1f}")
    for rep in range(repeat):
        shutil.rmtree(ml.DATA / "scratch" / f"cpu-{os.getpid()}-{rep}", ignore_errors=True)


if __name__ == "__main__":
    main()
