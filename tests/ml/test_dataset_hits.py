"""A dataset's hit path (issue 27): packed objects read with one ``pread``, no SQLite; the counters
of every worker gathered by the process that made the dataset; file datasets through the packs."""

from __future__ import annotations

import multiprocessing as mp
import os
import sqlite3
import threading
from pathlib import Path

import manyfiles as mf


def _seed(s3, n: int) -> dict[str, bytes]:
    return {f"train/{i:03d}.bin": s3.put(f"train/{i:03d}.bin", os.urandom(300 + 97 * i)) for i in range(n)}


def _mine(ds) -> dict[str, int]:
    """This process's counters (the first of ``worker_stats``)."""
    me = ds.worker_stats()[0]
    assert me["pid"] == os.getpid()
    return me


def _statements_by_thread(monkeypatch) -> list[tuple[int, str]]:
    """(thread, SQL) of every statement run from now on through connections opened from now on:
    ``sqlite3.connect`` hands out a Connection that notes each one (the cache's SQLite is real)."""
    calls: list[tuple[int, str]] = []

    class Noting(sqlite3.Connection):
        def execute(self, sql, *args):
            calls.append((threading.get_ident(), sql))
            return super().execute(sql, *args)

        def executemany(self, sql, *args):
            calls.append((threading.get_ident(), sql))
            return super().executemany(sql, *args)

    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **kw: real(*a, **{"factory": Noting, **kw}))
    return calls


def test_a_packed_hit_is_one_pread_without_sqlite_and_without_a_request(s3, cache, monkeypatch):
    objs = _seed(s3, 60)
    statements = _statements_by_thread(monkeypatch)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    assert [s.data for s in ds] == [objs[k] for k in ds.keys]          # epoch 1: fetched, packed behind
    ds.cache.flush()
    assert [s.data for s in ds] == [objs[k] for k in ds.keys]          # epoch 2: from the packs
    before = _mine(ds)
    assert before["packed_hits"] == 60 and before["fetched"] == 60
    requests = len(s3.proxy.requests)
    me = threading.get_ident()
    assert any(t == me for t, _ in statements), "the counting does not see this thread's statements"
    statements.clear()
    assert [s.data for s in ds] == [objs[k] for k in ds.keys]          # epoch 3
    assert ds.__getitems__([5, 0, 59])[2].data == objs[ds.keys[59]]
    assert [sql for t, sql in statements if t == me] == [], "the hit path ran SQL"
    after = _mine(ds)
    assert after["packed_hits"] - before["packed_hits"] == 63, "a read went another way"
    assert len(s3.proxy.requests) == requests
    ds.cache.flush()
    assert ds.cache.stats().object_hits >= 123, "the hit path's hits reach the cache's counters"


def _worker(ds, share: list[int], other: list[int], ready, go) -> None:
    ds.__getitems__(share)                 # epoch 1: its share, fetched
    ds.cache.flush()                       # (on disk and accounted before the other one reads it)
    ds.worker_stats()                      # (publishes this process's counters as they are now)
    ready.set()
    go.wait(60)
    got = ds.__getitems__(other)           # epoch 2: the other worker's share, from the packs
    assert all(len(s.data) == 300 + 97 * int(s.key[6:9]) for s in got)


def test_worker_stats_gathers_the_counters_of_every_worker_process(s3, cache):
    _seed(s3, 40)
    ds = mf.Dataset(s3.url("train/"), cache=cache, settings=s3.settings)
    ctx = mp.get_context("fork")
    go = ctx.Event()
    halves = [list(range(0, 40, 2)), list(range(1, 40, 2))]
    ready = [ctx.Event(), ctx.Event()]
    workers = [ctx.Process(target=_worker, args=(ds, halves[w], halves[1 - w], ready[w], go)) for w in (0, 1)]
    for w in workers:
        w.start()
    try:
        assert all(r.wait(60) for r in ready)
        epoch1 = {s["pid"]: s for s in ds.worker_stats()}
        assert set(epoch1) == {w.pid for w in workers}, "one entry per worker (the parent read nothing)"
        assert all(s["samples"] == s["fetched"] == 20 and s["fills_queued"] == 20 for s in epoch1.values())
        assert all(s["fills"] == s["fills_done"] == 20 for s in epoch1.values()), "flushed: all accounted"
    finally:
        go.set()
        for w in workers:
            w.join(60)
    assert [w.exitcode for w in workers] == [0, 0]
    epoch2 = {s["pid"]: s for s in ds.worker_stats()}
    assert all(s["samples"] == 40 and s["packed_hits"] == 20 and s["hit_ns"] > 0 for s in epoch2.values())


def test_a_dataset_of_small_local_files_reads_them_from_packs_and_sees_a_change(local_files, cache_dir,
                                                                                  cache):
    root, files = local_files(200, 4)
    ds = mf.Dataset(root, cache=cache)
    assert [s.data for s in ds] == [files[k] for k in ds.keys]
    ds.cache.flush()
    cache_files = [f for _, _, fs in os.walk(cache_dir) for f in fs]
    assert len(cache_files) <= 10, f"{len(cache_files)} files in the cache for 200 small files"
    assert [s.data for s in ds] == [files[k] for k in ds.keys]
    assert _mine(ds)["packed_hits"] == 200
    changed = ds.keys[7]
    Path(changed).write_bytes(b"new" + files[changed][3:])         # same size, new bytes
    assert ds[7].data == b"new" + files[changed][3:], "a file is validated by its stat at every read"
    assert _mine(ds)["packed_hits"] == 200
