"""list -> plan -> execute -> report for one bulk download.

A producer thread lists the source (or reads the manifest, or a plan's objects), maps each
key to a safe local path, skips what a previous run finished, asks :mod:`plan` for an engine
and submits the job, so downloads start with the first listing page.  The calling thread
consumes the engines' events: it keeps the state file, the report and the progress, and is
where Ctrl-C lands.  A dry run stops after the plan and returns it (:class:`PullPlan`);
``plan.execute()`` (or ``pull(plan=...)``) fetches exactly its objects later.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from manyfiles._core.progress import Progress, ProgressArg, check_progress, progress_for
from manyfiles.errors import IntegrityError, ManyfilesError, PartialFailure, UsageError
from manyfiles.s3 import routing as _plan
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.base import Ctx, Done, Engine, Failed, Options
from manyfiles.s3.integrity import Claim, digest_for, object_claim
from manyfiles.s3.keys import STATE_DIR, S3Url, UnsafeKey, local_relpath, make_filter, parse_url
from manyfiles.s3.object_listing import ObjectInfo, list_objects_lean, read_manifest
from manyfiles.s3.report import PullReport
from manyfiles.s3.retry import RetryPolicy, classify
from manyfiles.s3.state import State
from manyfiles.s3.transfer import Job
from manyfiles.scale import executor, lease
from manyfiles.scale.executor import ClusterArg, ClusterReport, Publish, ShardResult, run_job
from manyfiles.scale.keyranges import KeyRange, take

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


@dataclass(kw_only=True)
class PullPlan(PullReport):
    """A dry run: what :func:`pull` would fetch (``objects``: one :class:`Job` each, with its
    engine and part size) and how (:meth:`execute`).

    Executing fetches exactly these objects, each pinned to the ETag it had when planned (an
    object changed since fails as ``changed``), and re-checks the state first: an object a run
    finished in the meantime is skipped.  Keys the plan refused stay failures of the execution.
    """

    dry_run: bool = True
    source: str = ""
    dest: str = ""
    objects: list[Job] = field(default_factory=list, repr=False)
    settings: ClientSettings = field(default_factory=ClientSettings, repr=False)
    config: PullConfig = field(default_factory=PullConfig, repr=False)

    def execute(self, *, progress: ProgressArg = False,
                on_event: Callable[[Event], None] | None = None) -> PullReport:
        """Fetch the planned objects: ``pull(plan=self)``."""
        return pull(plan=self, progress=progress, on_event=on_event)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for name in ("objects", "settings", "config"):
            out.pop(name, None)
        out["objects"] = [{"key": j.key, "path": j.rel, "size": j.size, "etag": j.etag, "engine": j.engine,
                           "part_size": j.part_size} for j in self.objects]
        return out


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
                if isinstance(report, PullPlan):
                    report.objects.append(job)
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


def _check_call(progress: object, on_event: object) -> None:
    check_progress(progress)
    if on_event is not None and not callable(on_event):
        raise UsageError(f"on_event must be a callable taking an Event, not {on_event!r}")


def pull(source: str | None = None, dest: str | os.PathLike | None = None, *, strategy: str = "auto",
         concurrency: int = 64, processes: int = 0, include: Iterable[str] = (), exclude: Iterable[str] = (),
         manifest: str | None = None, layout: str = "folder", dry_run: bool = False,
         settings: ClientSettings | None = None, plan: PullPlan | None = None, progress: ProgressArg = False,
         on_event: Callable[[Event], None] | None = None, page_size: int = 1000, cluster: object = None,
         **config: Any) -> PullReport:
    """Download every object under ``source`` (``s3://bucket/prefix``, wildcards allowed) into ``dest``.

    Returns a :class:`PullReport`; per-object failures are collected there (and in
    ``DEST/.s3pull/failures.tsv``), not raised (``report.raise_for_failures()`` does).
    ``dry_run=True`` lists and plans only and returns a :class:`PullPlan` (a report with the
    planned objects and ``execute()``); ``plan=`` fetches a plan's objects (``source``, ``dest``
    and the options come from it).  ``progress``: True for a live display, or a callable taking
    a :class:`~manyfiles._core.progress.Snapshot` (objects done/total, bytes).  ``on_event``
    receives every :class:`Event` in the calling thread.  Extra keyword arguments go to
    :class:`PullConfig` (``verify``, ``verify_existing``, ``fsync``, ``part_size``, ``retry``...).
    ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``): listing and
    downloads run on Dask workers into the shared ``dest`` (:func:`pull_on_cluster`); the
    result is then a ``ClusterReport`` whose ``result`` is this report merged over every slice.
    Every argument is checked before anything is listed or created.

    Example:
        >>> report = pull("s3://bucket/images/", "/data/images", progress=True)   # doctest: +SKIP
        >>> report.done, report.failures
        (120000, [])
    """
    _check_call(progress, on_event)
    if cluster is not None:     # key ranges and slices on Dask workers: see pull_on_cluster
        if plan is not None:
            raise UsageError("plan=: not with a cluster (a cluster lists on its workers)")
        return pull_on_cluster(source, dest, cluster=cluster, settings=settings, include=include,
                               exclude=exclude, manifest=manifest, dry_run=dry_run, on_event=on_event,
                               progress=progress, strategy=strategy, concurrency=concurrency,
                               processes=processes, layout=layout, **config)
    if plan is not None:
        if not isinstance(plan, PullPlan):
            raise UsageError(f"plan must come from manyfiles.s3.plan() or pull(dry_run=True), not {plan!r}")
        if source is not None and source != plan.source:
            raise UsageError(f"the plan is for {plan.source}, not {source}")
        if dest is not None and os.path.abspath(dest) != plan.dest:
            raise UsageError(f"the plan is for {plan.dest}, not {os.fspath(dest)}")
        url, settings, cfg, dest = parse_url(plan.source), plan.settings, plan.config, plan.dest
        objects: Iterable[ObjectInfo] = [ObjectInfo(j.key, j.size, j.etag) for j in plan.objects]
        keep = None
        report = PullReport(failures=list(plan.failures))
    else:
        if source is None or dest is None:
            raise UsageError("pull needs a source and a destination (or a plan)")
        url = parse_url(source)
        cfg = _config(strategy=strategy, concurrency=concurrency, processes=processes, layout=layout,
                      **config)
        keep = make_filter(tuple(include), tuple(exclude))
        settings = (settings or ClientSettings()).resolved()
        objects = _source(url, settings, manifest, cfg.retry, page_size)
        report = PullPlan(source=source, dest=os.path.abspath(dest), settings=settings, config=cfg) \
            if dry_run else PullReport()
    with progress_for(progress, "s3pull (dry run)" if dry_run else "s3pull", unit="objects") as p:
        for ev in run(url, objects, os.fspath(dest), settings=settings, cfg=cfg, keep=keep, dry_run=dry_run,
                      report=report, progress=p):
            if on_event is not None and isinstance(ev, Event):
                on_event(ev)
    if plan is not None:
        report.listed += len(plan.failures)
    if not dry_run and report.ok:
        empty_tmp(os.fspath(dest))
    return report


def plan(source: str, dest: str | os.PathLike, **kwargs: Any) -> PullPlan:
    """What :func:`pull` would fetch: ``pull(source, dest, dry_run=True, ...)``; nothing is written."""
    kwargs.pop("dry_run", None)
    result = pull(source, dest, dry_run=True, **kwargs)
    assert isinstance(result, PullPlan)
    return result


def iter_objects(source: str, *, strategy: str = "auto", concurrency: int = 64,
                 include: Iterable[str] = (), exclude: Iterable[str] = (), manifest: str | None = None,
                 settings: ClientSettings | None = None, errors: str = "raise", progress: ProgressArg = False,
                 **config: Any) -> Iterator[tuple[str, bytes]]:
    """Yield ``(key, bytes)`` for every object under ``source``, in completion order.

    Nothing touches the disk.  ``errors="raise"`` raises PartialFailure at the end if
    some objects failed (after yielding all the others); ``"ignore"`` just skips them.
    ``progress`` as for :func:`pull`.  Arguments are checked when called, before the
    first object is asked for.

    Example:
        >>> for key, data in iter_objects("s3://bucket/labels/*.json"):   # doctest: +SKIP
        ...     labels[key] = json.loads(data)
    """
    _check_call(progress, None)
    if errors not in ("raise", "ignore"):
        raise UsageError(f"errors must be 'raise' or 'ignore', not {errors!r}")
    url = parse_url(source)
    cfg = _config(strategy=strategy, concurrency=concurrency, **config)
    if cfg.strategy == "processes":
        raise UsageError("the processes strategy writes files; use async or threads for memory")
    keep = make_filter(tuple(include), tuple(exclude))
    settings = (settings or ClientSettings()).resolved()
    return _iter_objects(url, settings, manifest, cfg, keep, errors, progress)


def _iter_objects(url: S3Url, settings: ClientSettings, manifest: str | None, cfg: PullConfig, keep,
                  errors: str, progress: ProgressArg) -> Iterator[tuple[str, bytes]]:
    report = PullReport()
    objects = _source(url, settings, manifest, cfg.retry)
    with progress_for(progress, "s3 get_objects", unit="objects") as p:
        for ev in run(url, objects, None, settings=settings, cfg=cfg, keep=keep, report=report, progress=p):
            if not isinstance(ev, Event):
                yield ev
    if report.failures and errors == "raise":
        first = report.failures[0]
        raise PartialFailure(f"{len(report.failures)} object(s) failed; first: {first.path}: {first.reason}",
                             report.failures, report)


def get_objects(source: str, **kwargs: Any) -> dict[str, bytes]:
    """``dict(iter_objects(source, ...))``: every object under ``source`` in memory, by key."""
    return dict(iter_objects(source, **kwargs))


# -- on a Dask cluster ---------------------------------------------------------------------------------
# ``pull(cluster=...)``: the listing cut into key ranges, the downloads into slices of keys.
#
# Two kinds of shard, both idempotent:
#
# * :class:`~manyfiles.scale.keyranges.KeyRange` -- list ``(after, upto]`` (ListObjectsV2 from
#   ``StartAfter=after``) until ``slice_keys`` keys are read; hand back the keys found as a
#   :class:`Slice` and the rest of the range cut in two (:mod:`manyfiles.scale.keyranges`).  With
#   ``--manifest`` the client reads the manifest and makes the slices itself.
# * :class:`Slice` -- download up to ``slice_keys`` objects with the single-machine engine room
#   (:func:`run`: the engines chosen by size, temp + rename, checksums, retries) into the
#   shared DEST.  Its state goes to ``DEST/.s3pull/shards/<slice>.<attempt>.jsonl``, a new file per
#   attempt, so workers on several machines never append to one file; a re-run of the slice (its
#   worker died, or the whole command again) skips what its earlier attempts installed and
#   resumes the large objects they left in parts.  A local ``s3pull`` of the same DEST reads every
#   slice's records as well.
#
# Downloads go first (slices are scheduled before listing ranges), so listed keys do not pile up
# in the client.  The client checks the source (one listing request) before DEST is created,
# tidies DEST's temp folder before any slice starts, and writes the merged ``failures.tsv`` at the
# end.  Slices of a listing are reproducible when the bucket has not changed (the cuts follow the
# keys), so a rerun finds its slices' records; after changes, shifted slices fetch again.

SLICE_KEYS = 10_000       # keys per download shard and per listing shard (10 pages of 1000)


class Slice(NamedTuple):
    """Objects to download: ``(key, size, etag)`` each, in key order."""

    objects: tuple[tuple[str, int | None, str | None], ...]

    @property
    def id(self) -> str:
        """Names the slice's state files: the same keys make the same slice on a rerun."""
        first, last = self.objects[0][0], self.objects[-1][0]
        digest = hashlib.sha1(f"{first}\0{last}\0{len(self.objects)}".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()[:20]


def _installed_by_earlier_attempts(dest: str, slice_id: str) -> dict[str, dict]:
    """key -> state record of the objects that earlier attempts of this slice *in this run*
    installed (their worker died): the records of the slice's state files that are not among
    those the run's first attempt found (each attempt notes them before it starts)."""
    attempt = lease.current()
    if not attempt.rerun_possible:
        return {}
    state = State(dest)
    try:
        files = state.open(create=False, load=False).slice_records(slice_id)
    finally:
        state.release()
    attempt.note(sorted(files))
    before = set(attempt.first_note(sorted(files)))
    out: dict[str, dict] = {}
    for name, records in files.items():
        if name not in before:
            out.update(records)
    return out


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


@dataclass(frozen=True)
class PullJob(executor.Job):
    """Download everything under ``source`` into ``dest`` (an absolute path every worker sees)."""

    source: str
    dest: str
    settings: Any
    config: tuple = ()                 # PullConfig keyword arguments, as sorted pairs
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    manifest: str | None = None
    slice_keys: int = SLICE_KEYS
    name = "s3pull"
    unit = "objects"

    def shards(self) -> Iterator[Any]:
        if self.manifest is None:
            yield KeyRange(None, None)
            return
        batch: list[tuple] = []
        for info in read_manifest(self.manifest, parse_url(self.source)):
            batch.append(tuple(info))
            if len(batch) >= self.slice_keys:
                yield Slice(tuple(batch))
                batch = []
        if batch:
            yield Slice(tuple(batch))

    def priority(self, shard: Any) -> int:
        return 0 if isinstance(shard, Slice) else 1      # downloads before more listing

    def new_report(self) -> Any:
        return PullReport()

    def run(self, shard: Any, publish: Publish) -> ShardResult:
        url = parse_url(self.source)
        if isinstance(shard, KeyRange):
            return self._list(url, shard)
        return self._download(url, shard, publish)

    def _cfg(self) -> Any:
        return PullConfig(**dict(self.config))

    def _list(self, url: Any, rng: KeyRange) -> ShardResult:
        # every key under the prefix, the wildcard applied here: a range ends at its first key past
        # ``upto`` even when few keys match (the lister's work stays bounded)
        everything = S3Url(url.bucket, url.prefix, None, url.base)
        listing = list_objects_lean(self.settings, everything, retry=self._cfg().retry, start_after=rng.after)
        keep = None if url.pattern is None else (lambda info: url.matches(info.key))
        found, rest = take(listing, rng, self.slice_keys, url.prefix, keep=keep)
        more: list[Any] = [Slice(tuple(tuple(info) for info in found))] if found else []
        return ShardResult(report=self.new_report(), more=more + rest)

    def _download(self, url: Any, sl: Slice, publish: Publish) -> ShardResult:
        """The slice's objects into DEST.  ``bytes``: the sizes of the objects installed (the
        parts a lost worker fetched and this attempt resumed included); an object a lost
        attempt of this run installed counts as downloaded ("lost worker"), not skipped."""
        report = self.new_report()
        objects = [ObjectInfo(*o) for o in sl.objects]
        keep = make_filter(self.include, self.exclude)
        theirs = _installed_by_earlier_attempts(self.dest, sl.id)
        installed = 0
        # closing(): a lapsed lease (publish raises) ends the engines here, as Ctrl-C does
        events = run(url, objects, self.dest, settings=self.settings, cfg=self._cfg(), keep=keep,
                     report=report, state_slice=sl.id)
        with contextlib.closing(events):
            for ev in events:
                if ev.kind == "done":
                    installed += ev.size
                elif ev.kind == "skip" and ev.key in theirs:
                    report.skipped -= 1
                    report.add_done("lost worker", ev.size, Claim.from_record(theirs[ev.key]).kind)
                    installed += ev.size
                publish(report.done + report.skipped + len(report.failures), installed, len(report.failures))
        report.bytes = installed
        handled = report.done + report.skipped + len(report.failures)
        return ShardResult(report=report, items=handled, bytes=installed)

    def finish(self, report: ClusterReport) -> None:
        """The merged ``DEST/.s3pull/failures.tsv`` (slices write none); after a run without
        failures, an empty ``DEST/.s3pull/tmp`` (temps of lost workers included)."""
        state = State(self.dest)
        try:
            state.open(create=False, load=False)
            if report.result is not None:
                report.result.failures_file = state.write_failures(
                    [(f.path, f.reason) for f in report.result.failures])
        finally:
            state.release()
        if report.ok:
            empty_tmp(self.dest)


def pull_on_cluster(source: str, dest: str | os.PathLike, *, cluster: ClusterArg, settings: Any = None,
                    include: Iterable[str] = (), exclude: Iterable[str] = (), manifest: str | None = None,
                    dry_run: bool = False, on_event: Any = None, progress: ProgressArg = False,
                    slice_keys: int = SLICE_KEYS, **config: Any) -> ClusterReport:
    """The cluster form of :func:`manyfiles.s3.pull` (same arguments); returns a ClusterReport whose
    ``result`` is the pull's report merged over every slice."""
    from manyfiles.s3.sink import FolderSink

    if dry_run or on_event is not None:
        raise UsageError("dry_run and on_event: not with a cluster (the events stay on the workers)")
    if config.get("cache") is not None:
        raise UsageError("--cache: not with a cluster (each node would need its own; warm them with "
                         "`manyfiles cache warm --cluster`)")
    if config.get("strategy") == "processes":
        raise UsageError("--strategy processes: not with a cluster (Dask's workers are the processes)")
    url = parse_url(source)
    cfg = _config(**config)
    settings = (settings or ClientSettings()).resolved()
    if manifest is None:
        # the first listing request before DEST exists: no bucket, no credentials -> nothing created
        next(iter(list_objects_lean(settings, url, page_size=1, retry=cfg.retry)), None)
    elif manifest != "-" and not os.path.isfile(manifest):   # "-": stdin, read here by shards()
        raise UsageError(f"--files-from {manifest}: no such file")
    dest = os.path.abspath(os.fspath(dest))
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise UsageError(f"{dest}: not a directory")
    sink = FolderSink(dest, layout=cfg.layout, fsync=cfg.fsync).open()    # checks DEST, tidies tmp/
    sink.state.close()
    sink.state.release()
    job = PullJob(source=source, dest=dest, settings=settings, config=tuple(sorted(config.items())),
                  include=tuple(include), exclude=tuple(exclude),
                  manifest=manifest if manifest in (None, "-") else os.path.abspath(manifest),
                  slice_keys=slice_keys)
    return run_job(job, cluster, progress=progress)


__all__ = ["SLICE_KEYS", "STATE_DIR", "Event", "PullConfig", "PullJob", "PullPlan", "Slice", "get_objects",
           "iter_objects", "plan", "pull", "pull_on_cluster", "run"]
