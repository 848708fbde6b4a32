"""One S3 store per bucket: every request of every tool goes through it.

The seam the anchors draw: s5cmd's ``Storage`` interface (``Stat``, ``List``, ``Get``, ``Put``,
``Delete``) under thin commands; obstore's store, configured once per bucket, then ``get``,
``get_range(s)``, ``list``; httpx's client holding the policy over a transport that only handles a
request.  Here:

* :class:`Store` is the interface (a Protocol): :meth:`~Store.head`, :meth:`~Store.get`,
  :meth:`~Store.get_range`, :meth:`~Store.get_ranges`, :meth:`~Store.open`, :meth:`~Store.list`;
  :meth:`~Store.put`, the multipart calls and :meth:`~Store.delete` / :meth:`~Store.delete_objects`.
* :class:`S3Store` is it on S3, configured once (:func:`store_for`): endpoint, region,
  credentials provider, TLS and proxy come from :mod:`manyfiles.s3.config`; the retry policy and
  timeouts from the call's :class:`~manyfiles.s3.retry.RetryPolicy` and
  :class:`~manyfiles.s3.client.ClientSettings`; the transport is
  :class:`~manyfiles.s3.transport.Transport` (hand-signed requests on raw sockets, through the
  sans-IO core :mod:`manyfiles.s3.http1`).  The policy lives here: which headers a call sends,
  what its answer must say, how each call is retried, and the check every object's bytes pass
  (:func:`~manyfiles.s3.integrity.object_claim`: checksum, MD5 ETag, multipart ETag, never a
  silent size check).
* s3pull's engines write bodies straight into their targets: :meth:`S3Store.fetch_into` (a whole
  object, checked by a :class:`~manyfiles.s3.transfer.WholeBody`), :meth:`S3Store.fetch_range_into`,
  and their twins on an event loop (:meth:`S3Store.afetch_into`, over an
  :class:`~manyfiles.s3.transport.AsyncConnection` from :meth:`S3Store.connection`).

API::

    store = store_for(settings, "bucket", retry=RetryPolicy())   # cheap: the transport is shared
    head = store.head("key")                      # ObjectHead: size, etag, claim, parts
    data = store.get("key")                       # the whole object, checked
    got = store.get_range("key", 0, 99, if_match=head.etag, head=head)   # RangeData(data, claim)
    with store.open("key", if_match=head.etag) as s:                      # one streamed GET
        for block in s.blocks(4 << 20): ...
    for info in store.list("prefix/"): ...        # ObjectInfo(key, size, etag, mtime)
    store.put("key", b"...", checksum=("crc64nvme", "..."), if_none_match=True)

Stores are kept per process, settings and bucket in :data:`manyfiles.s3.config.CONFIG` (rebuilt
when the environment or the AWS files change); :meth:`S3Store.with_options` gives another policy
(retries, checks, cancel event) over the same transport.  Errors are TransferErrors with a failure
code (``ObjectChanged`` when an If-Match pin fails, ``IntegrityError`` when bytes fail their
check, :class:`~manyfiles.s3.retry.Inconsistent` when an answer contradicts the listing or
itself, :class:`ObjectExists` when ``If-None-Match: *`` finds the key taken).
"""

from __future__ import annotations

import base64
import mmap
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, Protocol, runtime_checkable
from urllib.parse import unquote_plus

from manyfiles._core.progress import StallWatch
from manyfiles._core.retry import RetryPolicy, aretrying, retrying
from manyfiles.errors import IntegrityError, ManyfilesError, ObjectChanged, TransferError
from manyfiles.s3 import http1
from manyfiles.s3.client import ClientSettings, resolve
from manyfiles.s3.config import CONFIG, Route, known_region
from manyfiles.s3.http1 import FileBody, Headers
from manyfiles.s3.integrity import SIZE_ONLY, Claim, digest_for, encrypted, new_hash, object_claim
from manyfiles.s3.layouts import alearn_layout, etag_parts, learn_layout
from manyfiles.s3.retry import classify, coded
from manyfiles.s3.sigv4 import query_string, uri_path
from manyfiles.s3.transfer import CHUNK, Fetched, WholeBody, check_answer, check_range, needs_layout
from manyfiles.s3.transport import AsyncConnection, Splicer, Transport
from manyfiles.trace import iotrace

# -- what the store's calls return -------------------------------------------------------------------


class ObjectInfo(NamedTuple):
    """One listed object (or, with a delimiter, a common prefix: ``size`` and ``etag`` None)."""

    key: str
    size: int | None      # None: unknown (manifest without sizes), or a common prefix
    etag: str | None      # without the quotes
    mtime: float | None = None    # LastModified, seconds since the epoch (``list(mtime=True)``)


@dataclass(frozen=True)
class ObjectHead:
    """What a HEAD (or a GET's answer) says about one object, and the check its bytes must pass."""

    bucket: str
    key: str
    size: int
    etag: str | None
    claim: Claim
    headers: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def parts(self) -> tuple[int, ...]:
        """The part sizes when the object's check needed them (multipart ETag, composite checksum)."""
        return self.claim.parts

    @property
    def encrypted(self) -> bool:
        return encrypted(self.headers)

    def part_at(self, start: int, end: int) -> int:
        """The part number (1-based) whose bytes are exactly ``start..end`` (inclusive), else 0."""
        pos = 0
        for i, n in enumerate(self.parts, 1):
            if pos == start:
                return i if pos + n - 1 == end else 0
            if pos > start:
                return 0
            pos += n
        return 0


class RangeData(NamedTuple):
    """Bytes of one range (the buffer they were received into), and the check they passed on
    their own (None: none applies to the range)."""

    data: bytes | bytearray
    claim: Claim | None


@dataclass(frozen=True)
class PutResult:
    """What S3 answered to a PUT or a CompleteMultipartUpload: the object's ETag (no quotes), the
    checksums it stored (``{"crc64nvme": "base64"}``) and its version (versioned buckets)."""

    etag: str | None
    checksums: Mapping[str, str] = field(default_factory=dict)
    version_id: str | None = None


@dataclass(frozen=True)
class Part:
    """One part of a multipart upload: its number, ETag (no quotes), size (-1: not said), and its
    checksum ``(algorithm, base64)`` when it has one."""

    number: int
    etag: str
    size: int = -1
    checksum: tuple[str, str] | None = None


@dataclass(frozen=True)
class Upload:
    """A multipart upload in progress: its key, id and when it was started (seconds since the epoch)."""

    key: str
    upload_id: str
    initiated: float | None


@dataclass(frozen=True)
class DeleteFailure:
    """One key a batch delete could not remove: its key, S3's code and message."""

    key: str
    code: str
    message: str


class ObjectExists(TransferError):
    """``If-None-Match: *`` found the key taken: another writer got there first (never retried)."""

    code = "exists"

    def __init__(self, message: str = "the object already exists") -> None:
        super().__init__(message, retryable=False, status=412)


# A request body: bytes in memory, or FileBody(fd, offset, size) sent from an open file (resent
# as is when retried).
Body = bytes | bytearray | memoryview | FileBody

CHECKSUM_ALGORITHMS = ("crc64nvme", "crc32c", "crc32", "sha256", "sha1")
_XML_NAME = {"crc64nvme": "CRC64NVME", "crc32c": "CRC32C", "crc32": "CRC32", "sha256": "SHA256",
             "sha1": "SHA1"}
DELETE_BATCH = 1000      # keys per DeleteObjects request (S3's limit)


# -- the interface ------------------------------------------------------------------------------------

@runtime_checkable
class Store(Protocol):
    """One bucket's objects (s5cmd's ``Storage``, obstore's ``ObjectStore``), configured once.

    Reads are pinned and checked: a call given the version it expects (``if_match``/``etag``, the
    listing's ETag) never returns the bytes of another, and a whole object's bytes are returned only
    after they passed the object's check.  Every call is retried under the store's policy.
    Writes are conditional where S3 allows it (``if_none_match``), and carry a checksum or a
    Content-MD5 that the server checks every byte against.
    """

    bucket: str

    # -- reads ------------------------------------------------------------------------------------
    def head(self, key: str, *, etag: str | None = None, size: int | None = None) -> ObjectHead:
        """The object's size, ETag and the check its bytes must pass (``etag``/``size``: what the
        listing said; an answer that contradicts it raises :class:`~manyfiles.s3.retry.Inconsistent`)."""
        ...

    def get(self, key: str, *, if_match: str | None = None, size: int | None = None) -> bytes:
        """The whole object, checked (a failed check fetches it again, within the retry policy)."""
        ...

    def get_range(self, key: str, start: int, end: int, *, if_match: str | None,
                  size: int | None = None, head: ObjectHead | None = None) -> RangeData:
        """Bytes ``start..end`` (inclusive) of the object pinned to ``if_match``: exactly those."""
        ...

    def get_ranges(self, key: str, ranges: Iterable[tuple[int, int]], *, if_match: str | None,
                   size: int | None = None, head: ObjectHead | None = None) -> list[RangeData]:
        """Several ranges of one object, in the order asked (nearby ranges share one request)."""
        ...

    def open(self, key: str, *, if_match: str | None = None, size: int | None = None) -> ObjectStream:
        """One GET of the whole object, read in order and checked as it goes (:class:`ObjectStream`)."""
        ...

    def list(self, prefix: str = "", *, delimiter: str | None = None, start_after: str | None = None,
             page_size: int = 1000, mtime: bool = False) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, in key order, page by page (``delimiter``: one level,
        its common prefixes first in each page)."""
        ...

    # -- writes -----------------------------------------------------------------------------------
    def put(self, key: str, body: Body, *, checksum: tuple[str, str] | None = None,
            content_md5: bytes | None = None, if_none_match: bool = False,
            content_type: str | None = None) -> PutResult:
        """One PUT of ``body``.  ``checksum``: ``(algorithm, base64)`` of the whole body (CRC64NVME,
        CRC32C...), sent as ``x-amz-checksum-<algorithm>``; ``content_md5``: the MD5 digest, sent as
        ``Content-MD5``; the server refuses a body that does not match (BadDigest: an IntegrityError).
        ``if_none_match``: ``If-None-Match: *``, only if the key is free (:class:`ObjectExists`)."""
        ...

    def create_multipart(self, key: str, *, checksum_algorithm: str | None = None,
                         full_object: bool = True, content_type: str | None = None) -> str:
        """Start a multipart upload; returns its upload id.  ``checksum_algorithm``: every part
        carries one, and the object's is ``full_object`` (CRC64NVME, CRC32C, CRC32) or composite."""
        ...

    def upload_part(self, key: str, upload_id: str, number: int, body: Body, *,
                    checksum: tuple[str, str] | None = None, content_md5: bytes | None = None) -> Part:
        """Upload part ``number`` (1..10,000); the server checks it against ``checksum`` / ``content_md5``."""
        ...

    def list_parts(self, key: str, upload_id: str) -> list[Part]:
        """The parts the server holds for an upload (to resume it), by number."""
        ...

    def complete_multipart(self, key: str, upload_id: str, parts: Iterable[Part], *,
                           checksum: tuple[str, str] | None = None, if_none_match: bool = False) -> PutResult:
        """Make the object of ``parts`` (each with its ETag and checksum) visible.  ``checksum``: the
        full object's, checked by the server.  An error S3 sends inside a 200 answer is raised."""
        ...

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Abort an upload (its parts are freed); an upload already gone is not an error."""
        ...

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[Upload]:
        """The multipart uploads in progress under ``prefix``."""
        ...

    def delete(self, key: str) -> None:
        """Delete the object (a key that does not exist is not an error, as in S3)."""
        ...

    def delete_objects(self, keys: Iterable[str]) -> list[DeleteFailure]:
        """Delete many keys, 1,000 per request; returns the keys S3 could not delete."""
        ...


# -- the store on S3 ---------------------------------------------------------------------------------

class _Shared(NamedTuple):
    """What every store of one (settings, bucket) shares in a process: its route and transport."""

    route: Route
    transport: Transport


def _shared(settings: ClientSettings, bucket: str) -> _Shared:
    def make() -> _Shared:
        try:
            route = Route(settings, bucket, known_region(settings, bucket) or "us-east-1")
        except ManyfilesError:     # a profile that is not configured (UsageError)...
            raise
        except Exception as exc:     # no credentials...
            raise classify(exc) from exc
        transport = Transport(route, settings.read_timeout, connect_timeout=settings.connect_timeout)
        return _Shared(route, transport)

    return CONFIG.remember("stores", (settings, bucket), make)


def store_for(settings: ClientSettings | None, bucket: str, *, retry: RetryPolicy | None = None,
              verify: bool = True, checksum_mode: bool = True,
              on_retry: Callable[[TransferError], None] | None = None,
              cancel: threading.Event | None = None) -> S3Store:
    """The store of ``bucket`` for ``settings`` (resolved here, as the environment is now).

    Cheap: the route and transport are kept per process, settings and bucket (rebuilt when the
    environment or the AWS files change).  Raises TransferError (``NoCredentials``...) or
    UsageError when no store can be built.  Options: see :class:`S3Store`."""
    settings = resolve(settings)
    return S3Store(settings, bucket, _shared(settings, bucket), retry=retry, verify=verify,
                   checksum_mode=checksum_mode, on_retry=on_retry, cancel=cancel)


def list_buckets(settings: ClientSettings | None, *, retry: RetryPolicy | None = None) -> list[str]:
    """The names of the buckets the credentials own, sorted: ListBuckets (``GET /`` on the service
    endpoint), signed and sent as every store request is, retried under ``retry``.  Raises
    TransferError (403 AccessDenied when the credentials may not list buckets)."""
    service = store_for(settings, "", retry=retry)
    path = service.route.ep.path_prefix.rstrip("/") + "/"
    root, ns = service._retrying(lambda: service._xml_of("GET", path, ""))
    return sorted(b.findtext(f"{ns}Name") or "" for b in root.iter(f"{ns}Bucket"))


class S3Store:
    """:class:`Store` on S3 (see the module docstring); made by :func:`store_for`.

    ``retry``: the policy of every request; ``verify=False``: size checks only (``--no-checksum``);
    ``checksum_mode=False``: never ask for flexible checksums (ETags only); ``on_retry(err)`` is
    told of every retry; ``cancel`` (a ``threading.Event``): once set, no request is retried (a run
    that stopped).  Thread-safe: each thread has its own connection.
    """

    def __init__(self, settings: ClientSettings, bucket: str, shared: _Shared, *,
                 retry: RetryPolicy | None = None, verify: bool = True, checksum_mode: bool = True,
                 on_retry: Callable[[TransferError], None] | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.settings, self.bucket, self._shared = settings, bucket, shared
        self.route, self.transport = shared
        self.retry = retry or RetryPolicy()
        self.verify, self.checksum_mode = verify, checksum_mode
        self.on_retry, self.cancel = on_retry, cancel
        self._part_gets = [True]    # shared by with_options(): False once a GET ?partNumber=N gave more

    def with_options(self, **changes: Any) -> S3Store:
        """The same store (transport, connections) under other options (``retry``, ``verify``,
        ``checksum_mode``, ``on_retry``, ``cancel``)."""
        opts = {"retry": self.retry, "verify": self.verify, "checksum_mode": self.checksum_mode,
                "on_retry": self.on_retry, "cancel": self.cancel, **changes}
        out = S3Store(self.settings, self.bucket, self._shared, **opts)
        out._part_gets = self._part_gets
        return out

    @property
    def part_gets(self) -> bool:
        """Whether ``GET ?partNumber=N`` is still worth asking this store (False once it answered
        one with more than the part): a caller choosing to fetch a whole part for one block asks."""
        return self._part_gets[0]

    def interrupt(self) -> None:
        """From another thread, once ``cancel`` is set: every request of this store in flight fails
        at once (a run that stalled ends without waiting for read timeouts)."""
        self.transport.interrupt()

    def close(self) -> None:
        """Close this thread's connection (the store stays usable: the next call opens another)."""
        self.transport.close()

    def _retrying(self, fn, on_retry=None, reset=None):
        return retrying(fn, self.retry, classify=classify, on_retry=on_retry or self.on_retry, reset=reset,
                        cancel=self.cancel)

    def _path(self, key: str) -> str:
        return uri_path(self.route.ep.path_prefix, key)

    def _pin(self, etag: str | None, extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
        if etag:
            extra.append(("if-match", f'"{etag}"'))
        return extra

    # -- HEAD ---------------------------------------------------------------------------------------
    def head_headers(self, key: str, *, etag: str | None = None, part_number: int | None = None) -> Headers:
        """One HEAD's headers (``?partNumber=n``: that part's; pinned to ``etag``), not retried."""
        extra = [("x-amz-checksum-mode", "ENABLED")] if self.checksum_mode else []
        if etag and not part_number:
            extra.append(("if-match", f'"{etag}"'))
        query = f"partNumber={part_number}" if part_number else ""
        t0 = time.monotonic_ns()
        try:
            headers = self.transport.request("HEAD", self._path(key), query, extra, ok=(200, 206)).headers
        except TransferError as err:
            _trace("s3.head", self.bucket, key, 0, 0, t0, err.status or -1)
            raise
        _trace("s3.head", self.bucket, key, 0, 0, t0, 200)
        return headers

    def head(self, key: str, *, etag: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> ObjectHead:
        """HEAD the object (pinned to ``etag`` when given) and decide its check.

        ``etag``/``size``: what the listing said; an answer that contradicts it (or itself) is asked
        again and raises :class:`Inconsistent` if it persists.  A multipart object's part sizes are
        learnt with ``HEAD ?partNumber=1`` when its check needs them; when they cannot be, its claim
        is a pending layout search (``claim.pending``): only a whole read can check it.
        """
        def attempt() -> tuple[Headers, int, str | None]:
            headers = self.head_headers(key, etag=etag)
            n, tag = check_answer(headers, size, etag)
            return headers, n, tag

        headers, n, tag = self._retrying(attempt, on_retry)
        return ObjectHead(self.bucket, key, n, tag, self._claim(key, tag, headers, n, on_retry), headers)

    def learn_layout(self, key: str, size: int, etag: str | None,
                     on_retry: Callable[[TransferError], None] | None = None) -> tuple[int, ...]:
        """The part sizes of a multipart object pinned to ``etag`` (``()``: they cannot be learnt)."""
        return learn_layout(size, etag, lambda n: self.head_headers(key, etag=etag, part_number=n),
                            self.retry, on_retry=on_retry or self.on_retry)

    def _claim(self, key: str, etag: str | None, headers: Mapping[str, str], size: int, on_retry) -> Claim:
        claim = object_claim(etag, headers, size, None, verify=self.verify)
        if self.verify and (claim.pending or claim.method == SIZE_ONLY) and etag_parts(etag) > 1:
            claim = object_claim(etag, headers, size, self.learn_layout(key, size, etag, on_retry),
                                 verify=self.verify)
        return claim

    # -- GET ----------------------------------------------------------------------------------------
    def get(self, key: str, *, if_match: str | None = None, size: int | None = None,
            on_retry: Callable[[TransferError], None] | None = None) -> bytes:
        """The whole object, checked (a failed check fetches it again, within the retry policy)."""
        def attempt() -> bytes:
            with self.open(key, if_match=if_match, size=size, on_retry=on_retry) as s:
                return b"".join(s.blocks(CHUNK))

        return self._retrying(attempt, on_retry)

    def get_range(self, key: str, start: int, end: int, *, if_match: str | None,
                  size: int | None = None, head: ObjectHead | None = None,
                  on_retry: Callable[[TransferError], None] | None = None) -> RangeData:
        """Bytes ``start..end`` (inclusive) of the object pinned to ``if_match``, exactly those
        (206 and its Content-Range checked against the range asked and the object's size).

        With ``head``: a range that is the whole object is checked against ``head.claim``; a range
        that is exactly one part of an object with per-part checksums (composite) is fetched as
        ``GET ?partNumber=N`` and checked against that part's checksum.  ``RangeData.claim`` says
        which check passed (None: the bytes are unverified until the object is checked whole).
        """
        if head is not None:
            size = head.size
        if size is not None and not 0 <= start <= end < size:
            raise ValueError(f"range {start}-{end} outside an object of {size} bytes")
        if head is not None and self.verify and head.claim.composite and self.part_gets:
            n = head.part_at(start, end)
            if n:
                got = self._retrying(lambda: self._get_part(key, if_match, size, n, start, end, head.claim),
                                     on_retry)
                if got is not None:
                    return got
        whole = head is not None and start == 0 and end == head.size - 1

        def attempt() -> RangeData:
            buf = _Buffer(start, end - start + 1)
            self.fetch_range_into(key, buf, start, end, etag=if_match, size=size)
            data = buf.data             # no copy: the bytearray received into
            if not whole:
                return RangeData(data, None)
            digest = digest_for(head.claim, head.size, buf.read)
            digest.stream(data)
            digest.check()          # a flipped byte: asked again, within the policy
            return RangeData(data, digest.claim)

        return self._retrying(attempt, on_retry)

    def get_ranges(self, key: str, ranges: Iterable[tuple[int, int]], *, if_match: str | None,
                   size: int | None = None, head: ObjectHead | None = None, gap: int = 1 << 20,
                   on_retry: Callable[[TransferError], None] | None = None) -> list[RangeData]:
        """Several ranges (``(start, end)`` inclusive) of the object pinned to ``if_match``, in the
        order asked.  Ranges less than ``gap`` bytes apart are fetched by one request (obstore's
        coalescing); each piece is a view of the buffer it came in."""
        asked = list(ranges)
        out: list[RangeData | None] = [None] * len(asked)
        order = sorted(range(len(asked)), key=lambda i: asked[i])
        i = 0
        while i < len(order):
            start, end = asked[order[i]]
            group = [order[i]]
            while i + len(group) < len(order) and asked[order[i + len(group)]][0] <= end + gap:
                end = max(end, asked[order[i + len(group)]][1])
                group.append(order[i + len(group)])
            got = self.get_range(key, start, end, if_match=if_match, size=size, head=head, on_retry=on_retry)
            view = memoryview(got.data)
            for j in group:
                s, e = asked[j]
                whole = (s, e) == (start, end)
                out[j] = RangeData(got.data if whole else view[s - start:e - start + 1],
                                   got.claim if whole else None)
            i += len(group)
        return out       # type: ignore[return-value]

    def _get_part(self, key: str, etag: str | None, size: int | None, n: int, start: int, end: int,
                  claim: Claim) -> RangeData | None:
        """``GET ?partNumber=n`` checked against the part's own checksum; None when the server does
        not answer with exactly that part and its checksum (moto answers with the whole object)."""
        extra = self._pin(etag, [("x-amz-checksum-mode", "ENABLED")])
        resp = self.transport.open("GET", self._path(key), extra, f"partNumber={n}")
        try:
            want = resp.headers.get(f"x-amz-checksum-{claim.method}", "")
            total = f"/{size}" if size is not None else "/"
            crange = resp.headers.get("content-range", "")
            if resp.status != 206 or not crange.startswith(f"bytes {start}-{end}{total}") or not want \
                    or "-" in want:
                self._part_gets[0] = False
                return None
            data = resp.read(end - start + 1)
            if len(data) != end - start + 1:
                raise TransferError(f"part {n}: got {len(data)} of {end - start + 1} bytes", retryable=True)
        finally:
            resp.close()
        h = new_hash(claim.method)
        h.update(data)
        if base64.b64encode(h.digest()).decode() != want:
            raise IntegrityError(f"part {n}: {claim.method} of the bytes does not match the server's")
        return RangeData(data, Claim(claim.method, want))

    def open(self, key: str, *, if_match: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> ObjectStream:
        """One GET of the whole object, read in order (:class:`ObjectStream`); opened (and retried)
        here.  ``if_match``/``size``: the version and size expected (the listing's, a cache entry's)."""
        return ObjectStream(self, key, if_match, size, on_retry or self.on_retry)

    # -- GET into a target (s3pull's engines) ------------------------------------------------------
    def fetch_into(self, key: str, target: Any, *, etag: str | None, size: int | None,
                   layout: tuple[int, ...] | None = None,
                   on_bytes: Callable[[int], None] | None = None) -> Fetched:
        """One GET of the whole object (pinned to ``etag``) appended to ``target`` and checked as it
        is written (:class:`~manyfiles.s3.transfer.WholeBody`: ``layout`` the part sizes learnt, ``()``
        a layout search); not retried (the caller resets the target and tries again)."""
        get = _WholeGet(self, key, target, etag, size, layout)
        try:
            status, _, n, body = self.transport.fetch(get.path, get.extra, ok=(200,), begin=get.begin,
                                                      on_bytes=on_bytes)
            return get.finished(status, n, body)
        except TransferError as err:
            get.failed(err)
            raise

    def fetch_range_into(self, key: str, target: Any, start: int, end: int, *, etag: str | None,
                         size: int | None, feed: Any = None,
                         on_bytes: Callable[[int], None] | None = None) -> int:
        """One ranged GET (bytes ``start..end`` inclusive, pinned to ``etag``) written into ``target``
        at its offset (``target.write_at``) and hashed into ``feed`` as written; not retried."""
        extra = self._pin(etag, [("range", f"bytes={start}-{end}")])

        def begin(status: int, headers: Headers, length: int) -> _RangeWriter:
            check_range(status, headers.get("content-range"), start, end, size)
            if length != end - start + 1:
                raise TransferError(f"part length {length}, asked {end - start + 1}", retryable=True)
            return _RangeWriter(target, start, feed)

        t0 = time.monotonic_ns()
        try:
            status, _, n, _ = self.transport.fetch(self._path(key), extra, begin=begin, on_bytes=on_bytes)
        except TransferError as err:
            _trace("s3.get_range", self.bucket, key, start, getattr(err, "received", 0), t0, err.status or -1)
            raise
        _trace("s3.get_range", self.bucket, key, start, n, t0, status)
        return n

    def whole_get(self, key: str, target: Any, *, etag: str | None, size: int | None) -> _WholeGet:
        """One whole-object GET of ``key`` into ``target`` without its I/O, for an engine that does
        the I/O itself (the loop engine): ``path`` and ``extra`` headers to send, ``begin`` the body's
        writer once the answer came, ``finished`` its checks, ``failed`` its trace."""
        return _WholeGet(self, key, target, etag, size, None)

    def whole_put(self, key: str, body: bytes, *, checksum: tuple[str, str] | None = None,
                  content_md5: bytes | None = None) -> _WholePut:
        """One PUT of ``body`` (see :meth:`put`) without its I/O, for an engine that does the I/O itself
        (the loop): ``method``, ``path``, ``extra`` and ``body`` to send, ``begin`` the answer's
        writer, ``finished`` its :class:`PutResult`, ``failed`` the error to retry or report."""
        return _WholePut(self, key, body, _checked(checksum, content_md5))

    def connection(self) -> AsyncConnection:
        """A connection of its own for one coroutine (:meth:`afetch_into`); close it when done."""
        return AsyncConnection(self.route, self.settings.read_timeout,
                               connect_timeout=self.settings.connect_timeout)

    async def ahead_headers(self, conn: AsyncConnection, key: str, *, etag: str | None = None,
                            part_number: int | None = None) -> Headers:
        """The twin of :meth:`head_headers`, on ``conn``."""
        query = f"partNumber={part_number}" if part_number else ""
        extra = [] if part_number else self._pin(etag, [])
        return (await conn.request("HEAD", self._path(key), query, extra, ok=(200, 206))).headers

    async def afetch_into(self, conn: AsyncConnection, key: str, target: Any, *, etag: str | None,
                          size: int | None, on_bytes: Callable[[int], None] | None = None,
                          on_retry: Callable[[TransferError], None] | None = None) -> Fetched:
        """The twin of :meth:`fetch_into`, on ``conn``; a multipart ETag's part sizes are learnt
        first (:func:`~manyfiles.s3.layouts.alearn_layout`)."""
        get = _WholeGet(self, key, target, etag, size, None)
        try:
            if needs_layout(size, etag, self.verify):
                def part_head(n: int):
                    return self.ahead_headers(conn, key, etag=etag, part_number=n)

                get.layout = await alearn_layout(size, etag, part_head, self.retry, on_retry=on_retry)
            status, _, n, body = await conn.fetch(get.path, get.extra, ok=(200,), begin=get.begin,
                                                  on_bytes=on_bytes)
            return get.finished(status, n, body)
        except TransferError as err:
            get.failed(err)
            raise

    async def aretrying(self, fn, on_retry=None, reset=None):
        return await aretrying(fn, self.retry, classify=classify, on_retry=on_retry or self.on_retry,
                               reset=reset, cancel=self.cancel)

    # -- LIST ---------------------------------------------------------------------------------------
    def list(self, prefix: str = "", *, delimiter: str | None = None, start_after: str | None = None,
             page_size: int = 1000, mtime: bool = False,
             watch: StallWatch | None = None) -> Iterator[ObjectInfo]:
        """ListObjectsV2, page by page: every object under ``prefix`` in key order.

        Keys come URL-encoded (``encoding-type=url``) so that any byte survives the XML.
        ``mtime``: parse LastModified too.  ``delimiter`` (``"/"``): one level only, as ``ls`` shows
        it; its common prefixes ("folders") come first in each page, as records with ``size`` and
        ``etag`` None and the key ending in the delimiter.  ``start_after``: keys after this one.
        ``watch``: a run's stall watch, moved by every page and told every retry.  Each page is
        retried under the store's policy; the error raised is the page's TransferError.
        """
        params = {"list-type": "2", "prefix": prefix, "max-keys": str(page_size), "encoding-type": "url"}
        if start_after:
            params["start-after"] = start_after
        if delimiter:
            params["delimiter"] = delimiter
        on_retry = self.on_retry if watch is None else (lambda err: watch.failed(str(err)))
        path = self.route.ep.path_prefix or "/"
        while True:
            qs = query_string(params)
            root, ns = self._retrying(lambda qs=qs: self._page(path, qs, prefix), on_retry)
            if watch is not None:
                watch.moving = True
            if delimiter:
                for p in root.iterfind(f"{ns}CommonPrefixes"):
                    yield ObjectInfo(unquote_plus(p.findtext(f"{ns}Prefix") or ""), None, None)
            for c in root.iterfind(f"{ns}Contents"):
                yield ObjectInfo(unquote_plus(c.findtext(f"{ns}Key") or ""),
                                 int(c.findtext(f"{ns}Size") or 0), _unquoted(c.findtext(f"{ns}ETag")),
                                 _timestamp(c.findtext(f"{ns}LastModified")) if mtime else None)
            token = root.findtext(f"{ns}NextContinuationToken")
            if root.findtext(f"{ns}IsTruncated") != "true" or not token:
                return
            params["continuation-token"] = token

    def _xml_of(self, method: str, path: str, query: str) -> tuple[ET.Element, str]:
        return _xml(self.transport.request(method, path, query).body)

    def _page(self, path: str, qs: str, prefix: str) -> tuple[ET.Element, str]:
        t0 = time.monotonic_ns()
        try:
            body = self.transport.request("GET", path, qs).body
            root, ns = _xml(body)
        except TransferError as err:
            _trace("s3.list", self.bucket, prefix, 0, 0, t0, err.status or -1)
            raise
        _trace("s3.list", self.bucket, prefix, len(root.findall(f"{ns}Contents")), len(body), t0, 200)
        return root, ns

    # -- PUT ----------------------------------------------------------------------------------------
    def put(self, key: str, body: Body, *, checksum: tuple[str, str] | None = None,
            content_md5: bytes | None = None, if_none_match: bool = False,
            content_type: str | None = None) -> PutResult:
        """One PUT of ``body`` (see :meth:`Store.put`), retried under the policy."""
        extra = _checked(checksum, content_md5)
        if if_none_match:
            extra.append(("if-none-match", "*"))
        if content_type:
            extra.append(("content-type", content_type))
        size = body.size if isinstance(body, FileBody) else len(body)
        tries = 0

        def attempt() -> PutResult:
            nonlocal tries
            tries += 1
            t0 = time.monotonic_ns()
            try:
                answer = self.transport.request("PUT", self._path(key), "", extra, body=body)
            except ObjectChanged as err:
                _trace("s3.put", self.bucket, key, 0, size, t0, 412)
                if if_none_match:
                    # a try after one whose answer was lost may find the object that try wrote
                    mine = (self.holds(key, body, checksum=checksum, content_md5=content_md5)
                            if tries > 1 else None)
                    if mine is not None:
                        return mine
                    raise ObjectExists(f"s3://{self.bucket}/{key}: the object already exists") from err
                raise
            except TransferError as err:
                _trace("s3.put", self.bucket, key, 0, size, t0, err.status or -1)
                raise _bad_digest(err) from err
            _trace("s3.put", self.bucket, key, 0, size, t0, answer.status)
            return _put_result(answer.headers)

        return self._retrying(attempt)

    def holds(self, key: str, body: Body, *, checksum: tuple[str, str] | None = None,
              content_md5: bytes | None = None) -> PutResult | None:
        """The object under ``key`` as one HEAD shows it, when it is ``body`` (its ``checksum``'s value
        ours, asked for; else its ETag ``body``'s MD5, ``content_md5`` when given); None when it is
        not, or cannot be told.  Asked when a write's answer was lost or named other bytes: the
        server checked the body against our checksum before it stored it."""
        try:
            head = self.head_headers(key)
        except TransferError:
            return None
        found = _put_result(head)
        if checksum is not None:
            said = found.checksums.get(_algorithm(checksum[0]))
            if said is not None:
                return found if said == checksum[1] else None
        md5 = content_md5
        if md5 is None and not isinstance(body, FileBody):
            h = new_hash("md5")
            h.update(body)
            md5 = h.digest()
        etag = (found.etag or "").lower()
        return found if md5 is not None and etag == md5.hex() else None

    def create_multipart(self, key: str, *, checksum_algorithm: str | None = None,
                         full_object: bool = True, content_type: str | None = None) -> str:
        """CreateMultipartUpload (see :meth:`Store.create_multipart`); returns the upload id."""
        extra = []
        if checksum_algorithm:
            extra += [("x-amz-checksum-algorithm", _algorithm(checksum_algorithm).upper()),
                      ("x-amz-checksum-type", "FULL_OBJECT" if full_object else "COMPOSITE")]
        if content_type:
            extra.append(("content-type", content_type))

        def attempt() -> str:
            answer = self.transport.request("POST", self._path(key), "uploads=", extra)
            root, ns = _xml(answer.body)
            upload_id = root.findtext(f"{ns}UploadId")
            if not upload_id:
                raise TransferError("CreateMultipartUpload answered without an UploadId", retryable=True)
            return upload_id

        return self._retrying(attempt)

    def upload_part(self, key: str, upload_id: str, number: int, body: Body, *,
                    checksum: tuple[str, str] | None = None, content_md5: bytes | None = None) -> Part:
        """UploadPart (see :meth:`Store.upload_part`)."""
        extra = _checked(checksum, content_md5)
        query = query_string({"partNumber": str(number), "uploadId": upload_id})
        size = body.size if isinstance(body, FileBody) else len(body)

        def attempt() -> Part:
            t0 = time.monotonic_ns()
            try:
                answer = self.transport.request("PUT", self._path(key), query, extra, body=body)
            except TransferError as err:
                _trace("s3.put_part", self.bucket, key, number, size, t0, err.status or -1)
                raise _bad_digest(err) from err
            _trace("s3.put_part", self.bucket, key, number, size, t0, answer.status)
            etag = _unquoted(answer.headers.get("etag"))
            if not etag:
                raise TransferError(f"part {number}: answered without an ETag", retryable=True)
            said = _put_result(answer.headers).checksums
            part_sum = checksum
            if checksum is not None:
                alg = _algorithm(checksum[0])
                if said.get(alg, checksum[1]) != checksum[1]:
                    raise IntegrityError(f"part {number}: the server's {alg} is not the one sent")
            elif said:
                part_sum = next(iter(said.items()))
            return Part(number, etag, size, part_sum)

        return self._retrying(attempt)

    def list_parts(self, key: str, upload_id: str) -> list[Part]:
        """ListParts, every page (see :meth:`Store.list_parts`)."""
        parts: list[Part] = []
        marker = ""
        while True:
            params = {"uploadId": upload_id, "max-parts": "1000"}
            if marker:
                params["part-number-marker"] = marker
            qs = query_string(params)
            root, ns = self._retrying(lambda qs=qs: self._xml_of("GET", self._path(key), qs))
            for p in root.iterfind(f"{ns}Part"):
                checksum = None
                for alg, name in _XML_NAME.items():
                    value = p.findtext(f"{ns}Checksum{name}")
                    if value:
                        checksum = (alg, value)
                        break
                parts.append(Part(int(p.findtext(f"{ns}PartNumber") or 0),
                                  _unquoted(p.findtext(f"{ns}ETag")) or "",
                                  int(p.findtext(f"{ns}Size") or -1), checksum))
            marker = root.findtext(f"{ns}NextPartNumberMarker") or ""
            if root.findtext(f"{ns}IsTruncated") != "true" or not marker:
                return sorted(parts, key=lambda p: p.number)

    def complete_multipart(self, key: str, upload_id: str, parts: Iterable[Part], *,
                           checksum: tuple[str, str] | None = None, if_none_match: bool = False) -> PutResult:
        """CompleteMultipartUpload (see :meth:`Store.complete_multipart`).  Retried: a
        ``NoSuchUpload`` after a retry may mean an earlier attempt completed it (check with :meth:`head`)."""
        items = []
        for p in sorted(parts, key=lambda p: p.number):
            sums = ""
            if p.checksum is not None:
                name = _XML_NAME[_algorithm(p.checksum[0])]
                sums = f"<Checksum{name}>{_escape(p.checksum[1])}</Checksum{name}>"
            items.append(f"<Part><PartNumber>{p.number}</PartNumber><ETag>\"{_escape(p.etag)}\"</ETag>{sums}</Part>")
        doc = ('<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
               + "".join(items) + "</CompleteMultipartUpload>").encode()
        extra = _checked(checksum, None)
        if checksum is not None:
            extra.append(("x-amz-checksum-type", "FULL_OBJECT"))
        if if_none_match:
            extra.append(("if-none-match", "*"))
        query = query_string({"uploadId": upload_id})

        def attempt() -> PutResult:
            t0 = time.monotonic_ns()
            try:
                answer = self.transport.request("POST", self._path(key), query, extra, body=doc)
                failed = http1.error_in_body(answer.body)
                if failed is not None:
                    raise failed
            except ObjectChanged as err:
                _trace("s3.complete", self.bucket, key, 0, 0, t0, 412)
                if if_none_match:
                    raise ObjectExists(f"s3://{self.bucket}/{key}: the object already exists") from err
                raise
            except TransferError as err:
                _trace("s3.complete", self.bucket, key, 0, 0, t0, err.status or -1)
                raise _bad_digest(err) from err
            _trace("s3.complete", self.bucket, key, 0, 0, t0, answer.status)
            root, ns = _xml(answer.body)
            result = _put_result(answer.headers)
            etag = _unquoted(root.findtext(f"{ns}ETag")) or result.etag
            sums = dict(result.checksums)
            for alg, name in _XML_NAME.items():
                value = root.findtext(f"{ns}Checksum{name}")
                if value:
                    sums.setdefault(alg, value)
            if checksum is not None and sums.get(_algorithm(checksum[0]), checksum[1]) != checksum[1]:
                raise IntegrityError(f"s3://{self.bucket}/{key}: the server's {checksum[0]} of the object "
                                     "is not the one sent")
            return replace(result, etag=etag, checksums=sums)

        return self._retrying(attempt)

    def abort_multipart(self, key: str, upload_id: str) -> None:
        """AbortMultipartUpload (see :meth:`Store.abort_multipart`)."""
        query = query_string({"uploadId": upload_id})

        def attempt() -> None:
            try:
                self.transport.request("DELETE", self._path(key), query, ok=(200, 204))
            except TransferError as err:
                if getattr(err, "code", "") != "NoSuchUpload":
                    raise

        self._retrying(attempt)

    def list_multipart_uploads(self, prefix: str = "") -> Iterator[Upload]:
        """ListMultipartUploads, every page (see :meth:`Store.list_multipart_uploads`)."""
        params = {"uploads": "", "prefix": prefix, "encoding-type": "url"}
        path = self.route.ep.path_prefix or "/"
        while True:
            qs = query_string(params)
            root, ns = self._retrying(lambda qs=qs: self._xml_of("GET", path, qs))
            for u in root.iterfind(f"{ns}Upload"):
                yield Upload(unquote_plus(u.findtext(f"{ns}Key") or ""), u.findtext(f"{ns}UploadId") or "",
                             _timestamp(u.findtext(f"{ns}Initiated")))
            if root.findtext(f"{ns}IsTruncated") != "true":
                return
            params["key-marker"] = unquote_plus(root.findtext(f"{ns}NextKeyMarker") or "")
            params["upload-id-marker"] = root.findtext(f"{ns}NextUploadIdMarker") or ""

    # -- DELETE -------------------------------------------------------------------------------------
    def delete(self, key: str) -> None:
        """DeleteObject (see :meth:`Store.delete`)."""
        def attempt() -> None:
            t0 = time.monotonic_ns()
            try:
                self.transport.request("DELETE", self._path(key), ok=(200, 204))
            except TransferError as err:
                _trace("s3.delete", self.bucket, key, 0, 0, t0, err.status or -1)
                raise
            _trace("s3.delete", self.bucket, key, 0, 0, t0, 204)

        self._retrying(attempt)

    def delete_objects(self, keys: Iterable[str]) -> list[DeleteFailure]:
        """DeleteObjects, :data:`DELETE_BATCH` keys a request (see :meth:`Store.delete_objects`)."""
        import hashlib

        failures: list[DeleteFailure] = []
        batch: list[str] = []
        path = self.route.ep.path_prefix or "/"

        def send(batch: list[str]) -> None:
            objects = "".join(f"<Object><Key>{_escape(k)}</Key></Object>" for k in batch)
            doc = f"<Delete><Quiet>true</Quiet>{objects}</Delete>".encode()
            extra = [("content-md5", base64.b64encode(hashlib.md5(doc).digest()).decode())]
            t0 = time.monotonic_ns()
            answer = self._retrying(lambda: self.transport.request("POST", path, "delete=", extra, body=doc))
            _trace("s3.delete", self.bucket, batch[0], len(batch), 0, t0, answer.status)
            root, ns = _xml(answer.body)
            for e in root.iterfind(f"{ns}Error"):
                failures.append(DeleteFailure(e.findtext(f"{ns}Key") or "", e.findtext(f"{ns}Code") or "",
                                              e.findtext(f"{ns}Message") or ""))

        for key in keys:
            batch.append(key)
            if len(batch) == DELETE_BATCH:
                send(batch)
                batch = []
        if batch:
            send(batch)
        return failures


# -- helpers --------------------------------------------------------------------------------------

def _algorithm(name: str) -> str:
    alg = name.lower()
    if alg not in CHECKSUM_ALGORITHMS:
        raise ValueError(f"unknown checksum algorithm {name!r} (one of {', '.join(CHECKSUM_ALGORITHMS)})")
    return alg


def _checked(checksum: tuple[str, str] | None, content_md5: bytes | None) -> list[tuple[str, str]]:
    extra = []
    if checksum is not None:
        alg = _algorithm(checksum[0])
        # (the algorithm named too, as the SDKs send it: some servers store the checksum only then)
        extra += [(f"x-amz-checksum-{alg}", checksum[1]), ("x-amz-sdk-checksum-algorithm", alg.upper())]
    if content_md5 is not None:
        digest = content_md5 if len(content_md5) == 16 else base64.b64decode(content_md5)
        extra.append(("content-md5", base64.b64encode(digest).decode()))
    return extra


def _bad_digest(err: TransferError) -> TransferError:
    """A body the server found different from its checksum or Content-MD5: an IntegrityError (sent again)."""
    if getattr(err, "code", "") in ("BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
                                    "XAmzContentSHA256Mismatch"):
        return coded(IntegrityError(f"the server refused the body: {err}", retryable=True), err.code)
    return err


def _put_result(headers: Mapping[str, str]) -> PutResult:
    sums = {alg: headers[f"x-amz-checksum-{alg}"] for alg in CHECKSUM_ALGORITHMS
            if f"x-amz-checksum-{alg}" in headers}
    return PutResult(_unquoted(headers.get("etag")), sums, headers.get("x-amz-version-id"))


def _unquoted(etag: str | None) -> str | None:
    return etag.strip('"') if etag else None


def _escape(text: str) -> str:
    """``text`` as XML character data (xml.sax.saxutils.escape, without its import of urllib.request)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _xml(body: bytes) -> tuple[ET.Element, str]:
    """The root of an XML answer and its namespace (``{...}`` or "")."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise TransferError(f"unreadable XML answer ({exc})", retryable=True) from exc
    tag = root.tag
    return root, tag[: tag.index("}") + 1] if tag.startswith("{") else ""


def _timestamp(text: str | None) -> float | None:
    """``2024-05-01T12:00:00.123Z`` (S3's LastModified) -> seconds since the epoch."""
    if not text:
        return None
    import calendar

    try:
        whole = calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                                 int(text[14:16]), int(text[17:19]), 0, 0, 0))
        frac = text[19:].rstrip("Z")
        return whole + (float(frac) if frac.startswith(".") else 0.0)
    except ValueError:
        return None


def _trace(op: str, bucket: str, key: str, offset: int, n: int, t0: int, status: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, f"{bucket}/{key}", offset, n, t0, time.monotonic_ns() - t0, status)


class _WholeGet:
    """One whole-object GET without its I/O, under both shells (:meth:`S3Store.fetch_into` and
    :meth:`S3Store.afetch_into`): the path and headers sent (pinned to ``etag``, the server's
    checksums asked for), the body's writer made when the answer begins, and the trace of its end."""

    __slots__ = ("etag", "extra", "key", "layout", "path", "size", "store", "t0", "target")
    method, body = "GET", None

    def __init__(self, store: S3Store, key: str, target: Any, etag: str | None, size: int | None,
                 layout: tuple[int, ...] | None) -> None:
        self.store, self.key, self.target = store, key, target
        self.etag, self.size, self.layout = etag, size, layout
        self.path = store._path(key)
        self.extra = store._pin(etag, [("x-amz-checksum-mode", "ENABLED")] if store.checksum_mode else [])
        self.t0 = time.monotonic_ns()

    def begin(self, status: int, headers: Headers, length: int) -> WholeBody:
        return WholeBody(self.key, self.size, self.etag, self.target, headers, verify=self.store.verify,
                         layout=self.layout)

    def finished(self, status: int, n: int, body: WholeBody) -> Fetched:
        """The object's checks after its last byte (raises TransferError), then its trace."""
        fetched = body.finish(n)
        _trace("s3.get", self.store.bucket, self.key, 0, n, self.t0, status)
        return fetched

    def failed(self, err: TransferError) -> None:
        _trace("s3.get", self.store.bucket, self.key, 0, getattr(err, "received", 0), self.t0,
               err.status or -1)


class _WholePut:
    """One PUT without its I/O (:meth:`S3Store.whole_put`, for the loop): the path and headers sent (the
    body's checksum or Content-MD5), the answer's body (if any) dropped, its :class:`PutResult`, the trace."""

    __slots__ = ("body", "extra", "headers", "key", "path", "store", "t0")
    method = "PUT"

    def __init__(self, store: S3Store, key: str, body: bytes, extra: list[tuple[str, str]]) -> None:
        self.store, self.key, self.body, self.extra = store, key, body, extra
        self.path = store._path(key)
        self.headers: Headers | None = None
        self.t0 = time.monotonic_ns()

    def begin(self, status: int, headers: Headers, length: int) -> _WholePut:
        self.headers = headers
        return self             # (the answer's body, if any: nothing in it is needed)

    def write(self, data) -> None:
        pass

    def finished(self, status: int, n: int, body: Any) -> PutResult:
        _trace("s3.put", self.store.bucket, self.key, 0, len(self.body), self.t0, status)
        return _put_result(self.headers)

    def failed(self, err: TransferError) -> TransferError:
        _trace("s3.put", self.store.bucket, self.key, 0, len(self.body), self.t0, err.status or -1)
        return _bad_digest(err)


class _Buffer:
    """A ranged GET's target in memory: ``write_at`` absolute offsets of the range ``start..``."""

    def __init__(self, start: int, n: int) -> None:
        self.start, self.data = start, bytearray(n)

    def write_at(self, offset: int, data) -> None:
        i = offset - self.start
        self.data[i:i + len(data)] = data

    def read(self, offset: int, n: int) -> bytes:
        i = offset - self.start
        return bytes(self.data[i:i + n])


class _RangeWriter:
    """Writes a range at its offset; feeds the check unit's hasher when this range is next in it."""

    __slots__ = ("feed", "pos", "target")

    def __init__(self, target, start: int, feed) -> None:
        self.target, self.pos, self.feed = target, start, feed

    def write(self, data) -> None:
        self.target.write_at(self.pos, data)     # complete, or raises
        if self.feed is not None:
            self.feed.update(data)
        self.pos += len(data)


# -- one streamed GET --------------------------------------------------------------------------------

class ObjectStream:
    """One whole-object GET read in order, checked as it goes: the read that reaches the end hands
    out its bytes only after every byte passed :attr:`head` ``.claim`` (an IntegrityError instead).

    A connection lost mid-body is resumed with a ranged GET from where it stopped, pinned to the
    first answer's ETag (within the retry policy).  One reader at a time (any thread); ``close()``
    (or ``with``) ends it early.  :attr:`claim` is the check that passed, once at the end.
    """

    def __init__(self, store: S3Store, key: str, if_match: str | None, size: int | None, on_retry) -> None:
        self.store, self.bucket, self.key = store, store.bucket, key
        self._on_retry = on_retry
        self._resp = None
        self._opening = None        # the transport sending the current request (close() aborts it)
        self._closed = False
        self.pos = 0
        self.claim: Claim | None = None
        self._splicer: Splicer | None = None       # the pipe of readinto_file
        try:
            self.head = store._retrying(lambda: self._open(if_match, size), on_retry, reset=self._drop)
        except BaseException:
            self._drop()
            raise
        self._digest = digest_for(self.head.claim, self.head.size)

    @property
    def size(self) -> int:
        return self.head.size

    def _request(self, etag: str | None, start: int | None = None):
        extra = []
        if start is not None:       # resuming (from 0 too: a reset may lose the bytes in flight)
            extra.append(("range", f"bytes={start}-{self.size - 1}"))
        elif self.store.checksum_mode:
            extra.append(("x-amz-checksum-mode", "ENABLED"))
        if etag:
            extra.append(("if-match", f'"{etag}"'))
        resp = self.store.transport.open("GET", self.store._path(self.key), extra, on_transport=self._sending)
        self._opening = None
        if self._closed:            # closed while the answer came: nobody reads it
            resp.close()
            raise TransferError("the stream was closed", retryable=False)
        return resp

    def _sending(self, transport: Transport) -> None:
        self._opening = transport
        if self._closed:
            transport.abort()

    def _open(self, if_match: str | None, size: int | None) -> ObjectHead:
        resp = self._resp = self._request(if_match)
        if resp.status != 200:
            raise TransferError(f"asked for the whole object, got HTTP {resp.status}", retryable=True,
                                status=resp.status)
        n, tag = check_answer(resp.headers, size, if_match, "GET")
        claim = self.store._claim(self.key, tag, resp.headers, n, self._on_retry)
        return ObjectHead(self.bucket, self.key, n, tag, claim, resp.headers)

    def _drop(self) -> None:
        if self._resp is not None:
            self._resp.close()
            self._resp = None

    def _response(self):
        if self._closed:
            raise TransferError("the stream was closed", retryable=False)
        if self._resp is None:     # resume where the lost connection stopped
            resp = self._resp = self._request(self.head.etag, self.pos)
            check_range(resp.status, resp.headers.get("content-range"), self.pos, self.size - 1, self.size)
        return self._resp

    def _fill(self, view: memoryview) -> None:
        """Fill ``view`` exactly from the body (an attempt: a short body raises, retryable)."""
        got = self._response().readinto(view)
        if got != len(view):
            raise TransferError(f"truncated body: got {self.pos + got} of {self.size} bytes",
                                retryable=True)

    def readinto(self, buf) -> int:
        """Fill ``buf`` (a writable buffer) with the next bytes: ``len(buf)`` unless the object ends
        first; 0 after the end.  No copy: the body is received into ``buf`` itself.  The read
        that reaches the end returns only once every byte passed the check (IntegrityError)."""
        view = memoryview(buf).cast("B")
        want = min(len(view), self.size - self.pos)
        if want <= 0:
            if self.claim is None:      # an empty object
                self._finish()
            return 0
        view = view[:want]
        self.store._retrying(lambda: self._fill(view), self._on_retry, reset=self._drop)
        self._digest.stream(view)
        self.pos += want
        if self.pos == self.size:
            self._finish()              # raises before the last bytes are handed out
        return want

    def readinto_file(self, fd: int, n: int) -> memoryview | None:
        """The next ``n`` bytes (fewer only at the end) moved by the kernel into ``fd`` at their offset
        in the object (``splice``: no copy of ours), checked over the file's pages they landed in;
        returns a read-only view of those pages.  None (nothing read) where the body cannot be
        spliced (TLS): :meth:`readinto` then.  The read that reaches the end returns only once
        every byte passed the check, as :meth:`readinto`."""
        want = min(n, self.size - self.pos)
        if want <= 0 or not self.store._retrying(lambda: self._response().spliceable, self._on_retry,
                                                 reset=self._drop):
            return None
        if self._splicer is None or self._splicer.fd != fd:
            self._close_splicer()
            self._splicer = Splicer(fd)
        self.store._retrying(lambda: self._land(want), self._on_retry, reset=self._drop)
        start = self.pos - self.pos % mmap.ALLOCATIONGRANULARITY
        try:
            pages = mmap.mmap(fd, self.pos + want - start, mmap.MAP_SHARED, mmap.PROT_READ, offset=start)
        except OSError as exc:
            raise classify(exc) from exc
        view = memoryview(pages)[self.pos - start:]
        self._digest.stream(view)
        self.pos += want
        if self.pos == self.size:
            self._finish()              # raises before the last bytes are handed out
        return view

    def _land(self, want: int) -> None:
        got = self._response().land(self._splicer, self.pos, want)
        if got != want:
            raise TransferError(f"truncated body: got {self.pos + got} of {self.size} bytes", retryable=True)

    def _close_splicer(self) -> None:
        if self._splicer is not None:
            self._splicer.close()
            self._splicer = None

    def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes (``n`` unless the object ends first); b"" after the end."""
        buf = bytearray(max(0, min(n, self.size - self.pos)))
        got = self.readinto(buf)
        return bytes(buf) if got else b""

    def _finish(self) -> None:
        self._drop()
        self._close_splicer()
        self._digest.check()
        self.claim = self._digest.claim

    def blocks(self, block_size: int = CHUNK) -> Iterator[bytes]:
        """The rest of the object in blocks of ``block_size`` (the last one shorter)."""
        while data := self.read(block_size):
            yield data

    def close(self) -> None:
        """End the stream (from any thread: a read blocked on a stalled server, in a body or
        waiting for the answer to a resume, returns at once with a TransferError, not resumed)."""
        self._closed = True
        opening = self._opening
        if opening is not None:     # waiting for an answer (a resume, say)
            opening.abort()
        self._drop()

    def __enter__(self) -> ObjectStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CHECKSUM_ALGORITHMS", "DELETE_BATCH", "Body", "DeleteFailure", "FileBody", "ObjectExists",
           "ObjectHead", "ObjectInfo", "ObjectStream", "Part", "PutResult", "RangeData", "S3Store", "Store",
           "Upload", "list_buckets", "store_for"]
