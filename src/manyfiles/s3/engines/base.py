"""The seam between the planner and the engines.

An engine receives jobs with ``submit(job)`` from the planner's thread, runs them
on its own threads/loop/processes, and reports every outcome through the
:class:`Ctx` (``bytes``, ``retried``, ``done``, ``failed``), which only queues
events: the thread that called ``pull()`` consumes them (progress, state file,
report), so engines never share mutable state with it.  ``close()`` waits for
all submitted jobs.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from dataclasses import dataclass

from manyfiles._retry import aretrying
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import UnsafeKey
from manyfiles.s3.retry import LocalError, RetryPolicy, TransferError, classify


@dataclass(frozen=True)
class Options:
    """What every engine (and every worker process) needs to know; picklable."""

    bucket: str
    settings: ClientSettings
    retry: RetryPolicy
    verify: bool = True              # False: size-only (--no-verify)
    dest: str | None = None          # None: memory
    layout: str = "folder"
    fsync: bool = False


class Ctx:
    """Event channel from engines to the consuming thread, plus the cancel flag."""

    def __init__(self, options: Options, sink) -> None:
        self.options = options
        self.sink = sink
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.cancel = threading.Event()

    # Called from engine threads.  Event tuples: (kind, job_or_None, value)
    def bytes(self, n: int) -> None:
        self.events.put(("bytes", None, n))

    def retried(self, job, reason: str) -> None:
        self.events.put(("retry", job, reason))

    def done(self, job, engine: str) -> None:
        self.events.put(("done", job, engine))

    def failed(self, job, reason: str) -> None:
        self.events.put(("failed", job, reason))


def open_target(ctx: Ctx, job, identity: str | None = None):
    """The sink's target for ``job``, or None after reporting the failure."""
    try:
        return ctx.sink.target(job.key, job.rel, job.size, job.etag, identity)
    except UnsafeKey as exc:
        ctx.failed(job, str(exc))
    except OSError as exc:
        fail(ctx, job, classify(exc))
    return None


def fail(ctx: Ctx, job, error: BaseException) -> None:
    """Report ``job`` failed; a full or failing disk also stops the run (``job.extra["fatal"]``)."""
    if isinstance(error, LocalError) and error.stops_the_run and ctx.options.dest is not None:
        job.extra["fatal"] = f"{os.path.join(ctx.options.dest, job.rel)}: {error}"
    ctx.failed(job, str(error))


def finish(ctx: Ctx, job, target, engine: str, error: BaseException | None, keep: bool = False) -> None:
    """Commit or abort ``target`` and report the outcome."""
    if error is None:
        try:
            target.commit()
        except UnsafeKey as exc:
            target.abort()
            ctx.failed(job, str(exc))
            return
        except OSError as exc:
            target.abort()
            fail(ctx, job, classify(exc))
            return
        ctx.done(job, engine)
    else:
        target.abort(keep=keep)
        fail(ctx, job, error)


class Engine:
    name = "engine"

    def submit(self, job) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Hand over buffered jobs (the listing finished a page)."""

    def close(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Stop as fast as possible (Ctrl-C): in-flight temp files are removed or kept for resume."""
        self.close()


class LoopThreadEngine(Engine):
    """An engine whose worker coroutines run on an event loop in one background thread.

    Subclasses implement ``_main()``: it runs on the loop, sets ``self._ready`` once its
    workers can take jobs (or stores ``self._error`` first), and returns when every
    worker has taken its ``None`` from ``self.q``.
    """

    thread_name = "s3pull-loop"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        self.ctx, self.workers = ctx, max(1, workers)

    def _start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._thread, name=self.thread_name, daemon=True)
        self.thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def submit(self, job) -> None:
        self.loop.call_soon_threadsafe(self.q.put_nowait, job)

    def close(self) -> None:
        for _ in range(self.workers):
            self.loop.call_soon_threadsafe(self.q.put_nowait, None)
        self.thread.join()

    def kill(self) -> None:
        self.ctx.cancel.set()
        self.close()

    def _thread(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.q: asyncio.Queue = asyncio.Queue()
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        raise NotImplementedError

    async def _serve(self, fetch) -> None:
        """One worker coroutine: take jobs until its ``None``, run ``fetch(job, target)`` under the
        retry policy, and report each outcome."""
        ctx, opts = self.ctx, self.ctx.options
        while (job := await self.q.get()) is not None:
            if ctx.cancel.is_set():
                ctx.failed(job, "cancelled")
                continue
            target = open_target(ctx, job)
            if target is None:
                continue
            error = None
            try:
                await aretrying(lambda job=job, target=target: fetch(job, target), opts.retry,
                                classify=classify, on_retry=lambda err, job=job: ctx.retried(job, str(err)),
                                reset=target.reset)
            except TransferError as err:
                error = err
            finish(ctx, job, target, self.name, error)
