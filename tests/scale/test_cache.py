"""cache warm with the objects partitioned over a real 2-process Dask cluster."""

from __future__ import annotations

import os
from pathlib import Path

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
    with Cache(tmp_path / "cache", max_size=64 << 20) as cache:
        report = cache.warm([data], cluster=dask_client, jobs=4)
        assert report.ok, report.failures
        assert (report.objects, report.fetched, report.bytes) == (40, 40, sum(map(len, want.values())))
        assert report.shards == 6 and len(report.workers) == 2, report.worker_lines()
        assert dict(cache.options)["max_size"] == 64 << 20
    # the workers shared this machine's cache: a fresh process-level view finds every object
    with Cache(tmp_path / "cache") as again:
        second = again.warm([data], jobs=4)
        assert (second.cached, second.fetched) == (40, 0)
        for path, content in want.items():
            with again.open(path) as f:
                assert f.read() == content
        assert again.stats().misses == 0
