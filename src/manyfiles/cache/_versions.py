"""Which version of a source to read: the origins of sources, validations and what they are trusted for.

A version is asked of the origin at each open (a ``stat`` of a file, a ``HEAD`` of an S3 object
the cache holds a version of), unless a validation younger than ``ttl`` is known (this
process's memo, else the index: any process's), or a listing gave it (``etag``/``size``: no
request at all).  An S3 object the cache holds nothing of is opened by its GET, whose answer is
the version: a miss costs one round trip, not a HEAD and a GET.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

from manyfiles._core.retry import RetryPolicy
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Index, Version
from manyfiles.cache._origin import FileOrigin, Head, S3Origin, WholeRead, parse_source
from manyfiles.errors import AccessDenied, CredentialsError, ManyfilesError, NotFound, UsageError

Source = str | bytes | os.PathLike


class Listed(NamedTuple):
    """The version of an S3 object as a listing gave it (``at``: when; None: now)."""

    etag: str
    size: int
    at: float | None = None


def listed(etag: str | None, size: int | None, at: float | None) -> Listed | None:
    """The version a caller says a listing gave (``etag=``, ``size=``, ``listed_at=``), or None."""
    if etag is None and size is None:
        return None
    if not etag or size is None or isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UsageError(f"etag={etag!r}, size={size!r}: a listed version needs both, "
                         "an ETag and a size >= 0")
    return Listed(etag.strip('"'), size, at)


class Versions:
    """The versions of one cache's sources: their origins (one S3 client per settings), their
    validations, and this process's memo of those younger than ``ttl``."""

    def __init__(self, index: Index, *, ttl: float, settings: Any, retry: RetryPolicy) -> None:
        self._index = index
        self.ttl = float(ttl)
        self.settings = settings
        self.retry = retry
        self._memo: dict[bytes, Version] = {}
        self._clients: dict[Any, Any] = {}

    def origin(self, src: Source | FileOrigin | S3Origin, settings: Any = None) -> FileOrigin | S3Origin:
        """The origin of ``src`` (an S3 URL's with ``settings``, default the cache's)."""
        if isinstance(src, str) and src.startswith("s3://"):
            from manyfiles.s3.objects import ObjectClient, resolve

            resolved = resolve(settings or self.settings)
            client = self._clients.get(resolved)
            if client is None:
                client = self._clients[resolved] = ObjectClient(resolved, retry=self.retry)
            return parse_source(src, resolved, self.retry, client, resolved=True)
        return parse_source(src)

    def resolve(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False, whole: bool = True,
                ttl: float | None = None, listed: Listed | None = None
                ) -> tuple[Version, Head | None, WholeRead | None]:
        """(version, what the validation learnt, the whole read it opened if that was the way).

        ``whole``: an S3 object the cache holds nothing of is opened by its GET (``whole``), whose
        answer is the version: a miss costs one round trip, not a HEAD and a GET.  A HEAD whose
        answer contradicts the cached entry does the same: the object changed (or the HEAD lies),
        and only the GET's answer says what is there.  ``listed``: the version a listing gave (no
        request at all); ``ttl``: this call's instead of the cache's.
        """
        if listed is not None:
            if not isinstance(origin, S3Origin):
                raise UsageError(f"{origin.display}: etag= is for s3:// objects (a listing's ETag)")
            head = Head(S3Origin.validator(listed.etag, listed.size), listed.size)
            at = time.time() if listed.at is None else listed.at
            return self.validated(origin, head, at, ttl), None, None
        now = time.time()
        ttl = self.ttl if ttl is None else float(ttl)
        known = None
        asked = False
        if ttl > 0 and not revalidate:
            known = self._memo.get(origin.source)
            if known is None or now - known.validated_at >= ttl:
                known, asked = self._index.latest(origin.source), True
            if known is not None and now - known.validated_at < ttl:
                self._memo[origin.source] = known
                return known, None, None
        if isinstance(origin, S3Origin) and whole:
            if not asked:
                known = self._index.latest(origin.source)
            if known is not None:
                try:
                    head = origin.stat()
                except (NotFound, AccessDenied, CredentialsError):
                    raise
                except ManyfilesError:      # a HEAD that contradicts itself: only a GET can tell
                    head = None
                if head is not None and head.validator == known.validator:
                    return self.validated(origin, head, now, ttl), head, None
            stream = origin.open_whole(None)
            return self.validated(origin, stream.head, now, ttl), stream.head, stream
        head = origin.stat()
        return self.validated(origin, head, now, ttl), head, None

    def validated(self, origin: FileOrigin | S3Origin, head: Head, now: float | None = None,
                  ttl: float | None = None) -> Version:
        """The version ``head`` names, validated ``now`` (remembered within ``ttl``)."""
        v = Version(fmt.object_id(origin.source, head.validator), origin.source, head.validator, head.size,
                    time.time() if now is None else now)
        if (self.ttl if ttl is None else ttl) > 0:
            self._memo[origin.source] = v
        return v

    def forget(self, source: bytes | None = None) -> None:
        """Drop the memo of ``source`` (None: of every source), after its entries were removed."""
        if source is None:
            self._memo.clear()
        else:
            self._memo.pop(source, None)
