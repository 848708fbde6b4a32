"""Which version of a source to read: the origins of sources, validations and what they are trusted for.

A version is asked of the origin at each open (a ``stat`` of a file, a ``HEAD`` of an S3 object
the cache holds a version of), unless a validation younger than ``ttl`` is known (this
process's memo, else the index: any process's), or a listing gave it (``etag``/``size``: no
request at all).  An S3 object the cache holds nothing of is opened by its GET, whose answer is
the version: a miss costs one round trip, not a HEAD and a GET.

Offline (_offline.py): when the S3 endpoint cannot be reached (or ``offline=True``), the version
is the one validated last, as the index and the kept versions (_kept.py) know it, if the cache holds
it checked; anything else is asked with the usual retries (a blip is ridden out), then it is an
:class:`~manyfiles.errors.OfflineMiss` (at once with ``offline=True``).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from manyfiles._core.retry import RetryPolicy
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Index, Version
from manyfiles.cache._kept import Kept
from manyfiles.cache._offline import PROBE, REACH, ask_anyway, endpoint_of, fall_back, unreachable
from manyfiles.cache._origin import FileOrigin, Head, S3Origin, WholeRead, parse_source
from manyfiles.errors import (
    AccessDenied,
    CredentialsError,
    ManyfilesError,
    NotFound,
    OfflineMiss,
    UsageError,
)

Source = str | bytes | os.PathLike
T = TypeVar("T")


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

    def __init__(self, index: Index, *, ttl: float, settings: Any, retry: RetryPolicy, kept: Kept,
                 offline: bool | None = None) -> None:
        self._index = index
        self.ttl = float(ttl)
        self.settings = settings
        self.retry = retry
        self.kept = kept
        self.offline = offline
        #: does the cache hold this version checked (whole, or every block)?  Set by the Cache.
        self.held: Callable[[Version], bool] = lambda v: False
        self._memo: dict[bytes, Version] = {}
        self._clients: dict[Any, Any] = {}
        self._probes: dict[Any, Any] = {}
        self._fetched_with: dict[Any, Any] = {}     # settings given to fill() -> their resolution

    def origin(self, src: Source | FileOrigin | S3Origin, settings: Any = None, *,
               fetched: bool = False) -> FileOrigin | S3Origin:
        """The origin of ``src`` (an S3 URL's with ``settings``, default the cache's), its settings
        resolved as the environment is now.  ``fetched``: the caller fetched ``src`` itself with
        ``settings`` (:meth:`Cache.fill`): they are resolved the first time only, and the bytes are
        kept under the endpoint they came from, not under one the environment names later."""
        if isinstance(src, str) and src.startswith("s3://"):
            from manyfiles.s3.objects import ObjectClient, resolve

            # A fill is per object (a dataset's every miss): resolving there scanned the environment
            # and stat'ed the AWS files per object, for settings the caller resolved when it listed.
            resolved = self._fetched_with.get(settings) if fetched and settings is not None else None
            if resolved is None:
                resolved = resolve(settings or self.settings)
                if fetched and settings is not None:
                    if len(self._fetched_with) >= 64:
                        self._fetched_with.clear()
                    self._fetched_with[settings] = resolved
            client = self._clients.get(resolved)
            if client is None:
                client = self._clients[resolved] = ObjectClient(resolved, retry=self.retry)
            return parse_source(src, resolved, self.retry, client, resolved=True)
        return parse_source(src)

    def resolve(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False, whole: bool = True,
                ttl: float | None = None, listed: Listed | None = None, offline: bool | None = None,
                fetching: bool = False) -> tuple[Version, Head | None, WholeRead | None]:
        """(version, what the validation learnt, the whole read it opened if that was the way).

        ``whole``: an S3 object the cache holds nothing of is opened by its GET (``whole``), whose
        answer is the version: a miss costs one round trip, not a HEAD and a GET.  A HEAD whose
        answer contradicts the cached entry does the same: the object changed (or the HEAD lies),
        and only the GET's answer says what is there.  ``listed``: the version a listing gave (no
        request at all); ``ttl``: this call's instead of the cache's; ``offline``: this call's
        (None: the cache's), and ``fetching`` (a miss offline raises the network error, not
        OfflineMiss), see _offline.py.
        """
        if offline is None:
            offline = self.offline
        if listed is not None:
            if not isinstance(origin, S3Origin):
                raise UsageError(f"{origin.display}: etag= is for s3:// objects (a listing's ETag)")
            head = Head(S3Origin.validator(listed.etag, listed.size), listed.size)
            at = time.time() if listed.at is None else listed.at
            v = self.validated(origin, head, at, ttl)
            if self.offline_reason(origin, offline) is None or self.held(v):
                return v, None, None        # GETs pinned to it, or its blocks are here
            stream = self.fetch_miss(origin, lambda: origin.open_whole(head), offline, fetching=fetching)
            return v, stream.head, stream
        if not isinstance(origin, S3Origin):
            return self._online(origin, revalidate, whole, ttl)
        return fall_back(origin.display, endpoint_of(origin.settings), offline,
                         probe=lambda: self._probed(origin, revalidate, whole, ttl),
                         retried=lambda: self._online(origin, revalidate, whole, ttl),
                         cached=lambda: self._last_validated(origin),
                         missing=lambda why: self._missing(origin, why), fetching=fetching)

    def offline_reason(self, origin: FileOrigin | S3Origin, offline: bool | None) -> str | None:
        """Why reads of ``origin`` are offline now (``offline=True``, its endpoint found unreachable),
        or None."""
        if offline is None:
            offline = self.offline
        if not isinstance(origin, S3Origin) or offline is False:
            return None
        return "offline=True" if offline else REACH.reason_down(endpoint_of(origin.settings))

    def fetch_miss(self, origin: FileOrigin | S3Origin, fetch: Callable[[], T],
                   offline: bool | None = None, *, fetching: bool = False) -> T:
        """``fetch()``, the request for what the cache does not hold of ``origin``: as usual while its
        endpoint answers; while it is offline, with the usual retries (_offline.py), then OfflineMiss
        (``fetching``: the network error); with ``offline=True``, OfflineMiss."""
        reason = self.offline_reason(origin, offline)
        if reason is None:
            return fetch()
        if self.offline if offline is None else offline:
            raise self._missing(origin, reason)
        return ask_anyway(origin.display, endpoint_of(origin.settings), reason, fetch,
                          lambda why: self._missing(origin, why), fetching=fetching)

    def _last_validated(self, origin: S3Origin) -> tuple[tuple[Version, None, None], str] | None:
        """The version of ``origin`` validated last, if the cache holds it checked (offline reads),
        as :meth:`resolve` answers; None when it does not."""
        v = self._index.latest(origin.source)
        if v is None or not self.held(v):
            return None
        newer = self.kept.superseded(origin.source)
        if newer is not None and newer[0] != v.validator and newer[1] >= v.validated_at:
            return None         # a newer version was seen: never serve an older one
        return (v, None, None), origin.display

    def _missing(self, origin: S3Origin, reason: str) -> OfflineMiss:
        v = self._index.latest(origin.source)
        held = "only a version older than the one validated last" if v is not None and self.held(v) \
            else "no copy of it"
        return OfflineMiss(f"{origin.display}: offline ({reason}), and the cache holds {held}")

    def _probed(self, origin: S3Origin, revalidate: bool, whole: bool, ttl: float | None
                ) -> tuple[Version, Head | None, WholeRead | None]:
        """:meth:`_online` through a client that tries each request once (the probe of an endpoint);
        the whole read it opened goes on with ``origin``'s client (its resumes retried as usual)."""
        client = self._probes.get(origin.settings)
        if client is None:
            from manyfiles.s3.objects import ObjectClient

            client = self._probes[origin.settings] = ObjectClient(origin.settings, retry=PROBE)
        probe = copy.copy(origin)
        probe.client = client
        v, head, stream = self._online(probe, revalidate, whole, ttl)
        if stream is not None:
            stream.rehome(origin)
        return v, head, stream

    def _online(self, origin: FileOrigin | S3Origin, revalidate: bool, whole: bool, ttl: float | None
                ) -> tuple[Version, Head | None, WholeRead | None]:
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
                except ManyfilesError as exc:   # a HEAD that contradicts itself: only a GET can tell
                    if unreachable(exc, origin.display) is not None:
                        raise
                    head = None
                if head is not None and head.validator == known.validator:
                    return self.validated(origin, head, now, ttl), head, None
            stream = origin.open_whole(None)
            if known is not None and stream.head.validator != known.validator:
                self.kept.supersede(origin.source, stream.head.validator, now)    # offline: not the old one
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
