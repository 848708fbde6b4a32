"""Helpers for the tests that kill a cluster job's client: which shards still run on the workers."""

from __future__ import annotations

import time
from collections.abc import Callable


def running_keys(dask_worker) -> list[str]:
    """The keys of the tasks running on a worker, those Dask cancelled but whose thread runs included
    (``client.run(running_keys)``)."""
    return [str(ts.key) for ts in dask_worker.state.executing | dask_worker.state.long_running]


def shards_running(client, job_name: str) -> bool:
    """Does any worker still run a shard of a job named ``job_name`` (its tasks' key prefix)?"""
    return any(k.startswith(f"{job_name}-") for keys in client.run(running_keys).values() for k in keys)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> float:
    """Poll ``condition`` until it is true; the seconds it took (the test fails after ``timeout``)."""
    t0 = time.monotonic()
    while not condition():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.05)
    return time.monotonic() - t0
