"""One retry loop for every tool: full-jitter backoff, retrying only what the caller says is retryable.

:class:`RetryPolicy` is the schedule; :func:`retrying` calls a function until it succeeds,
``classify(exc)`` says an error is final, or the policy's budget runs out; :func:`aretrying` is
its coroutine twin, in the same order.  ``classify`` maps any exception to the exception to raise
(or to retry on): its ``retryable`` attribute decides.  Nothing here knows about S3 or botocore.

Two budgets, by what the error says of the other end (its ``unanswered`` attribute):

* an error the other end answered with (a 5xx, a body cut short, a reset in the middle of one) is
  counted: ``attempts`` tries in all;
* an error that heard nothing from it (refused, unreachable, timed out before any answer, a DNS
  failure: ``unanswered`` true) is retried for a time, not a count: for :attr:`RetryPolicy.outage`
  seconds (the stall timeout and a few seconds more) since the first try, or since the last
  answered one, so that an outage shorter than the stall timeout is ridden out however fast each
  try fails, and a run whose requests all wait ends on its stall watch (one line) before they give
  up one by one; an error that also says ``first_contact`` (the other end never answered in this
  process) gets :attr:`RetryPolicy.first_contact`, half the stall timeout: an endpoint that was
  never there is given up on sooner than one that went away, and the request's own error, which
  says what it waited for, ends the run before its watch does.

``cancel`` (a ``threading.Event``) ends the wait between two tries: the last error is raised.

Example:
    >>> policy = RetryPolicy(attempts=3, base=0.0)
    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise TimeoutError("slow")
    ...     return "ok"
    >>> retrying(flaky, policy, classify=lambda e: Retryable(e))
    'ok'
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

T = TypeVar("T")


#: The network timeouts every S3 path uses by default (``ClientSettings``): a connection may take
#: ``CONNECT_TIMEOUT`` seconds, an answer may keep us waiting ``READ_TIMEOUT`` seconds for a byte.
#: They agree with ``RetryPolicy.stall_timeout`` (docs/s3pull.md, "Network errors and stalls"):
#: an endpoint that accepts and never answers fails its first request after READ_TIMEOUT, which
#: is also its first-contact budget (half the stall timeout), so the run ends then, within 90 s;
#: one that answered and then went away is waited for the whole stall timeout, twice the read
#: timeout: an outage of a minute is ridden out.
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to try (see the module docstring): ``attempts`` tries for errors
    the other end answered with, ``stall_timeout`` seconds for errors that heard nothing from it
    (half of it while it never answered), full-jitter backoff between tries."""

    attempts: int = 6          # tries per item, including the first
    base: float = 0.1          # seconds
    cap: float = 10.0
    stall_timeout: float = 120.0   # seconds (docs/s3pull.md, "Network errors and stalls")

    GRACE: ClassVar[float] = 5.0   # seconds: see outage, and StallWatch.for_policy

    def delay(self, attempt: int) -> float:
        """Full jitter (AWS architecture blog): uniform(0, min(cap, base * 2**attempt))."""
        return random.uniform(0.0, min(self.cap, self.base * (2 ** min(attempt, 60))))

    @property
    def first_contact(self) -> float:
        """Seconds an endpoint that never answered is tried for: half the stall timeout."""
        return self.stall_timeout / 2

    @property
    def outage(self) -> float:
        """Seconds an endpoint that answered before is tried for: the stall timeout and ``GRACE``."""
        return self.stall_timeout + self.GRACE


class Retryable(Exception):
    """Wraps an exception that ``classify`` wants retried (for callers without their own type)."""

    retryable = True


class _Tries:
    """Where one call stands: failures so far, those counted, and the clock of the unanswered ones."""

    __slots__ = ("counted", "failures", "since")

    def __init__(self) -> None:
        self.failures = self.counted = 0
        self.since = time.monotonic()


def retrying(fn: Callable[[], T], policy: RetryPolicy, *, classify: Callable[[Exception], Exception],
             on_retry: Callable[[Exception], None] | None = None,
             reset: Callable[[], None] | None = None, cancel: threading.Event | None = None) -> T:
    """Call ``fn()`` until it succeeds, ``classify(exc).retryable`` is false, or the policy runs out.

    The classified error is raised (``from`` the original when they differ).  ``on_retry(err)``
    is told before each new attempt, ``reset()`` runs before it (e.g. truncate a partial file).
    ``cancel`` set: the wait ends and the last error is raised.
    """
    tries = _Tries()
    while True:
        try:
            return fn()
        except Exception as exc:
            err, delay = _next_attempt(exc, tries, policy, classify, on_retry, reset)
            if cancel is not None:
                if cancel.wait(delay):
                    _give_up(err, exc)
            else:
                time.sleep(delay)


async def aretrying(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *,
                    classify: Callable[[Exception], Exception],
                    on_retry: Callable[[Exception], None] | None = None,
                    reset: Callable[[], None] | None = None, cancel: threading.Event | None = None) -> T:
    """The coroutine twin of :func:`retrying` (``fn`` returns an awaitable)."""
    tries = _Tries()
    while True:
        try:
            return await fn()
        except Exception as exc:
            import asyncio  # here: the threaded engines never load it

            err, delay = _next_attempt(exc, tries, policy, classify, on_retry, reset)
            while delay > 0 and not (cancel is not None and cancel.is_set()):
                step = min(delay, 0.5)      # a cancel is seen within half a second
                await asyncio.sleep(step)
                delay -= step
            if cancel is not None and cancel.is_set():
                _give_up(err, exc)


class Tries:
    """One call's tries under ``policy``, for a caller that waits between them itself (an event loop's
    timer, not a sleep): :meth:`failed` makes :func:`retrying`'s decision after a failed try."""

    __slots__ = ("_tries", "classify", "on_retry", "policy", "reset")

    def __init__(self, policy: RetryPolicy, *, classify: Callable[[Exception], Exception],
                 on_retry: Callable[[Exception], None] | None = None,
                 reset: Callable[[], None] | None = None) -> None:
        self.policy, self.classify, self.on_retry, self.reset = policy, classify, on_retry, reset
        self._tries = _Tries()

    def failed(self, exc: Exception) -> float:
        """After a failed try: raise the error to give up with, or tell ``on_retry``, run ``reset`` and
        return the seconds to wait before the next try."""
        return _next_attempt(exc, self._tries, self.policy, self.classify, self.on_retry, self.reset)[1]


def _next_attempt(exc: Exception, tries: _Tries, policy: RetryPolicy,
                  classify: Callable[[Exception], Exception],
                  on_retry: Callable[[Exception], None] | None,
                  reset: Callable[[], None] | None) -> tuple[Exception, float]:
    """After a failed attempt: raise the classified error if it is final (see the module docstring
    for the two budgets), else tell ``on_retry``, run ``reset`` and return the error and the delay
    before the next attempt.  One decision for both twins, so they cannot drift apart (issue 10:
    the async twin once retried any exception)."""
    err = classify(exc)
    if not getattr(err, "retryable", False):
        _give_up(err, exc)
    now = time.monotonic()
    delay = policy.delay(tries.failures)
    tries.failures += 1
    if getattr(err, "unanswered", False):
        budget = policy.first_contact if getattr(err, "first_contact", False) else policy.outage
        if now - tries.since >= budget:
            _give_up(err, exc)
    else:
        tries.counted += 1
        if tries.counted >= policy.attempts:
            _give_up(err, exc)
        tries.since = now + delay       # it answered: the next silence is timed from the next try
    if on_retry is not None:
        on_retry(err)
    if reset is not None:
        reset()
    return err, delay


def _give_up(err: Exception, exc: Exception) -> None:
    if err is exc:
        raise exc
    raise err from exc


__all__ = ["CONNECT_TIMEOUT", "READ_TIMEOUT", "RetryPolicy", "Retryable", "Tries", "aretrying", "retrying"]
