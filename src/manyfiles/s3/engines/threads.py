"""Thread pool engines: ``sync`` (1 thread), ``threads`` (one shared boto3 client), ``lean`` and
``ranged`` (the bucket's store: raw sockets, see :mod:`manyfiles.s3.store`).

botocore clients are thread-safe, and the client's urllib3 pool is sized to the number of
threads so no thread waits for a connection.  Large objects (``job.part_size``) start with a
*probe*: the store's HEAD (:meth:`manyfiles.s3.store.S3Store.head`: checksums,
encryption, ``?partNumber=1`` for multipart ETags, checked against the listing), which decides
the check and the ranges: multipart objects are cut on their part boundaries, so each part's MD5
or checksum is taken as it is written.  Every range is a GET pinned to the listed ETag with
If-Match, written with pwrite at its offset into one preallocated temp file by whichever thread
fetched it.  When the last range is in, the object's check runs; if it fails, the whole object is
fetched again (up to the retry policy), since no single range can be blamed.  A HEAD that keeps
contradicting the listing, or a multipart layout that cannot be learnt, sends the object to one
whole GET whose check is a layout search (:class:`manyfiles.s3.integrity.LayoutSearch`): never a
silent size-only check.
"""

from __future__ import annotations

import json
import queue
import threading

from manyfiles._core.retry import retrying
from manyfiles.errors import IntegrityError
from manyfiles.s3.engines.base import Ctx, Engine, Failed, cancelled, fail, finish, open_target
from manyfiles.s3.integrity import NO_CHECKSUM, SIZE_ONLY, Claim, Digest, check_or_search
from manyfiles.s3.retry import Inconsistent, ObjectChanged, TransferError, classify
from manyfiles.s3.store import store_for
from manyfiles.s3.transfer import Download, Fetched, get_whole, needs_layout

SEARCH = "search"    # a whole GET whose multipart layout is searched (the HEADs were no use)


class _Ranged:
    """Book-keeping of one object being fetched in ranges (``attempt``: whole-object tries so far)."""

    def __init__(self, job: Download, target, claim: Claim, ranges: list[tuple[int, int, int]], *,
                 attempt: int = 0, resumed: int = 0) -> None:
        self.job, self.target, self.claim, self.ranges = job, target, claim, ranges
        self.attempt, self.resumed = attempt, resumed
        self.digest = Digest(claim, job.size, target.read)
        self.remaining = 0
        self.error: TransferError | None = None
        self.lock = threading.Lock()

    def part_finished(self, error: TransferError | None) -> bool:
        """Record one range's outcome; True for the caller that finished the last one."""
        with self.lock:
            if error is not None and self.error is None:
                self.error = error
            self.remaining -= 1
            return self.remaining == 0


def ranges_for(size: int, part_size: int, claim: Claim) -> list[tuple[int, int, int]]:
    """(index, first, last) ranges of at most ``part_size`` that never straddle a check unit."""
    units = claim.parts or (size,)
    out = []
    pos = 0
    for usize in units:
        end = pos + usize
        while pos < end:
            last = min(end, pos + part_size) - 1
            out.append((len(out), pos, last))
            pos = last + 1
    return out


class ThreadsEngine(Engine):
    """``transport``: "boto3" (one shared client) or "lean" (the bucket's store)."""

    def __init__(self, ctx: Ctx, workers: int, name: str = "threads", transport: str = "boto3") -> None:
        self.ctx, self.name, self.workers = ctx, name, max(1, workers)
        opts = ctx.options
        self.store = None
        if transport == "lean":
            # the bucket's store, for the configuration and credentials of this pull
            self.store = store = store_for(opts.settings, opts.bucket, retry=opts.retry, verify=opts.verify,
                                           checksum_mode=opts.checksum_mode, cancel=ctx.cancel)

            def whole(job, target, hint=None) -> Fetched:
                layout = None
                if hint == SEARCH:
                    layout = ()
                elif needs_layout(job.size, job.etag, opts.verify):
                    layout = store.learn_layout(job.key, job.size, job.etag,
                                                on_retry=lambda err: ctx.retried(job, str(err)))
                return store.fetch_into(job.key, target, etag=job.etag, size=job.size, layout=layout,
                                        on_bytes=ctx.bytes)
        else:
            client = opts.settings.client(pool=self.workers, checksums=opts.checksum_mode)

            def whole(job, target, hint=None) -> Fetched:
                return get_whole(client, opts.bucket, job, target, verify=opts.verify,
                                 checksum_mode=opts.checksum_mode, on_bytes=ctx.bytes, retry=opts.retry,
                                 on_retry=lambda err: ctx.retried(job, str(err)))

        self._get_whole = whole
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        # jobs submitted and not ended: a probe or a failed check queues more work, so close()
        # waits for these before it sends the workers home
        self._open_jobs = 0
        self._cond = threading.Condition(threading.Lock())   # not reentrant: cheaper per object
        self.threads = [threading.Thread(target=self._run, name=f"s3pull-{name}-{i}", daemon=True)
                        for i in range(self.workers)]
        for t in self.threads:
            t.start()

    def submit(self, job: Download) -> None:
        with self._cond:
            self._open_jobs += 1
        if len(job.parts) <= 1 or self.store is None:
            self.q.put(("whole", job, None))
        else:
            self.q.put(("probe", job, None))

    def _ended(self) -> None:
        with self._cond:
            self._open_jobs -= 1
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            while self._open_jobs > 0 and any(t.is_alive() for t in self.threads):
                self._cond.wait(0.5)
        for _ in self.threads:
            self.q.put(None)
        for t in self.threads:
            t.join()

    def kill(self) -> None:
        self.ctx.cancel.set()
        if self.store is not None:
            self.store.interrupt()       # no thread waits for a read timeout (a stalled run)
        self.close()

    # -- worker threads -----------------------------------------------------------
    def _run(self) -> None:
        ctx = self.ctx
        while True:
            item = self.q.get()
            if item is None:
                return
            kind, obj, part = item
            ended = False
            try:
                if kind == "whole":
                    ended = self._whole(obj, part) or True
                elif kind == "probe":
                    ended = self._probe(obj)
                else:
                    ended = self._part(obj, part)
            except BaseException as exc:
                job = obj if kind != "part" else obj.job
                ctx.failed(job, Failed(f"internal error: {type(exc).__name__}: {exc}", "internal"))
                ended = kind != "part"
            if ended:
                self._ended()

    def _retrying(self, fn, job: Download, reset=None):
        return retrying(fn, self.ctx.options.retry, classify=classify,
                        on_retry=lambda err: self.ctx.retried(job, str(err)), reset=reset,
                        cancel=self.ctx.cancel)

    def _whole(self, job: Download, hint: str | None = None) -> None:
        ctx = self.ctx
        if ctx.cancel.is_set():
            cancelled(ctx, job)
            return
        target = open_target(ctx, job)
        if target is None:
            return
        fetched = error = None
        try:
            fetched = self._retrying(lambda: self._get_whole(job, target, hint), job, reset=target.reset)
        except TransferError as err:
            error = err
        finish(ctx, job, target, self.name, fetched, error)

    def _probe(self, job: Download) -> bool:
        """HEAD the object, choose its check and ranges, open (or resume) its temp file, queue ranges.

        A HEAD that keeps contradicting the listing, or a multipart layout that cannot be learnt,
        sends the object to one whole GET with a layout search instead (queued: returns False)."""
        ctx, opts = self.ctx, self.ctx.options
        if ctx.cancel.is_set():
            cancelled(ctx, job)
            return True
        claim = Claim(SIZE_ONLY, why=NO_CHECKSUM)
        if opts.verify:
            try:
                claim = self.store.head(job.key, etag=job.etag, size=job.size,
                                        on_retry=lambda err: ctx.retried(job, str(err))).claim
            except Inconsistent as err:
                ctx.retried(job, f"{err}: fetching it whole")
                claim = None
            except TransferError as err:
                fail(ctx, job, err)
                return True
            if claim is None or claim.pending:
                self.q.put(("whole", job, SEARCH))
                return False
        ranges = ranges_for(job.size, job.part_size, claim)
        identity = json.dumps([job.key, job.etag, job.size, [r[1] for r in ranges[:2]], len(ranges)],
                              ensure_ascii=False)
        target = open_target(ctx, job, identity)
        if target is None:
            return True
        tracker = _Ranged(job, target, claim, ranges)
        try:
            for index, start, last in ranges:       # parts a previous run finished: hash them back
                if index in target.resumable_parts:
                    tracker.digest.written(start, last - start + 1)
        except (OSError, IntegrityError):
            target.forget_parts()
            tracker = _Ranged(job, target, claim, ranges)
        todo = [r for r in ranges if r[0] not in target.resumable_parts]
        tracker.resumed = len(ranges) - len(todo)
        if not todo:
            return self._verdict(tracker)
        tracker.remaining = len(todo)
        for r in todo:
            self.q.put(("part", tracker, r))
        return False

    def _part(self, tracker: _Ranged, part: tuple[int, int, int]) -> bool:
        ctx, job, store = self.ctx, tracker.job, self.store
        index, start, end = part
        digest = tracker.digest
        error: TransferError | None = None

        def attempt() -> None:
            feed = digest.claim_feed(start)
            try:
                store.fetch_range_into(job.key, tracker.target, start, end, etag=job.etag, size=job.size,
                                       feed=feed, on_bytes=ctx.bytes)
            except BaseException:
                if feed is not None:
                    digest.release(start)
                raise
            digest.written(start, end - start + 1, feed)

        if tracker.error is not None:
            error = tracker.error
        elif ctx.cancel.is_set():
            error = TransferError("cancelled", retryable=True)
        else:
            try:
                self._retrying(attempt, job)
                tracker.target.part_done(index)
            except TransferError as err:
                error = err
        if tracker.part_finished(error):
            return self._verdict(tracker)
        return False

    def _verdict(self, tracker: _Ranged) -> bool:
        """Every range is in: check the object; fetch it all again if the check fails.

        True when the object ended (installed or failed), False when it was queued again."""
        ctx, job, err = self.ctx, tracker.job, tracker.error
        if err is None:
            try:
                tracker.claim = check_or_search(tracker.digest, job.size, tracker.target.read)
            except IntegrityError as exc:
                if tracker.attempt + 1 < ctx.options.retry.attempts and not ctx.cancel.is_set():
                    ctx.retried(job, str(exc))
                    tracker.target.forget_parts()
                    again = _Ranged(job, tracker.target, tracker.claim, tracker.ranges,
                                    attempt=tracker.attempt + 1)
                    again.remaining = len(again.ranges)
                    for r in again.ranges:
                        self.q.put(("part", again, r))
                    return False
                err = exc
        # keep finished parts for a re-run unless the object changed or failed its check
        keep = err is not None and not isinstance(err, (ObjectChanged, IntegrityError))
        fetched = Fetched(job.size, tracker.claim, tracker.resumed) if err is None else None
        finish(ctx, job, tracker.target, "ranged", fetched, err, keep=keep)
        return True
