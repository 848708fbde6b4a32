"""Many objects of one bucket, fetched concurrently into memory: the public many-objects fetch.

:class:`Fetcher` keeps ``workers`` connections of the bucket's store busy with whole-object GETs,
each pinned to the ETag given and checked whole before its bytes are handed out (MD5 ETag, multipart
ETag or S3 checksum; ``verify=False``: size only), and with ranged GETs (``range=(start, end)``,
inclusive) on a pool of its own.  Whole objects go through s3pull's small-object engine: one thread
multiplexing the ``workers`` connections with epoll (:mod:`manyfiles.s3.engines.loop`), started on
the first submit; what it does not speak (TLS, a proxy, a multipart ETag whose part sizes must be
learnt first) goes to the lean thread pool (raw sockets, signed by hand), started when first
needed.  Every request is under the :class:`~manyfiles.s3.RetryPolicy` given; while the caller
waits for a result the run's stall watch (issue 24) looks on: nothing moving for the policy's
``stall_timeout`` (an endpoint never heard from: its first-contact time) raises
:class:`~manyfiles.errors.Stalled`.

``submit`` then ``result`` (in any order): the Dataset's prefetch.  :func:`fetch_objects` is the
one-call form for a list.

Example:
    >>> from manyfiles.s3 import fetch_objects
    >>> for r in fetch_objects("bucket", ["a.json", ("big.bin", (0, 1023))]):   # doctest: +SKIP
    ...     print(r.key, r.range, len(r.data), r.checked)
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from manyfiles.errors import (
    ManyfilesError,
    NotFound,
    ObjectChanged,
    PartialFailure,
    TransferError,
    UsageError,
)
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.engines.events import Batch, BytesIn, JobDone, JobFailed, Retried
from manyfiles.s3.retry import (
    NETWORK_CODES,
    RetryPolicy,
    endpoint_name,
    failure_code,
    has_answered,
    stopping_error,
)
from manyfiles.s3.sink import MemorySink, MemoryTarget

CHECK = 1.0     # seconds between two looks at the stall while a result is awaited

Range = tuple[int, int]
Request = str | tuple[str, Range]       # a key, or (key, (first byte, last byte inclusive))


class FetchResult(NamedTuple):
    """One request's outcome: ``data`` (None when it failed; a view of the buffer given as ``into``),
    ``checked`` how the bytes were checked ("md5", "crc32c", "size-only"...; None for a range that
    was not checked whole: only its length and Content-Range are), or ``error``."""

    key: str
    range: Range | None
    data: bytes | memoryview | None
    checked: str | None
    error: ManyfilesError | None


class RangeDone(NamedTuple):
    """A range's outcome, on the engine's event channel beside its :class:`JobDone`/:class:`JobFailed`."""

    request: tuple[str, Range]
    result: FetchResult


class _IntoTarget(MemoryTarget):
    """A whole object written into the caller's buffer (no copy when it is handed out)."""

    def __init__(self, sink: MemorySink, key: str, into: memoryview) -> None:
        super().__init__(sink, key, len(into))
        self.buf = into          # type: ignore[assignment]

    def write_at(self, offset: int, data) -> None:
        end = offset + len(data)
        if end > len(self.buf):
            raise TransferError(f"{end:,} bytes do not fit the buffer of {len(self.buf):,}", retryable=False)
        self.buf[offset:end] = data

    def reset(self) -> None:
        self._pos = 0

    def commit(self) -> None:
        self.sink.deliver(self.key, self.buf)

    def abort(self, keep: bool = False) -> None:
        pass


class _Sink(MemorySink):
    """The fetcher's sink: objects into fresh bytes, or into the buffer given for their key."""

    def __init__(self, deliver) -> None:
        super().__init__(deliver)
        self.into: dict[str, memoryview] = {}

    def target(self, key: str, rel: str, size: int | None, etag: str | None,
               identity: str | None = None) -> MemoryTarget:
        into = self.into.pop(key, None)
        return MemoryTarget(self, key, size) if into is None else _IntoTarget(self, key, into)


class Fetcher:
    """Fetches many objects (or ranges of them) of one bucket, ``workers`` at a time.

    ``submit(key, ...)`` then ``result(key, ...)``: outcomes come back by request, in any order, each
    kept until asked for (``abandon`` drops one that will not be).  One whole-object request per key
    at a time.  One per process (not picklable); ``close()`` (or ``with``) ends its connections.
    ``settings``: the endpoint and credentials (the environment's by default); ``retry``: the policy
    of every request and of the stall watch; ``verify=False``: size checks only.
    """

    def __init__(self, bucket: str, *, settings: ClientSettings | None = None, workers: int = 16,
                 retry: RetryPolicy | None = None, verify: bool = True) -> None:
        from manyfiles._core.progress import StallWatch
        from manyfiles.s3.engines.base import Ctx, Options

        if workers < 1:
            raise UsageError(f"workers must be at least 1, not {workers}")
        settings = (settings or ClientSettings()).resolved()
        retry = retry or RetryPolicy()
        self.bucket, self.settings, self.workers, self.verify = bucket, settings, workers, verify
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._delivered: dict[str, bytes | memoryview] = {}
        self._done: dict[tuple[str, Range | None], FetchResult] = {}
        self._abandoned: set[tuple[str, Range | None]] = set()
        self._ctx = Ctx(Options(bucket, settings, retry, verify=verify), _Sink(self._deliver))
        self._engine: Any = None        # the loop engine, made on the first submit (see the module docs)
        self._lean: Any = None          # the thread pool, for what the loop does not speak
        self._closed = False
        self._ranges: ThreadPoolExecutor | None = None
        self._where = endpoint_name(settings.endpoint_url) or f"s3://{bucket}"   # what a stall names
        self._watch = StallWatch.for_policy(retry, answered=has_answered(self._where))

    def _deliver(self, key: str, data: bytes | memoryview) -> None:     # an engine thread, before "done"
        with self._lock:
            self._delivered[key] = data

    def submit(self, key: str, *, size: int | None = None, etag: str | None = None,
               range: Range | None = None, into: Any = None) -> None:
        """Start fetching ``key`` (pinned to ``etag`` and checked against ``size`` when given), or bytes
        ``range`` = (first, last) of it.  ``into``: a writable buffer of exactly the object's (or the
        range's) length that receives the bytes; the result's ``data`` is then a view of it."""
        from manyfiles.s3.transfer import Download

        if range is not None and not 0 <= range[0] <= range[1]:
            raise UsageError(f"{key}: not a byte range: {range!r} (first, last inclusive)")
        view = None
        if into is not None:
            view = memoryview(into).cast("B")
            want = size if range is None else range[1] - range[0] + 1
            if want is not None and want != len(view):
                raise UsageError(f"{key}: a buffer of {len(view):,} bytes for {want:,}")
        if range is not None:
            if self._ranges is None:
                self._ranges = ThreadPoolExecutor(self.workers, thread_name_prefix="s3-fetch-range")
            self._ranges.submit(self._fetch_range, key, range, size, etag, view)
            return
        if view is not None:
            self._ctx.sink.into[key] = view
            size = len(view)
        self._whole_engine().submit(Download(key, key, size, etag, "loop", 0))

    def _whole_engine(self) -> Any:
        # made on first use, in the process that uses it: a fetcher made before a fork is never used
        # in the child (see close()), so no child inherits a loop it believes is running
        if self._engine is None:
            from manyfiles.s3.engines.loop import LoopEngine

            try:
                self._engine = LoopEngine(self._ctx, self.workers, self._elsewhere)
            except Exception:       # no store (no credentials...): each job fails with the reason
                self._engine = self._lean_engine()
        return self._engine

    def _lean_engine(self) -> Any:
        with self._lock:
            if self._lean is None:
                from manyfiles.s3.engines.threads import ThreadsEngine

                self._lean = ThreadsEngine(self._ctx, self.workers, name="lean", transport="lean")
            return self._lean

    def _elsewhere(self, job: Any) -> None:     # a Download the loop does not speak
        self._lean_engine().submit(job)

    def _fetch_range(self, key: str, range: Range, size: int | None, etag: str | None,
                     into: memoryview | None) -> None:      # a range thread
        from manyfiles.s3.store import store_for

        events, ctx = self._ctx.events, self._ctx
        try:
            store = store_for(self.settings, self.bucket, retry=ctx.options.retry, verify=self.verify,
                              cancel=ctx.cancel, on_retry=lambda err: events.put(Retried(None, str(err))))
            got = store.get_range(key, range[0], range[1], if_match=etag, size=size)
            data = got.data
            if into is not None:
                into[:] = data
                data = into
            outcome = FetchResult(key, range, data, got.claim and got.claim.method, None)
        except Exception as err:       # (told to the caller with its result, never lost in this thread)
            outcome = FetchResult(key, range, None, None, self._range_error(key, err))
        events.put(RangeDone((key, range), outcome))

    def _range_error(self, key: str, err: Exception) -> ManyfilesError:
        if isinstance(err, TransferError):
            stop = stopping_error(err, f"s3://{self.bucket}/{key}")
            return stop or _error(key, self.bucket, failure_code(err), str(err))
        return err if isinstance(err, ManyfilesError) else _error(key, self.bucket, "transfer", str(err))

    def result(self, key: str, *, range: Range | None = None) -> FetchResult:
        """Wait for ``key`` (or its ``range``), submitted before; other outcomes are kept for their turn.
        Raises :class:`~manyfiles.errors.Stalled` when nothing moved for the stall timeout."""
        want = (key, range)
        self._abandoned.discard(want)
        watch = self._watch
        watch.since = max(watch.since, time.monotonic())   # (the caller's own time is no stall)
        get = self._ctx.events.get
        while want not in self._done:
            try:
                ev = get(timeout=CHECK)
            except queue.Empty:
                watch.tick(None, self._where)
                continue
            if type(ev) is Batch:       # one turn of the loop engine's outcomes
                for one in ev.events:
                    self._event(one)
            else:
                self._event(ev)
        return self._done.pop(want)

    def _event(self, ev: Any) -> None:
        kind = type(ev)
        if kind is JobDone or kind is JobFailed:
            self._outcome(ev)
        elif kind is BytesIn:
            self._watch.moving = True
        elif kind is Retried:
            self._watch.failed(ev.reason)
        elif kind is RangeDone:
            self._watch.moving = True
            self._keep(ev.request, ev.result)

    def _outcome(self, ev: JobDone | JobFailed) -> None:
        key, outcome = ev.job.key, ev.outcome
        with self._lock:
            data = self._delivered.pop(key, None)
        if type(ev) is JobDone:
            self._watch.moving = True
            self._keep((key, None), FetchResult(key, None, data, outcome.claim.method, None))
            return
        if outcome.code in NETWORK_CODES:
            self._watch.failed(outcome.reason)
        elif outcome.code != "cancelled":
            self._watch.moving = True
        error = outcome.stop or _error(key, self.bucket, outcome.code, outcome.reason)
        self._keep((key, None), FetchResult(key, None, None, None, error))

    def _keep(self, request: tuple[str, Range | None], outcome: FetchResult) -> None:
        if request in self._abandoned:
            self._abandoned.discard(request)
        else:
            self._done[request] = outcome

    def abandon(self, key: str, *, range: Range | None = None) -> None:
        """``key`` (or its ``range``) was submitted but will not be waited for: drop its outcome."""
        if self._done.pop((key, range), None) is None:
            self._abandoned.add((key, range))

    def close(self) -> None:
        """Stop: requests in flight are cut off, the connections closed."""
        if os.getpid() != self.pid or self._closed:
            return
        self._closed = True
        for engine in {id(e): e for e in (self._engine, self._lean) if e is not None}.values():
            engine.kill()
        if self._ranges is not None:
            self._ranges.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error(key: str, bucket: str, code: str, reason: str) -> ManyfilesError:
    where = f"s3://{bucket}/{key}"
    if code in ("changed", "PreconditionFailed"):
        return ObjectChanged(f"{where}: {reason}")
    if code in ("NoSuchKey", "NotFound"):
        return NotFound(f"{where}: {reason}")
    return TransferError(f"{where}: {reason}")


def fetch_objects(bucket: str, requests: Iterable[Request], *, settings: ClientSettings | None = None,
                  workers: int = 16, retry: RetryPolicy | None = None, verify: bool = True,
                  errors: str = "raise") -> Iterator[FetchResult]:
    """Fetch every request (a key, or ``(key, (first, last))`` for a range) of ``bucket``, ``workers``
    at a time, and yield their :class:`FetchResult` in the order asked.

    ``errors="raise"``: raises :class:`~manyfiles.errors.PartialFailure` at the end if some failed
    (after yielding the others); ``"ignore"``: their results carry the error.  Options as
    :class:`Fetcher`.
    """
    if errors not in ("raise", "ignore"):
        raise UsageError(f"errors must be 'raise' or 'ignore', not {errors!r}")
    asked = [(r, None) if isinstance(r, str) else (r[0], tuple(r[1])) for r in requests]
    return _fetch_all(bucket, asked, settings, workers, retry, verify, errors)


def _fetch_all(bucket: str, asked: list, settings: ClientSettings | None, workers: int,
               retry: RetryPolicy | None, verify: bool, errors: str) -> Iterator[FetchResult]:
    failed: list[FetchResult] = []
    with Fetcher(bucket, settings=settings, workers=workers, retry=retry, verify=verify) as f:
        for key, rng in asked:
            f.submit(key, range=rng)
        for key, rng in asked:
            r = f.result(key, range=rng)
            if r.error is not None:
                failed.append(r)
            yield r
    if failed and errors == "raise":
        raise PartialFailure(f"{len(failed)} object(s) failed; first: {failed[0].error}",
                             [(r.key, str(r.error)) for r in failed])
