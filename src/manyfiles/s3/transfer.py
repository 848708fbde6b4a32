"""One object or one part: GET, stream into a Target, verify, retry.  Shared by all engines.

``Job`` is the unit the planner hands to engines (picklable, for worker processes).
The blocking functions here use a boto3 client; :mod:`manyfiles.s3.engines` has the
asyncio twins for aioboto3, in the same order.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from dataclasses import dataclass, field

from manyfiles import iotrace
from manyfiles.s3.retry import ObjectChanged, RetryPolicy, TransferError, classify

CHUNK = 1 << 20
_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Job:
    """One object to fetch, with the engine the planner chose for it."""

    key: str
    rel: str
    size: int | None
    etag: str | None
    engine: str = ""
    part_size: int = 0         # > 0: ranged, in parts of this size
    tries: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def parts(self) -> list[tuple[int, int, int]]:
        """(index, first byte, last byte inclusive) of each ranged part."""
        if not self.part_size or not self.size:
            return []
        n = (self.size + self.part_size - 1) // self.part_size
        return [(i, i * self.part_size, min(self.size, (i + 1) * self.part_size) - 1) for i in range(n)]


def md5_checkable(job: Job) -> bool:
    """Single-part uploads (and unencrypted objects) have ETag == MD5 of the body."""
    return bool(job.etag) and _MD5_ETAG.match(job.etag) is not None


class Verifier:
    """Checks a whole-object body: its length against the listing, its MD5 against the ETag."""

    def __init__(self, job: Job, verify_md5: bool) -> None:
        self.job = job
        self.md5 = hashlib.md5() if verify_md5 and md5_checkable(job) else None
        self.n = 0

    def update(self, chunk) -> None:
        self.n += len(chunk)
        if self.md5 is not None:
            self.md5.update(chunk)

    def check(self, content_length: int | None) -> None:
        expected = content_length if content_length is not None else self.job.size
        if expected is not None and self.n != expected:
            raise TransferError(f"truncated body: got {self.n} of {expected} bytes", retryable=True)
        if self.job.size is not None and content_length is not None and content_length != self.job.size:
            raise ObjectChanged(f"size changed since listing ({self.job.size} -> {content_length})")
        if self.md5 is not None and self.md5.hexdigest() != self.job.etag:
            raise TransferError("MD5 of the body does not match the ETag", retryable=True)


def _trace(op: str, bucket: str, key: str, offset: int, length: int, t0: int, status: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, f"{bucket}/{key}", offset, length, t0, time.monotonic_ns() - t0, status)


def get_whole(client, bucket: str, job: Job, target, *, verify_md5: bool = True, on_bytes=None) -> int:
    """One GET of the whole object into ``target`` (sequential appends); returns bytes read."""
    kw = {"Bucket": bucket, "Key": job.key}
    if job.etag:
        kw["IfMatch"] = f'"{job.etag}"'
    t0 = time.monotonic_ns()
    status = 0
    ver = Verifier(job, verify_md5)
    try:
        resp = client.get_object(**kw)
        status = resp["ResponseMetadata"]["HTTPStatusCode"]
        length = resp.get("ContentLength")
        body = resp["Body"]
        try:
            while True:
                chunk = body.read(CHUNK)
                if not chunk:
                    break
                target.append(chunk)
                ver.update(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        finally:
            body.close()
        ver.check(length)
    except Exception as exc:
        err = classify(exc)
        _trace("s3.get", bucket, job.key, 0, ver.n, t0, err.status or status or -1)
        raise err from exc
    _trace("s3.get", bucket, job.key, 0, ver.n, t0, status)
    if job.size is None:
        job.size = ver.n
    return ver.n


def check_range(status: int, content_range: str | None, start: int, end: int, size: int | None) -> None:
    """A ranged GET must answer 206 with exactly the range we asked for."""
    if status != 206:
        raise TransferError(f"asked for a range, got HTTP {status}", retryable=True, status=status)
    expect = f"bytes {start}-{end}/"
    if not content_range or not content_range.startswith(expect):
        raise TransferError(f"wrong Content-Range {content_range!r}", retryable=True, status=status)
    total = content_range[len(expect):]
    if size is not None and total != "*" and total != str(size):
        raise ObjectChanged(f"size changed since listing ({size} -> {total})")


def with_retries(fn, policy: RetryPolicy, on_retry=None, reset=None):
    """Call ``fn()`` until it succeeds, a non-retryable error, or ``policy.attempts`` tries."""
    for attempt in range(policy.attempts):
        try:
            return fn()
        except TransferError as err:
            if not err.retryable or attempt + 1 >= policy.attempts:
                raise
            if on_retry is not None:
                on_retry(str(err))
            if reset is not None:
                reset()
            time.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")


async def awith_retries(fn, policy: RetryPolicy, on_retry=None, reset=None):
    """The coroutine twin of :func:`with_retries` (``fn`` returns an awaitable); any other
    exception is classified into a TransferError first, so it is retried or reported too."""
    for attempt in range(policy.attempts):
        try:
            return await fn()
        except Exception as exc:
            err = classify(exc)
            if not err.retryable or attempt + 1 >= policy.attempts:
                if err is exc:
                    raise
                raise err from exc
            if on_retry is not None:
                on_retry(str(err))
            if reset is not None:
                reset()
            await asyncio.sleep(policy.delay(attempt))
    raise AssertionError("unreachable")

