"""Reading when the origin cannot be reached: which failures mean "unreachable", which endpoints
this process found so, and the one warning it gives.

``offline`` (of :class:`~manyfiles.cache.Cache`, ``mf.open``, the datasets and the filesystem):

* ``None`` (default): ask the origin; when a request finds it unreachable (connection refused, no
  route, name not resolved, timed out: :func:`unreachable`), the endpoint is marked down for this
  process (:data:`RECHECK` seconds), the call is served from the cache at the versions validated
  last, and one :class:`~manyfiles.errors.OfflineWarning` per process names what was served.  While
  an endpoint is marked down, no request is sent to it: every read goes straight to the cache.
* ``True``: never ask the origin (the same reads, without the failed request first, without a warning).
* ``False``: never fall back (the unreachable origin is an error, as before).

The first request to an endpoint is tried once, not retried (:data:`PROBE`): refused, unroutable and
unresolvable endpoints do not get better within a retry's backoff, and the cache can answer now.
Anything else that is worth retrying (throttling, 5xx, a reset) is then retried as usual.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import OfflineWarning, OriginUnreachable, UsageError, origin_unreachable

unreachable = origin_unreachable

T = TypeVar("T")

RECHECK = 60.0                  # seconds an endpoint found unreachable is not asked again
PROBE = RetryPolicy(attempts=1)  # the first try of a call that can fall back to the cache



def check_mode(offline: Any) -> bool | None:
    """``offline`` as given (None, True or False), or a UsageError."""
    if offline is None or isinstance(offline, bool):
        return offline
    raise UsageError(f"offline={offline!r}: give True (serve the cache only), False (never fall back) "
                     "or None (fall back when the origin cannot be reached)")


def endpoint_of(settings: Any) -> str:
    """The key of an endpoint: its URL, or AWS's by region."""
    url = getattr(settings, "endpoint_url", None)
    return url or f"aws:{getattr(settings, 'region', None) or ''}"


class _Reachability:
    """This process's endpoints found unreachable, and whether it warned."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down: dict[str, tuple[float, str]] = {}      # endpoint -> (monotonic time, reason)
        self.warned = False

    def reason_down(self, endpoint: str) -> str | None:
        """Why ``endpoint`` is taken as down now (None: ask it)."""
        got = self.down.get(endpoint)
        if got is None:
            return None
        if time.monotonic() - got[0] >= RECHECK:
            with self.lock:
                self.down.pop(endpoint, None)
            return None
        return got[1]

    def mark_down(self, endpoint: str, err: OriginUnreachable) -> None:
        text = str(err)
        cut = text.find(": the S3 endpoint ")
        reason = f"the S3 endpoint {endpoint} {text[cut + 18:]}" if cut >= 0 else text
        with self.lock:
            self.down[endpoint] = (time.monotonic(), reason)

    def mark_up(self, endpoint: str) -> None:
        if endpoint in self.down:
            with self.lock:
                self.down.pop(endpoint, None)

    def served(self, what: str, reason: str, stacklevel: int = 4) -> None:
        """Warn, once per process, that ``what`` was served from the cache (``reason``: why)."""
        if self.warned:
            return
        with self.lock:
            if self.warned:
                return
            self.warned = True
        warnings.warn(f"manyfiles: {reason}; serving {what} from the cache, at the versions validated last "
                      "(further reads served offline in this process are not warned about)",
                      OfflineWarning, stacklevel=stacklevel)


REACH = _Reachability()


def _after_fork() -> None:
    REACH.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def probing(first: Callable[[], T], rest: Callable[[], T], where: str) -> T:
    """``first()`` (a call that tries once: :data:`PROBE`); unless the origin was unreachable (raised
    as :class:`OriginUnreachable`), ``rest()`` (the same with the usual retries) when its error is
    worth retrying."""
    try:
        return first()
    except Exception as exc:
        err = unreachable(exc, where)
        if err is not None:
            raise err from exc
        if not _retryable(exc):
            raise
    return rest()


def _retryable(exc: BaseException) -> bool:
    """Is ``exc``, or the error it was made from (a listing's error keeps the request's), retryable?"""
    e: BaseException | None = exc
    for _ in range(6):
        if e is None:
            return False
        flag = getattr(e, "retryable", None)
        if flag is not None:
            return bool(flag)
        e = e.__cause__
    return False
