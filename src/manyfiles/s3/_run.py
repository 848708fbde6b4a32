"""One pull on this machine, the engine room: plan each listed object, run the engines, keep the
state, fill the report.

A producer thread lists the source (or reads the manifest, or a plan's objects), maps each
key to a safe local path, skips what a previous run finished, asks :mod:`~manyfiles.s3.routing`
for an engine and submits the job, so downloads start with the first listing page.  The calling
thread consumes the engines' events: it keeps the state file, the report and the progress, and is
where Ctrl-C lands.  :func:`run` is what :func:`manyfiles.s3.pull` (``pull.py``, the public calls)
and each cluster slice (``_cluster.py``) call; neither is imported here.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from manyfiles._core.progress import Progress
from manyfiles.errors import IntegrityError, ManyfilesError, UsageError
from manyfiles.s3 import routing as _plan
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.base import Ctx, Done, Engine, Failed, Options
from manyfiles.s3.integrity import digest_for, object_claim
from manyfiles.s3.keys import S3Url, UnsafeKey, local_relpath
from manyfiles.s3.object_listing import ObjectInfo, list_objects_lean, read_manifest
from manyfiles.s3.report import PullReport
from manyfiles.s3.retry import RetryPolicy, classify
from manyfiles.s3.state import State
from manyfiles.s3.transfer import Job

MAX_OUTSTANDING = 20_000   # jobs listed but not finished: bounds memory on huge buckets
LAYOUTS = ("folder", "sharded")


class Event(NamedTuple):
    """What ``on_event`` receives.

    kind: "plan" (engine chosen; value = part size), "skip" (value = reason), "done" (value = the
    relative path), "failed" (value = reason), "retry" (value = reason), "bytes" (value = n, no
    key), "listed" (listing finished; value = number of objects).
    """

    kind: str
    key: str | None
    size: int | None
    engine: str | None
    value: Any


@dataclass(frozen=True)
class PullConfig:
    strategy: str = "auto"
    concurrency: int = 64
    processes: int = 0                  # 0: os.cpu_count() for the processes engine
    sub_engine: str = "http"            # what each worker process runs: http, async or threads
    ranged_min: int = _plan.RANGED_MIN
    part_size: int | None = None        # None: by object size and cores (routing.part_size_for)
    verify: bool = True                 # False: size-only (--no-verify)
    verify_existing: bool = False       # re-hash every file the state file calls done
    checksum_mode: bool = True          # False: never ask for flexible checksums, ETags only
    fsync: bool = False
    layout: str = "folder"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache: Any = None                   # a manyfiles.cache.Cache: hits are copied from it, downloads fill it

    def check(self) -> None:
        """UsageError for a bad value, before anything is listed or created."""
        if self.strategy not in _plan.STRATEGIES + _plan.CANDIDATES:
            raise UsageError(f"unknown strategy {self.strategy!r} "
                             f"(choose from {', '.join(_plan.STRATEGIES)})")
        if self.layout not in LAYOUTS:
            raise UsageError(f"unknown layout {self.layout!r} (choose from {', '.join(LAYOUTS)})")
        for name in ("concurrency", "part_size", "ranged_min"):
            value = getattr(self, name)
            if value is None and name == "part_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise UsageError(f"retry must be a manyfiles.s3.RetryPolicy, not {self.retry!r}")


def _engine_factory(ctx: Ctx, cfg: PullConfig, bud: _plan.Budget) -> Callable[[str], Engine]:
    from manyfiles.s3.engines.threads import ThreadsEngine

    engines: dict[str, Engine] = {}

    def get(name: str) -> Engine:
        eng = engines.get(name)
        if eng is None:
            if name == "async":
                from manyfiles.s3.engines.aio import AsyncEngine

                eng = AsyncEngine(ctx, bud.small)
            elif name == "http":
                from manyfiles.s3.engines.http import HttpEngine

                eng = HttpEngine(ctx, bud.small)
            elif name == "obstore":      # a candidate (issue 18): not used by auto
                from manyfiles.s3.engines.candidates import ObstoreEngine

                eng = ObstoreEngine(ctx, bud.small)
            elif name == "crt":          # a candidate (issue 18): not used by auto
                from manyfiles.s3.engines.candidates import CrtEngine

                eng = CrtEngine(ctx, bud.small)
            elif name == "sync":
                eng = ThreadsEngine(ctx, 1, name="sync")
            elif name == "processes":
                from manyfiles.s3.engines.processes import ProcessesEngine

                eng = ProcessesEngine(ctx, bud.processes, max(1, bud.small // bud.processes), cfg.sub_engine)
            elif name == "ranged":
                eng = ThreadsEngine(ctx, bud.big or bud.small, name="ranged", transport="lean")
            elif name == "lean":
                n = bud.small if cfg.strategy == "auto" else bud.big
                eng = ThreadsEngine(ctx, n, name="lean", transport="lean")
            else:
                eng = ThreadsEngine(ctx, bud.big or bud.small, name="threads")
            engines[name] = eng
        return eng

    get.engines = engines  # type: ignore[attr-defined]
    return get


def plan_objects(url: S3Url, objects: Iterable[ObjectInfo], cfg: PullConfig, *,
                 keep: Callable[[str], bool] | None, final_path: Callable[[str], str],
                 state: State | None) -> Iterator[tuple[str, Job, Any]]:
    """The planner: ``("plan", job, part_size)``, ``("skip", job, reason)`` or ``("failed", job,
    Failed)`` for every object ``keep`` accepts, in listing order.  Pure but for the state check."""
    for info in objects:
        if keep is not None and not keep(info.key.removeprefix(url.base)):
            continue
        try:
            rel = local_relpath(info.key, url.base)
            path = final_path(rel)
        except UnsafeKey as exc:
            job = Job(info.key, "", info.size, info.etag)
            if info.key.endswith("/") and not info.size:
                yield "skip", job, "directory marker"
            else:
                yield "failed", job, Failed(f"unsafe key: {exc}", "unsafe-key")
            continue
        if state is not None and state.done and state.is_done(info.key, info.size, info.etag, path,
                                                              verify=cfg.verify_existing):
            yield "skip", Job(info.key, rel, info.size, info.etag), "already downloaded"
            continue
        engine, part_size = _plan.choose(cfg.strategy, info.size, ranged_min=cfg.ranged_min,
                                         part_size=cfg.part_size)
        yield "plan", Job(info.key, rel, info.size, info.etag, engine, part_size), part_size


def run(url: S3Url, objects: Iterable[ObjectInfo], dest: str | None, *, settings: ClientSettings,
        cfg: PullConfig, keep: Callable[[str], bool] | None = None, dry_run: bool = False,
        report: PullReport | None = None,
        progress: Progress | None = None,
        state_slice: str | None = None) -> Iterator[Event | tuple[str, bytes]]:
    """The engine room: yields Events, and (key, bytes) pairs when ``dest`` is None (memory).

    Fills ``report`` (a :class:`PullPlan` also collects the planned jobs) and ``progress``
    (objects: done + skipped + failed; bytes; totals once the listing ended).
    ``state_slice``: a cluster slice (:class:`Slice`) keeps its own state files.
    """
    from manyfiles.s3.sink import FolderSink, MemorySink

    cfg.check()
    if dest is None and cfg.strategy == "processes":
        raise UsageError("the processes strategy writes files; use async or threads for memory")
    report = report if report is not None else PullReport()
    report.dry_run = dry_run
    options = Options(url.bucket, settings, cfg.retry, cfg.verify, dest, cfg.layout, cfg.fsync,
                      cfg.checksum_mode)
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
            for kind, job, value in plan_objects(url, objects, cfg, keep=keep, final_path=final_path,
                                                 state=state):
                if ctx.cancel.is_set():
                    return
                listed += 1
                put((kind, job, value))
                if kind != "plan" or dry_run:
                    continue
                while not slots.acquire(timeout=0.5):
                    if ctx.cancel.is_set():
                        return
                if cfg.cache is not None and not sink.memory:
                    hit = _from_cache(cfg, sink, url, job)
                    if hit is not None:
                        put(("done", job, hit))
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
                wrapped = ManyfilesError(f"s3://{url.bucket}/{url.prefix}: {classify(exc)}")
                wrapped.__cause__ = exc
                exc = wrapped
            put(("fatal", None, exc))
            return
        put(("end", None, None))

    def counted(n: int) -> Iterator[Event]:
        if n:
            report.bytes += n
            if progress:
                progress.add(bytes=n)
            yield Event("bytes", None, None, None, n)

    t0 = time.monotonic()
    producer = threading.Thread(target=produce, name="s3pull-planner", daemon=True)
    producer.start()
    clean = False
    planned_bytes: int | None = 0
    try:
        while True:
            kind, job, value = ctx.events.get()
            if kind == "bytes":
                yield from counted(value)
            elif kind == "done":
                outcome: Done = value
                slots.release()
                yield from counted(ctx.take_bytes())   # this object's bytes not sent as an event yet
                report.add_done(outcome.engine, outcome.size, outcome.claim.kind, outcome.claim.note,
                                outcome.resumed_parts)
                if state is not None:
                    state.record(job.key, outcome.size, job.etag, outcome.claim.to_record(),
                                 final_path(job.rel), stat=outcome.installed)
                if cfg.cache is not None and outcome.engine != "cache" and job.etag and not sink.memory:
                    cfg.cache.import_file(f"s3://{url.bucket}/{job.key}", job.etag, outcome.size,
                                          final_path(job.rel))
                if progress:
                    progress.add(1)
                yield Event("done", job.key, outcome.size, outcome.engine, job.rel)
            elif kind == "data":
                yield (job, value)
            elif kind == "plan":
                report.add_planned(job.engine, job.size)
                planned = getattr(report, "objects", None)   # a PullPlan collects its jobs
                if planned is not None:
                    planned.append(job)
                if planned_bytes is not None:
                    planned_bytes = None if job.size is None else planned_bytes + job.size
                if dry_run and progress:
                    progress.add(1)
                yield Event("plan", job.key, job.size, job.engine, value)
            elif kind == "failed":
                failed: Failed = value
                if not dry_run and job.engine:
                    slots.release()
                report.add_failure(job.key, failed.reason, failed.code)
                if progress:
                    progress.add(1, failures=1)
                if failed.stop is not None:
                    # the run stops on it (a full disk...): its error names the object, one line, not
                    # an event line and the error line for the same ENOSPC
                    raise failed.stop
                yield Event("failed", job.key, job.size, job.engine or None, failed.reason)
            elif kind == "retry":
                report.retries += 1
                yield Event("retry", job.key, job.size, job.engine, value)
            elif kind == "skip":
                report.skipped += 1
                if progress:
                    progress.add(1)
                yield Event("skip", job.key, job.size, None, value)
            elif kind == "listed":
                report.listed = value
                if progress:
                    progress.set(total=value, bytes_total=None if dry_run else planned_bytes)
                yield Event("listed", None, None, None, value)
            elif kind == "fatal":
                raise value
            elif kind == "end":
                yield from counted(ctx.take_bytes())
                clean = True
                break
    finally:
        report.seconds = time.monotonic() - t0
        if not clean:
            ctx.cancel.set()
            for eng in list(get_engine.engines.values()):  # type: ignore[attr-defined]
                eng.kill()
        if state is not None and not dry_run:
            _close_state(state, report, raising=clean)


def _from_cache(cfg: PullConfig, sink: Any, url: S3Url, job: Job) -> Done | None:
    """``--cache``: install the object from the cache if it holds this version (ETag, size).

    The exported bytes pass the same check a download would where the listing allows one (a
    single-part ETag is the MD5 of the body); a miss, a short block or a failed check leaves the
    object to the engines (None)."""
    if not job.etag or job.size is None:
        return None
    try:
        target = sink.target(job.key, job.rel, job.size, job.etag)
    except (UnsafeKey, OSError):
        return None                # the engine reports it
    try:
        # the listing's ETag decides (a multipart one: its part sizes searched); no headers here, so
        # an SSE-KMS object's ETag fails its check and the engines fetch it
        claim = object_claim(job.etag, {}, job.size, None, verify=cfg.verify)
        digest = digest_for(claim, job.size, target.read)

        def write(data: bytes) -> None:
            target.append(data)
            digest.stream(data)

        if cfg.cache.export(f"s3://{url.bucket}/{job.key}", job.etag, job.size, write):
            digest.check()
            target.commit()
            return Done("cache", job.size, digest.claim)
    except (UnsafeKey, OSError, IntegrityError):
        pass
    target.abort()
    return None


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
            page_size: int = 1000):
    if manifest:
        return read_manifest(manifest, url)
    return list_objects_lean(settings, url, retry=retry, page_size=page_size)


def _config(**kwargs: Any) -> PullConfig:
    names = {f.name for f in fields(PullConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    cfg = PullConfig(**kwargs)
    cfg.check()
    return cfg


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
