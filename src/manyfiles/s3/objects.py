"""Single objects by URL, in any bucket: :class:`ObjectClient` (the store of each bucket, see
:mod:`manyfiles.s3.store`), and the one-line errors users see (:func:`object_error`).

The read cache names objects by URL, one bucket after another; its calls come here and go to
:func:`~manyfiles.s3.store.store_for` (the store of that bucket, as the configuration and
credentials are *now*), so they get the store's checks (checksum, MD5 ETag, multipart ETag, never
a silent size check), its retries and its transport.

API::

    objs = ObjectClient(settings, retry=RetryPolicy())      # cheap; one per caller is fine
    head = objs.head("bucket", "key")                       # ObjectHead: size, etag, claim, parts
    got = objs.get_range("bucket", "key", start, end, if_match=head.etag, head=head)
    with objs.stream("bucket", "key", if_match=etag) as s:   # one GET of the whole object
        for block in s.blocks(4 << 20): ...
    data = objs.read("bucket", "key")                       # the whole object, checked
    bucket, key = parse_object_url("s3://bucket/key")
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import (
    AccessDenied,
    IntegrityError,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    TransferError,
)
from manyfiles.s3.client import ClientSettings, resolve
from manyfiles.s3.keys import parse_object_url
from manyfiles.s3.retry import Inconsistent, NetworkError, classify, coded, failure_code, stopping_error
from manyfiles.s3.store import ObjectHead, ObjectStream, RangeData, S3Store, store_for
from manyfiles.s3.transfer import CHUNK, EMPTY_MD5


class ObjectClient:
    """HEAD, ranged GET and streamed whole GET of single objects of any bucket, each checked: the
    store of each bucket (:func:`~manyfiles.s3.store.store_for`) under one policy.

    ``retry``: the policy of every request; ``verify=False``: size checks only (``--no-checksum``);
    ``checksum_mode=False``: never ask for flexible checksums (ETags only); ``on_retry(err)`` is
    told of every retry; ``cancel`` (a ``threading.Event``): once set, no request is retried (a run
    that stopped).
    """

    def __init__(self, settings: ClientSettings | None = None, *, retry: RetryPolicy | None = None,
                 verify: bool = True, checksum_mode: bool = True,
                 on_retry: Callable[[TransferError], None] | None = None,
                 cancel: threading.Event | None = None) -> None:
        self.settings = settings or ClientSettings()
        self.retry = retry or RetryPolicy()
        self.cancel = cancel
        self.verify, self.checksum_mode = verify, checksum_mode
        self.on_retry = on_retry
        self._used: weakref.WeakSet = weakref.WeakSet()     # the stores it used (interrupt())
        self._part_gets = [True]       # shared with its stores (see S3Store.part_gets)

    def store(self, bucket: str) -> S3Store:
        """The store of ``bucket`` under this client's policy (as the configuration is now)."""
        store = store_for(self.settings, bucket, retry=self.retry, verify=self.verify,
                          checksum_mode=self.checksum_mode, on_retry=self.on_retry, cancel=self.cancel)
        self._used.add(store.transport)
        store._part_gets = self._part_gets
        return store

    @property
    def part_gets(self) -> bool:
        """Whether ``GET ?partNumber=N`` is still worth asking (False once a store answered one
        with more than the part)."""
        return self._part_gets[0]

    def interrupt(self) -> None:
        """From another thread, once ``cancel`` is set: every request of this client in flight
        fails at once (a run that stalled ends without waiting for read timeouts)."""
        for transport in list(self._used):
            transport.interrupt()

    def head(self, bucket: str, key: str, *, etag: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> ObjectHead:
        """:meth:`S3Store.head <manyfiles.s3.store.S3Store.head>` of ``bucket``."""
        return self.store(bucket).head(key, etag=etag, size=size, on_retry=on_retry)

    def get_range(self, bucket: str, key: str, start: int, end: int, *, if_match: str | None,
                  size: int | None = None, head: ObjectHead | None = None,
                  on_retry: Callable[[TransferError], None] | None = None) -> RangeData:
        """:meth:`S3Store.get_range <manyfiles.s3.store.S3Store.get_range>` of ``bucket``."""
        return self.store(bucket).get_range(key, start, end, if_match=if_match, size=size, head=head,
                                            on_retry=on_retry)

    def stream(self, bucket: str, key: str, *, if_match: str | None = None, size: int | None = None,
               on_retry: Callable[[TransferError], None] | None = None) -> ObjectStream:
        """:meth:`S3Store.open <manyfiles.s3.store.S3Store.open>` of ``bucket``: one GET of the
        whole object, read in order and checked as it goes."""
        return self.store(bucket).open(key, if_match=if_match, size=size, on_retry=on_retry)

    def read(self, bucket: str, key: str, *, if_match: str | None = None, size: int | None = None,
             on_retry: Callable[[TransferError], None] | None = None) -> bytes:
        """:meth:`S3Store.get <manyfiles.s3.store.S3Store.get>` of ``bucket``: the whole object, checked."""
        return self.store(bucket).get(key, if_match=if_match, size=size, on_retry=on_retry)

    def close(self) -> None:
        """Nothing to release: stores are shared per process (see :func:`~manyfiles.s3.store.store_for`)."""


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


__all__ = ["CHUNK", "EMPTY_MD5", "Inconsistent", "ObjectClient", "ObjectHead", "ObjectStream", "RangeData",
           "object_error", "parse_object_url", "resolve"]
