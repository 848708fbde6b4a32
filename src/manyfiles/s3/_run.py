"""One pull on this machine, the engine room: list -> plan -> execute -> report.

:func:`run` opens the destination (:class:`Destination`), starts the engines (an
:class:`~manyfiles.s3.engines.engine_set.EngineSet`) and two sides that meet on ``ctx.events``:
the :class:`~manyfiles.s3._producer.Producer` thread lists the source (or reads the manifest, or a
plan's objects), plans each object and submits it, so downloads start with the first listing page;
the calling thread's :class:`~manyfiles.s3._events.Consumer` turns the events into the state file,
the report and the progress, and is where Ctrl-C lands.  :func:`run` is what
:func:`manyfiles.s3.pull` (``pull.py``, the public calls) and each cluster slice (``_cluster.py``)
call; neither is imported here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from manyfiles._core.progress import Progress, StallWatch, wait_ticking
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.s3 import routing
from manyfiles.s3._events import Consumer, Event
from manyfiles.s3._producer import Producer
from manyfiles.s3._pullconfig import Destination, PullConfig
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.base import Ctx, Options
from manyfiles.s3.engines.engine_set import EngineSet
from manyfiles.s3.engines.events import Delivered
from manyfiles.s3.keys import S3Url
from manyfiles.s3.object_listing import ObjectInfo, list_objects_lean, read_manifest
from manyfiles.s3.report import PullReport
from manyfiles.s3.retry import RetryPolicy, endpoint_name, has_answered
from manyfiles.s3.state import State

MAX_OUTSTANDING = 20_000   # jobs listed but not finished: bounds memory on huge buckets
def _first_listed(objects: Iterable[ObjectInfo], progress: Progress | None, watch: StallWatch,
                  where: str) -> tuple[Iterator[ObjectInfo], bool]:
    """The first listing page (or manifest line) read now, before anything is created, and
    whether it listed anything: a listing that fails (no bucket, no credentials) or lists nothing
    (a prefix with a typo) leaves no DEST behind.  While it is awaited, the progress shows the
    stall (an endpoint that does not answer) and the watch ends the wait past its limit."""
    objects = iter(objects)
    try:
        first = wait_ticking(lambda: next(objects, None), lambda: watch.tick(progress, where))
    except BaseException:
        watch.show(progress)    # the ticks are a second apart: the listing's last error may be newer
        raise
    return (objects, False) if first is None else (itertools.chain([first], objects), True)


def endpoint_of(settings: ClientSettings, url: S3Url) -> str:
    """What a run's stall names: the endpoint (``http://host:port``), else the bucket's URL."""
    return endpoint_name(settings.endpoint_url) or f"s3://{url.bucket}"


def stall_watch(cfg: PullConfig, settings: ClientSettings, url: S3Url) -> StallWatch:
    """The stall watch of a run (its listing's too): under ``cfg.retry``, knowing whether the
    endpoint answered before in this process (a cluster worker's earlier slices, say)."""
    return StallWatch.for_policy(cfg.retry, answered=has_answered(endpoint_of(settings, url)))


def run(url: S3Url, objects: Iterable[ObjectInfo], dest: str | None, *, settings: ClientSettings,
        cfg: PullConfig, keep: Callable[[str], bool] | None = None, dry_run: bool = False,
        report: PullReport | None = None,
        progress: Progress | None = None,
        state_slice: str | None = None,
        watch: StallWatch | None = None) -> Iterator[Event | tuple[str, bytes]]:
    """The engine room: yields Events, and (key, bytes) pairs when ``dest`` is None (memory).

    Fills ``report`` and ``progress`` (see :class:`~manyfiles.s3._events.Consumer`).
    ``state_slice``: a cluster slice (:class:`Slice`) keeps its own state files.  ``watch``: the
    run's stall watch (the listing's too: see :func:`_source`), by default one of
    ``cfg.retry``; a stall past it raises :class:`~manyfiles.errors.Stalled`.
    """
    cfg.check()
    if dest is None and cfg.strategy == "processes":
        raise UsageError("the processes strategy writes files; use async or threads for memory")
    report = report if report is not None else PullReport()
    report.dry_run = dry_run
    budget = routing.budget(cfg.strategy, cfg.concurrency, cfg.processes or os.cpu_count() or 2)
    report.budget = budget.describe()
    watch = watch if watch is not None else stall_watch(cfg, settings, url)
    where = endpoint_of(settings, url)
    objects, listed = _first_listed(objects, progress, watch, where)
    writes = listed and not dry_run    # nothing listed: DEST is only read, as for a dry run
    out = Destination.open(dest, cfg, dry_run=not writes, state_slice=state_slice,
                           on_data=lambda k, d: ctx.events.put(Delivered(k, d)))
    ctx = Ctx(Options(url.bucket, settings, cfg.retry, cfg.verify, dest, cfg.layout, cfg.fsync,
                      cfg.checksum_mode), out.sink)
    engines = EngineSet(ctx, budget, strategy=cfg.strategy, sub_engine=cfg.sub_engine)
    if writes and cfg.strategy == "processes":
        engines.get("processes")   # fork before any thread of ours exists
    slots = threading.BoundedSemaphore(MAX_OUTSTANDING)
    producer = Producer(url, objects, cfg, keep=keep, dest=out, ctx=ctx, engines=engines, slots=slots,
                        dry_run=dry_run)
    consumer = Consumer(ctx, report, progress, out, cfg, url, slots, dry_run, watch, where)
    t0 = time.monotonic()
    producer.start()
    clean = False
    try:
        yield from consumer.events()
        clean = True
    finally:
        report.seconds = time.monotonic() - t0
        if not clean:
            ctx.cancel.set()
            engines.kill()
        if out.state is not None and writes:
            _close_state(out.state, report, raising=clean)


def _close_state(state: State, report: PullReport, raising: bool) -> None:
    """Flush the state file and write failures.tsv; a disk error is one ``PATH: reason`` line,
    raised only if nothing else is already being raised."""
    try:
        try:
            state.close()
        finally:
            report.failures_file = state.write_failures([(f.path, f.reason) for f in report.failures])
    except ManyfilesError:
        if raising:
            raise
    finally:
        state.release()


def _source(url: S3Url, settings: ClientSettings, manifest: str | None, retry: RetryPolicy,
            page_size: int = 1000, watch: StallWatch | None = None):
    """The objects of a run: the manifest's, or the listing's (whose pages and retries ``watch``
    sees)."""
    if manifest:
        return read_manifest(manifest, url)
    return list_objects_lean(settings, url, retry=retry, page_size=page_size, watch=watch)


def empty_tmp(dest: str) -> None:
    """Remove what s3pull left in ``DEST/.s3pull/tmp``: a run that ended with every object in
    place needs none of it (temps of killed runs or lost workers, parts of objects it skipped)."""
    state = State(dest)
    try:
        state.open(create=False, load=False)
        for name in state.tmp_names:
            if name.endswith((".tmp", ".new", ".part", ".parts")):     # the names s3pull makes there
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=state.tmp_fd)
    finally:
        state.release()
