"""Thread pool engines on one shared boto3 client: ``sync`` (1 thread), ``threads``, ``ranged``.

botocore clients are thread-safe, and the client's urllib3 pool is sized to the
number of threads so no thread waits for a connection.  Large objects are split
into parts (``job.part_size``); every part is a ranged GET pinned to the listed
ETag with IfMatch and written with pwrite at its offset into one preallocated
temp file, by whichever thread fetched it, so parts of one object are fetched in
parallel and parts of several objects share the pool.
"""

from __future__ import annotations

import queue
import threading

from manyfiles.s3.engines.base import Ctx, Engine
from manyfiles.s3.keys import UnsafeKey
from manyfiles.s3.retry import ObjectChanged, TransferError, classify
from manyfiles.s3.transfer import Job, get_whole, with_retries


class _Ranged:
    """Book-keeping of one object being fetched in parts."""

    def __init__(self, job: Job, target, remaining: int) -> None:
        self.job, self.target, self.remaining = job, target, remaining
        self.error: TransferError | None = None
        self.lock = threading.Lock()

    def part_finished(self, error: TransferError | None) -> bool:
        """Record one part's outcome; True for the caller that finished the last part."""
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.remaining -= 1
            return self.remaining == 0


def open_target(ctx: Ctx, job: Job, resumable: bool):
    """The sink's target for ``job``, or None after reporting the failure."""
    try:
        return ctx.sink.target(job.key, job.rel, job.size, job.etag, resumable)
    except UnsafeKey as exc:
        ctx.failed(job, str(exc))
    except OSError as exc:
        ctx.failed(job, f"{exc.strerror or exc}")
    return None


def finish(ctx: Ctx, job: Job, target, engine: str, error: BaseException | None, keep: bool = False) -> None:
    """Commit or abort ``target`` and report the outcome."""
    if error is None:
        try:
            target.commit()
        except (OSError, UnsafeKey) as exc:
            target.abort()
            ctx.failed(job, str(exc) if isinstance(exc, UnsafeKey) else f"{exc.strerror or exc}")
            return
        ctx.done(job, engine)
    else:
        target.abort(keep=keep)
        ctx.failed(job, str(error))


class ThreadsEngine(Engine):
    """``transport``: "boto3" (one shared client) or "lean" (raw sockets, see engines.lean)."""

    def __init__(self, ctx: Ctx, workers: int, name: str = "threads", transport: str = "boto3") -> None:
        self.ctx, self.name, self.workers = ctx, name, max(1, workers)
        opts = ctx.options
        if transport == "lean":
            from manyfiles.s3.engines.lean import LeanClient
            from manyfiles.s3.sigv4 import Signer, bucket_region, resolve_endpoint

            region = bucket_region(opts.settings, opts.bucket)
            lean = LeanClient(resolve_endpoint(opts.settings, opts.bucket, region),
                              Signer(opts.settings, region), opts.settings.read_timeout)
            self._get_whole = lambda job, target: lean.get(opts.bucket, job, target,
                                                           verify_md5=opts.verify_md5, on_bytes=ctx.bytes)
            self._get_part = lambda job, target, a, b: lean.get(opts.bucket, job, target, a, b,
                                                                on_bytes=ctx.bytes)
        else:
            client = opts.settings.client(pool=self.workers)
            self._get_whole = lambda job, target: get_whole(client, opts.bucket, job, target,
                                                            verify_md5=opts.verify_md5, on_bytes=ctx.bytes)
            self._get_part = None    # ranged parts always go to the lean pool (plan.choose)
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"s3pull-{name}-{i}", daemon=True)
                        for i in range(self.workers)]
        for t in self.threads:
            t.start()

    def submit(self, job: Job) -> None:
        parts = job.parts
        if len(parts) <= 1:
            self.q.put(("whole", job, None))
            return
        target = open_target(self.ctx, job, resumable=self.ctx.sink.state is not None)
        if target is None:
            return
        todo = [p for p in parts if p[0] not in target.resumable_parts]
        if not todo:
            finish(self.ctx, job, target, "ranged", None)
            return
        if len(todo) < len(parts):
            job.extra["resumed_parts"] = len(parts) - len(todo)
        tracker = _Ranged(job, target, len(todo))
        for p in todo:
            self.q.put(("part", tracker, p))

    def close(self) -> None:
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            t.join()

    def kill(self) -> None:
        self.ctx.cancel.set()
        self.close()

    # -- worker threads -----------------------------------------------------------
    def _run(self) -> None:
        ctx = self.ctx
        while True:
            item = self.q.get()
            if item is None:
                return
            kind, obj, part = item
            try:
                if kind == "whole":
                    self._whole(obj)
                else:
                    self._part(obj, part)
            except BaseException as exc:
                job = obj if kind == "whole" else obj.job
                ctx.failed(job, f"internal error: {type(exc).__name__}: {exc}")

    def _whole(self, job: Job) -> None:
        ctx = self.ctx
        if ctx.cancel.is_set():
            ctx.failed(job, "cancelled")
            return
        target = open_target(ctx, job, resumable=False)
        if target is None:
            return
        opts = ctx.options
        error = None
        try:
            with_retries(lambda: self._get_whole(job, target), opts.retry,
                         on_retry=lambda r: ctx.retried(job, r), reset=target.reset)
        except TransferError as err:
            error = err
        except OSError as exc:
            error = classify(exc)
        finish(ctx, job, target, "ranged" if self.name == "ranged" else self.name, error)

    def _part(self, tracker: _Ranged, part: tuple[int, int, int]) -> None:
        ctx, opts, job = self.ctx, self.ctx.options, tracker.job
        index, start, end = part
        error: TransferError | None = None
        if tracker.error is not None:
            error = tracker.error
        elif ctx.cancel.is_set():
            error = TransferError("cancelled", retryable=True)
        else:
            try:
                with_retries(lambda: self._get_part(job, tracker.target, start, end), opts.retry,
                             on_retry=lambda r: ctx.retried(job, r))
                tracker.target.part_done(index)
            except TransferError as err:
                error = err
            except OSError as exc:
                error = classify(exc)
        if tracker.part_finished(error):
            err = tracker.error
            # keep finished parts for a re-run unless the object itself changed
            finish(ctx, job, tracker.target, "ranged", err, keep=not isinstance(err, ObjectChanged))
