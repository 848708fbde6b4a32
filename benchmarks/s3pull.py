"""s3pull against its peers on a fast local S3 server (versitygw), direct and behind added latency.

One run measures, on the same server and the same data: s3pull --strategy auto and each forced
engine, s3pull auto without content checks (--no-checksum) and with ETag/MD5 checks only
(--etag-only), s5cmd, the aws cli, a plain aioboto3 script with default settings, rclone
(`rclone copy`, 64 transfers), boto3's CRT transfer manager (`s3transfer.crt`, awscrt's native S3
client) and obstore (Rust object_store from Python, asyncio, 64 GETs in flight).  Each tool
downloads the whole bucket into an empty folder; the median of --repeat runs is reported, with
ratios against s5cmd, (for auto) against the best forced engine and the other peers, and the cost
of verification (auto against auto --no-checksum) measured in the same run.

Shapes: 1k, 1m, 50m, 1g, mixed, 100k (100,000 x 4 KiB) (uploaded by s5cmd), and for the
verification cost three 1 GiB
objects uploaded by boto3: 1g-md5 (one PutObject: single-part, ETag = MD5), 1g-multi (8 MiB
parts: ETag = md5-of-md5s-128) and 1g-crc32c (one PutObject with a CRC32C checksum).  versitygw
also stores a CRC64NVME for every object, so auto checks crc64nvme (crc32c for 1g-crc32c) and
--etag-only checks md5 / multipart-md5; the "checked by" column says what each run used.

Needs: versitygw, rclone (and toxiproxy for --latency): taken from .cache/go/bin, ~/go/bin or
PATH, and built into .cache/go/bin (git-ignored) with `go install` when missing; the peers from
`make bench-venv` (.venv-bench: s5cmd, aws cli; .venv-peers: boto3 with awscrt, obstore, whose
botocore pins fight the aws cli's).  Data lives in benchmarks/_data/s3pull (git-ignored; --clean deletes it).

    .venv/bin/python benchmarks/s3pull.py                       # all shapes, direct
    .venv/bin/python benchmarks/s3pull.py --latency 0,5,20 --shapes 1k,1m
    .venv/bin/python benchmarks/s3pull.py --shapes 1k,1g-md5,1g-multi,1g-crc32c --repeat 5 \\
        --tools "auto,auto --no-checksum,auto --etag-only,s5cmd,aws cli"    # verification cost
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_line

ROOT = Path(__file__).resolve().parent.parent
GOBIN = ROOT / ".cache" / "go" / "bin"
BENCH_VENV = ROOT / ".venv-bench" / "bin"
PEERS_VENV = ROOT / ".venv-peers" / "bin"
DATA = Path(os.environ.get("S3PULL_BENCH_DATA", ROOT / "benchmarks" / "_data" / "s3pull"))
GO_TOOLS = {   # binary -> (go package, name go install gives it)
    "versitygw": ("github.com/versity/versitygw/cmd/versitygw@latest", "versitygw"),
    "toxiproxy-server": ("github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0", "server"),
    "rclone": ("github.com/rclone/rclone@latest", "rclone"),
}
KEY, SECRET = "benchkey", "benchsecret"
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

# shape -> list of (count, size)
SHAPES = {
    "1k": [(2000, 1 * KiB)],
    "1m": [(200, 1 * MiB)],
    "50m": [(20, 50 * MiB)],
    "1g": [(1, 1024 * MiB)],
    "mixed": [(1000, 1 * KiB), (50, 1 * MiB), (4, 50 * MiB), (1, 256 * MiB)],
    "1g-md5": [(1, 1024 * MiB)],
    "1g-multi": [(1, 1024 * MiB)],
    "1g-crc32c": [(1, 1024 * MiB)],
    "100k": [(100_000, 4 * KiB)],
}
# how a shape is uploaded: s5cmd, or boto3 as one PutObject / multipart / PutObject with a CRC32C
UPLOAD = {"1g-md5": "put", "1g-multi": "multipart", "1g-crc32c": "crc32c"}
ENGINES = ["auto", "lean", "loop", "http", "async", "threads", "processes", "ranged", "sync", "obstore",
           "crt"]
VARIANTS = {"auto --no-checksum": ["--no-checksum"], "auto --etag-only": ["--etag-only"]}
PEERS = ("s5cmd", "aws cli", "aioboto3 default", "rclone", "boto3 crt", "obstore")
IN_FLIGHT = 64     # rclone's --transfers and obstore's GETs in flight: s3pull's default -j
ALIASES = {"auto --no-verify": "auto --no-checksum"}    # the flag's old name, as older commands say


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port}")


def go_tool(name: str) -> Path:
    """``name`` from .cache/go/bin, ~/go/bin or PATH; else built with ``go install`` into .cache/go/bin."""
    built = GO_TOOLS[name][1] if name in GO_TOOLS else name
    for candidate in (GOBIN / name, Path.home() / "go" / "bin" / name, Path.home() / "go" / "bin" / built):
        if candidate.exists():
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    package, built = GO_TOOLS[name]
    if not shutil.which("go"):
        sys.exit(f"{name} is missing and there is no go toolchain to build it ({package})")
    print(f"building {name}: go install {package} (a few minutes)", file=sys.stderr, flush=True)
    GOBIN.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "install", package], env={**os.environ, "GOBIN": str(GOBIN)}, check=True)
    if built != name:
        (GOBIN / name).symlink_to(GOBIN / built)
    return GOBIN / name


def start_versitygw() -> tuple[subprocess.Popen, int]:
    exe = go_tool("versitygw")
    port = free_port()
    (DATA / "gw").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "ROOT_ACCESS_KEY": KEY, "ROOT_SECRET_KEY": SECRET}
    proc = subprocess.Popen([str(exe), "--port", f"127.0.0.1:{port}", "--keep-alive", "--quiet",
                             "posix", str(DATA / "gw")], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    wait_port(port)
    return proc, port


class Toxiproxy:
    """toxiproxy-server in front of the S3 server, adding ``latency`` ms to every response."""

    def __init__(self, upstream_port: int) -> None:
        exe = go_tool("toxiproxy-server")
        self.api_port = free_port()
        self.proc = subprocess.Popen([str(exe), "-host", "127.0.0.1", "-port", str(self.api_port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.api_port)
        self.port = free_port()
        self._api("POST", "/proxies", {"name": "s3", "listen": f"127.0.0.1:{self.port}",
                                       "upstream": f"127.0.0.1:{upstream_port}", "enabled": True})

    def _api(self, method: str, path: str, body: dict | None = None) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()

    def set_latency(self, ms: int) -> None:
        with contextlib.suppress(Exception):   # no toxic yet
            self._api("DELETE", "/proxies/s3/toxics/lat")
        if ms:
            self._api("POST", "/proxies/s3/toxics", {"name": "lat", "type": "latency", "stream": "downstream",
                                                     "attributes": {"latency": ms, "jitter": 0}})

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def env_for(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint,
            "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
            # rclone's remote "bench:" from the environment, no config file
            "RCLONE_CONFIG": "/dev/null", "RCLONE_CONFIG_BENCH_TYPE": "s3",
            "RCLONE_CONFIG_BENCH_PROVIDER": "Other", "RCLONE_CONFIG_BENCH_ENDPOINT": endpoint,
            "RCLONE_CONFIG_BENCH_ACCESS_KEY_ID": KEY, "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY": SECRET,
            "RCLONE_CONFIG_BENCH_REGION": "us-east-1", "RCLONE_CONFIG_BENCH_FORCE_PATH_STYLE": "true"}


def seed(shape: str, endpoint: str) -> tuple[int, int]:
    """Upload the shape's objects once (bucket ``bench-<shape>``); returns (objects, bytes)."""
    import boto3

    bucket = f"bench-{shape}"
    n_total = sum(n for n, _ in SHAPES[shape])
    b_total = sum(n * s for n, s in SHAPES[shape])
    c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                     aws_secret_access_key=SECRET)
    with contextlib.suppress(c.exceptions.ClientError):
        c.create_bucket(Bucket=bucket)
    have = sum(1 for p in c.get_paginator("list_objects_v2").paginate(Bucket=bucket)
               for _ in p.get("Contents", ()))
    if have == n_total:
        return n_total, b_total
    src = DATA / "src" / shape
    shutil.rmtree(src, ignore_errors=True)
    for gi, (n, size) in enumerate(SHAPES[shape]):
        d = src / f"g{gi}-{size}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            with open(d / f"obj-{i:06d}.bin", "wb") as f:
                left = size
                while left:
                    chunk = os.urandom(min(left, 8 * MiB))
                    f.write(chunk)
                    left -= len(chunk)
    how = UPLOAD.get(shape, "s5cmd")
    if how == "s5cmd":
        subprocess.run([str(BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint, "cp", f"{src}/*",
                        f"s3://{bucket}/"], env=env_for(endpoint), check=True, stdout=subprocess.DEVNULL)
    else:
        upload_boto3(c, how, src, bucket)
    shutil.rmtree(src, ignore_errors=True)
    return n_total, b_total


def upload_boto3(client, how: str, src: Path, bucket: str) -> None:
    """One PutObject (single-part, ETag = MD5), multipart in 8 MiB parts, or PutObject + CRC32C.

    No checksum is sent but the CRC32C one: the server then stores its default (versitygw: a
    full-object CRC64NVME, as S3 does since 2025)."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    if how != "crc32c":
        client = boto3.client("s3", endpoint_url=client.meta.endpoint_url, region_name="us-east-1",
                              aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                              config=Config(request_checksum_calculation="when_required"))

    for path in sorted(src.rglob("*.bin")):
        key = str(path.relative_to(src))
        if how == "multipart":
            parts = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB)
            client.upload_file(str(path), bucket, key, Config=parts)
            continue
        extra = {"ChecksumAlgorithm": "CRC32C"} if how == "crc32c" else {}
        with open(path, "rb") as f:
            client.put_object(Bucket=bucket, Key=key, Body=f, **extra)


def tools(bucket: str, dest: Path, endpoint: str, only: set[str] | None) -> dict[str, list[str]]:
    py = str(Path(sys.executable))
    s3pull = str(Path(sys.executable).parent / "s3pull")
    out = {f"s3pull {e}": [s3pull, f"s3://{bucket}/", str(dest), "--strategy", e, "-q"] for e in ENGINES}
    if BASELINE:    # another build's s3pull (e.g. main's), in the same run: what a change gained
        out["s3pull auto (baseline)"] = [BASELINE, f"s3://{bucket}/", str(dest), "-q"]
    for name, flags in VARIANTS.items():
        out[f"s3pull {name}"] = [s3pull, f"s3://{bucket}/", str(dest), "-q", *flags]
    out["s5cmd"] = [str(BENCH_VENV / "s5cmd"), "--endpoint-url", endpoint, "cp", f"s3://{bucket}/*",
                    f"{dest}/"]
    out["aws cli"] = [str(BENCH_VENV / "aws"), "s3", "cp", "--recursive", "--quiet", "--endpoint-url",
                      endpoint, f"s3://{bucket}/", str(dest)]
    out["aioboto3 default"] = [py, __file__, "--peer-aioboto3", bucket, str(dest)]
    rclone = str(go_tool("rclone")) if only is None or "rclone" in only else "rclone"
    out["rclone"] = [rclone, "copy", f"bench:{bucket}", str(dest), "--transfers", str(IN_FLIGHT),
                     "--checkers", str(IN_FLIGHT)]
    peers_py = str(PEERS_VENV / "python")
    out["boto3 crt"] = [peers_py, __file__, "--peer-crt", bucket, str(dest)]
    out["obstore"] = [peers_py, __file__, "--peer-obstore", bucket, str(dest)]
    if only:
        out = {k: v for k, v in out.items() if k in only or k.removeprefix("s3pull ") in only}
    return out


def check(dest: Path, n: int, nbytes: int) -> None:
    cnt = size = 0
    for dirpath, dirnames, filenames in os.walk(dest):
        dirnames[:] = [d for d in dirnames if d != ".s3pull"]
        for f in filenames:
            cnt += 1
            size += os.path.getsize(os.path.join(dirpath, f))
    if (cnt, size) != (n, nbytes):
        raise RuntimeError(f"{dest}: got {cnt} files / {size} bytes, expected {n} / {nbytes}")


def checked_by(dest: Path) -> str:
    """The check methods s3pull recorded for what it installed (its state file), e.g. "md5"."""
    counts: dict[str, int] = {}
    state = dest / ".s3pull" / "state.jsonl"
    if state.exists():
        for line in state.read_text().splitlines():
            method = json.loads(line).get("m", "?")
            counts[method] = counts.get(method, 0) + 1
    return ", ".join(sorted(counts)) if counts else "-"


def measure(shape: str, endpoint: str, repeat: int, only: set[str] | None,
            label: str) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Every tool ``repeat`` times, interleaved; returns (times per tool, check method per tool).
    Each run's client CPU (user + system seconds of the tool and the children it waited for, from
    ``getrusage(RUSAGE_CHILDREN)``) goes to ``CPU``: steadier than wall time on a shared machine."""
    n, nbytes = SHAPES_TOTALS[shape]
    dest = DATA / "dest"
    done = DATA / "dest-done"       # the runs' DESTs set aside (see KEEP_BYTES)
    cmds = tools(f"bench-{shape}", dest, endpoint, only)
    times: dict[str, list[float]] = {k: [] for k in cmds}
    checks: dict[str, str] = {}
    env = env_for(endpoint)
    kept = 0
    shutil.rmtree(done, ignore_errors=True)
    for _ in range(repeat):
        for name, cmd in cmds.items():          # interleaved: noise spreads over every tool
            if name in FAILED:
                continue
            if dest.exists() and kept + nbytes <= KEEP_BYTES:
                done.mkdir(parents=True, exist_ok=True)
                dest.rename(done / str(kept // max(1, nbytes)))    # set aside: deleted after the shape
                kept += nbytes
            else:
                shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            dt = time.perf_counter() - t0
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            if r.returncode != 0:
                if name.startswith("s3pull"):
                    raise RuntimeError(f"{name} failed ({r.returncode}): {r.stderr.decode()[-500:]}")
                # a peer that does not complete is a result, not the end of the run
                last = (r.stderr.decode(errors="replace").strip().splitlines() or ["?"])[-1]
                FAILED[name] = f"exit {r.returncode}: {last[:200]}"
                del times[name]
                print(f"  {label} {shape} {name}: FAILED {FAILED[name]}", file=sys.stderr, flush=True)
                continue
            check(dest, n, nbytes)
            times[name].append(dt)
            CPU.setdefault((shape, label, name), []).append(cpu)
            if name.startswith("s3pull"):
                checks[name] = checked_by(dest)
            print(f"  {label} {shape} {name}: {dt:.2f} s, client CPU {cpu:.2f} s", file=sys.stderr,
                  flush=True)
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(done, ignore_errors=True)
    return times, checks


SHAPES_TOTALS: dict[str, tuple[int, int]] = {}
CPU: dict[tuple[str, str, str], list[float]] = {}   # (shape, label, tool) -> client CPU seconds per run
FAILED: dict[str, str] = {}     # peer -> why it did not complete (it is not run again)
BASELINE = ""                   # --baseline: another s3pull executable
# A run's DEST is set aside, not deleted, while the shape's DESTs stay under this many bytes: on an
# ext4 without a journal (this machine's root), files created right after thousands were deleted
# pay a scan of the recently freed inodes (find_inode_bit -> recently_deleted: most of every tool's
# CPU on 2,000 x 1 KiB, docs/benchmarks.md), a cost of the benchmark's loop, not of the tools.
# --keep-bytes 0: every DEST deleted before the next run (how runs before 2026-11-28 12:30 measured).
KEEP_BYTES = 1 << 30


def verification_cost(times: dict[str, list[float]], checked: str) -> str | None:
    """Throughput lost to checking, against auto --no-checksum in the same run: from the medians,
    and the median of the per-round ratios (each round ran both back to back)."""
    off = times.get("s3pull auto --no-checksum")
    on = times.get(checked)
    if not off or not on:
        return None
    cost = 1 - statistics.median(off) / statistics.median(on)
    paired = statistics.median(1 - a / b for a, b in zip(off, on, strict=True))
    return (f"verification cost, {checked.removeprefix('s3pull ')} vs auto --no-checksum: {cost:.1%} of "
            f"throughput (paired rounds: {paired:.1%}; target <= 10%)")


def print_shape(shape: str, label: str, times: dict[str, list[float]], checks: dict[str, str]) -> list[str]:
    n, nbytes = SHAPES_TOTALS[shape]
    med = {k: statistics.median(v) for k, v in times.items()}
    desc = " + ".join(f"{c} x {s // MiB} MiB" if s >= MiB else f"{c} x {s // KiB} KiB"
                      for c, s in SHAPES[shape])
    how = {"put": "one PutObject", "multipart": "multipart, 8 MiB parts", "crc32c": "PutObject + CRC32C"}
    upload = how.get(UPLOAD.get(shape, ""), "uploaded by s5cmd")
    lines = [f"\n### {desc}, {upload} ({label}; load average {os.getloadavg()[0]:.1f} at the end)\n",
             "| tool | median s | objects/s | MB/s | speed vs s5cmd | client CPU s / 1,000 objects | "
             "client CPU s / GiB | CPU vs s5cmd | checked by |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = med.get("s5cmd")
    cpu = {k: statistics.median(CPU[(shape, label, k)]) * 1000 / n for k in med if (shape, label, k) in CPU}
    cpu_base = cpu.get("s5cmd")
    for name, secs in sorted(med.items(), key=lambda kv: kv[1]):
        ratio = f"{base / secs:.2f}" if base else "-"
        c = cpu.get(name)
        c_ratio = f"{c / cpu_base:.2f}" if c is not None and cpu_base else "-"
        per_obj, per_gib = ("-", "-") if c is None else (f"{c:.3f}", f"{c * n / 1000 / (nbytes / GiB):.3f}")
        lines.append(f"| {name} | {secs:.2f} | {n / secs:.0f} | {nbytes / secs / 1e6:.0f} | {ratio} | "
                     f"{per_obj} | {per_gib} | {c_ratio} | {checks.get(name, '-')} |")
    forced = {k: v for k, v in med.items()
              if k.startswith("s3pull ") and k.removeprefix("s3pull ") in ENGINES and k != "s3pull auto"}
    notes = []
    if "s3pull auto" in med and forced:
        best = min(forced, key=forced.get)
        notes.append(f"auto / best forced ({best}): {med['s3pull auto'] / forced[best]:.2f}x the time "
                     f"(target <= 1.10)")
    for checked in ("s3pull auto", "s3pull auto --etag-only"):
        cost = verification_cost(times, checked)
        if cost:
            notes.append(cost)
    if "s3pull auto" in med:
        for peer in (*PEERS, "s3pull obstore", "s3pull auto (baseline)"):
            if peer in med:
                notes.append(f"auto vs {peer}: {med[peer] / med['s3pull auto']:.2f}x as fast")
        if "s5cmd" in cpu and "s3pull auto" in cpu:
            notes.append(f"auto's client CPU per object: {cpu['s3pull auto'] / cpu['s5cmd']:.2f}x s5cmd's "
                         "(target <= 1.00 on 2,000 x 1 KiB)")
    for name, why in FAILED.items():
        notes.append(f"{name} did not complete: {why}")
    notes.append(f"load average (1 min) when this shape finished: {os.getloadavg()[0]:.1f}")
    lines.append("")
    lines += [f"- {x}" for x in notes]
    print("\n".join(lines), flush=True)
    return lines


def peer_aioboto3(bucket: str, dest: str) -> None:
    """What a user writes with aioboto3 and default settings: list, then gather every GET."""
    import asyncio

    import aioboto3

    async def main() -> None:
        session = aioboto3.Session()
        async with session.client("s3") as s3:
            keys = []
            paginator = s3.get_paginator("list_objects_v2")
            async for page in paginator.paginate(Bucket=bucket):
                keys += [o["Key"] for o in page.get("Contents", ())]

            async def one(key: str) -> None:
                resp = await s3.get_object(Bucket=bucket, Key=key)
                data = await resp["Body"].read()
                path = os.path.join(dest, key)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)

            await asyncio.gather(*(one(k) for k in keys))

    asyncio.run(main())


def peer_crt(bucket: str, dest: str) -> None:
    """boto3's CRT transfer manager (s3transfer.crt on awscrt's S3 client), default settings but
    one: boto3's own factory always asks for TLS, which a plain-HTTP endpoint answers by closing the
    socket (AWS_IO_SOCKET_CLOSED), so the client is built with TLS only for https endpoints."""
    import boto3
    import botocore.session
    from s3transfer.crt import (
        BotocoreCRTCredentialsWrapper,
        BotocoreCRTRequestSerializer,
        CRTTransferManager,
        create_s3_crt_client,
    )

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    region = os.environ["AWS_DEFAULT_REGION"]
    session = botocore.session.get_session()
    creds = BotocoreCRTCredentialsWrapper(session.get_credentials()).to_crt_credentials_provider()
    crt = create_s3_crt_client(region, crt_credentials_provider=creds, use_ssl=endpoint.startswith("https"))
    serializer = BotocoreCRTRequestSerializer(session, {"region_name": region, "endpoint_url": endpoint})
    lister = boto3.client("s3")
    with CRTTransferManager(crt, serializer) as tm:
        futures = []
        made: set[str] = set()
        for page in lister.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", ()):
                path = os.path.join(dest, obj["Key"])
                parent = os.path.dirname(path)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                futures.append(tm.download(bucket, obj["Key"], path))
        for f in futures:
            f.result()


def peer_obstore(bucket: str, dest: str) -> None:
    """obstore (Rust object_store): the listing streams into a queue, IN_FLIGHT coroutines GET
    and write; what a user writes with its asyncio API.  It checks no content."""
    import asyncio

    import obstore
    from obstore.store import S3Store

    endpoint = os.environ["AWS_ENDPOINT_URL"]
    store = S3Store(bucket, endpoint=endpoint, access_key_id=KEY, secret_access_key=SECRET,
                    region=os.environ["AWS_DEFAULT_REGION"], virtual_hosted_style_request=False,
                    client_options={"allow_http": endpoint.startswith("http:")})

    async def main() -> None:
        q: asyncio.Queue = asyncio.Queue(maxsize=4 * IN_FLIGHT)
        made: set[str] = set()

        async def worker() -> None:
            while (key := await q.get()) is not None:
                data = await (await obstore.get_async(store, key)).bytes_async()
                path = os.path.join(dest, key)
                parent = os.path.dirname(path)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    made.add(parent)
                with open(path, "wb") as f:
                    f.write(data)

        workers = [asyncio.create_task(worker()) for _ in range(IN_FLIGHT)]
        async for batch in obstore.list(store, chunk_size=1000):
            for meta in batch:
                await q.put(meta["path"])
        for _ in workers:
            await q.put(None)
        await asyncio.gather(*workers)

    asyncio.run(main())


def byte_compile() -> None:
    """Byte-compile manyfiles and the packages its CLI imports (click, rich) as an install would:
    with PYTHONDONTWRITEBYTECODE set (this shell sets it) and a venv made by uv (which does not
    compile), every `s3pull` run would compile them again (click alone: ~400 M instructions, a
    tenth of a second), a constant that is not s3pull's and that no pip install pays."""
    import compileall
    import importlib.util

    import manyfiles

    compileall.compile_dir(os.path.dirname(manyfiles.__file__), quiet=1)
    for name in ("click", "rich"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            compileall.compile_dir(os.path.dirname(spec.origin), quiet=1)


def main() -> None:
    global BASELINE, KEEP_BYTES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--latency", default="0", help="comma-separated added latencies in ms (0 = direct)")
    ap.add_argument("--latency-shapes", default="1k,1m,mixed", help="shapes measured behind latency")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tools", default="",
                    help="comma-separated subset (e.g. auto,http,s5cmd,auto --no-checksum)")
    ap.add_argument("--clean", action="store_true", help="delete the server's data at the end")
    ap.add_argument("--keep-bytes", type=int, default=KEEP_BYTES,
                    help="set the runs' DESTs aside up to this many bytes a shape, deleted after it "
                         "(0: delete each before the next run)")
    ap.add_argument("--baseline", default="", metavar="S3PULL",
                    help="another s3pull executable (e.g. main's .venv/bin/s3pull), run as 'auto (baseline)'")
    ap.add_argument("--peer-aioboto3", nargs=2, metavar=("BUCKET", "DEST"), help=argparse.SUPPRESS)
    ap.add_argument("--peer-crt", nargs=2, metavar=("BUCKET", "DEST"), help=argparse.SUPPRESS)
    ap.add_argument("--peer-obstore", nargs=2, metavar=("BUCKET", "DEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    for peer, fn in ((args.peer_aioboto3, peer_aioboto3), (args.peer_crt, peer_crt),
                     (args.peer_obstore, peer_obstore)):
        if peer:
            fn(*peer)
            return
    only = {ALIASES.get(t, t) for t in args.tools.split(",")} if args.tools else None
    BASELINE = args.baseline
    KEEP_BYTES = args.keep_bytes
    if only is not None and BASELINE:
        only.add("auto (baseline)")
    byte_compile()
    gw, port = start_versitygw()
    direct = f"http://127.0.0.1:{port}"
    toxi = None
    print(f"Machine: {machine_line()}; load average {os.getloadavg()[0]:.1f}; server: versitygw posix "
          f"backend on 127.0.0.1 (same 2 cores); median of {args.repeat}; command: {' '.join(sys.argv)}",
          flush=True)
    try:
        shapes = args.shapes.split(",")
        for shape in shapes:
            SHAPES_TOTALS[shape] = seed(shape, direct)
        for ms in (int(x) for x in args.latency.split(",")):
            endpoint = direct
            label = "direct"
            todo = shapes
            if ms:
                if toxi is None:
                    toxi = Toxiproxy(port)
                toxi.set_latency(ms)
                endpoint = f"http://127.0.0.1:{toxi.port}"
                label = f"+{ms} ms latency"
                todo = [s for s in shapes if s in args.latency_shapes.split(",")]
            for shape in todo:
                times, checks = measure(shape, endpoint, args.repeat, only, label)
                print_shape(shape, label, times, checks)
    finally:
        if toxi is not None:
            toxi.stop()
        gw.terminate()
        gw.wait()
        if args.clean:
            shutil.rmtree(DATA, ignore_errors=True)


if __name__ == "__main__":
    main()
