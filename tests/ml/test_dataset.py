"""mf.Dataset, mf.IterableDataset and mf.s3.list against moto behind the signature-checking fault proxy."""

from __future__ import annotations

import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap
import types

import pytest

import manyfiles as mf
from manyfiles.errors import ObjectChanged, UsageError


def _seed(s3, n: int = 24, prefix: str = "train/") -> dict[str, bytes]:
    return {f"{prefix}{i:03d}.bin": s3.put(f"{prefix}{i:03d}.bin", os.urandom(700 + 131 * i))
            for i in range(n)}


# -- the cache hooks the datasets stand on ------------------------------------------------------------

def test_a_listed_version_is_read_without_a_head_and_a_changed_one_never_mixes(s3, cache_dir):
    data = s3.put("a.bin", os.urandom(5000))
    info = next(iter(mf.s3.list(s3.url("a.bin"), settings=s3.settings)))
    with mf.Cache(cache_dir, min_free=0, settings=s3.settings) as cache:
        assert cache.get_bytes(s3.url("a.bin"), etag=info.etag, size=info.size) == data
        assert cache.get_bytes(s3.url("a.bin"), etag=info.etag, size=info.size) == data
        assert s3.heads() == [] and len(s3.gets()) == 1, "listed: no HEAD, and the second read is a hit"
        s3.put("b.bin", b"old")
        old = next(iter(mf.s3.list(s3.url("b.bin"), settings=s3.settings)))
        s3.put("b.bin", b"new!")
        with pytest.raises(ObjectChanged):      # the GET is pinned to the listed ETag
            cache.get_bytes(s3.url("b.bin"), etag=old.etag, size=old.size)
        assert cache.get_bytes(s3.url("b.bin")) == b"new!"
        with pytest.raises(UsageError):
            cache.get_bytes(s3.url("a.bin"), etag=info.etag)


def test_mf_open_takes_a_ttl(s3, cache_dir):
    data = s3.put("t.bin", os.urandom(3000))
    cache = mf.Cache(cache_dir, min_free=0, settings=s3.settings)
    with mf.open(s3.url("t.bin"), cache=cache) as f:
        assert f.read() == data
    cache.flush()
    with mf.open(s3.url("t.bin"), cache=cache) as f:      # default: validate on open
        assert f.read() == data
    assert len(s3.heads()) == 1
    with mf.open(s3.url("t.bin"), cache=cache, ttl=600) as f:
        assert f.read() == data
    assert len(s3.heads()) == 1 and len(s3.gets()) == 1, "within the ttl: no request"
    with pytest.raises(UsageError):
        mf.open(s3.url("t.bin"), ttl=600)
    cache.close()


def test_object_counters_reach_stats_and_render_as_html(s3, cache_dir):
    objs = _seed(s3, 5)
    with mf.Cache(cache_dir, min_free=0, settings=s3.settings) as cache:
        for key in objs:
            cache.get_bytes(s3.url(key))
        cache.flush()
        for key in objs:
            cache.get_bytes(s3.url(key))
        s = cache.stats()
        assert (s.object_misses, s.object_hits) == (5, 5)
        page = s._repr_html_()
        assert "objects read" in page and "5 hits" in page and "<table>" in page
        assert s.to_dict()["object_hit_ratio"] == 0.5


def test_s3_list_is_a_table_that_downloads_nothing(s3):
    objs = _seed(s3, 12)
    s3.put("train/skip.tmp", b"x")
    table = mf.s3.list(s3.url("train/"), exclude=["*.tmp"], settings=s3.settings)
    assert [r.key for r in table] == sorted(objs)
    assert {r.key: r.size for r in table} == {k: len(v) for k, v in objs.items()}
    assert all(r.etag == hashlib.md5(objs[r.key]).hexdigest() and r.mtime > 1e9 for r in table)
    df = table.to_pandas()
    assert list(df.columns) == ["key", "size", "etag", "mtime"] and df["size"].sum() == table.total_bytes
    assert table.to_arrow().num_rows == 12 and "ObjectTable" in table._repr_html_()
    assert s3.gets() == [] and s3.heads() == []


# -- Dataset -------------------------------------------------------------------------------------------

def test_dataset_is_byte_exact_in_key_order_and_epoch_2_sends_no_request(s3, cache):
    objs = _seed(s3)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert len(ds) == len(objs) and ds.keys == sorted(objs)
    assert [(s.key, s.data) for s in ds] == sorted(objs.items())
    assert ds[3] == (ds.keys[3], objs[ds.keys[3]]) and ds[-1].data == objs[ds.keys[-1]]
    assert [s.key for s in ds.__getitems__([5, 0, 7])] == [ds.keys[5], ds.keys[0], ds.keys[7]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    requests = len(s3.proxy.requests)
    assert len(s3.gets()) == len(objs) and s3.heads() == []
    ds.cache.flush()
    assert [s.data for s in ds] == [objs[k] for k in ds.keys]
    assert len(s3.proxy.requests) == requests, "epoch 2 sent requests"
    # a transform gets the Sample; a changed object is fetched again after refresh()
    ds2 = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings, transform=lambda s: len(s.data))
    assert list(ds2) == [len(objs[k]) for k in ds2.keys]
    new = s3.put(ds.keys[0], b"changed")
    assert ds[0].data == objs[ds.keys[0]], "a dataset reads the versions it listed (from the cache)"
    ds.refresh()
    assert ds[0].data == new


def test_dataset_over_a_local_folder(tmp_path, local_files, cache):
    root, files = local_files(7, 2)
    ds = mf.Dataset(root, cache=cache, exclude=["f006.bin"])
    assert ds.keys == sorted(k for k in files if not k.endswith("f006.bin"))
    assert all(s.data == files[s.key] for s in ds)
    with pytest.raises(mf.NotFound):
        mf.Dataset(tmp_path / "missing", cache=cache)
    with pytest.raises(UsageError):
        mf.Dataset(root, cache=None)


def _read_share(blob: bytes, indexes: list[int]) -> dict[str, str]:
    ds = pickle.loads(blob)
    return {s.key: hashlib.sha256(s.data).hexdigest() for s in ds.__getitems__(indexes)}


def test_dataset_in_two_spawned_workers_then_a_new_process_sends_no_get(s3, cache_dir, cache):
    objs = _seed(s3, 30)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    blob = pickle.dumps(ds)
    pool = mp.get_context("spawn").Pool(2)     # what DataLoader(multiprocessing_context="spawn") does
    try:
        shares = pool.starmap(_read_share, [(blob, list(range(0, 30, 2))), (blob, list(range(1, 30, 2)))])
    finally:
        pool.close()        # workers leave as DataLoader's do (their finalizers write the queued fills)
        pool.join()
    got = {**shares[0], **shares[1]}
    assert got == {k: hashlib.sha256(v).hexdigest() for k, v in objs.items()}
    assert len(s3.gets()) == 30, "each object fetched once, by one worker"
    before = len(s3.gets())
    code = textwrap.dedent(f"""
        import hashlib, json, manyfiles as mf
        from manyfiles.s3 import ClientSettings
        ds = mf.Dataset("s3://{s3.bucket}/train/", cache=mf.Cache({cache_dir!r}, min_free=0),
                        settings=ClientSettings(endpoint_url={s3.endpoint!r}, region="us-east-1"))
        print(json.dumps({{s.key: hashlib.sha256(s.data).hexdigest() for s in ds}}))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **s3.env}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == got
    assert len(s3.gets()) == before, "the new process sent object GETs"
    assert s3.heads() == []


# -- IterableDataset -----------------------------------------------------------------------------------

def test_iterable_dataset_shards_by_rank_and_worker_and_shuffles_by_seed_and_epoch(s3, cache):
    objs = _seed(s3, 20)
    seen = []
    for rank in range(2):
        ds = mf.IterableDataset(s3.url("train/"), cache=cache, settings=s3.settings, shuffle=True, seed=7,
                                rank=rank, world_size=2, prefetch=3)
        ds.set_epoch(1)
        for w in range(3):
            seen += [(s.key, s.data) for s in ds.worker(w, 3)]
    assert sorted(seen) == sorted(objs.items()), "every object exactly once per epoch"
    a = mf.IterableDataset(s3.url("train/"), cache=cache, settings=s3.settings, shuffle=True, seed=7)
    first, second = a.order(), (a.set_epoch(1), a.order())[1]
    assert sorted(first) == sorted(second) == list(range(20)) and first != second
    b = pickle.loads(pickle.dumps(a))
    assert b.order() == second, "the same seed and epoch give the same order in every process"
    assert [s.key for s in a] == [a.keys[i] for i in second]
    assert a.epoch == 2, "iterating advanced the epoch"


def test_iterable_dataset_follows_torch_worker_info_when_torch_is_loaded(s3, cache, monkeypatch):
    """The protocol without torch: a stand-in torch.utils.data whose get_worker_info says worker 1 of 2."""
    _seed(s3, 9)
    fake = types.ModuleType("torch.utils.data")
    fake.get_worker_info = lambda: types.SimpleNamespace(id=1, num_workers=2)
    monkeypatch.setitem(sys.modules, "torch.utils.data", fake)
    ds = mf.IterableDataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert [s.key for s in ds] == ds.keys[1::2]
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    assert ds.order() == list(range(9))[2 * 2 + 1::6]


# -- faults ---------------------------------------------------------------------------------------------

def test_a_flipping_lying_link_never_yields_wrong_bytes_nor_keeps_them(s3, cache):
    from manyfiles.errors import TransferError

    objs = _seed(s3, 30)
    s3.proxy.random_faults = (0.5, ("flip", "wrong-range", "truncate"),
                              lambda m, p, h: m == "GET" and "list-type" not in p)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    served = {}
    for i in range(len(ds)):
        with contextlib.suppress(TransferError):    # a fault on every retry: an error, never wrong bytes
            served[ds.keys[i]] = ds[i].data
    it = mf.IterableDataset(s3.url("train/"), cache=cache, settings=s3.settings, prefetch=8)
    with contextlib.suppress(TransferError):    # (an error ends the iteration, as it would a loader's)
        for s in it:
            served.setdefault(s.key, s.data)
            assert s.data == objs[s.key]
    assert s3.proxy.applied, "no fault was injected"
    assert served and all(served[k] == objs[k] for k in served), "wrong bytes served"
    ds.cache.flush()
    s3.proxy.random_faults = None
    clean = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert {s.key: s.data for s in clean} == objs, "wrong bytes kept in the cache"


def test_a_dataset_dropped_ends_its_fetchers_threads(s3, cache):
    """A notebook makes datasets again and again: each one's fetcher (its connections and threads)
    ends when the dataset is collected, not with the process."""
    import gc
    import threading
    import time

    objs = _seed(s3, n=6)
    before = set(threading.enumerate())
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert [s.data for s in ds] == [objs[k] for k in ds.keys]           # cold: fetched
    started = [t for t in threading.enumerate() if t not in before and t.name.startswith("s3pull-")]
    assert started, "the dataset fetched without a fetcher's threads?"
    del ds
    gc.collect()
    deadline = time.monotonic() + 30          # for them all: they end at once, or never
    for t in started:
        t.join(max(0.0, deadline - time.monotonic()))
    assert [t.name for t in started if t.is_alive()] == []
