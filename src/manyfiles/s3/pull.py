"""list -> plan -> execute -> report for one bulk download.

A producer thread lists the source (or reads the manifest), maps each key to a
safe local path, skips what a previous run finished, asks :mod:`plan` for an
engine and submits the job, so downloads start with the first listing page.
The calling thread consumes the engines' events: it keeps the state file, the
report and the progress callback, and is where Ctrl-C lands.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.s3 import plan as _plan
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.base import Ctx, Engine, Options
from manyfiles.s3.keys import STATE_DIR, S3Url, UnsafeKey, local_relpath, make_filter, parse_url
from manyfiles.s3.listing import ObjectInfo, list_objects_lean, read_manifest
from manyfiles.s3.retry import RetryPolicy, classify
from manyfiles.s3.state import State
from manyfiles.s3.transfer import Job

MAX_OUTSTANDING = 20_000   # jobs listed but not finished: bounds memory on huge buckets


class Event(NamedTuple):
    """What ``on_event`` receives.

    kind: "plan" (engine chosen; value = part size), "skip" (value = reason), "done" (value = the
    relative path),
    "failed" (value = reason), "retry" (value = reason), "bytes" (value = n, no key),
    "listed" (listing finished; value = number of objects).
    """

    kind: str
    key: str | None
    size: int | None
    engine: str | None
    value: Any


@dataclass
class Report:
    """Outcome of a pull; ``failures`` holds (key, reason) for every object that failed."""

    listed: int = 0
    done: int = 0
    skipped: int = 0
    bytes: int = 0
    retries: int = 0
    resumed_parts: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    engines: dict[str, list[int]] = field(default_factory=dict)   # engine -> [objects, bytes]
    planned: dict[str, list[int]] = field(default_factory=dict)   # engine -> [objects, bytes]
    budget: str = ""
    elapsed: float = 0.0
    failures_file: str | None = None
    dry_run: bool = False
    verified: dict[str, int] = field(default_factory=dict)   # check method -> objects (md5, size-only...)
    notes: list[str] = field(default_factory=list)           # why a better check was not possible

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def rate(self) -> float:
        return self.bytes / self.elapsed if self.elapsed > 0 else 0.0


@dataclass(frozen=True)
class PullConfig:
    strategy: str = "auto"
    concurrency: int = 64
    processes: int = 0                  # 0: os.cpu_count() for the processes engine
    sub_engine: str = "http"            # what each worker process runs: http, async or threads
    ranged_min: int = _plan.RANGED_MIN
    part_size: int = _plan.PART_SIZE
    verify: bool = True                 # False: size-only (--no-verify)
    verify_existing: bool = False       # re-hash every file the state file calls done
    fsync: bool = False
    layout: str = "folder"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache: Any = None                   # a manyfiles.cache.Cache: hits are copied from it, downloads fill it


def _engine_factory(ctx: Ctx, cfg: PullConfig, bud: _plan.Budget) -> Callable[[str], Engine]:
    from manyfiles.s3.engines.threads import ThreadsEngine

    engines: dict[str, Engine] = {}

    def get(name: str) -> Engine:
        key = name
        eng = engines.get(key)
        if eng is None:
            if key == "async":
                from manyfiles.s3.engines.aio import AsyncEngine

                eng = AsyncEngine(ctx, bud.small)
            elif key == "http":
                from manyfiles.s3.engines.http import HttpEngine

                eng = HttpEngine(ctx, bud.small)
            elif key == "sync":
                eng = ThreadsEngine(ctx, 1, name="sync")
            elif key == "processes":
                from manyfiles.s3.engines.processes import ProcessesEngine

                eng = ProcessesEngine(ctx, bud.processes, max(1, bud.small // bud.processes), cfg.sub_engine)
            elif key == "ranged":
                eng = ThreadsEngine(ctx, bud.big or bud.small, name="ranged", transport="lean")
            elif key == "lean":
                n = bud.small if cfg.strategy == "auto" else bud.big
                eng = ThreadsEngine(ctx, n, name="lean", transport="lean")
            else:
                eng = ThreadsEngine(ctx, bud.big or bud.small, name="threads")
            engines[key] = eng
        return eng

    get.engines = engines  # type: ignore[attr-defined]
    return get


def execute(url: S3Url, objects: Iterable[ObjectInfo], dest: str | None, *, settings: ClientSettings,
            cfg: PullConfig, keep: Callable[[str], bool] | None = None, dry_run: bool = False,
            report: Report | None = None,
            state_slice: str | None = None) -> Iterator[Event | tuple[str, bytes]]:
    """The engine room: yields Events, and (key, bytes) pairs when ``dest`` is None (memory).

    ``state_slice``: a cluster slice (``manyfiles.scale.s3pull``) keeps its own state files."""
    from manyfiles.s3.sink import FolderSink, MemorySink

    if cfg.strategy not in _plan.STRATEGIES:
        raise UsageError(f"unknown strategy {cfg.strategy!r} (choose from {', '.join(_plan.STRATEGIES)})")
    if dest is None and cfg.strategy == "processes":
        raise UsageError("the processes strategy writes files; use async or threads for memory")
    report = report if report is not None else Report()
    report.dry_run = dry_run
    options = Options(url.bucket, settings, cfg.retry, cfg.verify, dest, cfg.layout, cfg.fsync)
    procs = cfg.processes or os.cpu_count() or 2
    bud = _plan.budget(cfg.strategy, cfg.concurrency, procs)
    report.budget = bud.describe()

    # The first listing page (or manifest line) before anything is created: a listing that
    # fails (no bucket, no credentials) leaves no DEST behind.
    objects = iter(objects)
    first = next(objects, None)
    if first is not None:
        objects = itertools.chain([first], objects)

    sink: Any
    state: State | None = None
    if dest is None:
        sink = MemorySink(lambda k, d: ctx.events.put(("data", k, d)))
    elif dry_run:
        sink = None
        state = State(os.path.abspath(dest))
        if os.path.isdir(dest):
            state.open(create=False)
    else:
        if os.path.exists(dest) and not os.path.isdir(dest):
            raise ManyfilesError(f"{dest}: not a directory")
        sink = FolderSink(dest, layout=cfg.layout, fsync=cfg.fsync, state_slice=state_slice).open()
        state = sink.state
    ctx = Ctx(options, sink)
    get_engine = _engine_factory(ctx, cfg, bud)
    if not dry_run and cfg.strategy == "processes":
        get_engine("processes")   # fork before any thread of ours exists
    slots = threading.BoundedSemaphore(MAX_OUTSTANDING)
    if sink is not None and not sink.memory:
        final_path = sink.final_path
    else:
        root = os.path.abspath(dest or ".")

        def final_path(rel: str) -> str:
            return os.path.join(root, rel)

    put = ctx.events.put

    def produce() -> None:
        listed = 0
        try:
            for info in objects:
                if ctx.cancel.is_set():
                    break
                if keep is not None and not keep(
                        info.key[len(url.base):] if info.key.startswith(url.base) else info.key):
                    continue
                listed += 1
                job = Job(info.key, "", info.size, info.etag)
                try:
                    job.rel = local_relpath(info.key, url.base)
                    path = final_path(job.rel)
                except UnsafeKey as exc:
                    if info.key.endswith("/") and not info.size:
                        put(("skip", job, "directory marker"))
                    else:
                        put(("failed", job, f"unsafe key: {exc}"))
                    continue
                if state is not None and state.done and state.is_done(info.key, info.size, info.etag, path,
                                                                      verify=cfg.verify_existing):
                    put(("skip", job, "already downloaded"))
                    continue
                job.engine, job.part_size = _plan.choose(cfg.strategy, info.size, ranged_min=cfg.ranged_min,
                                                         part_size=cfg.part_size)
                put(("plan", job, job.part_size))
                if dry_run:
                    continue
                while not slots.acquire(timeout=0.5):
                    if ctx.cancel.is_set():
                        return
                if cfg.cache is not None and _from_cache(cfg.cache, sink, url, info, job):
                    put(("done", job, "cache"))
                    continue
                get_engine(job.engine).submit(job)
            put(("listed", None, listed))
            for eng in get_engine.engines.values():  # type: ignore[attr-defined]
                eng.flush()
            for eng in list(get_engine.engines.values()):  # type: ignore[attr-defined]
                eng.close()
        except BaseException as exc:  # re-raised in the consuming thread
            if not isinstance(exc, (ManyfilesError, KeyboardInterrupt)):
                # e.g. no credentials found, or an engine that could not start
                exc = ManyfilesError(f"s3://{url.bucket}/{url.prefix}: {classify(exc)}")
            put(("fatal", None, exc))
            return
        put(("end", None, None))

    t0 = time.monotonic()
    producer = threading.Thread(target=produce, name="s3pull-planner", daemon=True)
    producer.start()
    clean = False
    try:
        while True:
            kind, job, value = ctx.events.get()
            if kind == "bytes":
                report.bytes += value
                yield Event("bytes", None, None, None, value)
            elif kind == "done":
                slots.release()
                report.done += 1
                eng = report.engines.setdefault(value, [0, 0])
                eng[0] += 1
                eng[1] += job.size or 0
                report.resumed_parts += job.extra.get("resumed_parts", 0)
                method = job.extra.get("verified", "size-only")
                report.verified[method] = report.verified.get(method, 0) + 1
                note = job.extra.get("note")
                if note and note not in report.notes:
                    report.notes.append(note)
                if state is not None:
                    state.record(job.key, job.size or 0, job.etag, job.extra.get("check"),
                                 final_path(job.rel))
                if cfg.cache is not None and value != "cache" and job.etag and job.size is not None \
                        and not sink.memory:
                    cfg.cache.import_file(f"s3://{url.bucket}/{job.key}", job.etag, job.size,
                                          final_path(job.rel))
                yield Event("done", job.key, job.size, value, job.rel)
            elif kind == "data":
                yield (job, value)
            elif kind == "plan":
                p = report.planned.setdefault(job.engine, [0, 0])
                p[0] += 1
                p[1] += job.size or 0
                yield Event("plan", job.key, job.size, job.engine, value)
            elif kind == "failed":
                if not dry_run and job.engine and job.rel:
                    slots.release()
                report.failures.append((job.key, value))
                yield Event("failed", job.key, job.size, job.engine or None, value)
                if job is not None and job.extra.get("fatal"):
                    raise ManyfilesError(job.extra["fatal"])
            elif kind == "retry":
                report.retries += 1
                yield Event("retry", job.key, job.size, job.engine, value)
            elif kind == "skip":
                report.skipped += 1
                yield Event("skip", job.key, job.size, None, value)
            elif kind == "listed":
                report.listed = value
                yield Event("listed", None, None, None, value)
            elif kind == "fatal":
                raise value
            elif kind == "end":
                clean = True
                break
    finally:
        report.elapsed = time.monotonic() - t0
        if not clean:
            ctx.cancel.set()
            for eng in list(get_engine.engines.values()):  # type: ignore[attr-defined]
                eng.kill()
        if state is not None and not dry_run:
            _close_state(state, report, raising=clean)


def _close_state(state: State, report: Report, raising: bool) -> None:
    """Flush the state file and write failures.tsv; a disk error is one ``PATH: reason`` line,
    raised only if nothing else is already being raised."""
    try:
        try:
            state.close()
        finally:
            report.failures_file = state.write_failures(report.failures)
    except ManyfilesError:
        if raising:
            raise
    finally:
        state.release()


def _from_cache(cache: Any, sink: Any, url: S3Url, info: ObjectInfo, job: Job) -> bool:
    """``--cache``: install the object from the cache if it holds this version (ETag, size)."""
    if not info.etag or info.size is None:
        return False
    try:
        target = sink.target(info.key, job.rel, info.size, info.etag)
    except (UnsafeKey, OSError):
        return False                # the engine reports it
    try:
        if cache.export(f"s3://{url.bucket}/{info.key}", info.etag, info.size, target.append):
            target.commit()
            job.extra["verified"] = "cache"
            return True
    except (UnsafeKey, OSError):
        pass
    target.abort()
    return False


def _source(url: S3Url, settings: ClientSettings, manifest: str | None, retry: RetryPolicy,
            page_size: int = 1000):
    if manifest:
        return read_manifest(manifest, url)
    return list_objects_lean(settings, url, retry=retry, page_size=page_size)


def pull(source: str, dest: str, *, strategy: str = "auto", concurrency: int = 64, processes: int = 0,
         include: Iterable[str] = (), exclude: Iterable[str] = (), manifest: str | None = None,
         layout: str = "folder", dry_run: bool = False, settings: ClientSettings | None = None,
         on_event: Callable[[Event], None] | None = None, page_size: int = 1000, cluster: object = None,
         **config: Any) -> Report:
    """Download every object under ``source`` (``s3://bucket/prefix``, wildcards allowed) into ``dest``.

    Returns a :class:`Report`; per-object failures are collected there (and in
    ``DEST/.s3pull/failures.tsv``), not raised.  ``on_event`` receives every
    :class:`Event` in the calling thread.  Extra keyword arguments go to
    :class:`PullConfig` (``verify``, ``verify_existing``, ``fsync``, ``part_size``, ``retry``...).
    ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``): listing and
    downloads run on Dask workers into the shared ``dest`` (:mod:`manyfiles.scale.s3pull`).

    Example:
        >>> report = pull("s3://bucket/images/", "/data/images")   # doctest: +SKIP
        >>> report.done, report.failures
        (120000, [])
    """
    if cluster is not None:     # key ranges and slices on Dask workers: manyfiles.scale.s3pull
        from manyfiles.scale.s3pull import pull_on_cluster

        return pull_on_cluster(source, dest, cluster=cluster, settings=settings, include=include,
                               exclude=exclude, manifest=manifest, dry_run=dry_run, on_event=on_event,
                               strategy=strategy, concurrency=concurrency, processes=processes, layout=layout,
                               **config)
    url = parse_url(source)
    settings = (settings or ClientSettings()).resolved()
    cfg = PullConfig(strategy=strategy, concurrency=concurrency, processes=processes, layout=layout, **config)
    report = Report()
    keep = make_filter(tuple(include), tuple(exclude))
    objects = _source(url, settings, manifest, cfg.retry, page_size)
    for ev in execute(url, objects, dest, settings=settings, cfg=cfg, keep=keep, dry_run=dry_run,
                      report=report):
        if on_event is not None and isinstance(ev, Event):
            on_event(ev)
    return report


def iter_objects(source: str, *, strategy: str = "auto", concurrency: int = 64,
                 include: Iterable[str] = (), exclude: Iterable[str] = (), manifest: str | None = None,
                 settings: ClientSettings | None = None, errors: str = "raise",
                 **config: Any) -> Iterator[tuple[str, bytes]]:
    """Yield ``(key, bytes)`` for every object under ``source``, in completion order.

    Nothing touches the disk.  ``errors="raise"`` raises PartialFailure at the end if
    some objects failed (after yielding all the others); ``"ignore"`` just skips them.

    Example:
        >>> for key, data in iter_objects("s3://bucket/labels/*.json"):   # doctest: +SKIP
        ...     labels[key] = json.loads(data)
    """
    from manyfiles.errors import PartialFailure

    url = parse_url(source)
    settings = (settings or ClientSettings()).resolved()
    cfg = PullConfig(strategy=strategy, concurrency=concurrency, **config)
    report = Report()
    keep = make_filter(tuple(include), tuple(exclude))
    objects = _source(url, settings, manifest, cfg.retry)
    for ev in execute(url, objects, None, settings=settings, cfg=cfg, keep=keep, report=report):
        if not isinstance(ev, Event):
            yield ev
    if report.failures and errors == "raise":
        key, reason = report.failures[0]
        raise PartialFailure(f"{len(report.failures)} object(s) failed; first: {key}: {reason}",
                             report.failures)


def get_objects(source: str, **kwargs: Any) -> dict[str, bytes]:
    """``dict(iter_objects(source, ...))``: every object under ``source`` in memory, by key."""
    return dict(iter_objects(source, **kwargs))


__all__ = ["STATE_DIR", "Event", "PullConfig", "Report", "execute", "get_objects", "iter_objects", "pull"]
