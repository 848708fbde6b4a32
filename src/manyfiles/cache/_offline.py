"""Reading when the origin cannot be reached: which failures mean "unreachable", which endpoints
this process found so, and the one warning it gives.

``offline`` (of :class:`~manyfiles.cache.Cache`, ``mf.open``, the datasets and the filesystem):

* ``None`` (default): ask the origin; when a request finds it unreachable (connection refused, no
  route, name not resolved, timed out: :func:`unreachable`), the endpoint is marked down for this
  process (:data:`RECHECK` seconds) and the call is served from the cache at the versions validated
  last, with one :class:`~manyfiles.errors.OfflineWarning` per process that names what was served.
  While an endpoint is marked down, what the cache holds is served without asking it.
* ``True``: never ask the origin (the same reads, without the failed request first, without a warning).
* ``False``: never fall back (the unreachable origin is an error, as before).

What the cache can answer, it answers at once: the first request of a call is tried once
(:data:`PROBE`), and when it finds the endpoint unreachable, the cached answer is served without
waiting out a retry.  What the cache cannot answer (an object it does not hold, a prefix it keeps
no listing of) is asked with the usual retries (the cache's ``retry`` policy), so a blip on a cold
cache is ridden out; only when they fail too is it an :class:`~manyfiles.errors.OfflineMiss`, and
other misses of the next :data:`RECHECK` seconds are then refused at once (that endpoint was
given up on after the full retries: waiting them out again for each object would add nothing).
The usual retries of a request that heard nothing from the endpoint are the policy's time budget
(:mod:`manyfiles._core.retry`), so an outage shorter than the stall timeout is ridden out there too.
A command whose job is to fetch (``cache warm``: ``fetching``) asks for every miss, and reports the
network error itself, not an offline miss.  Any other error worth retrying (throttling, 5xx, a
reset) is retried as usual.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import OfflineMiss, OfflineWarning, OriginUnreachable, UsageError

T = TypeVar("T")

RECHECK = 60.0                  # seconds an endpoint found unreachable is not asked for what the cache holds


@dataclass(frozen=True)
class _Once(RetryPolicy):
    """One try, whatever the error: no time budget either (the probe of an endpoint)."""

    @property
    def first_contact(self) -> float:
        return 0.0

    @property
    def outage(self) -> float:
        return 0.0


PROBE = _Once(attempts=1)       # the first try of a call that the cache can answer


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
        # endpoint -> (monotonic time, reason, given up on after the usual retries)
        self.down: dict[str, tuple[float, str, bool]] = {}
        self.warned = False

    def _current(self, endpoint: str) -> tuple[float, str, bool] | None:
        got = self.down.get(endpoint)
        if got is not None and time.monotonic() - got[0] >= RECHECK:
            with self.lock:
                self.down.pop(endpoint, None)
            return None
        return got

    def reason_down(self, endpoint: str) -> str | None:
        """Why ``endpoint`` is taken as down now (None: ask it)."""
        got = self._current(endpoint)
        return None if got is None else got[1]

    def given_up(self, endpoint: str) -> bool:
        """Did a call with the usual retries find ``endpoint`` unreachable less than RECHECK ago?"""
        got = self._current(endpoint)
        return got is not None and got[2]

    def mark_down(self, endpoint: str, err: OriginUnreachable, *, given_up: bool = False) -> str:
        """``endpoint`` was found unreachable (``err``); returns the reason, as :meth:`reason_down` will."""
        text = str(err)
        cut = text.find(": the S3 endpoint ")
        reason = f"the S3 endpoint {endpoint} {text[cut + 18:]}" if cut >= 0 else text
        with self.lock:
            self.down[endpoint] = (time.monotonic(), reason, given_up)
        return reason

    def mark_up(self, endpoint: str) -> None:
        if endpoint in self.down:
            with self.lock:
                self.down.pop(endpoint, None)

    def served(self, what: str, reason: str) -> None:
        """Warn, once per process, that ``what`` was served from the cache (``reason``: why)."""
        if self.warned:
            return
        with self.lock:
            if self.warned:
                return
            self.warned = True
        warnings.warn(f"manyfiles: {reason}; serving {what} from the cache, at the versions validated last "
                      "(further reads served offline in this process are not warned about)",
                      OfflineWarning, stacklevel=_caller_level())


REACH = _Reachability()


def _after_fork() -> None:
    REACH.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside manyfiles (the warning names the caller's line)."""
    level, frame = 2, sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def fall_back(where: str, endpoint: str, offline: bool | None, *, probe: Callable[[], T],
              retried: Callable[[], T], cached: Callable[[], tuple[T, str] | None],
              missing: Callable[[str], OfflineMiss], fetching: bool = False) -> T:
    """One call that the cache may answer, under the rules of the module docstring.

    ``probe()``: the call tried once (:data:`PROBE`); ``retried()``: the same with the usual retries;
    ``cached()``: the cache's answer and what it is (for the warning), or None; ``missing(reason)``:
    the error when the cache has no answer; ``fetching``: see :func:`ask_anyway`.  ``where`` names
    the call in errors."""
    if offline is False:
        return retried()
    if offline:
        got = cached()
        if got is None:
            raise missing("offline=True")
        return got[0]
    reason = REACH.reason_down(endpoint)
    if reason is None:
        try:
            return probing(probe, retried, where)
        except OriginUnreachable as err:
            reason = REACH.mark_down(endpoint, err)
    got = cached()
    if got is not None:
        REACH.served(got[1], reason)
        return got[0]
    return ask_anyway(where, endpoint, reason, retried, missing, fetching=fetching)


def ask_anyway(where: str, endpoint: str, reason: str, retried: Callable[[], T],
               missing: Callable[[str], OfflineMiss], *, fetching: bool = False) -> T:
    """What the cache cannot answer while ``endpoint`` is down (``reason``): ``retried()``, the call
    with the usual retries, unless the endpoint was given up on after them less than RECHECK ago;
    when it is still unreachable, ``missing(reason)``.  ``fetching``: a command whose job is to
    fetch (``cache warm``) asks every time, and an endpoint still unreachable raises the network
    error itself, as any of its requests would (not an offline miss)."""
    if REACH.given_up(endpoint) and not fetching:
        raise missing(reason)
    try:
        got = retried()
    except Exception as exc:
        err = unreachable(exc, where)
        if err is None:
            raise
        REACH.mark_down(endpoint, err, given_up=True)
        if fetching:
            raise
        raise missing(reason) from err
    REACH.mark_up(endpoint)
    return got


def unreachable(exc: BaseException, where: str) -> OriginUnreachable | None:
    """Does ``exc`` say that the endpoint cannot be reached?  (``manyfiles.s3.retry``'s answer,
    imported here: only a failure pays for importing the S3 package.)"""
    from manyfiles.s3.retry import origin_unreachable

    return origin_unreachable(exc, where)


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
