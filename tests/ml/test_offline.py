"""Offline reads: the S3 server stopped for real, a Dataset epoch over 2,000 cached objects, pyarrow
through the filesystem, mf.open and cache warm are served from the cache at the versions validated
last, with one warning; an object never cached raises one clear FileNotFoundError.

The reader runs in a network namespace of its own (with its own moto server on that namespace's
loopback), so the kernel's TCP counters of that namespace (``ActiveOpens``: every connection
attempt, refused ones too) count exactly the requests it tried after the server was stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

SCRIPT = textwrap.dedent("""
    import io, json, logging, os, sys, warnings
    sys.path.insert(0, sys.argv[2])
    from s3util import CREDS
    os.environ.update(CREDS)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.server import ThreadedMotoServer
    import boto3, fsspec, pyarrow as pa, pyarrow.parquet as pq
    import manyfiles as mf
    from manyfiles.s3 import ClientSettings

    def tcp_opens():
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Tcp:")]
        return int(rows[1][rows[0].index("ActiveOpens")])

    out = {}
    cache_dir = sys.argv[1]
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    settings = ClientSettings(endpoint_url=endpoint, region="us-east-1")
    admin = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    admin.create_bucket(Bucket="offline-data")
    objs = {f"train/{i:05d}.bin": os.urandom(100 + i % 700) for i in range(2000)}
    for k, v in objs.items():
        admin.put_object(Bucket="offline-data", Key=k, Body=v)
    buf = io.BytesIO()
    table = pa.table({"id": list(range(1000))})
    pq.write_table(table, buf)
    admin.put_object(Bucket="offline-data", Key="t/part-0.parquet", Body=buf.getvalue())
    admin.put_object(Bucket="offline-data", Key="never-read.bin", Body=b"x")
    admin.put_object(Bucket="offline-data", Key="one.bin", Body=b"one")

    # online: one epoch fills the cache; the filesystem and mf.open read too
    ds = mf.Dataset("s3://offline-data/train/", cache=cache_dir, settings=settings)
    assert [s.data for s in ds] == list(objs.values())
    fs = fsspec.filesystem("manyfiles", cache=cache_dir, endpoint_url=endpoint, region="us-east-1",
                           skip_instance_cache=True)
    assert pq.read_table("offline-data/t/", filesystem=fs).equals(table)
    assert mf.open("s3://offline-data/one.bin", cache=cache_dir, settings=settings).read() == b"one"
    ds.cache.flush()
    mf.Cache(cache_dir).flush()

    srv.stop()                                  # the S3 server is gone
    opens = tcp_opens()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = mf.Dataset("s3://offline-data/train/", cache=cache_dir, settings=settings)
        out["epoch"] = [s.data for s in ds] == list(objs.values())
        out["opens_after_epoch"] = tcp_opens() - opens
        fs = fsspec.filesystem("manyfiles", cache=cache_dir, endpoint_url=endpoint, region="us-east-1",
                               skip_instance_cache=True)
        out["pyarrow"] = pq.read_table("offline-data/t/", filesystem=fs).equals(table)
        out["mf_open"] = mf.open("s3://offline-data/one.bin", cache=cache_dir, settings=settings).read().decode()
        try:
            fs.cat_file("offline-data/never-read.bin")
        except FileNotFoundError as exc:
            out["uncached"] = str(exc)
        try:
            mf.open("s3://offline-data/never-read.bin", cache=cache_dir, settings=settings)
        except FileNotFoundError as exc:
            out["uncached_open"] = str(exc)
        report = mf.Cache(cache_dir, settings=settings).warm(["s3://offline-data/train/"])
        out["warm"] = [report.objects, report.cached, len(report.failures)]
        out["opens_after_all"] = tcp_opens() - opens
    out["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "OfflineWarning"]
    explicit = mf.Dataset("s3://offline-data/train/", cache=cache_dir, settings=settings, offline=True)
    out["explicit"] = explicit[1999].data == objs["train/01999.bin"]
    try:
        mf.Dataset("s3://offline-data/train/", cache=cache_dir, settings=settings, offline=False)
    except Exception as exc:
        out["never_fall_back"] = [type(exc).__name__, isinstance(exc, ConnectionError)]
    print(json.dumps(out))
""")


@pytest.fixture
def netns():
    name = f"mfoff-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot make a network namespace here: {made.stderr.strip()}")
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_with_s3_stopped_everything_cached_is_served_and_nothing_is_asked_again(netns, tmp_path):
    s3tests = os.path.join(os.path.dirname(__file__), "..", "s3")
    proc = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", SCRIPT, str(tmp_path / "c"),
                           s3tests], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["epoch"], "the offline epoch did not read every object exactly"
    assert out["opens_after_epoch"] == 1, "more than the first failed request went to the stopped server"
    assert out["opens_after_all"] == 1, "the reads after the first failure asked the server again"
    assert out["pyarrow"] and out["mf_open"] == "one"
    for msg in (out["uncached"], out["uncached_open"]):
        assert "never-read.bin" in msg and "offline" in msg and "\n" not in msg, msg
    assert out["warm"] == [2000, 2000, 0]
    assert len(out["warnings"]) == 1 and "s3://offline-data/train/" in out["warnings"][0], out["warnings"]
    assert "cannot be reached" in out["warnings"][0]
    assert out["explicit"]
    assert out["never_fall_back"][1] is False or out["never_fall_back"][0]
