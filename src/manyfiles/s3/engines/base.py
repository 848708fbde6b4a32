"""The seam between the planner and the engines.

An engine receives jobs with ``submit(job)`` from the planner's thread, runs them
on its own threads/loop/processes, and reports every outcome through the
:class:`Ctx` (``bytes``, ``retried``, ``done``, ``failed``), which only queues
events (typed: :mod:`manyfiles.s3.engines.events`): the thread that called ``pull()`` consumes
them (progress, state file, report).  Jobs are immutable; what happened travels in the event
(:class:`Done`, :class:`Failed`), so engines never share mutable state with the consumer.
``close()`` waits for all submitted jobs.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from dataclasses import dataclass

from manyfiles._core.retry import aretrying
from manyfiles.errors import ManyfilesError
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.events import BytesIn, Done, Failed, JobDone, JobFailed, Retried
from manyfiles.s3.keys import UnsafeKey
from manyfiles.s3.retry import LocalError, RetryPolicy, TransferError, classify, failure_code, stopping_error
from manyfiles.s3.transfer import Fetched

BYTES_BATCH = 1 << 20


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
    checksum_mode: bool = True       # ask for the server's flexible checksums (x-amz-checksum-mode)


class Ctx:
    """Event channel from engines to the consuming thread, plus the cancel flag."""

    bytes_batch = BYTES_BATCH

    def __init__(self, options: Options, sink) -> None:
        self.options = options
        self.sink = sink
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.cancel = threading.Event()
        self._bytes_lock = threading.Lock()
        self._unsent = 0

    # Called from engine threads; the events: manyfiles.s3.engines.events
    def bytes(self, n: int) -> None:
        """Count ``n`` bytes received: one "bytes" event per BYTES_BATCH (an event per chunk was a
        third of the consumer's events on small objects); the rest goes with the next outcome."""
        with self._bytes_lock:
            self._unsent += n
            if self._unsent < self.bytes_batch:
                return
            n, self._unsent = self._unsent, 0
        self._send_bytes(n)

    def _send_bytes(self, n: int) -> None:
        self.events.put(BytesIn(n))

    def take_bytes(self) -> int:
        """Bytes counted but not sent in an event yet (the consumer takes them with each outcome)."""
        with self._bytes_lock:
            n, self._unsent = self._unsent, 0
        return n

    def retried(self, job, reason: str) -> None:
        self.events.put(Retried(job, reason))

    def done(self, job, outcome: Done) -> None:
        self.events.put(JobDone(job, outcome))

    def failed(self, job, outcome: Failed) -> None:
        self.events.put(JobFailed(job, outcome))


def open_target(ctx: Ctx, job, identity: str | None = None):
    """The sink's target for ``job``, or None after reporting the failure."""
    try:
        return ctx.sink.target(job.key, job.rel, job.size, job.etag, identity)
    except UnsafeKey as exc:
        fail(ctx, job, exc)
    except OSError as exc:
        fail(ctx, job, classify(exc))
    return None


def fail(ctx: Ctx, job, error: BaseException, code: str | None = None) -> None:
    """Report ``job`` failed; an error every other object would meet too also stops the run."""
    stop = None
    if isinstance(error, LocalError) and error.stops_the_run and ctx.options.dest is not None:
        stop = ManyfilesError(f"{os.path.join(ctx.options.dest, job.rel)}: {error}")
    elif isinstance(error, TransferError):
        stop = stopping_error(error, f"s3://{ctx.options.bucket}/{job.key}")
    if stop is not None:
        stop.__cause__ = error
    ctx.failed(job, Failed(str(error), code or failure_code(error), stop))


def finish(ctx: Ctx, job, target, engine: str, fetched: Fetched | None, error: BaseException | None,
           keep: bool = False) -> None:
    """Commit or abort ``target`` and report the outcome (``fetched``: what the transfer produced)."""
    if error is None:
        assert fetched is not None
        try:
            installed = target.commit()
        except UnsafeKey as exc:
            target.abort()
            fail(ctx, job, exc)
            return
        except OSError as exc:
            target.abort()
            fail(ctx, job, classify(exc))
            return
        ctx.done(job, Done(engine, fetched.size, fetched.claim, fetched.resumed_parts, installed))
    else:
        target.abort(keep=keep)
        fail(ctx, job, error)


def cancelled(ctx: Ctx, job) -> None:
    ctx.failed(job, Failed("cancelled", "cancelled"))


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
        self._closing = threading.Lock()
        self._closed = False

    def _start(self) -> None:
        import asyncio  # here: a pull on the thread pools never loads it (~10 ms of start-up)

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
        # the planner closes at the end of the listing while the consumer may kill (an error
        # that stops the run): the workers get their None once, from whoever comes first
        with self._closing:
            first, self._closed = not self._closed, True
        if first:
            try:
                for _ in range(self.workers):
                    self.loop.call_soon_threadsafe(self.q.put_nowait, None)
            except RuntimeError:    # the loop already ended (its workers failed to start)
                pass
        self.thread.join()

    def kill(self) -> None:
        """Stop now: the workers' requests are cancelled where they wait (a stalled server holds
        nothing up), their temp files removed."""
        self.ctx.cancel.set()
        with contextlib.suppress(RuntimeError):     # (the loop already ended)
            self.loop.call_soon_threadsafe(self._task.cancel)
        self.close()

    def _thread(self) -> None:
        import asyncio

        asyncio.set_event_loop(self.loop)
        self.q: asyncio.Queue = asyncio.Queue()
        self._task = self.loop.create_task(self._main())
        try:
            self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:      # kill()
            pass
        finally:
            # a worker still pending when _main ended (gather ends at the first worker's error) is
            # cancelled and run to its end here, while the sink is open: closed later by the garbage
            # collector, it would clean up against a closed sink and print a traceback
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def _main(self) -> None:
        raise NotImplementedError

    async def _serve(self, fetch) -> None:
        """One worker coroutine: take jobs until its ``None``, run ``fetch(job, target)`` under the
        retry policy, and report each outcome."""
        ctx, opts = self.ctx, self.ctx.options
        while (job := await self.q.get()) is not None:
            if ctx.cancel.is_set():
                cancelled(ctx, job)
                continue
            target = open_target(ctx, job)
            if target is None:
                continue
            fetched = error = None
            try:
                fetched = await aretrying(lambda job=job, target=target: fetch(job, target), opts.retry,
                                          classify=classify,
                                          on_retry=lambda err, job=job: ctx.retried(job, str(err)),
                                          reset=target.reset, cancel=ctx.cancel)
            except TransferError as err:
                error = err
            except BaseException:       # kill(): the task is cancelled
                target.abort()
                raise
            finish(ctx, job, target, self.name, fetched, error)
