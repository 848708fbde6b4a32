"""Beyond one machine: the tools' jobs split into idempotent shards and run on a Dask cluster.

Every tool that takes ``cluster=`` (CLI: ``--cluster``) accepts ``"local:N"`` (N worker
processes on this machine), ``"tcp://HOST:8786"`` (a running Dask scheduler), or a
``distributed.Client``.  Without it the tool runs its normal single-machine call and Dask is
never imported; with it and without the [dask] extra, one line says what to install.

* :mod:`manyfiles.scale.executor` -- the seam: :class:`Job`, :class:`ShardResult`,
  :class:`ClusterReport` (the tool's merged report + per-worker throughput), :func:`connect`;
* :mod:`manyfiles.scale.keyranges` -- an S3 listing cut into ``StartAfter`` ranges;
* :mod:`manyfiles.scale.lease` -- the job's lease: a shard whose client is gone stops, and a
  re-run shard learns what its lost attempts noted (:func:`~manyfiles.scale.lease.current`).

This package imports no tool: each tool keeps its cluster job in its own package (``s3/_cluster.py``,
``shard/_cluster.py``, ``remove/_cluster.py``, ``cache/_cluster.py``, ``listing/_cluster.py``)
and reaches the executors through :mod:`~manyfiles.scale.executor`.

Example:
    >>> import manyfiles as mf
    >>> r = mf.shard.apply("/nfs/images", cluster="local:4", progress=True)   # doctest: +SKIP
    >>> r.moved, r.workers
"""

from __future__ import annotations

from manyfiles._core.lazy import lazy_exports

_EXPORTS = {
    "ClusterLost": ".executor",
    "ClusterReport": ".executor",
    "Executor": ".executor",
    "InProcessExecutor": ".executor",
    "Job": ".executor",
    "LeaseLapsed": ".lease",
    "ShardResult": ".executor",
    "WorkerStats": ".executor",
    "connect": ".executor",
    "parse_cluster": ".executor",
    "run_job": ".executor",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
