"""Offline reads: the S3 server stopped for real, a Dataset epoch over 2,000 cached objects, pyarrow
through the filesystem, mf.open and cache warm are served from the cache at the versions validated
last, with one warning and no request after the first failed one; an object never cached is asked
with the usual retries (a blip on a cold cache is ridden out), then raises one clear
FileNotFoundError.

The reader runs in a network namespace of its own (with its own moto server on that namespace's
loopback), so the kernel's TCP counters of that namespace (``ActiveOpens``: every connection
attempt, refused ones too) count exactly the requests it tried while the server was stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

SCRIPT = textwrap.dedent("""
    import hashlib, io, json, logging, os, sys, threading, time, warnings
    sys.path.insert(0, sys.argv[2])
    from s3util import CREDS
    os.environ.update(CREDS)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer
    import boto3, fsspec, pyarrow as pa, pyarrow.parquet as pq
    import manyfiles as mf
    from manyfiles.s3 import ClientSettings, RetryPolicy

    def tcp_opens():
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Tcp:")]
        return int(rows[1][rows[0].index("ActiveOpens")])

    def attempts_since(opens):
        return tcp_opens() - opens

    out = {}
    cache_dir = sys.argv[1]
    kept = mf.Cache(cache_dir, min_free=0)     # what is filled stays, however full the disk
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    settings = ClientSettings(endpoint_url=endpoint, region="us-east-1")
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="offline-data")
    # seeded in the server's store (2,000 PUTs over HTTP would be most of this test's time)
    store = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    objs = {f"train/{i:05d}.bin": os.urandom(100 + i % 700) for i in range(2000)}
    buf = io.BytesIO()
    table = pa.table({"id": list(range(1000))})
    pq.write_table(table, buf)
    for key, data in [*objs.items(), ("t/part-0.parquet", buf.getvalue()), ("never-read.bin", b"x"),
                      ("one.bin", b"one"), ("blip.bin", b"blip")]:
        store.put_object("offline-data", key, data)

    # online: the listing a Dataset makes is kept, and the cache filled as a Dataset's epoch fills it
    # (cache.fill of each object, checked whole against its ETag: 2,000 GETs over HTTP would be most
    # of this test's time; tests/ml/test_dataset.py reads epochs over HTTP); the filesystem and
    # mf.open read too
    filler = mf.Cache(cache_dir, min_free=0, settings=settings)
    listing = filler.list_objects("s3://offline-data/train/")
    assert [o.key for o in listing.objects] == list(objs)
    for o in listing.objects:
        data = objs[o.key]
        assert hashlib.md5(data).hexdigest() == o.etag.strip('"')
        filler.fill(f"s3://offline-data/{o.key}", data, etag=o.etag, checked="md5",
                    listed_at=listing.listed_at)
    filler.flush()
    assert filler.stats().entries == 2000
    fs = fsspec.filesystem("manyfiles", cache=kept, endpoint_url=endpoint, region="us-east-1",
                           skip_instance_cache=True)
    assert pq.read_table("offline-data/t/", filesystem=fs).equals(table)
    assert mf.open("s3://offline-data/one.bin", cache=kept, settings=settings).read() == b"one"

    # a blip on a cold cache: the server is stopped while something never cached is read (an object,
    # a prefix never listed); once the read has tried twice (its first request and a retry), the
    # server answers again on its port
    patient = mf.Cache(cache_dir, min_free=0, settings=settings,
                       retry=RetryPolicy(attempts=200, base=0.02, cap=0.1))

    def blip(read):
        global srv
        srv.stop()
        got = {}

        def run():
            try:
                got["data"] = read()
            except Exception as exc:
                got["data"] = f"{type(exc).__name__}: {exc}"

        opens = tcp_opens()
        reader = threading.Thread(target=run)
        reader.start()
        deadline = time.monotonic() + 120
        while reader.is_alive() and attempts_since(opens) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)           # (polls the kernel's counter: the event is a refused connection)
        tries = attempts_since(opens)
        srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        srv.start()
        reader.join()
        return [tries, got["data"]]

    out["blip_object"] = blip(lambda: mf.open("s3://offline-data/blip.bin", cache=patient).read().decode())
    out["blip_listing"] = blip(lambda: [s.data.decode() for s in mf.Dataset("s3://offline-data/blip",
                                                                           cache=patient)])
    patient.close()
    mf.Cache(cache_dir, min_free=0).flush()

    srv.stop()                                  # the S3 server is gone
    class Quick(RetryPolicy):       # a test's budget: unanswered requests retried for 0.3 s, no grace
        GRACE = 0.0

    quick = mf.Cache(cache_dir, min_free=0, settings=settings,
                     retry=Quick(attempts=3, base=0.01, cap=0.05, stall_timeout=0.3))
    opens = tcp_opens()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = mf.Dataset("s3://offline-data/train/", cache=kept, settings=settings)
        out["epoch"] = [s.data for s in ds] == list(objs.values())
        out["packed_hits"] = sum(s["packed_hits"] for s in ds.worker_stats())   # (records of packs)
        out["opens_after_epoch"] = attempts_since(opens)
        fs = fsspec.filesystem("manyfiles", cache=quick, settings=settings, skip_instance_cache=True)
        out["pyarrow"] = pq.read_table("offline-data/t/", filesystem=fs).equals(table)
        out["mf_open"] = mf.open("s3://offline-data/one.bin", cache=quick).read().decode()
        report = mf.Cache(cache_dir, min_free=0, settings=settings).warm(["s3://offline-data/train/"])
        out["warm"] = [report.objects, report.cached, len(report.failures)]
        out["opens_after_cached"] = attempts_since(opens)
        try:                        # never cached: asked with the usual retries, then one error
            fs.cat_file("offline-data/never-read.bin")
        except FileNotFoundError as exc:
            out["uncached"] = str(exc)
        out["uncached_tries"] = attempts_since(opens) - out["opens_after_cached"]
        try:                        # given up on after those retries: not asked again for a while
            mf.open("s3://offline-data/never-read.bin", cache=quick)
        except FileNotFoundError as exc:
            out["uncached_open"] = str(exc)
        out["uncached_again_tries"] = attempts_since(opens) - sum(out[k] for k in ("opens_after_cached",
                                                                                 "uncached_tries"))
    out["warnings"] = [str(w.message) for w in caught if w.category.__name__ == "OfflineWarning"]
    explicit = mf.Dataset("s3://offline-data/train/", cache=kept, settings=settings, offline=True)
    out["explicit"] = explicit[1999].data == objs["train/01999.bin"]
    try:
        mf.Dataset("s3://offline-data/train/", cache=quick, offline=False)
    except Exception as exc:
        out["never_fall_back"] = [isinstance(exc, FileNotFoundError), str(exc)]
    print(json.dumps(out))
""")


def _stale_namespaces() -> None:
    """Remove the namespaces of earlier runs whose process is gone (a run killed before its teardown)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in listed:
        if name.startswith("mfoff-") and name.count("-") == 2:
            pid = name.split("-")[1]
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                subprocess.run(["ip", "netns", "del", name], check=False)


@pytest.fixture
def netns():
    _stale_namespaces()
    name = f"mfoff-{os.getpid()}-{uuid.uuid4().hex[:8]}"
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
    for what, expected in (("blip_object", "blip"), ("blip_listing", ["blip"])):
        tries, got = out[what]
        assert tries >= 2 and got == expected, f"{what}: a blip on a cold cache was not ridden out: {got}"
    assert out["epoch"], "the offline epoch did not read every object exactly"
    assert out["packed_hits"] == 2000, "the offline epoch did not read the objects from their packs"
    assert out["opens_after_epoch"] == 1, "more than the first failed request went to the stopped server"
    assert out["opens_after_cached"] == 1, "the reads after the first failure asked the server again"
    assert out["pyarrow"] and out["mf_open"] == "one"
    assert out["warm"] == [2000, 2000, 0]
    assert out["uncached_tries"] >= 2, "an object never cached was not asked with the cache's retries"
    assert out["uncached_again_tries"] == 0
    for msg in (out["uncached"], out["uncached_open"]):
        assert "never-read.bin" in msg and "offline" in msg and "\n" not in msg, msg
    assert len(out["warnings"]) == 1 and "s3://offline-data/train/" in out["warnings"][0], out["warnings"]
    assert "cannot be reached" in out["warnings"][0]
    assert out["explicit"]
    never_found, text = out["never_fall_back"]
    assert not never_found and "offline-data" in text and "offline (" not in text, text
