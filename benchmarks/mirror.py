"""No-op syncs and checks of an unchanged tree against its peers on a local S3 server (versitygw).

N objects of 1 KiB (``--objects 2000,100000``) under ``s3://mirror-N/p/``, the same N files in a local
folder; nothing differs, so every command only compares.  Two directions, each tool timed on the
same data, interleaved round by round, median of ``--repeat``:

* **up**: ``s3push --sync`` (and with ``--compare size-mtime``), whose floor is ``manyfiles check``
  (the same comparison with nothing to upload): ``manyfiles check`` (checksum: an MD5 per file
  against the listing's ETag), ``manyfiles check --compare size-mtime`` (s5cmd's and aws's rule),
  ``s5cmd sync``, ``aws s3 sync``,
  ``rclone sync --fast-list --checksum``, ``rclone check``.  By checksum, twice: ``(memo empty)``
  with a new ``XDG_STATE_HOME`` each run (the first sync of a tree: every file read and hashed, the
  checksum memo written), ``(memo warm)`` with the benchmark's own state folder, filled by the
  untimed run (a file unchanged since it was hashed is not read);
* **down**: ``s3pull --sync`` (into a folder s3pull filled: its state keeps every file, nothing
  hashed), ``s3pull`` (a plain re-run), ``s5cmd sync``, ``aws s3 sync`` (each into its own copy of
  the folder, synced once before timing so that its own rule finds nothing to do).

Requests are counted from versitygw's access log (``--access-log``): LIST (ListObjectsV2), HEAD and
GET per run.  Client CPU is the tool's (``getrusage`` of the children).  Needs versitygw and rclone
(~/go/bin, .cache/go/bin or PATH), s5cmd and the aws cli in .venv-bench (``make bench-venv``).

    flock /work/bench.lock .venv/bin/python benchmarks/mirror.py --objects 2000 --repeat 3 --planted 10000
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3pull as pullbench
from _common import machine_line

ROOT = pullbench.ROOT
DATA = Path(os.environ.get("MIRROR_BENCH_DATA", ROOT / "benchmarks" / "_data" / "mirror"))
BIN = Path(sys.executable).parent
SIZE = 1024


def start_server() -> tuple[subprocess.Popen, str, Path]:
    """versitygw (posix, --keep-alive) with an access log: (process, endpoint, log path)."""
    exe = pullbench.go_tool("versitygw")
    port = pullbench.free_port()
    (DATA / "gw").mkdir(parents=True, exist_ok=True)
    log = DATA / "access.log"
    log.write_bytes(b"")
    env = {**os.environ, "ROOT_ACCESS_KEY": pullbench.KEY, "ROOT_SECRET_KEY": pullbench.SECRET}
    proc = subprocess.Popen([str(exe), "--port", f"127.0.0.1:{port}", "--keep-alive", "--quiet",
                             "--access-log", str(log), "posix", str(DATA / "gw")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pullbench.wait_port(port)
    return proc, f"http://127.0.0.1:{port}", log


def seed(n: int, endpoint: str) -> tuple[str, Path]:
    """N local files of 1 KiB and the same N objects (uploaded by s5cmd after the files were written,
    so every object is newer than its file); returns (bucket, folder)."""
    import boto3

    bucket = f"mirror-{n}"
    src = DATA / f"src-{n}"
    marker = src / ".complete"
    if not marker.exists():
        shutil.rmtree(src, ignore_errors=True)
        for i in range(n):
            sub = src / f"d{i % 100:02d}"
            sub.mkdir(parents=True, exist_ok=True)
            (sub / f"f{i:07d}.bin").write_bytes(os.urandom(SIZE))
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id=pullbench.KEY, aws_secret_access_key=pullbench.SECRET)
    with contextlib.suppress(c.exceptions.BucketAlreadyOwnedByYou, c.exceptions.BucketAlreadyExists):
        c.create_bucket(Bucket=bucket)
    listed = c.list_objects_v2(Bucket=bucket, Prefix="p/", MaxKeys=1).get("KeyCount", 0)
    if not listed or not marker.exists():
        subprocess.run([str(pullbench.BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint, "cp",
                        f"{src}/*", f"s3://{bucket}/p/"], env=pullbench.env_for(endpoint), check=True,
                       stdout=subprocess.DEVNULL)
        marker.write_text("")
    return bucket, src


STATE = DATA / "state"            # XDG_STATE_HOME of every run but the "(memo empty)" ones
EMPTY = "(memo empty)"


def commands(bucket: str, src: Path, down: dict[str, Path], endpoint: str) -> dict[str, list[str]]:
    url = f"s3://{bucket}/p/"
    s5 = [str(pullbench.BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint]
    aws = [str(pullbench.BENCH_VENV / "aws"), "s3", "sync", "--only-show-errors", "--endpoint-url", endpoint]
    rclone = str(pullbench.go_tool("rclone"))
    return {
        f"up: manyfiles check {EMPTY}": [str(BIN / "manyfiles"), "check", str(src), url, "-q"],
        "up: manyfiles check (memo warm)": [str(BIN / "manyfiles"), "check", str(src), url, "-q"],
        "up: manyfiles check --compare size-mtime": [str(BIN / "manyfiles"), "check", str(src), url, "-q",
                                                     "--compare", "size-mtime"],
        f"up: s3push --sync {EMPTY}": [str(BIN / "s3push"), f"{src}/", url, "--sync", "-q"],
        "up: s3push --sync (memo warm)": [str(BIN / "s3push"), f"{src}/", url, "--sync", "-q"],
        "up: s3push --sync --compare size-mtime": [str(BIN / "s3push"), f"{src}/", url, "--sync", "-q",
                                                   "--compare", "size-mtime"],
        "up: s5cmd sync": [*s5, "sync", f"{src}/", url],
        "up: aws s3 sync": [*aws, f"{src}/", url],
        "up: rclone sync --fast-list --checksum": [rclone, "sync", "--fast-list", "--checksum", str(src),
                                                   f"bench:{bucket}/p"],
        "up: rclone check": [rclone, "check", "--fast-list", str(src), f"bench:{bucket}/p"],
        "down: s3pull --sync": [str(BIN / "s3pull"), url, str(down["s3pull"]), "--sync", "-q"],
        "down: s3pull (re-run)": [str(BIN / "s3pull"), url, str(down["s3pull"]), "-q"],
        "down: s5cmd sync": [*s5, "sync", f"{url}*", f"{down['s5cmd']}/"],
        "down: aws s3 sync": [*aws, url, str(down["aws"])],
    }


def requests_since(log: Path, offset: int) -> tuple[dict[str, int], int]:
    """(LIST, HEAD, GET, PUT counts in the access log after ``offset``, the new offset)."""
    with open(log, "rb") as f:
        f.seek(offset)
        data = f.read()
    counts = {"LIST": 0, "HEAD": 0, "GET": 0, "PUT": 0}
    for line in data.splitlines():
        if b"REST.GET.BUCKET" in line or b"ListObjects" in line:
            counts["LIST"] += 1
        elif b"REST.HEAD.OBJECT" in line or b"HeadObject" in line:
            counts["HEAD"] += 1
        elif b"REST.GET.OBJECT" in line or b"GetObject" in line:
            counts["GET"] += 1
        elif b"REST.PUT.OBJECT" in line or b"PutObject" in line:
            counts["PUT"] += 1
    return counts, offset + len(data)


def run(n: int, repeat: int, endpoint: str, log: Path, only: set[str] | None) -> None:
    bucket, src = seed(n, endpoint)
    env = {**pullbench.env_for(endpoint), "XDG_STATE_HOME": str(STATE)}
    down = {tool: DATA / f"down-{n}-{tool}" for tool in ("s3pull", "s5cmd", "aws")}
    cmds = commands(bucket, src, down, endpoint)
    if only:
        cmds = {k: v for k, v in cmds.items() if any(o in k for o in only)}
    if any(k.startswith("down:") for k in cmds):
        # (only then: 300,000 files deleted and made again slow every later file creation on this
        # machine's ext4, see docs/benchmarks.md "the benchmark's own file deletions")
        for path in down.values():
            shutil.rmtree(path, ignore_errors=True)
        subprocess.run([str(BIN / "s3pull"), f"s3://{bucket}/p/", str(down["s3pull"]), "-q"], env=env,
                       check=True)
        for tool in ("s5cmd", "aws"):           # a copy of the files (mtimes kept), without s3pull's state
            shutil.copytree(down["s3pull"], down[tool], ignore=shutil.ignore_patterns(".s3pull"))
    offset = log.stat().st_size
    for cmd in cmds.values():               # once untimed: each tool's own rule settles its folder
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, offset = requests_since(log, offset)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    cpus: dict[str, list[float]] = {k: [] for k in cmds}
    reqs: dict[str, dict[str, int]] = {}
    codes: dict[str, int] = {}
    failed: dict[str, int] = {}
    for _ in range(repeat):
        for name, cmd in cmds.items():
            time.sleep(0.5)                 # the access log of the previous run flushed
            _, offset = requests_since(log, offset)
            empty = DATA / "state-empty"        # one memo file: nothing like many deletions
            shutil.rmtree(empty, ignore_errors=True)
            run_env = {**env, "XDG_STATE_HOME": str(empty)} if EMPTY in name else env
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            dt = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            time.sleep(0.5)
            counts, offset = requests_since(log, offset)
            print(f"  {n} {name}: {dt:.2f} s (exit {r.returncode}) {counts}", file=sys.stderr, flush=True)
            if r.returncode not in (0, 1) or (r.returncode == 1 and "check" not in name):
                # a run that failed is no measurement: said, and left out of the medians
                failed[name] = failed.get(name, 0) + 1
                print(f"    FAILED: {r.stderr.decode(errors='replace').strip()[-400:]}", file=sys.stderr,
                      flush=True)
                continue
            reqs[name] = counts
            codes[name] = r.returncode
            times[name].append(dt)
            cpus[name].append((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime))
    print(f"\n### No-op sync / check of {n:,} unchanged 1 KiB objects\n")
    print(f"Load average {os.getloadavg()[0]:.1f} at the end; median of {repeat}; requests of the last "
          "run.\n")
    print("| command | median s | client CPU s | vs s5cmd sync / aws s3 sync (same direction) | LIST | HEAD "
          "| GET | PUT | exit |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in cmds:
        if not times[name]:
            print(f"| `{name}` | every run failed | | | | | | | |")
            continue
        med = statistics.median(times[name])
        base = times.get(f"{name.split(':')[0]}: s5cmd sync")
        ratio = f"{statistics.median(base) / med:.2f}x" if base else "-"
        aws = times.get(f"{name.split(':')[0]}: aws s3 sync")
        ratio += f" / {statistics.median(aws) / med:.2f}x" if aws else ""
        c = reqs[name]
        side, _, what = name.partition(": ")
        print(f"| `{what}` ({side}) | {med:.2f} | {statistics.median(cpus[name]):.2f} "
              f"| {ratio} | {c['LIST']} | {c['HEAD']} | {c['GET']} | {c['PUT']} | {codes[name]}"
              + (f" ({failed[name]} run(s) failed, left out)" if name in failed else "") + " |")
    sys.stdout.flush()


def planted(n: int, endpoint: str, per_kind: int = 10) -> None:
    """``manyfiles check`` on an N-object tree with ``per_kind`` differences of each kind planted
    (missing remote, missing local, same size but other bytes, other size): every one found, nothing
    else (asserted); rclone check on the same tree, timed beside it."""
    import json
    import random

    bucket, src = seed(n, endpoint)
    tree = DATA / f"planted-{n}"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns(".complete"))
    env = pullbench.env_for(endpoint)
    s5 = [str(pullbench.BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint]
    subprocess.run([*s5, "rm", f"s3://{bucket}/planted/*"], env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    subprocess.run([*s5, "cp", f"{tree}/*", f"s3://{bucket}/planted/"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    rels = sorted(str(p.relative_to(tree)) for p in tree.rglob("*.bin"))
    pick = random.Random(n).sample(rels, 4 * per_kind)
    kinds = {"missing-remote": pick[:per_kind], "missing-local": pick[per_kind:2 * per_kind],
             "same size, other bytes": pick[2 * per_kind:3 * per_kind], "other size": pick[3 * per_kind:]}
    subprocess.run([*s5, "rm", *(f"s3://{bucket}/planted/{r}" for r in kinds["missing-remote"])], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    for r in kinds["missing-local"]:
        (tree / r).unlink()
    for r in kinds["same size, other bytes"]:
        (tree / r).write_bytes(os.urandom(SIZE))
    for r in kinds["other size"]:
        (tree / r).write_bytes(os.urandom(SIZE + 1))
    t0 = time.perf_counter()
    r = subprocess.run([str(BIN / "manyfiles"), "check", str(tree), f"s3://{bucket}/planted/", "--json"],
                       env=env, capture_output=True)
    ours = time.perf_counter() - t0
    found: dict[str, set[str]] = {}
    for line in r.stdout.decode().splitlines():
        rec = json.loads(line)
        if rec["event"] != "summary":
            found.setdefault(rec["event"], set()).add(rec["path"])
    want = {"missing-remote": set(kinds["missing-remote"]), "missing-local": set(kinds["missing-local"]),
            "differing": set(kinds["same size, other bytes"]) | set(kinds["other size"])}
    assert r.returncode == 1 and found == want, (r.returncode, found, r.stderr.decode()[-500:])
    t0 = time.perf_counter()
    rc = subprocess.run([str(pullbench.go_tool("rclone")), "check", "--fast-list", str(tree),
                         f"bench:{bucket}/planted"], env=env, capture_output=True)
    theirs = time.perf_counter() - t0
    print(f"\n### manyfiles check on {n:,} objects, {per_kind} differences of each kind planted\n")
    print("| planted | count | found by `manyfiles check` |\n|---|---:|---:|")
    for kind, rels_ in kinds.items():
        event = kind if kind in want else "differing"
        print(f"| {kind} | {len(rels_)} | {len(set(rels_) & found.get(event, set()))} |")
    print(f"\n`manyfiles check --json`: exit {r.returncode}, {ours:.2f} s, every planted difference and "
          f"nothing else; `rclone check --fast-list`: exit {rc.returncode}, {theirs:.2f} s (one run each, "
          f"load {os.getloadavg()[0]:.1f}).")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", default="2000", help="comma-separated tree sizes (e.g. 2000,100000)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tools", default="", help="comma-separated substrings of the commands to run")
    ap.add_argument("--planted", type=int, default=0, metavar="N",
                    help="also: manyfiles check on an N-object tree with differences planted (e.g. 10000)")
    ap.add_argument("--clean", action="store_true", help="delete the data at the end")
    args = ap.parse_args()
    pullbench.byte_compile()
    gw, endpoint, log = start_server()
    print(f"Machine: {machine_line()}; load average {os.getloadavg()[0]:.1f}; server: versitygw posix "
          f"--keep-alive --access-log on 127.0.0.1 (same 2 cores); command: {' '.join(sys.argv)}", flush=True)
    try:
        for n in (int(x) for x in args.objects.split(",") if x):
            run(n, args.repeat, endpoint, log, set(args.tools.split(",")) if args.tools else None)
        if args.planted:
            planted(args.planted, endpoint)
    finally:
        gw.terminate()
        gw.wait()
        if args.clean:
            shutil.rmtree(DATA, ignore_errors=True)


if __name__ == "__main__":
    main()
