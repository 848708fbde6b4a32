"""One S3 object at a time: HEAD, ranged GET and streamed whole GET, each checked (the object layer).

s3pull's engines and the read cache reach objects through this module, so one place decides an
object's check (:func:`~manyfiles.s3.integrity.object_claim`: checksum, MD5 ETag, multipart ETag,
never a silent size check), how a failed request is retried (the call's
:class:`~manyfiles.s3.retry.RetryPolicy`) and what error it becomes (:func:`manyfiles.s3.retry.classify`
and its failure codes).  Requests go over the lean transport (:mod:`manyfiles.s3.engines.socket_client`:
raw sockets, hand-signed SigV4), so cache fills get s3pull's fast path.

API::

    objs = ObjectClient(settings, retry=RetryPolicy())      # cheap; one per caller is fine
    head = objs.head("bucket", "key")                       # ObjectHead: size, etag, claim, parts
    got = objs.get_range("bucket", "key", start, end, if_match=head.etag, head=head)
    got.data, got.claim        # bytes; the check they passed on their own (a whole object, a part
                               # with its own checksum), None: unverified until the object is
    with objs.stream("bucket", "key", if_match=etag) as s:   # one GET of the whole object
        s.head                 # what its answer says (size, etag, claim)
        for block in s.blocks(4 << 20):
            ...                # the last block comes only after every byte passed s.head.claim
    data = objs.read("bucket", "key")                       # the whole object, checked
    bucket, key = parse_object_url("s3://bucket/key")

Every call resolves the configuration and credentials as they are then (environment, profile,
files): the transports (:func:`transport`) are kept per process and keyed by what they were built
from (endpoint, region, credentials), so keys changed or removed between two calls are never
used again.  Errors are :class:`~manyfiles.errors.TransferError` s (``ObjectChanged`` when the
If-Match pin fails, ``IntegrityError`` when bytes fail their check, :class:`Inconsistent` when an
answer contradicts the listing or itself) with a failure code; :func:`object_error` turns one
into the one-line error for a user (``NotFound``, ``AccessDenied``, ``CredentialsError``...).

Engines that write into temp files use the same pieces on their own transport:
:func:`learn_layout` / :func:`alearn_layout` (part sizes, retried; ``()`` when unusable, then the
claim is a layout search), :func:`check_answer` (a HEAD or GET against the listing), and
:class:`ObjectClient` with ``transport=`` (the ``ranged`` engine's probe).
"""

from __future__ import annotations

import base64
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from manyfiles._core.retry import RetryPolicy, retrying
from manyfiles.errors import (
    AccessDenied,
    IntegrityError,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    TransferError,
)
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.integrity import (
    SIZE_ONLY,
    Claim,
    digest_for,
    encrypted,
    new_hash,
    object_claim,
)
from manyfiles.s3.keys import parse_object_url
from manyfiles.s3.layouts import alearn_layout, etag_parts, learn_layout
from manyfiles.s3.retry import Inconsistent, NetworkError, classify, coded, failure_code, stopping_error
from manyfiles.s3.sigv4 import aws_config, bucket_region, credentials_key, environment_key, uri_path
from manyfiles.s3.transfer import CHUNK, EMPTY_MD5, Job, check_answer, check_range


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


# -- the check of an answer, and the part layout ---------------------------------------------------

# -- transports, per configuration and credentials --------------------------------------------------

_transports: dict = {}
_resolved: dict = {}
_lock = threading.Lock()


def resolve(settings: ClientSettings | None) -> ClientSettings:
    """``settings`` with the endpoint the environment and profile give now (memoized per environment)."""
    settings = settings or ClientSettings()
    key = (settings, environment_key())
    out = _resolved.get(key)
    if out is None:
        out = settings.resolved()
        with _lock:
            if len(_resolved) > 64:
                _resolved.clear()
            _resolved[key] = out
    return out


def transport(settings: ClientSettings | None, bucket: str, *, checksum_mode: bool = True):
    """The lean client (:class:`~manyfiles.s3.engines.socket_client.SocketClient`) for ``bucket`` as the
    configuration and credentials are *now*: one per process, settings and bucket, rebuilt when
    what it was built from changed (the environment and AWS files, endpoint, region, credentials).
    Raises TransferError (``NoCredentials``...) when it cannot be built."""
    from manyfiles.s3.engines.socket_client import SocketClient
    from manyfiles.s3.sigv4 import Route

    settings = resolve(settings)
    try:
        built_from = (environment_key(), aws_config(settings), credentials_key(settings))
        key = (os.getpid(), settings, bucket, checksum_mode)
        cur = _transports.get(key)
        region = bucket_region(settings, bucket)      # a redirect learnt since moved it
        if cur is not None and cur[0] == built_from and cur[1].route.region == region:
            return cur[1]
        client = SocketClient(Route(settings, bucket), settings.read_timeout, checksum_mode=checksum_mode,
                              connect_timeout=settings.connect_timeout)
    except ManyfilesError:      # TransferError, a profile that is not configured (UsageError)
        raise
    except Exception as exc:     # no credentials, no region...
        raise classify(exc) from exc
    with _lock:
        old = _transports.get(key)
        _transports[key] = (built_from, client)
    if old is not None:
        old[1].close()
    return client


# -- the object client ------------------------------------------------------------------------------

class ObjectClient:
    """HEAD, ranged GET and streamed whole GET of single objects, each checked (see the module docs).

    ``retry``: the policy of every request; ``verify=False``: size checks only (``--no-checksum``);
    ``checksum_mode=False``: never ask for flexible checksums (ETags only); ``on_retry(err)`` is
    told of every retry; ``transport``: a fixed lean client (an engine's) instead of the one the
    current configuration gives; ``cancel`` (a ``threading.Event``): once set, no request is
    retried (a run that stopped).
    """

    def __init__(self, settings: ClientSettings | None = None, *, retry: RetryPolicy | None = None,
                 verify: bool = True, checksum_mode: bool = True,
                 on_retry: Callable[[TransferError], None] | None = None, transport=None,
                 cancel: threading.Event | None = None) -> None:
        self.settings = settings or ClientSettings()
        self.retry = retry or RetryPolicy()
        self.cancel = cancel
        self.verify, self.checksum_mode = verify, checksum_mode
        self.on_retry = on_retry
        self._fixed = transport
        self._used: weakref.WeakSet = weakref.WeakSet()     # the transports it used (interrupt())
        self._part_gets = True       # False once the server answered a GET ?partNumber=N with more

    @property
    def part_gets(self) -> bool:
        """Whether ``GET ?partNumber=N`` is still worth asking this store (False once it answered
        one with more than the part): a caller choosing to fetch a whole part for one block asks."""
        return self._part_gets

    def transport(self, bucket: str):
        lean = self._fixed if self._fixed is not None else transport(self.settings, bucket,
                                                                     checksum_mode=self.checksum_mode)
        self._used.add(lean)
        return lean

    def interrupt(self) -> None:
        """From another thread, once ``cancel`` is set: every request of this client in flight
        fails at once (a run that stalled ends without waiting for read timeouts)."""
        for lean in list(self._used):
            lean.interrupt()

    def _retrying(self, fn, on_retry=None, reset=None):
        return retrying(fn, self.retry, classify=classify, on_retry=on_retry or self.on_retry, reset=reset,
                        cancel=self.cancel)

    # -- HEAD -------------------------------------------------------------------------------------
    def head(self, bucket: str, key: str, *, etag: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> ObjectHead:
        """HEAD the object (pinned to ``etag`` when given) and decide its check.

        ``etag``/``size``: what the listing said; an answer that contradicts it (or itself) is asked
        again and raises :class:`Inconsistent` if it persists.  A multipart object's part sizes are
        learnt with ``HEAD ?partNumber=1`` when its check needs them; when they cannot be, its claim
        is a pending layout search (``claim.pending``): only a whole read can check it.
        """
        lean = self.transport(bucket)
        job = Job(key, key, size, etag)

        def attempt() -> tuple[Mapping[str, str], int, str | None]:
            headers = lean.head(bucket, job)
            n, tag = check_answer(headers, size, etag)
            return headers, n, tag

        headers, n, tag = self._retrying(attempt, on_retry)

        def layout() -> tuple[int, ...]:
            pinned = Job(key, key, n, tag)
            return learn_layout(n, tag, lambda p: lean.head(bucket, pinned, p), self.retry,
                                on_retry=on_retry or self.on_retry)

        return ObjectHead(bucket, key, n, tag, self._claim(tag, headers, n, layout), headers)

    def _claim(self, etag, headers, size, layout) -> Claim:
        claim = object_claim(etag, headers, size, None, verify=self.verify)
        if self.verify and (claim.pending or claim.method == SIZE_ONLY) and etag_parts(etag) > 1 \
                and size is not None:
            claim = object_claim(etag, headers, size, layout(), verify=self.verify)
        return claim

    # -- ranged GET -------------------------------------------------------------------------------
    def get_range(self, bucket: str, key: str, start: int, end: int, *, if_match: str | None,
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
        lean = self.transport(bucket)
        job = Job(key, key, size, if_match)
        if head is not None and self.verify and head.claim.composite and self._part_gets:
            n = head.part_at(start, end)
            if n:
                got = self._retrying(lambda: self._get_part(lean, bucket, job, n, start, end, head.claim),
                                     on_retry)
                if got is not None:
                    return got
        whole = head is not None and start == 0 and end == head.size - 1

        def attempt() -> RangeData:
            buf = _Buffer(start, end - start + 1)
            lean.get(bucket, job, buf, start, end)
            data = buf.data             # no copy: the bytearray received into
            if not whole:
                return RangeData(data, None)
            digest = digest_for(head.claim, head.size, buf.read)
            digest.stream(data)
            digest.check()          # a flipped byte: asked again, within the policy
            return RangeData(data, digest.claim)

        return self._retrying(attempt, on_retry)

    def _get_part(self, lean, bucket: str, job: Job, n: int, start: int, end: int,
                  claim: Claim) -> RangeData | None:
        """``GET ?partNumber=n`` checked against the part's own checksum; None when the server does
        not answer with exactly that part and its checksum (moto answers with the whole object)."""
        extra = [("x-amz-checksum-mode", "ENABLED")]
        if job.etag:
            extra.append(("if-match", f'"{job.etag}"'))
        resp = lean.open("GET", uri_path(lean.ep.path_prefix, job.key), extra, f"partNumber={n}")
        try:
            want = resp.headers.get(f"x-amz-checksum-{claim.method}", "")
            total = f"/{job.size}" if job.size is not None else "/"
            crange = resp.headers.get("content-range", "")
            if resp.status != 206 or not crange.startswith(f"bytes {start}-{end}{total}") or not want \
                    or "-" in want:
                self._part_gets = False
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

    # -- whole GET --------------------------------------------------------------------------------
    def stream(self, bucket: str, key: str, *, if_match: str | None = None, size: int | None = None,
               on_retry: Callable[[TransferError], None] | None = None) -> ObjectStream:
        """One GET of the whole object, read in order (:class:`ObjectStream`); opened (and retried)
        here.  ``if_match``/``size``: the version and size expected (the listing's, a cache entry's)."""
        return ObjectStream(self, bucket, key, if_match, size, on_retry or self.on_retry)

    def read(self, bucket: str, key: str, *, if_match: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> bytes:
        """The whole object, checked (a failed check fetches it again, within the retry policy)."""
        def attempt() -> bytes:
            with self.stream(bucket, key, if_match=if_match, size=size, on_retry=on_retry) as s:
                return b"".join(s.blocks(CHUNK))

        return self._retrying(attempt, on_retry)

    def close(self) -> None:
        """Nothing to release: transports are shared per process (see :func:`transport`)."""


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


class ObjectStream:
    """One whole-object GET read in order, checked as it goes: the read that reaches the end hands
    out its bytes only after every byte passed :attr:`head` ``.claim`` (an IntegrityError instead).

    A connection lost mid-body is resumed with a ranged GET from where it stopped, pinned to the
    first answer's ETag (within the retry policy).  One reader at a time (any thread); ``close()``
    (or ``with``) ends it early.  :attr:`claim` is the check that passed, once at the end.
    """

    def __init__(self, client: ObjectClient, bucket: str, key: str, if_match: str | None, size: int | None,
                 on_retry) -> None:
        self.client, self.bucket, self.key = client, bucket, key
        self._lean = client.transport(bucket)
        self._on_retry = on_retry
        self._resp = None
        self._opening = None        # the client sending the current request (close() aborts it)
        self._closed = False
        self.pos = 0
        self.claim: Claim | None = None
        try:
            self.head = client._retrying(lambda: self._open(if_match, size), on_retry, reset=self._drop)
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
        elif self.client.checksum_mode:
            extra.append(("x-amz-checksum-mode", "ENABLED"))
        if etag:
            extra.append(("if-match", f'"{etag}"'))
        resp = self._lean.open("GET", uri_path(self._lean.ep.path_prefix, self.key), extra,
                               on_client=self._sending)
        self._opening = None
        if self._closed:            # closed while the answer came: nobody reads it
            resp.close()
            raise TransferError("the stream was closed", retryable=False)
        return resp

    def _sending(self, client) -> None:
        self._opening = client
        if self._closed:
            client.abort()

    def _open(self, if_match: str | None, size: int | None) -> ObjectHead:
        resp = self._resp = self._request(if_match)
        if resp.status != 200:
            raise TransferError(f"asked for the whole object, got HTTP {resp.status}", retryable=True,
                                status=resp.status)
        n, tag = check_answer(resp.headers, size, if_match, "GET")
        client, lean = self.client, self._lean

        def layout() -> tuple[int, ...]:
            pinned = Job(self.key, self.key, n, tag)
            return learn_layout(n, tag, lambda p: lean.head(self.bucket, pinned, p), client.retry,
                                on_retry=self._on_retry)

        return ObjectHead(self.bucket, self.key, n, tag, client._claim(tag, resp.headers, n, layout),
                          resp.headers)

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
        self.client._retrying(lambda: self._fill(view), self._on_retry, reset=self._drop)
        self._digest.stream(view)
        self.pos += want
        if self.pos == self.size:
            self._finish()              # raises before the last bytes are handed out
        return want

    def read(self, n: int = CHUNK) -> bytes:
        """Up to ``n`` bytes (``n`` unless the object ends first); b"" after the end."""
        buf = bytearray(max(0, min(n, self.size - self.pos)))
        got = self.readinto(buf)
        return bytes(buf) if got else b""

    def _finish(self) -> None:
        self._drop()
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


# -- errors for users --------------------------------------------------------------------------------

def object_error(url: str, err: BaseException) -> ManyfilesError:
    """The one-line error for a failed operation on the object ``url`` (``url: reason``), from any
    error an :class:`ObjectClient` call raised: NotFound, AccessDenied, CredentialsError, or the
    TransferError with the URL in front (ObjectChanged, IntegrityError kept as such)."""
    terr = classify(err)
    code = failure_code(terr)
    stop = stopping_error(terr, url)      # no such bucket, credentials missing or refused, TLS
    if stop is not None:
        return stop
    if code in ("NoSuchKey", "404") or terr.status == 404:
        return NotFound(f"{url}: no such object")
    if code == "AccessDenied" or terr.status in (401, 403):
        return AccessDenied(f"{url}: access denied ({terr})")
    if isinstance(terr, ObjectChanged):
        return ObjectChanged(f"{url}: {terr}")
    if isinstance(terr, IntegrityError):
        return coded(IntegrityError(f"{url}: {terr}", retryable=terr.retryable), code)
    if isinstance(terr, NetworkError):      # what it says of the endpoint decides its retries
        return terr.about(url)
    return coded(TransferError(f"{url}: {terr}", retryable=terr.retryable, status=terr.status), code)


__all__ = ["EMPTY_MD5", "Inconsistent", "ObjectClient", "ObjectHead", "ObjectStream", "RangeData",
           "alearn_layout", "check_answer", "learn_layout", "object_claim", "object_error",
           "parse_object_url", "resolve", "transport"]
