"""One retry loop for every tool: full-jitter backoff, retrying only what the caller says is retryable.

:class:`RetryPolicy` is the schedule (attempts, base, cap); :func:`retrying` calls a function
until it succeeds, ``classify(exc)`` says an error is final, or the attempts run out;
:func:`aretrying` is its coroutine twin, in the same order.  ``classify`` maps any exception
to the exception to raise (or to retry on): its ``retryable`` attribute decides.  Nothing here
knows about S3 or botocore.

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
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to try: ``attempts`` tries in all, full-jitter backoff."""

    attempts: int = 6          # tries per item, including the first
    base: float = 0.1          # seconds
    cap: float = 10.0

    def delay(self, attempt: int) -> float:
        """Full jitter (AWS architecture blog): uniform(0, min(cap, base * 2**attempt))."""
        return random.uniform(0.0, min(self.cap, self.base * (2 ** attempt)))


class Retryable(Exception):
    """Wraps an exception that ``classify`` wants retried (for callers without their own type)."""

    retryable = True


def retrying(fn: Callable[[], T], policy: RetryPolicy, *, classify: Callable[[Exception], Exception],
             on_retry: Callable[[Exception], None] | None = None,
             reset: Callable[[], None] | None = None) -> T:
    """Call ``fn()`` until it succeeds, ``classify(exc).retryable`` is false, or the policy runs out.

    The classified error is raised (``from`` the original when they differ).  ``on_retry(err)``
    is told before each new attempt, ``reset()`` runs before it (e.g. truncate a partial file).
    """
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            time.sleep(_next_attempt(exc, attempt, policy, classify, on_retry, reset))
    raise AssertionError("unreachable")


async def aretrying(fn: Callable[[], Awaitable[T]], policy: RetryPolicy, *,
                    classify: Callable[[Exception], Exception],
                    on_retry: Callable[[Exception], None] | None = None,
                    reset: Callable[[], None] | None = None) -> T:
    """The coroutine twin of :func:`retrying` (``fn`` returns an awaitable)."""
    for attempt in range(policy.attempts):
        try:
            return await fn()
        except Exception as exc:
            import asyncio  # here: the threaded engines never load it

            await asyncio.sleep(_next_attempt(exc, attempt, policy, classify, on_retry, reset))
    raise AssertionError("unreachable")


def _next_attempt(exc: Exception, attempt: int, policy: RetryPolicy,
                  classify: Callable[[Exception], Exception],
                  on_retry: Callable[[Exception], None] | None,
                  reset: Callable[[], None] | None) -> float:
    """After a failed attempt: raise the classified error if it is final, else tell ``on_retry``,
    run ``reset`` and return the delay before the next attempt.  One decision for both twins, so
    they cannot drift apart (issue 10: the async twin once retried any exception)."""
    err = classify(exc)
    if not getattr(err, "retryable", False) or attempt + 1 >= policy.attempts:
        if err is exc:
            raise exc
        raise err from exc
    if on_retry is not None:
        on_retry(err)
    if reset is not None:
        reset()
    return policy.delay(attempt)


__all__ = ["RetryPolicy", "Retryable", "aretrying", "retrying"]
