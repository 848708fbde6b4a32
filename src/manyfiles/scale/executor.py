"""The executor seam: a job split into idempotent shards, run by an executor, one merged report.

A :class:`Job` says how to split the work (:meth:`Job.shards`, lazily: a 10^8-key listing is
never held in memory) and how to run one shard (:meth:`Job.run`, on a worker).  A shard may
find more work (a subtree, the rest of a listing): it returns it in ``ShardResult.more`` and
the executor schedules it, so the shape of the work unfolds while it runs, as in
mpiFileUtils' libcircle queues, without a home-made engine: the scheduling, the
placement, and the re-run of a shard whose worker died belong to Dask.

Every shard must be **idempotent**: run twice (a worker killed mid-shard, then the same
shard re-run elsewhere), the outcome is the same as once.  The tools get that from what they
already are: temp + rename + state (s3pull), journaled renames (shard), unlink of what is
left (fastrm), and a part file per shard written under a temp name then renamed (listings).

Executors:

* :class:`InProcessExecutor` -- the shards one after another in this process (the reference
  semantics, and what tests use to run a shard twice);
* the Dask executor (:func:`connect` with ``"local:N"``, ``"tcp://HOST:8786"`` or a
  ``distributed.Client``) -- shards as Dask tasks, at most 4 per worker thread (+16) in flight,
  counters published by the workers (``Worker.log_event``) and summed on the client
  (``Client.subscribe_topic``) for the progress display.

This module imports no tool: each tool keeps its own job beside its code (``s3/_cluster.py``,
``shard/_cluster.py``, ``remove/_cluster.py``, ``cache/_cluster.py``, ``listing/_cluster.py``)
and reaches the executors through here.  Without ``cluster``
a tool runs its normal library call; nothing here is imported.

Example:
    >>> from manyfiles.scale import connect                       # doctest: +SKIP
    >>> with connect("local:4") as ex:
    ...     report = ex.run(job, progress=True)
    >>> report.workers                                            # per-worker throughput
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from manyfiles._core.progress import ProgressArg, check_progress
from manyfiles.errors import UsageError
from manyfiles.scale._jobs import (
    ClusterLost,
    ClusterReport,
    Executor,
    InProcessExecutor,
    Job,
    NoopJob,
    Publish,
    ShardResult,
    WorkerStats,
    execute_shard,
    merge_report,
    parse_cluster,
)

ClusterArg = Any
"""What ``cluster=`` accepts: ``"local:N"``, ``"tcp://HOST:PORT"``, a ``distributed.Client``,
a Dask cluster object (``LocalCluster``, dask-jobqueue's ``SLURMCluster``...), or an Executor."""


@contextlib.contextmanager
def connect(cluster: ClusterArg) -> Iterator[Executor]:
    """An executor for ``cluster``; what it started (a LocalCluster, a connection) ends with the block.

    A ``distributed.Client`` passed in stays open (it is the caller's).  Without the [dask]
    extra, a one-line :class:`~manyfiles.errors.MissingExtra`.
    """
    if isinstance(cluster, Executor):
        yield cluster
        return
    if isinstance(cluster, str):
        parse_cluster(cluster)      # a malformed value is a usage error with or without Dask
    elif cluster is None or isinstance(cluster, (bytes, int, float, bool)):
        raise UsageError(f"cluster must be 'local:N', 'tcp://HOST:PORT' or a distributed.Client, "
                         f"not {cluster!r}")
    from manyfiles.scale._dask import DaskExecutor

    executor = DaskExecutor.open(cluster)
    try:
        yield executor
    finally:
        executor.close()


def run_job(job: Job, cluster: ClusterArg, *, shards: Iterable[Any] | None = None,
            progress: ProgressArg = False) -> ClusterReport:
    """``connect(cluster)`` and run ``job`` on it: what the tools' ``cluster=`` argument does."""
    check_progress(progress)
    with connect(cluster) as executor:
        return executor.run(job, shards=shards, progress=progress)


__all__ = [
    "ClusterArg",
    "ClusterLost",
    "ClusterReport",
    "Executor",
    "InProcessExecutor",
    "Job",
    "NoopJob",
    "Publish",
    "ShardResult",
    "WorkerStats",
    "connect",
    "execute_shard",
    "merge_report",
    "parse_cluster",
    "run_job",
]
