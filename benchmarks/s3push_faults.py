"""s3push's fault matrix: every fault of issue 28 at P 0.2 and 0.4, then at most one rerun.

Each cell pushes the same tree (small files and multipart uploads) to a fresh bucket of moto's
S3 server behind the tests' fault proxy (tests/s3/s3util.py: it checks every signature and every
body against its Content-MD5 / x-amz-checksum-*, and lists each part's checksum in ListParts,
as S3 does), with one fault kind applied to each
write request with probability P:

* ``reset`` (RST after half the answer), ``503`` (SlowDown), ``truncate`` (the answer cut);
* ``drop`` (the server did the request, then the connection closed without a byte of its answer);
* ``flip`` (one byte of the request body flipped on its way: the server must refuse it);
* ``lie`` (the answer's ETag or checksum replaced: the client must not believe it);
* ``complete`` (CompleteMultipartUpload reset or answered 503).

After the first run, and again after each rerun while it is not exact (the same command, the
same faults), every object is read back from moto directly: ``wrong`` counts objects whose bytes
are not their file's, ``partial`` objects shorter than their file, ``open`` multipart uploads left.
The script exits 1 if any cell ends with a wrong or partial object, or is not exact after one rerun
(``--reruns N`` allows more, to see how many it takes).
Timing is the client's wall time per run (moto is slow; the numbers are for the record, not a race).

    flock /work/bench.lock .venv/bin/python benchmarks/s3push_faults.py
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "s3"))
from s3util import Bucket, blob, moto_endpoint  # noqa: E402

from _common import machine_line  # noqa: E402
from manyfiles.push import push  # noqa: E402
from manyfiles.s3 import RetryPolicy  # noqa: E402

MiB = 1 << 20
KINDS = ("reset", "503", "truncate", "drop", "flip", "lie", "complete")


def writes(m, path, headers) -> bool:
    return m in ("PUT", "POST")


def complete(m, path, headers) -> bool:
    return m == "POST" and "uploadId=" in path


class Chance:
    """A request predicate true with probability ``p`` for requests matching ``base``, decided once
    per request (the proxy asks every rule of its list with the same request)."""

    def __init__(self, p: float, base, rng: random.Random) -> None:
        self.p, self.base, self.rng = p, base, rng
        self.decided: dict[int, tuple[object, bool]] = {}

    def __call__(self, m, path, headers) -> bool:
        if not self.base(m, path, headers):
            return False
        seen = self.decided.get(id(headers))
        if seen is None or seen[0] is not headers:
            seen = self.decided[id(headers)] = (headers, self.rng.random() < self.p)
        return seen[1]


def plant(proxy, kind: str, p: float, rng: random.Random) -> None:
    if kind in ("reset", "503", "truncate"):
        proxy.random_faults = (p, kind, writes)
    elif kind == "drop":
        proxy.random_faults = (p, "drop-after", writes)
    elif kind == "complete":
        proxy.random_faults = (p, ("reset", "503"), complete)
    else:       # request faults are consumed: enough entries for every write, each decided by chance
        pred = Chance(p, writes, rng)
        kinds = ("flip-request",) if kind == "flip" else ("lie-etag", "lie-checksum")
        proxy.request_faults += [(pred, kinds[i % len(kinds)]) for i in range(5000)]


def check(dest, files: dict[str, bytes]) -> tuple[int, int, int, bool]:
    """(wrong, partial, open uploads, exact) of the bucket against the tree."""
    wrong = partial = 0
    seen = {}
    for page in dest.admin.get_paginator("list_objects_v2").paginate(Bucket=dest.bucket):
        for obj in page.get("Contents", []):
            data = dest.admin.get_object(Bucket=dest.bucket, Key=obj["Key"])["Body"].read()
            seen[obj["Key"]] = data
            want = files.get(obj["Key"][2:])
            if want is None or data != want:
                wrong += 1
                if want is not None and len(data) < len(want):
                    partial += 1
    uploads = len(dest.admin.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", []))
    return wrong, partial, uploads, seen == {f"p/{k}": v for k, v in files.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200, help="small files (1-4 KiB)")
    ap.add_argument("--large", type=int, default=4, help="multipart files (11 MiB: 3 parts of 5 MiB)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--p", default="0.2,0.4")
    ap.add_argument("--retries", type=int, default=5, help="s3push's --retries (its default: 5)")
    ap.add_argument("--reruns", type=int, default=1, help="reruns allowed (the target: 1)")
    ap.add_argument("--seed", default="", help="another draw of the faults (the default: the recorded one)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="s3push-faults-"))
    files = {f"d{i % 9}/s{i:05d}.bin": blob(1024 + (i * 37) % 3072, f"s{i}") for i in range(args.small)}
    files.update({f"big/l{i}.bin": blob(11 * MiB + i, f"l{i}") for i in range(args.large)})
    for rel, data in files.items():
        (tmp / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "src" / rel).write_bytes(data)
    retry = RetryPolicy(attempts=args.retries + 1, base=0.01, cap=0.2)
    print(f"# s3push fault matrix, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n\n{machine_line()}\n"
          f"tree: {args.small} x 1-4 KiB + {args.large} x 11 MiB (3 parts of 5 MiB); moto behind the "
          f"fault proxy; {args.retries} retries per request; load {os.getloadavg()[0]:.2f} at the start\n")
    print("| fault | P | faults applied | run 1: s, wrong, partial, open, exact | rerun: s, wrong, partial, "
          "open, exact | verdict |")
    print("|---|---:|---:|---|---|---|")
    bad = 0
    with moto_endpoint() as moto:
        for kind in args.kinds.split(","):
            for p in (float(x) for x in args.p.split(",")):
                dest = Bucket(moto, "faults")
                rng = random.Random(f"{kind}{p}{args.seed}")
                dest.proxy.rng = random.Random(f"proxy{kind}{p}{args.seed}")
                dest.proxy.list_part_checksums = True      # ListParts as S3 answers it
                plant(dest.proxy, kind, p, rng)
                state = tmp / f"state-{kind}-{p}"
                cells = []
                for _ in range(1 + args.reruns):
                    t0 = time.perf_counter()
                    try:
                        push(f"{tmp / 'src'}/", dest.url("p/"), settings=dest.settings, retry=retry,
                             state_dir=state, part_size=5 * MiB, multipart_threshold=5 * MiB, jobs=16)
                    except Exception as exc:      # a run that stopped: the rerun must finish it
                        print(f"  {kind} {p}: run stopped: {exc}", file=sys.stderr)
                    dt = time.perf_counter() - t0
                    wrong, partial, uploads, exact = check(dest, files)
                    cells.append(f"{dt:.1f}, {wrong}, {partial}, {uploads}, {'yes' if exact else 'no'}")
                    if exact or wrong or partial:
                        break
                ok = exact and not wrong and not partial and uploads == 0
                bad += not ok or len(cells) > 2
                applied = len(dest.proxy.applied)
                reruns = len(cells) - 1
                verdict = ("exact" + (f" after {reruns} rerun(s)" if reruns else "") if ok else
                           "FAILED" if wrong or partial else f"not exact after {reruns} rerun(s)")
                later = " / ".join(cells[1:]) or "-"
                print(f"| {kind} | {p} | {applied} | {cells[0]} | {later} | {verdict} |", flush=True)
                dest.close()
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
