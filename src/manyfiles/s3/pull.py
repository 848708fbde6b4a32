"""list -> plan -> execute -> report for one bulk download: the public calls (pull, plan,
iter_objects, get_objects) and the dry run's :class:`PullPlan`.

The work is :func:`~manyfiles.s3._run.run` (``_run.py``: the listing, the planner, the engines,
the state; its producer and consumer sides in ``_producer.py`` and ``_events.py``); on a cluster,
``_cluster.py`` cuts it into shards.

A producer thread lists the source (or reads the manifest, or a plan's objects), maps each
key to a safe local path, skips what a previous run finished, asks :mod:`plan` for an engine
and submits the job, so downloads start with the first listing page.  The calling thread
consumes the engines' events: it keeps the state file, the report and the progress, and is
where Ctrl-C lands.  A dry run stops after the plan and returns it (:class:`PullPlan`);
``plan.execute()`` (or ``pull(plan=...)``) fetches exactly its objects later.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import PartialFailure, UsageError
from manyfiles.s3._cluster import SLICE_KEYS, PullJob, Slice, pull_on_cluster
from manyfiles.s3._events import Event
from manyfiles.s3._pullconfig import PullConfig, _config
from manyfiles.s3._run import _source, empty_tmp, run, stall_watch
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import STATE_DIR, S3Url, make_filter, parse_url
from manyfiles.s3.object_listing import ObjectInfo
from manyfiles.s3.report import PullReport
from manyfiles.s3.transfer import Download

Job = Download      # the name PullPlan.objects' pinned signature (tests/public_api.json) carries


@dataclass(kw_only=True)
class PullPlan(PullReport):
    """A dry run: what :func:`pull` would fetch (``objects``: one :class:`Download` each, with its
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


def _check_call(progress: object, on_event: object) -> None:
    check_progress(progress)
    if on_event is not None and not callable(on_event):
        raise UsageError(f"on_event must be a callable taking an Event, not {on_event!r}")


def pull(source: str | None = None, dest: str | os.PathLike | None = None, *, strategy: str = "auto",
         concurrency: int = 64, processes: int = 0, include: Iterable[str] = (), exclude: Iterable[str] = (),
         manifest: str | None = None, layout: str = "folder", dry_run: bool = False,
         settings: ClientSettings | None = None, plan: PullPlan | None = None, progress: ProgressArg = False,
         on_event: Callable[[Event], None] | None = None, page_size: int = 1000, cluster: object = None,
         objects: Iterable[ObjectInfo] | None = None, **config: Any) -> PullReport:
    """Download every object under ``source`` (``s3://bucket/prefix``, wildcards allowed) into ``dest``.

    Returns a :class:`PullReport`; per-object failures are collected there (and in
    ``DEST/.s3pull/failures.tsv``), not raised (``report.raise_for_failures()`` does).
    ``dry_run=True`` lists and plans only and returns a :class:`PullPlan` (a report with the
    planned objects and ``execute()``); ``plan=`` fetches a plan's objects (``source``, ``dest``
    and the options come from it).  ``progress``: True for a live display, or a callable taking
    a :class:`~manyfiles._core.progress.Snapshot` (objects done/total, bytes).  ``on_event``
    receives every :class:`Event` in the calling thread.  Extra keyword arguments go to
    :class:`PullConfig` (``verify``, ``verify_existing``, ``fsync``, ``part_size``, ``retry``...).
    ``objects``: fetch these listed objects (``ObjectInfo(key, size, etag)`` under ``source``)
    instead of listing ``source`` (what a sync decided: :func:`manyfiles.mirror.pull_sync`).
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
    if objects is not None and (plan is not None or manifest is not None or cluster is not None):
        raise UsageError("objects=: not with plan=, a manifest or a cluster (each says what to fetch)")
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
        watch = stall_watch(cfg, settings, url)
        objects = [ObjectInfo(j.key, j.size, j.etag) for j in plan.objects]
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
        watch = stall_watch(cfg, settings, url)
        if objects is None:
            objects = _source(url, settings, manifest, cfg.retry, page_size, watch)
        report = PullPlan(source=source, dest=os.path.abspath(dest), settings=settings, config=cfg) \
            if dry_run else PullReport()
    with progress_for(progress, "s3pull (dry run)" if dry_run else "s3pull", unit="objects") as p:
        for ev in run(url, objects, os.fspath(dest), settings=settings, cfg=cfg, keep=keep, dry_run=dry_run,
                      report=report, progress=p, watch=watch):
            if on_event is not None and isinstance(ev, Event):
                on_event(ev)
    if plan is not None:
        report.listed += len(plan.failures)
    if not dry_run and report.ok and report.listed:     # nothing listed: nothing was created
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
    watch = stall_watch(cfg, settings, url)
    objects = _source(url, settings, manifest, cfg.retry, watch=watch)
    with progress_for(progress, "s3 get_objects", unit="objects") as p:
        for ev in run(url, objects, None, settings=settings, cfg=cfg, keep=keep, report=report, progress=p,
                      watch=watch):
            if not isinstance(ev, Event):
                yield ev
    if report.failures and errors == "raise":
        first = report.failures[0]
        raise PartialFailure(f"{len(report.failures)} object(s) failed; first: {first.path}: {first.reason}",
                             report.failures, report)


def get_objects(source: str, **kwargs: Any) -> dict[str, bytes]:
    """``dict(iter_objects(source, ...))``: every object under ``source`` in memory, by key."""
    return dict(iter_objects(source, **kwargs))


__all__ = ["SLICE_KEYS", "STATE_DIR", "Event", "PullConfig", "PullJob", "PullPlan", "Slice", "get_objects",
           "iter_objects", "plan", "pull", "pull_on_cluster", "run"]
