"""``manyfiles cache warm --cluster``: objects partitioned across nodes, each warming its own cache.

Every worker opens the cache at the same path with the same options as the client's
(``Cache.options``) -- on a cluster that is each node's own local disk -- and warms the objects
of the shards Dask gives it: shards of ``OBJECTS_PER_SHARD`` sources (``s3://bucket/key`` or file
paths), listed by the client from the prefixes and folders it was given.  Which node caches
which shard is the scheduler's choice (it balances the load); the report says how much each
worker fetched.  A shard is idempotent: re-run, objects already complete are only validated.

Limits: the client lists S3 prefixes and walks folders itself (one listing, sequential); each
object then costs its worker a validation request (a HEAD or a stat) before its blocks are
fetched, as ``cache warm`` of a single key does.

The job carries the cache's class and its report's class (pickled by reference), so this module
needs nothing from ``_cache.py``, which calls it: no import circle.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.progress import ProgressArg
from manyfiles.scale import lease
from manyfiles.scale.executor import ClusterArg, ClusterReport, Job, Publish, ShardResult, run_job

OBJECTS_PER_SHARD = 1_000

_OPENED: dict[tuple, Any] = {}       # (class, dir, options) -> this worker process's Cache
_OPENED_LOCK = threading.Lock()


@dataclass(frozen=True)
class WarmJob(Job):
    """Warm shards of sources into the worker's own cache at ``dir`` (``cache_type(dir, **options)``)."""

    cache_type: type            # Cache
    report_type: type           # what Cache.warm returns: WarmReport
    dir: str
    options: tuple = field(default=())     # Cache keyword arguments, as sorted (name, value) pairs
    jobs: int = 8
    name = "cache warm"
    unit = "objects"

    def new_report(self) -> Any:
        return self.report_type()

    def run(self, sources: tuple[str, ...], publish: Publish) -> ShardResult:
        from manyfiles.cache._warm import warm

        cache = _worker_cache(self.cache_type, self.dir, self.options)
        report = warm(cache, list(sources), jobs=self.jobs, fetched_since=_lost_attempts_since(cache.dir),
                      progress=lambda snap: publish(snap.done, snap.bytes, snap.failures, snap.stall))
        return ShardResult(report=report, items=report.objects, bytes=report.bytes)


def _lost_attempts_since(directory: str) -> float | None:
    """When the first lost attempt of this shard on this node's cache started (a time.time()), if
    one did: what this attempt finds complete and written since was fetched by this run.  Each
    attempt notes its node's cache and start before it works (two scheduler requests)."""
    attempt = lease.current()
    if not attempt.rerun_possible:
        return None
    st = os.stat(directory)
    here = f"{os.uname().nodename}:{st.st_dev}:{st.st_ino}"
    attempt.note({"cache": here, "at": time.time()})
    ours = [n["at"] for n in attempt.earlier.values() if isinstance(n, dict) and n.get("cache") == here]
    return min(ours) if ours else None


def _worker_cache(cache_type: type, directory: str, options: tuple) -> Any:
    key = (cache_type, directory, options)
    with _OPENED_LOCK:
        cache = _OPENED.get(key)
        if cache is None:
            cache = _OPENED[key] = cache_type(directory, **dict(options))
    return cache


def expand(sources: Iterable[str | os.PathLike], settings: Any) -> Iterator[str]:
    """Every object under ``sources``: S3 prefixes listed, folders walked, the rest as given."""
    for src in sources:
        text = os.fsdecode(os.fspath(src))
        if text.startswith("s3://"):
            yield from _s3_objects(text, settings)
        elif os.path.isdir(text):
            from manyfiles import listing

            for d in listing.walk(os.path.abspath(text)):
                for e in d.entries:
                    if e.type in ("f", "?"):
                        yield os.path.join(d.path, e.name)
        else:
            yield os.path.abspath(text)


def _s3_objects(url: str, settings: Any) -> Iterator[str]:
    from manyfiles.s3.client import ClientSettings
    from manyfiles.s3.keys import parse_url
    from manyfiles.s3.object_listing import list_objects

    parsed = parse_url(url)
    if parsed.pattern is None and parsed.prefix and not parsed.prefix.endswith("/"):
        yield url              # one object (or a "folder" without its slash: the worker finds out)
        return
    for info in list_objects((settings or ClientSettings()).resolved(), parsed):
        if not (info.key.endswith("/") and not info.size):
            yield f"s3://{parsed.bucket}/{info.key}"


def _shards(objects: Iterator[str], size: int) -> Iterator[tuple[str, ...]]:
    batch: list[str] = []
    for obj in objects:
        batch.append(obj)
        if len(batch) >= size:
            yield tuple(batch)
            batch = []
    if batch:
        yield tuple(batch)


def warm_on_cluster(cache: Any, sources: Iterable[str | os.PathLike], *, report_type: type,
                    cluster: ClusterArg, jobs: int = 8, progress: ProgressArg = False) -> ClusterReport:
    """The cluster form of ``Cache.warm``: each worker warms its own cache at ``cache.dir``
    (``report_type``: what ``Cache.warm`` returns, the shards' reports merge into one)."""
    options = tuple(sorted(cache.options.items()))
    job = WarmJob(cache_type=type(cache), report_type=report_type, dir=cache.dir, options=options, jobs=jobs)
    shards = _shards(expand(sources, cache.settings), OBJECTS_PER_SHARD)
    return run_job(job, cluster, shards=shards, progress=progress)


__all__ = ["OBJECTS_PER_SHARD", "WarmJob", "expand", "warm_on_cluster"]
