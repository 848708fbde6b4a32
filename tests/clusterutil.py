"""Helpers for the tests that kill a cluster job's client or a worker: which shards still run on the
workers, a progress hook that kills a busy worker."""

from __future__ import annotations

import os
import signal
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


def kill_a_busy_worker(client, after: int) -> tuple[Callable[[object], None], list[int]]:
    """A ``progress=`` hook that SIGKILLs one worker running a shard once the job's total says
    ``after`` items are done, and the list it appends the killed pid to."""
    killed: list[int] = []

    def hook(snap) -> None:
        if killed or snap.done < after or snap.finished:
            return
        busy = [addr for addr, keys in client.processing().items() if keys]
        if busy:
            pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return hook, killed
