"""``make demo``: run every tool on an embedded default and show what it does.

Generates a demo folder (``demo/`` by default, 50,000 empty files: the tools work on
names, so the files need no data), lists it with fastls next to ``os.listdir``, and
then runs the other tools on it.  Each step prints the command it runs, so the demo
doubles as a tour of the CLI.  It ends by saying how much it left on disk (about
60 MB, mostly the S3 pull); ``make clean`` or ``rm -rf demo`` removes it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from manyfiles.s3.localserver import LocalS3

BIN = Path(sys.executable).parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m manyfiles.demo", description=__doc__)
    parser.add_argument("--dir", default="demo", help="where to generate the demo data (default: ./demo)")
    parser.add_argument("--files", type=int, default=50_000,
                        help="files in the demo folder (default 50,000; try 1000000 for a real listing)")
    args = parser.parse_args(argv)
    root = Path(args.dir).resolve()
    steps: list[Callable[[Path, int], None]] = [
        step_generate, step_fastls, step_shard, step_fastrm, step_s3, step_trace,
    ]
    for step in steps:
        step(root, args.files)
    print("\ndemo finished: every step above ran for real on", root)
    print(f"it leaves {footprint(root) / 1e6:.0f} MB on disk there; `make clean` (or rm -rf) removes it")
    return 0


def footprint(root: Path) -> int:
    """Bytes of disk used under ``root`` (allocated blocks, like ``du``)."""
    import manyfiles as mf

    total = root.stat().st_blocks * 512
    for d in mf.walk(str(root), stat=True):
        total += sum(st.st_blocks * 512 for st in d.stats or () if st is not None)
    return total


def banner(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


def run(*cmd: str | os.PathLike, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run one of our console scripts (or any command), echoing it like a shell would."""
    argv = [str(BIN / c) if i == 0 and (BIN / str(c)).exists() else str(c) for i, c in enumerate(cmd)]
    print("$", shlex.join([os.path.basename(argv[0]), *argv[1:]]), flush=True)
    proc = subprocess.run(argv, stdout=subprocess.PIPE if quiet else None, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: step failed with exit {proc.returncode}: {shlex.join(argv)}")
    return proc


def timed(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def flat_dir(root: Path) -> Path:
    return root / "flat"


def step_generate(root: Path, files: int) -> None:
    banner(f"generating {files:,} files in {flat_dir(root)}")
    flat = flat_dir(root)
    marker = root / f".generated-{files}"
    if marker.exists():
        print("(already there)")
        return
    if root.exists():
        shutil.rmtree(root)
    flat.mkdir(parents=True)
    fd = os.open(flat, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(files):
            # empty: a byte of data would cost a 4 KiB block per file (800 MB for 200k files)
            os.close(os.open(f"sample-{i:07d}.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    marker.touch()


def step_fastls(root: Path, files: int) -> None:
    import manyfiles as mf

    flat = str(flat_dir(root))
    banner("fastls: listing with getdents64 and a 1 MiB buffer")
    run("fastls", "--count", flat)
    run("fastls", "--sort", "--include", "sample-000000*", flat)
    t_mf = timed(lambda: mf.listdir(flat))
    t_os = timed(lambda: os.listdir(flat))
    t_count = timed(lambda: mf.count(flat))
    print(f"manyfiles.listdir {t_mf * 1e3:.0f} ms, os.listdir {t_os * 1e3:.0f} ms "
          f"(x{t_os / t_mf:.2f}), manyfiles.count {t_count * 1e3:.0f} ms; local disks gain little, "
          "network mounts gain 20x+ (docs/benchmarks.md)")



def step_shard(root: Path, files: int) -> None:
    flat = str(flat_dir(root))
    banner("shard: flat folder -> hashed prefix tree (ab/cd/<name>), in place, and back")
    run("shard", "apply", "-n", flat)
    run("shard", "apply", flat)
    run("shard", "verify", flat)
    run("shard", "status", flat)
    run("fastls", "-r", "--max-depth", "0", "--count", flat)
    run("fastls", "-r", "--type", "f", "--count", flat)
    run("shard", "revert", flat)
    run("fastls", "--count", flat)


def step_fastrm(root: Path, files: int) -> None:
    trash = root / "trash"
    banner("fastrm: parallel deletion, one worker per directory")
    n = min(files, 50_000)
    trash.mkdir(exist_ok=True)
    for i in range(n):
        (trash / f"t{i:06d}").touch()
    run("shard", "apply", str(trash))
    run("fastls", "-r", "--count", str(trash))
    run("fastrm", "--verbose", str(trash))
    print("exists afterwards:", trash.exists())


def step_s3(root: Path, files: int) -> None:
    """One in-process S3 server (moto) for the two S3 steps: s3pull, then training reads."""
    from manyfiles.s3.localserver import local_s3

    with local_s3() as srv:
        os.environ.update(srv.env)
        s3pull_from(srv, root)
        ml_from(srv, root)


def s3pull_from(srv: LocalS3, root: Path) -> None:
    dest = root / "s3"
    banner("s3pull: an in-process S3 server (moto), seeded, then pulled")
    url = f"s3://{srv.bucket}/"
    print(f"(server {srv.endpoint_url}: {srv.objects} objects, {srv.bytes / 1e6:.1f} MB)")
    run("s3pull", url, str(dest), "--dry-run", quiet=True)
    run("s3pull", url, str(dest))
    print("a second run skips what is already there:")
    run("s3pull", url, str(dest))
    run("fastls", "-r", "--count", str(dest))


def ml_from(srv: LocalS3, root: Path) -> None:
    """Training reads through the cache: a Dataset for two epochs, then pandas through fsspec."""
    import importlib.util

    banner("ML: mf.Dataset over the demo bucket, two epochs through the cache; pandas through fsspec")
    missing = [m for m in ("fsspec", "pandas") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"(skipped: needs {', '.join(missing)}: pip install \"manyfiles[fsspec,notebooks]\")")
        return
    cache = root / "ml-cache"
    shutil.rmtree(cache, ignore_errors=True)
    # in a process of its own (its caches are closed, their files final, when it ends), reading from
    # this process's server: the server's threads and the reader do not share one GIL
    code = (f"from manyfiles.demo import ml_reads; "
            f"ml_reads({str(cache)!r}, {srv.endpoint_url!r}, {srv.bucket!r})")
    proc = subprocess.run([sys.executable, "-c", code], check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: the ML step failed with exit {proc.returncode}")


def ml_reads(cache: str, endpoint_url: str, bucket: str) -> None:
    """The ML step's reads (a process of its own, see :func:`ml_from`)."""
    import manyfiles as mf
    from manyfiles.s3.client import ClientSettings

    settings = ClientSettings(endpoint_url=endpoint_url, region="us-east-1")
    ds = mf.Dataset(f"s3://{bucket}/small/", cache=cache, settings=settings)
    print(f">>> ds = mf.Dataset('s3://{bucket}/small/', cache='{cache}')   # {len(ds):,} objects")
    seconds = []
    for epoch in (1, 2):
        t0 = time.perf_counter()
        total = sum(len(sample.data) for sample in ds)
        seconds.append(time.perf_counter() - t0)
        print(f"epoch {epoch}: {len(ds):,} objects, {total / 1e6:.1f} MB in {seconds[-1]:.2f} s"
              + (" (from S3, kept in the cache)" if epoch == 1 else " (from the cache: no request)"))
    print(f"epoch 2 is {seconds[0] / seconds[1]:.1f}x faster than epoch 1")
    import boto3
    import pandas as pd

    boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1").put_object(
        Bucket=bucket, Key="tables/labels.csv", Body=b"name,label\ncat.jpg,0\ndog.jpg,1\n")
    url = f"manyfiles://s3://{bucket}/tables/labels.csv"
    opts = {"cache": cache, "endpoint_url": endpoint_url}
    print(f">>> pd.read_csv('{url}', storage_options={{'cache': '{cache}', ...}})")
    print(pd.read_csv(url, storage_options=opts).to_string(index=False), flush=True)


def step_trace(root: Path, files: int) -> None:
    trace = root / "listing.mftrace"
    banner("tracing: the I/O operation log of a command, summarized")
    run("fastls", "--trace", str(trace), "-r", "--count", str(root))
    run("manyfiles", "trace", "summary", str(trace))


if __name__ == "__main__":
    sys.exit(main())
