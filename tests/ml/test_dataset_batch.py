"""A batch read through the hit table (issue 27): ``Dataset.__getitems__`` reads what the packs hold in
one call (the C core's ``pread_records``: one ``preadv`` per run of records close together in a pack),
``IterableDataset`` reads ahead from the table ``prefetch`` at a time; everything else goes the
per-object way.  A batch gives exactly what the same items read one by one give, in every case below
(hits, misses, repeats, packs evicted by another process before or during the batch, a flipped byte
at rest), with the C reads and with their Python fallback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import manyfiles as mf
from manyfiles._core import checkpoints
from manyfiles.cache import _format as fmt
from manyfiles.cache import _hits


@pytest.fixture(params=["c", "python"])
def reads(request, monkeypatch) -> str:
    """Which implementation of ``pread_records`` the hit table uses (the C core's, or the fallback
    of an install where it is not built)."""
    if request.param == "python":
        monkeypatch.setattr(_hits, "pread_records", _hits.pread_records_python)
    else:
        assert _hits.pread_records_c is not None, "the C core is not built"
        monkeypatch.setattr(_hits, "pread_records", _hits.pread_records_c)
    return request.param


def _seed(s3, n: int) -> dict[str, bytes]:
    return {f"train/{i:03d}.bin": s3.put(f"train/{i:03d}.bin", os.urandom(200 + 53 * i)) for i in range(n)}


def _mine(ds) -> dict[str, int]:
    me = ds.worker_stats()[0]
    assert me["pid"] == os.getpid()
    return me


def _evict_everything(cache_dir: str) -> dict:
    """``manyfiles cache evict --to 0`` in a process of its own (a real eviction: packs unlinked, the
    generation bumped)."""
    exe = os.path.join(os.path.dirname(sys.executable), "manyfiles")
    r = subprocess.run([exe, "cache", "evict", "--dir", cache_dir, "--to", "0", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _data(samples) -> list[bytes]:
    return [s.data for s in samples]


def test_a_batch_equals_its_items_read_one_by_one_hits_misses_and_repeats(s3, cache, reads):
    objs = _seed(s3, 80)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    truth = [objs[k] for k in ds.keys]
    ds.__getitems__(list(range(0, 80, 2)))           # the even ones fetched, packed behind
    ds.cache.flush()
    before = _mine(ds)
    batch = [79, 0, 2, 1, 2, -1, -80, 40, 41, 3, *range(4, 80, 3)]
    got = ds.__getitems__(batch)
    after = _mine(ds)
    assert _data(got) == [truth[i] for i in batch]
    assert [s.key for s in got] == [ds.keys[i] for i in batch]
    evens = sum(1 for i in batch if i % 2 == 0)
    assert after["packed_hits"] - before["packed_hits"] == evens, "the even ones: one batch read"
    assert after["samples"] - before["samples"] == len(batch)
    assert after["hit_bytes"] - before["hit_bytes"] >= sum(len(truth[i]) for i in batch if i % 2 == 0)
    assert got == [ds[i] for i in batch], "a batch is its items read one by one"
    ds.cache.flush()
    assert ds.__getitems__(batch) == got
    with pytest.raises(IndexError):
        ds.__getitems__([0, 80])


def test_an_index_repeated_in_a_batch_of_misses_is_one_get_and_the_same_bytes(s3, cache):
    """Two GETs of one key in flight were one outcome's: when both bytes came before the first was
    waited for, the second turn got no bytes and no error (``raise None``: a TypeError, under load)."""
    objs = _seed(s3, 6)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    batch = [3, 3, 5, 0, 5, 3]
    got = ds.__getitems__(batch)
    assert _data(got) == [objs[ds.keys[i]] for i in batch]
    keys = sorted(path.partition("?")[0].rsplit("/", 2)[-1] for _, path, _ in s3.gets())
    assert keys == ["000.bin", "003.bin", "005.bin"], "one GET per object"


def test_a_batch_of_records_side_by_side_in_a_pack_is_one_read(s3, cache):
    """32 records appended one after the other: the C core reads them with one ``preadv`` (this
    thread's read system calls, /proc/thread-self/io), where the per-object path made 32."""
    assert _hits.pread_records is _hits.pread_records_c, "the C core is not built"
    objs = _seed(s3, 32)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    batch = list(range(32))
    ds.__getitems__(batch)                  # fetched, appended to this process's one pack
    ds.cache.flush()
    assert _data(ds.__getitems__(batch)) == [objs[k] for k in ds.keys]     # (the table loaded)

    def reads() -> int:
        with open("/proc/thread-self/io", "rb") as f:
            return int(re.search(rb"syscr: (\d+)", f.read()).group(1))

    base = reads()
    idle = reads() - base                   # what reading the counter itself costs
    start = reads()
    got = ds.__getitems__(batch)
    made = reads() - start - idle
    assert _data(got) == [objs[k] for k in ds.keys]
    assert made == 1, f"{made} read system calls for 32 records side by side in one pack"


def test_packs_evicted_by_another_process_before_or_during_a_batch_are_never_wrong_bytes(
        s3, cache_dir, cache, reads):
    objs = _seed(s3, 40)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    truth = [objs[k] for k in ds.keys]
    batch = [7, *range(40), 3]
    ds.__getitems__(batch)
    ds.cache.flush()
    assert _data(ds.__getitems__(batch)) == [truth[i] for i in batch]
    gets = len(s3.gets())

    # during: the table has looked (refreshed), then every pack goes before it reads.  The records are
    # read from the descriptors it holds (a pack is only ever appended to: the same bytes), or missed.
    evicted: list[dict] = []
    checkpoints.add("hit-batch", lambda: None if evicted else evicted.append(_evict_everything(cache_dir)))
    try:
        got = ds.__getitems__(batch)
    finally:
        checkpoints.remove("hit-batch")
    assert evicted and evicted[0]["entries"] == 40
    assert not ds.cache._store.packs.files(), "the packs are gone from the disk"
    assert _data(got) == [truth[i] for i in batch]
    assert got == [ds[i] for i in batch]

    # after: the next batch sees the packs removed (their descriptors closed): misses, fetched again
    ds.cache.flush()                        # (what the reads above fetched is accounted, then evicted)
    _evict_everything(cache_dir)
    gets = len(s3.gets())
    before = _mine(ds)
    got = ds.__getitems__(batch)
    assert _data(got) == [truth[i] for i in batch]
    assert _mine(ds)["packed_hits"] == before["packed_hits"], "a removed pack's record is a miss"
    assert len(s3.gets()) - gets >= 40, "fetched again"
    ds.cache.flush()
    assert _data(ds.__getitems__(batch)) == [truth[i] for i in batch]


def _flip_a_payload_byte(cache_dir: str, objid: bytes) -> None:
    import sqlite3

    with sqlite3.connect(os.path.join(cache_dir, fmt.INDEX)) as db:
        pack, offset, length = db.execute("SELECT pack, offset, length FROM packed WHERE objid = ?",
                                          (objid,)).fetchone()
    with open(os.path.join(cache_dir, fmt.pack_relpath(pack)), "r+b") as f:       # bit rot at rest
        f.seek(offset + fmt.RECORD_HEADER_SIZE + length // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))


def test_a_flipped_byte_at_rest_is_never_served_with_verify_and_a_batch_reads_as_its_items(
        s3, cache_dir, cache, reads):
    objs = _seed(s3, 30)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    truth = [objs[k] for k in ds.keys]
    ds.__getitems__(list(range(30)))
    ds.cache.flush()                        # (written and accounted: the index names every record)
    _flip_a_payload_byte(cache_dir, ds._hits.ids[16 * 11:16 * 12])
    batch = [11, *range(30), 11]

    # verify=True: the record is checked before its first use in the process, fails, is dropped and
    # fetched again; a batch never serves it
    checked = mf.Cache(cache_dir, min_free=0, settings=s3.settings, verify=True)
    vds = mf.Dataset(s3.url("train/"), cache=checked)
    gets = len(s3.gets())
    with pytest.warns(RuntimeWarning, match="corrupt cache record"):
        assert _data(vds.__getitems__(batch)) == [truth[i] for i in batch]
    assert {key for _, key, _ in s3.gets()[gets:]} == {f"/{s3.bucket}/{ds.keys[11]}"}, \
        "the damaged one fetched again (once per place in the batch), the others read from the packs"
    vds.cache.flush()
    assert vds.cache.stats().corrupt == 1, "detected"
    assert _data(vds.__getitems__(batch)) == [truth[i] for i in batch]
    checked.close()

    # verify=False: a hit is not re-hashed (docs/cache.md, "At rest"); a batch reads exactly what the
    # same items read one by one read -- here the bytes at rest, the record re-fetched above included
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert ds.__getitems__(batch) == [ds[i] for i in batch]


@pytest.mark.parametrize("prefetch", [0, 1, 5, 32])
def test_iteration_reads_ahead_from_the_table_in_its_order(s3, cache_dir, cache, reads, prefetch):
    objs = _seed(s3, 50)
    ds = mf.IterableDataset(s3.url("train/"), cache=cache, settings=s3.settings, prefetch=prefetch,
                            shuffle=True, seed=3)
    truth = dict(objs)
    ds.set_epoch(0)
    order = ds.order()
    first = [(s.key, s.data) for s in ds]                       # all fetched
    ds.cache.flush()
    ds.set_epoch(0)
    again = [(s.key, s.data) for s in ds]                       # all from the packs
    assert again == first and [d for _, d in first] == [truth[k] for k, _ in first]
    assert [k for k, _ in first] == [ds.keys[i] for i in order]
    assert _mine(ds)["packed_hits"] == 50
    mix = mf.Cache(cache_dir + "-mix", min_free=0)             # a mix: every other one packed
    ds = mf.IterableDataset(s3.url("train/"), cache=mix, settings=s3.settings, prefetch=prefetch,
                            shuffle=True, seed=3)
    ds.set_epoch(7)
    order = ds.order()
    mf.Dataset(s3.url("train/"), cache=mix, settings=s3.settings).__getitems__(order[::2])
    ds.cache.flush()
    mixed = [(s.key, s.data) for s in ds]
    counts = _mine(ds)                                          # (this dataset's only reads)
    assert (counts["packed_hits"], counts["fetched"]) == (25, 25), "a mix of hits and misses"
    assert [k for k, _ in mixed] == [ds.keys[i] for i in order]
    assert [d for _, d in mixed] == [truth[k] for k, _ in mixed]


def test_a_batch_of_local_files_reads_them_from_packs_and_sees_a_change(local_files, cache, reads):
    root, files = local_files(120, 3)
    ds = mf.Dataset(root, cache=cache)
    batch = [5, *range(120), 5]
    assert _data(ds.__getitems__(batch)) == [files[ds.keys[i]] for i in batch]
    ds.cache.flush()
    before = _mine(ds)
    assert _data(ds.__getitems__(batch)) == [files[ds.keys[i]] for i in batch]
    assert _mine(ds)["packed_hits"] - before["packed_hits"] == len(batch)
    changed = ds.keys[5]
    new = b"new" + files[changed][3:]
    Path(changed).write_bytes(new)                  # same size, new bytes: its stat says so
    os.utime(changed, ns=(1, 1))
    got = ds.__getitems__(batch)
    assert [s.data for s in got] == [new if ds.keys[i] == changed else files[ds.keys[i]] for i in batch]
    assert got == [ds[i] for i in batch]


def test_a_batch_of_misses_resolves_its_settings_once_and_a_new_call_sees_the_environment_change(
        s3, cache, monkeypatch):
    """Each fill of a batch's misses resolved the dataset's settings again: the whole environment
    scanned and the two AWS files stat'ed per object.  The dataset's settings were resolved when it
    listed and its fetcher uses them: its fills are kept under them, resolved once.  A change of the
    environment is still seen by every new call of the public API that resolves settings."""
    from manyfiles.s3 import config
    from manyfiles.s3.store import store_for

    objs = _seed(s3, 40)
    scans = []
    real = config.environment_key
    monkeypatch.setattr(config, "environment_key", lambda: scans.append(1) or real())
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    ds = mf.Dataset(s3.url("train/"), cache=cache)             # the endpoint from the environment
    scans.clear()
    assert _data(ds.__getitems__(list(range(40)))) == list(objs.values())
    assert len(scans) <= 10, f"{len(scans)} environment scans for a batch of 40 misses"
    cache.flush()
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")   # nothing listens there
    assert store_for(None, s3.bucket).route.ep.port == 1, "a new store: the environment as it is now"
    gets = len(s3.gets())
    assert _data(ds.__getitems__(list(range(40)))) == list(objs.values()), "the dataset's fills are hits"
    assert len(s3.gets()) == gets


def test_a_refresh_after_the_environment_changed_fetches_from_the_endpoint_it_names_now(
        s3, cache, monkeypatch):
    """The fetcher was made with the settings of the first listing: a refresh that resolves to another
    endpoint (a notebook that changed AWS_ENDPOINT_URL) must not fetch its misses from the old one."""
    from s3util import SECRETS, FaultProxy

    objs = _seed(s3, 4)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    ds = mf.Dataset(s3.url("train/"), cache=cache)
    assert _data(ds.__getitems__([0, 1])) == [objs[k] for k in ds.keys[:2]]
    other = FaultProxy(s3.proxy.upstream.geturl(), secrets=SECRETS)     # the same server, another endpoint
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", other.url)
        ds.refresh()
        gets = len(s3.gets())
        assert _data(ds.__getitems__([2, 3])) == [objs[k] for k in ds.keys[2:]]
        assert len(s3.gets()) == gets, "fetched from the endpoint of the first listing"
        assert len([r for r in other.requests if r[0] == "GET" and "list-type" not in r[1]]) == 2
    finally:
        other.close()
