"""list -> plan -> submit: the producer thread of one pull.

It walks the listing (or the manifest, or a plan's objects), plans each object
(:func:`plan_objects`: a safe local path, skipped if a previous run finished it, an engine from
:mod:`~manyfiles.s3.routing`) and hands each planned job to its engine, or installs it from the
cache, so downloads start with the first listing page.  What it decides goes to the consuming
thread as events on ``ctx.events`` (:mod:`manyfiles.s3._events`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from manyfiles.errors import IntegrityError, ManyfilesError
from manyfiles.s3 import routing
from manyfiles.s3.engines.base import Ctx, Done, Failed
from manyfiles.s3.engines.engine_set import EngineSet
from manyfiles.s3.engines.events import End, Fatal, JobDone, JobFailed, Listed, Planned, Skipped
from manyfiles.s3.integrity import digest_for, object_claim
from manyfiles.s3.keys import S3Url, UnsafeKey, local_relpath
from manyfiles.s3.object_listing import ObjectInfo
from manyfiles.s3.retry import classify
from manyfiles.s3.state import State
from manyfiles.s3.transfer import Download

if TYPE_CHECKING:
    from manyfiles.s3._pullconfig import Destination, PullConfig


def plan_objects(url: S3Url, objects: Iterable[ObjectInfo], cfg: PullConfig, *,
                 keep: Callable[[str], bool] | None, final_path: Callable[[str], str],
                 state: State | None) -> Iterator[Planned | Skipped | JobFailed]:
    """The planner: :class:`Planned`, :class:`Skipped` or :class:`JobFailed` (an unsafe key) for every
    object ``keep`` accepts, in listing order.  Pure but for the state check."""
    for info in objects:
        if keep is not None and not keep(info.key.removeprefix(url.base)):
            continue
        try:
            rel = local_relpath(info.key, url.base)
            path = final_path(rel)
        except UnsafeKey as exc:
            job = Download(info.key, "", info.size, info.etag)
            if info.key.endswith("/") and not info.size:
                yield Skipped(job, "directory marker")
            else:
                yield JobFailed(job, Failed(f"unsafe key: {exc}", "unsafe-key"))
            continue
        if state is not None and state.done and state.is_done(info.key, info.size, info.etag, path,
                                                              verify=cfg.verify_existing):
            yield Skipped(Download(info.key, rel, info.size, info.etag), "already downloaded")
            continue
        engine, part_size = routing.choose(cfg.strategy, info.size, ranged_min=cfg.ranged_min,
                                           part_size=cfg.part_size)
        yield Planned(Download(info.key, rel, info.size, info.etag, engine, part_size), part_size)


class Producer:
    """The planning thread: every planned job goes to its engine (or is installed from the cache)
    once one of ``slots`` is free, which bounds the jobs listed but not finished; the consumer
    frees a slot per outcome.  A dry run only plans.

    Events it sends (:mod:`manyfiles.s3.engines.events`): each plan's :class:`Planned`/:class:`Skipped`/
    :class:`JobFailed`, :class:`JobDone` for a cache hit, then :class:`Listed` (the count) and
    :class:`End` once every engine finished; :class:`Fatal` (the error, re-raised by the consumer) if
    listing or submitting failed.  It stops quietly when ``ctx.cancel`` is set.
    """

    def __init__(self, url: S3Url, objects: Iterable[ObjectInfo], cfg: PullConfig, *,
                 keep: Callable[[str], bool] | None, dest: Destination, ctx: Ctx, engines: EngineSet,
                 slots: threading.BoundedSemaphore, dry_run: bool) -> None:
        self.url, self.objects, self.cfg, self.keep = url, objects, cfg, keep
        self.dest, self.ctx, self.engines, self.slots, self.dry_run = dest, ctx, engines, slots, dry_run
        self.put = ctx.events.put

    def start(self) -> None:
        threading.Thread(target=self._run, name="s3pull-planner", daemon=True).start()

    def _run(self) -> None:
        try:
            if not self._produce():
                return
        except BaseException as exc:  # re-raised in the consuming thread
            self.put(Fatal(self._fatal(exc)))
            return
        self.put(End())

    def _produce(self) -> bool:
        """Plan and submit every object; False if the run was cancelled meanwhile."""
        listed = 0
        for ev in plan_objects(self.url, self.objects, self.cfg, keep=self.keep,
                               final_path=self.dest.final_path, state=self.dest.state):
            if self.ctx.cancel.is_set():
                return False
            listed += 1
            self.put(ev)
            if type(ev) is Planned and not self.dry_run and not self._submit(ev.job):
                return False
        self.put(Listed(listed))
        self.engines.close()
        return True

    def _submit(self, job: Download) -> bool:
        """Hand ``job`` over once a slot is free; False if the run was cancelled while waiting."""
        while not self.slots.acquire(timeout=0.5):
            if self.ctx.cancel.is_set():
                return False
        sink = self.dest.sink
        if self.cfg.cache is not None and not sink.memory:
            hit = from_cache(self.cfg, sink, self.url, job)
            if hit is not None:
                self.put(JobDone(job, hit))
                return True
        self.engines.get(job.engine).submit(job)
        return True

    def _fatal(self, exc: BaseException) -> BaseException:
        if isinstance(exc, (ManyfilesError, KeyboardInterrupt)):
            return exc
        # e.g. no credentials found, or an engine that could not start
        wrapped = ManyfilesError(f"s3://{self.url.bucket}/{self.url.prefix}: {classify(exc)}")
        wrapped.__cause__ = exc
        return wrapped


def from_cache(cfg: PullConfig, sink: Any, url: S3Url, job: Download) -> Done | None:
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
