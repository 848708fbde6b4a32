"""The report side of one pull: the calling thread turns the events of the producer and the engines
into the report, the state file, the progress and the :class:`Event` stream the caller reads."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from manyfiles._core.progress import LOG_INTERVAL, Progress, StallWatch
from manyfiles.errors import Stalled
from manyfiles.s3.engines.base import Ctx, Done, Failed
from manyfiles.s3.engines.events import (
    Batch,
    BytesIn,
    Delivered,
    End,
    Fatal,
    JobDone,
    JobFailed,
    Listed,
    Planned,
    Retried,
    Skipped,
)
from manyfiles.s3.keys import S3Url
from manyfiles.s3.report import PullReport
from manyfiles.s3.retry import NETWORK_CODES
from manyfiles.s3.transfer import Download

CHECK = 1.0     # seconds between two looks at the stall (and renderings while nothing arrives)

if TYPE_CHECKING:
    from manyfiles.s3._pullconfig import Destination, PullConfig


class Event(NamedTuple):
    """What ``on_event`` receives.

    kind: "plan" (engine chosen; value = part size), "skip" (value = reason), "done" (value = the
    relative path), "failed" (value = reason), "retry" (value = reason), "bytes" (value = n, no
    key), "listed" (listing finished; value = number of objects), "stall" (nothing moved for a
    while, every 5 s while it lasts; value = a :class:`~manyfiles._core.progress.Stall`: seconds,
    last error).
    """

    kind: str
    key: str | None
    size: int | None
    engine: str | None
    value: Any


class Consumer:
    """Reads ``ctx.events`` in the calling thread (where Ctrl-C lands): fills ``report`` (a
    :class:`PullPlan` also collects the planned jobs) and ``progress`` (objects: done + skipped +
    failed; bytes; totals once the listing ended), records each installed object in the state file
    (and the cache), and frees the producer's slot of each finished job.

    It also keeps the run's :class:`~manyfiles._core.progress.StallWatch`: every byte, object and
    listed page (the listing tells it) moves it, every retry and network failure is its last error.
    While nothing moves it shows the stall on ``progress`` and sends a "stall" event every 5 s
    (:attr:`stall`: the :class:`~manyfiles._core.progress.Stall` now, None while moving); past the
    stall timeout it raises :class:`~manyfiles.errors.Stalled`, naming ``where`` (the endpoint).
    An object that fails on the network before anything moved ends the run the same way: the
    endpoint never answered, every other object would wait as long."""

    def __init__(self, ctx: Ctx, report: PullReport, progress: Progress | None, dest: Destination,
                 cfg: PullConfig, url: S3Url, slots: threading.BoundedSemaphore, dry_run: bool,
                 watch: StallWatch, where: str) -> None:
        self.ctx, self.report, self.progress, self.dest = ctx, report, progress, dest
        self.cfg, self.url, self.slots, self.dry_run = cfg, url, slots, dry_run
        self.watch, self.where = watch, where
        self.stall = None
        self._stall_sent = float("-inf")
        self.planned_bytes: int | None = 0   # None once an object of unknown size was planned

    def events(self) -> Iterator[Event | tuple[str, bytes]]:
        """Events until the producer's end, and (key, bytes) pairs from a memory sink.  Raises the
        producer's fatal error, the error of a failure that stops the run (a full disk), or
        Stalled."""
        get, watch = self.ctx.events.get, self.watch
        monotonic = time.monotonic
        next_check = monotonic() + CHECK
        batch: list = []        # what is left of a Batch, last event first
        while True:
            if batch:
                ev = batch.pop()
            else:
                try:
                    ev = get(timeout=CHECK)
                except queue.Empty:
                    ev = None
                if type(ev) is Batch:
                    batch = list(reversed(ev.events))
                    ev = batch.pop()
            now = monotonic()
            if now >= next_check:
                next_check = now + CHECK
                stalled = self._check(now)
                if stalled is not None:
                    yield stalled
            kind = type(ev)
            if kind is BytesIn:
                watch.moving = True
                yield from self._counted(ev.n)
            elif kind is JobDone:
                watch.moving = True
                yield from self._done(ev.job, ev.outcome)
            elif kind is Delivered:
                yield (ev.key, ev.data)
            elif kind is Planned:
                if self.dry_run:        # (a run's plans are decisions, not progress)
                    watch.moving = True
                yield self._planned(ev.job, ev.part_size)
            elif kind is JobFailed:
                yield self._failed(ev.job, ev.outcome)
            elif kind is Retried:
                job = ev.job
                self.report.retries += 1
                watch.failed(ev.reason)
                yield Event("retry", job.key, job.size, job.engine, ev.reason)
            elif kind is Skipped:
                watch.moving = True
                yield self._skipped(ev.job, ev.reason)
            elif kind is Listed:
                yield self._listed(ev.count)
            elif kind is Fatal:
                raise ev.error
            elif kind is End:
                yield from self._counted(self.ctx.take_bytes())
                return

    def _check(self, now: float) -> Event | None:
        """The stall as of ``now`` (shown, raised past the timeout); a "stall" event every 5 s of it."""
        self.stall = stall = self.watch.tick(self.progress, self.where, now)
        if stall is None or now - self._stall_sent < LOG_INTERVAL:
            return None
        self._stall_sent = now
        return Event("stall", None, None, None, stall)

    def _counted(self, n: int) -> Iterator[Event]:
        if n:
            self.report.bytes += n
            if self.progress:
                self.progress.add(bytes=n)
            yield Event("bytes", None, None, None, n)

    def _done(self, job: Download, outcome: Done) -> Iterator[Event]:
        self.slots.release()
        yield from self._counted(self.ctx.take_bytes())   # this object's bytes not sent as an event yet
        self.report.add_done(outcome.engine, outcome.size, outcome.claim.kind, outcome.claim.note,
                             outcome.resumed_parts)
        dest, cache = self.dest, self.cfg.cache
        if dest.state is not None:
            dest.state.record(job.key, outcome.size, job.etag, outcome.claim.to_record(),
                              dest.final_path(job.rel), stat=outcome.installed)
        if cache is not None and outcome.engine != "cache" and job.etag and not dest.sink.memory:
            cache.import_file(f"s3://{self.url.bucket}/{job.key}", job.etag, outcome.size,
                              dest.final_path(job.rel))
        if self.progress:
            self.progress.add(1)
        yield Event("done", job.key, outcome.size, outcome.engine, job.rel)

    def _planned(self, job: Download, part_size: int | None) -> Event:
        self.report.add_planned(job.engine, job.size)
        planned = getattr(self.report, "objects", None)   # a PullPlan collects its jobs
        if planned is not None:
            planned.append(job)
        if self.planned_bytes is not None:
            self.planned_bytes = None if job.size is None else self.planned_bytes + job.size
        if self.dry_run and self.progress:
            self.progress.add(1)
        return Event("plan", job.key, job.size, job.engine, part_size)

    def _failed(self, job: Download, failed: Failed) -> Event:
        if not self.dry_run and job.engine:
            self.slots.release()
        self.report.add_failure(job.key, failed.reason, failed.code)
        if failed.code in NETWORK_CODES:
            if not self.watch.ever_moved:
                # the endpoint never answered this run, for a request's whole first-contact budget:
                # every other object would wait as long (one that went away: the watch decides)
                raise Stalled(failed.reason if failed.reason.startswith(self.where + ": ")
                              else f"{self.where}: {failed.reason}")
            self.watch.failed(failed.reason)
        elif failed.code != "cancelled":    # an answer (a 404, a failed check...): the run moves
            self.watch.moving = True
        if self.progress:
            self.progress.add(1, failures=1)
        if failed.stop is not None:
            # the run stops on it (a full disk...): its error names the object, one line, not
            # an event line and the error line for the same ENOSPC
            raise failed.stop
        return Event("failed", job.key, job.size, job.engine or None, failed.reason)

    def _skipped(self, job: Download, reason: str) -> Event:
        self.report.skipped += 1
        if self.progress:
            self.progress.add(1)
        return Event("skip", job.key, job.size, None, reason)

    def _listed(self, count: int) -> Event:
        self.report.listed = count
        if self.progress:
            self.progress.set(total=count, bytes_total=None if self.dry_run else self.planned_bytes)
        return Event("listed", None, None, None, count)
