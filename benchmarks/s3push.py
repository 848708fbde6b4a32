"""s3push against its peers on a fast local S3 server (versitygw), on the same data in one run.

Each tool uploads the same local folder to a fresh prefix of one bucket: s3push (CRC64NVME sent
with every body and checked, ETags checked), ``s5cmd cp`` (256 workers, Content-MD5),
``rclone copy`` (64 transfers, 64 checkers; MD5 pre-pass), ``aws s3 cp --recursive``.  The tools
are interleaved round by round (noise spreads over all), every run is checked (object count and
bytes under its prefix), each run's prefix is kept until the shape is done (``--keep-bytes``: the
server's data folder is on this machine's root ext4, and files created right after thousands were
deleted cost every tool the same inode scan); the median of --repeat runs is
reported with ratios against s5cmd and rclone from the same run, each tool's client CPU (the
children's getrusage), and the load average before and after.

Shapes: ``2k`` (2,000 x 1 KiB), ``50m`` (20 x 50 MiB), ``100k`` (100,000 x 4 KiB), ``1g`` (one 1 GiB file).

Needs versitygw and rclone (.cache/go/bin, ~/go/bin or PATH; see benchmarks/s3pull.py) and the
peers of ``make bench-venv`` (.venv-bench: s5cmd, aws cli).  Run it under the team's lock:

    flock /work/bench.lock .venv/bin/python benchmarks/s3push.py --shapes 2k,50m --repeat 3
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = Path(os.environ.get("S3PUSH_BENCH_DATA", HERE / "_data" / "s3push"))
os.environ.setdefault("S3PULL_BENCH_DATA", str(DATA))      # versitygw's folder, for s3pull's helpers
sys.path.insert(0, str(HERE))
from _common import machine_line  # noqa: E402
from s3pull import BENCH_VENV, KEY, SECRET, byte_compile, env_for, go_tool, start_versitygw  # noqa: E402

SHAPES = {"2k": (2000, 1 << 10), "50m": (20, 50 << 20), "100k": (100_000, 4 << 10), "1g": (1, 1 << 30)}
IN_FLIGHT = 64
BASELINE = ""       # --baseline: another s3push executable
BUCKET = "push-bench"
# Each run's objects stay in versitygw's posix data folder (files on the root ext4, which has no
# journal) until the shape is done, while the shape's runs hold at most this many bytes: files
# created right after thousands were deleted scan the recently freed inodes (find_inode_bit ->
# recently_deleted), a cost of the benchmark's loop paid by every tool alike, not of the tools
# (docs/benchmarks.md, issue 26 and pushsmall33).  --keep-bytes 0: each run's prefix deleted right
# after the run (how runs before 2026-11-28 14:05 measured).
KEEP_BYTES = 4 << 30


def make_data(shape: str) -> Path:
    n, size = SHAPES[shape]
    folder = DATA / "src" / shape
    if folder.exists() and len(os.listdir(folder)) == n:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(n):
        with open(folder / f"f{i:06d}.bin", "wb") as f:
            left = size
            while left:
                chunk = min(left, 8 << 20)
                f.write(os.urandom(chunk))
                left -= chunk
    return folder


def tools(src: Path, url: str, endpoint: str, aws_config: Path,
          state: Path) -> dict[str, tuple[list[str], dict]]:
    """tool -> (argv, extra environment), uploading ``src``'s files to ``url`` (a prefix, with /)."""
    s3push = str(Path(sys.executable).parent / "s3push")
    return {
        "s3push": ([s3push, f"{src}/", url, "-q"], {"XDG_STATE_HOME": str(state)}),
        "s3push (baseline)": ([BASELINE, f"{src}/", url, "-q"], {"XDG_STATE_HOME": str(state)}),
        "s5cmd": ([str(BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint, "cp", f"{src}/", url], {}),
        "rclone": ([str(go_tool("rclone")), "copy", str(src), "bench:" + url[len("s3://"):].rstrip("/"),
                    "--transfers", str(IN_FLIGHT), "--checkers", str(IN_FLIGHT)], {}),
        "aws cli": ([str(BENCH_VENV / "aws"), "s3", "cp", "--recursive", "--quiet", f"{src}/", url],
                    {"AWS_CONFIG_FILE": str(aws_config)}),
    }


def check(client, prefix: str, n: int, nbytes: int) -> None:
    count = total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            count += 1
            total += obj["Size"]
    if (count, total) != (n, nbytes):
        raise RuntimeError(f"{prefix}: {count} objects, {total} bytes; expected {n}, {nbytes}")


def uptime() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2k,50m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tools", default="s3push,s5cmd,rclone,aws cli")
    parser.add_argument("--clean", action="store_true", help="remove the generated data at the end")
    parser.add_argument("--keep-bytes", type=int, default=KEEP_BYTES,
                        help="keep the runs' objects up to this many bytes a shape, deleted after it "
                             "(0: delete each run's prefix right after the run)")
    parser.add_argument("--baseline", default="", metavar="S3PUSH",
                        help="another s3push executable (e.g. main's), run as 's3push (baseline)'")
    args = parser.parse_args()
    import boto3

    global BASELINE
    BASELINE = args.baseline
    only = args.tools.split(",")
    if BASELINE and "s3push (baseline)" not in only:
        only.insert(1, "s3push (baseline)")
    byte_compile()
    proc, port = start_versitygw()
    endpoint = f"http://127.0.0.1:{port}"
    env = env_for(endpoint)
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                          aws_secret_access_key=SECRET)
    tmp = Path(tempfile.mkdtemp(prefix="s3push-bench-"))
    aws_config = tmp / "aws-config"
    aws_config.write_text("[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n")
    print(f"# s3push benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{machine_line()}\n"
          f"server: versitygw --keep-alive (posix, {DATA / 'gw'}); {uptime()} at the start; "
          f"keep-bytes {args.keep_bytes:,}; command: {' '.join(sys.argv)}\n")
    try:
        client.create_bucket(Bucket=BUCKET)
        for shape in args.shapes.split(","):
            n, size = SHAPES[shape]
            src = make_data(shape)
            times: dict[str, list[float]] = {t: [] for t in only}
            cpu: dict[str, list[float]] = {t: [] for t in only}
            load0 = uptime()
            kept = 0
            for r in range(args.repeat):
                for name in only:
                    prefix = f"{shape}/{name.replace(' ', '-')}/{r}/"
                    state = tmp / f"state-{shape}-{r}"
                    argv, extra = tools(src, f"s3://{BUCKET}/{prefix}", endpoint, aws_config, state)[name]
                    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.perf_counter()
                    done = subprocess.run(argv, env={**env, **extra}, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE)
                    dt = time.perf_counter() - t0
                    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    if done.returncode != 0:
                        raise RuntimeError(f"{name} exit {done.returncode}: {done.stderr.decode()[-400:]}")
                    check(client, prefix, n, n * size)
                    times[name].append(dt)
                    cpu[name].append(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                    print(f"  {shape} {name} run {r + 1}: {dt:.2f} s", file=sys.stderr, flush=True)
                    kept += n * size
                    if kept > args.keep_bytes:
                        shutil.rmtree(DATA / "gw" / BUCKET / prefix.rstrip("/"), ignore_errors=True)
                        kept -= n * size
            shutil.rmtree(DATA / "gw" / BUCKET / shape, ignore_errors=True)     # the shape's runs, after it
            med = {t: statistics.median(v) for t, v in times.items()}
            print(f"## {shape}: {n:,} x {size:,} B, median of {args.repeat} ({load0} -> {uptime()})\n")
            print("| tool | wall s (runs) | files/s | MB/s | client CPU s | s3push vs it |")
            print("|---|---|---:|---:|---:|---:|")
            for t in only:
                runs = ", ".join(f"{x:.2f}" for x in times[t])
                ratio = "" if t == "s3push" or "s3push" not in med else f"{med[t] / med['s3push']:.2f}x"
                print(f"| {t} | {med[t]:.2f} ({runs}) | {n / med[t]:,.0f} | {n * size / med[t] / 1e6:,.0f} | "
                      f"{statistics.median(cpu[t]):.2f} | {ratio} |")
            print()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(DATA / "gw", ignore_errors=True)
        if args.clean:
            shutil.rmtree(DATA, ignore_errors=True)


if __name__ == "__main__":
    main()
