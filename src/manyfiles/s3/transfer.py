"""One object or one part: GET, write into a Target, verify.  Shared by all engines.

``Job`` is the unit the planner hands to engines (immutable and picklable, for worker
processes); what a transfer produced comes back as a :class:`Fetched`, never written into
the job.  :class:`WholeBody` is what every whole-object GET does with its body, whatever the
transport: complete writes into the target, hashing of what was written, and the final checks
(length, listed size, then the object's :class:`~manyfiles.s3.integrity.Claim`).  The blocking
boto3 GET is here; the asyncio twins live with their engines, in the same order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from manyfiles.errors import IntegrityError
from manyfiles.s3.integrity import (
    Claim,
    check_or_search,
    digest_for,
    encrypted,
    object_claim,
)
from manyfiles.s3.layouts import etag_parts, learn_layout
from manyfiles.s3.retry import Inconsistent, ObjectChanged, TransferError, cause_of, classify
from manyfiles.trace import iotrace

CHUNK = 1 << 20
EMPTY_MD5 = "d41d8cd98f00b204e9800998ecf8427e"


@dataclass(frozen=True)
class Job:
    """One object to fetch, with the engine the planner chose for it (``size`` None: unknown)."""

    key: str
    rel: str
    size: int | None
    etag: str | None
    engine: str = ""
    part_size: int = 0         # > 0: ranged, in parts of this size

    @property
    def parts(self) -> list[tuple[int, int, int]]:
        """(index, first byte, last byte inclusive) of each ranged part."""
        if not self.part_size or not self.size:
            return []
        n = (self.size + self.part_size - 1) // self.part_size
        return [(i, i * self.part_size, min(self.size, (i + 1) * self.part_size) - 1) for i in range(n)]


@dataclass(frozen=True)
class Fetched:
    """What one object's transfer produced: its size and the check every byte of it passed."""

    size: int
    claim: Claim
    resumed_parts: int = 0     # ranged parts a previous run had finished


def needs_layout(size: int | None, etag: str | None, verify: bool) -> bool:
    """A multipart ETag can only be checked with the part sizes (one HEAD ?partNumber=1)."""
    return verify and size is not None and etag_parts(etag) > 1


def check_answer(headers: Mapping[str, str], size: int | None, etag: str | None,
                 what: str = "HEAD") -> tuple[int, str | None]:
    """(size, ETag) of a HEAD or GET answer (lower-case header names), checked against the
    listing's ``size`` and ``etag`` (when known) and against itself; raises :class:`Inconsistent`."""
    length = _int(headers.get("content-length"))
    got = (headers.get("etag") or "").strip('"') or None
    if length < 0:
        raise Inconsistent(f"{what} without a usable Content-Length ({headers.get('content-length')!r})")
    if size is not None and length != size:
        raise Inconsistent(f"{what} says {length:,} bytes, the listing {size:,}")
    if etag and got and got != etag:
        raise Inconsistent(f"{what} says ETag {got}, the listing {etag}")
    tag = got or etag
    if length == 0 and tag and len(tag) == 32 and tag != EMPTY_MD5 and not encrypted(headers):
        raise Inconsistent(f"{what} says 0 bytes, but the ETag {tag} is not an empty object's")
    if length < etag_parts(tag):
        raise Inconsistent(f"{what} says {length:,} bytes, fewer than its ETag's {etag_parts(tag)} parts")
    return length, tag


def _int(value: str | None) -> int:
    try:
        return int(value) if value is not None else -1
    except ValueError:
        return -1


class WholeBody:
    """The body of one whole-object GET of ``key`` on its way into ``target``: its answer is checked
    against the listing's ``listed_size`` and ``listed_etag`` (:func:`check_answer`), its check
    decided (:func:`~manyfiles.s3.integrity.object_claim`: ``layout`` the part sizes learnt, ``()``
    when they could not be: a layout search)."""

    def __init__(self, key: str, listed_size: int | None, listed_etag: str | None, target,
                 headers: Mapping[str, str], *, verify: bool, layout: tuple[int, ...] | None) -> None:
        self.key, self.listed_size, self.target = key, listed_size, target
        if listed_etag:      # pinned by If-Match: a size that differs is a lying answer, not a new version
            size, etag = check_answer(headers, listed_size, listed_etag, "GET")
        else:
            size, etag = _int(headers.get("content-length")), (headers.get("etag") or "").strip('"') or None
            if listed_size is not None and size >= 0 and size != listed_size:
                raise ObjectChanged(f"size changed since listing ({listed_size} -> {size})")
            size = size if size >= 0 else listed_size
        self.size = size
        self.claim = object_claim(etag, headers, size, layout, verify=verify)
        self.digest = digest_for(self.claim, size, target.read)
        self.n = 0

    def write(self, chunk) -> None:
        self.target.append(chunk)       # complete, or raises (ENOSPC...)
        self.digest.stream(chunk)       # what was written, in order
        self.n += len(chunk)

    def finish(self, content_length: int | None) -> Fetched:
        """The final checks: length, listed size, then the claim over every byte written."""
        expected = content_length if content_length is not None else self.size
        if expected is not None and self.n != expected:
            raise TransferError(f"truncated body: got {self.n} of {expected} bytes", retryable=True)
        if self.listed_size is not None and self.n != self.listed_size:
            raise ObjectChanged(f"size changed since listing ({self.listed_size} -> {self.n})")
        units = getattr(self.digest, "units", None)
        if self.size is None and self.digest.active and units and units[-1].end < 0:
            units[-1].end = self.n
        self.claim = check_or_search(self.digest, self.n, self.target.read)
        return Fetched(self.n, self.claim)


def trace_request(op: str, bucket: str, key: str, offset: int, length: int, t0: int, status: int) -> None:
    """Record one request (started at ``t0``, monotonic ns) in the I/O trace, if one is running."""
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, f"{bucket}/{key}", offset, length, t0, time.monotonic_ns() - t0, status)


def head_part_boto3(client, bucket: str, key: str, n: int) -> Mapping[str, str]:
    resp = client.head_object(Bucket=bucket, Key=key, PartNumber=n)
    return resp["ResponseMetadata"]["HTTPHeaders"]


def get_kwargs(bucket: str, job: Job, checksum_mode: bool) -> dict:
    """GetObject arguments for boto3/aioboto3: pinned to the listed ETag, checksums asked for."""
    kw = {"Bucket": bucket, "Key": job.key}
    if checksum_mode:
        kw["ChecksumMode"] = "ENABLED"
    if job.etag:
        kw["IfMatch"] = f'"{job.etag}"'
    return kw


def get_whole(client, bucket: str, job: Job, target, *, verify: bool = True, checksum_mode: bool = True,
              on_bytes=None, retry=None, on_retry=None) -> Fetched:
    """One GET of the whole object into ``target`` (sequential appends), checked; a multipart
    ETag's part sizes are learnt first (:func:`~manyfiles.s3.layouts.learn_layout`, under ``retry``)."""
    kw = get_kwargs(bucket, job, checksum_mode)
    t0 = time.monotonic_ns()
    status = 0
    body_w = None
    try:
        layout = None
        if needs_layout(job.size, job.etag, verify):
            layout = learn_layout(job.size, job.etag, lambda n: head_part_boto3(client, bucket, job.key, n),
                                  retry, on_retry=on_retry)
        resp = client.get_object(**kw)
        status = resp["ResponseMetadata"]["HTTPStatusCode"]
        body = resp["Body"]
        try:
            body_w = WholeBody(job.key, job.size, job.etag, target, resp["ResponseMetadata"]["HTTPHeaders"],
                               verify=verify, layout=layout)
            while True:
                chunk = body.read(CHUNK)
                if not chunk:
                    break
                body_w.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        finally:
            body.close()
        fetched = body_w.finish(resp.get("ContentLength"))
    except Exception as exc:
        err = classify(exc, answered=status != 0)
        trace_request("s3.get", bucket, job.key, 0, body_w.n if body_w else 0, t0, err.status or status or -1)
        raise err from cause_of(err, exc)
    trace_request("s3.get", bucket, job.key, 0, body_w.n, t0, status)
    return fetched


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


__all__ = ["CHUNK", "EMPTY_MD5", "Fetched", "IntegrityError", "Job", "WholeBody", "check_answer",
           "check_range", "get_kwargs", "get_whole", "needs_layout", "trace_request"]
