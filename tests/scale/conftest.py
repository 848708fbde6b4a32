"""One real Dask cluster for the scale-out tests: a LocalCluster of 2 worker processes.

Session-scoped: starting one costs ~1-3 s.  Tests that kill a worker wait for the nanny to
bring a new one before they return (``wait_for_two``), so the next test finds 2 workers again.
"""

from __future__ import annotations

import logging

import distributed
import pytest

from manyfiles.scale._dask import LOCAL_QUIET, SPAWN_ENV, dask, worker_environ


@pytest.fixture(scope="session")
def dask_client():
    with dask.config.set({SPAWN_ENV: worker_environ()}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           silence_logs=logging.CRITICAL, **LOCAL_QUIET)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def wait_for_two(dask_client):
    """Call after killing a worker: returns once the cluster has 2 workers again."""

    def wait() -> None:
        dask_client.wait_for_workers(2, timeout=60)

    yield wait
    wait()
