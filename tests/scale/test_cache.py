"""cache warm with the objects partitioned over a real 2-process Dask cluster."""

from __future__ import annotations

import os
from pathlib import Path

import faults
from manyfiles.cache import Cache
from manyfiles.cache import _cluster as scale_cache


def test_warm_files_on_the_cluster_then_every_read_is_a_hit(tmp_path: Path, dask_client, monkeypatch) -> None:
    monkeypatch.setattr(scale_cache, "OBJECTS_PER_SHARD", 7)
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    want = {}
    for i in range(40):
        p = data / ("sub" if i % 3 else "") / f"obj-{i}.bin"
        p.write_bytes(os.urandom(1000 + 97 * i))
        want[p] = p.read_bytes()
    with Cache(tmp_path / "cache", min_free=0, max_size=64 << 20) as cache:
        report = cache.warm([data], cluster=dask_client, jobs=4)
        assert report.ok, report.failures
        assert (report.objects, report.fetched, report.bytes) == (40, 40, sum(map(len, want.values())))
        assert report.shards == 6 and len(report.workers) == 2, report.worker_lines()
        assert dict(cache.options)["max_size"] == 64 << 20
    # the workers shared this machine's cache: a fresh process-level view finds every object
    with Cache(tmp_path / "cache", min_free=0) as again:
        second = again.warm([data], jobs=4)
        assert (second.cached, second.fetched) == (40, 0)
        for path, content in want.items():
            with again.open(path) as f:
                assert f.read() == content
        assert again.stats().misses == 0


def test_a_worker_killed_mid_warm_still_counts_every_object_once(tmp_path: Path, dask_client, wait_for_two,
                                                                monkeypatch) -> None:
    """One worker SIGKILLs itself after its 5th object, mid-shard: Dask runs the shard again, which
    finds those objects complete in the cache (one machine, one cache).  They were fetched by this
    run, so they count as fetched, not as "already cached" (before: fetched 35, cached 5)."""
    monkeypatch.setattr(scale_cache, "OBJECTS_PER_SHARD", 10)
    data = tmp_path / "data"
    data.mkdir()
    want = {}
    for i in range(40):
        p = data / f"obj-{i}.bin"
        p.write_bytes(os.urandom(2000 + 13 * i))
        want[p] = p.read_bytes()
    victim = sorted(dask_client.nthreads())[0]
    pid = dask_client.run(os.getpid, workers=[victim])[victim]
    dask_client.run(faults.kill_worker_at, "warm", 5, workers=[victim])
    with Cache(tmp_path / "cache", min_free=0) as cache:
        report = cache.warm([data], cluster=dask_client, jobs=1)
    wait_for_two()
    assert pid not in dask_client.run(os.getpid).values()          # it really died
    assert report.ok and report.reruns >= 1, report.failures
    assert (report.objects, report.fetched, report.cached) == (40, 40, 0)
    assert report.bytes == sum(map(len, want.values()))
    with Cache(tmp_path / "cache", min_free=0) as again:
        second = again.warm([data], jobs=4)
        assert (second.cached, second.fetched) == (40, 0)
