"""The retry policy's two budgets and the run's stall watch (issue 24), and the arithmetic of their
defaults: an outage of a minute in the middle of a job is ridden out, an endpoint that never answers
is given up on within 90 s.

Errors that the other end answered with are counted (``attempts``); errors that heard nothing from it
(``unanswered``: refused, unreachable, timed out, DNS) are retried for a time, the policy's
``stall_timeout``, half of it while the endpoint never answered (``first_contact``).  Time here is
a clock of the test's own (the retry module's ``time``), so no test waits for it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

import manyfiles._core.retry as retry_module
from manyfiles._core.progress import Stall, StallWatch
from manyfiles._core.retry import CONNECT_TIMEOUT, READ_TIMEOUT, RetryPolicy, aretrying, retrying


class Failed(Exception):
    """What a transport's error says of the other end (the attributes the retry loop reads)."""

    retryable = True

    def __init__(self, what: str, *, unanswered: bool, first_contact: bool = False) -> None:
        super().__init__(what)
        self.unanswered, self.first_contact = unanswered, first_contact


class Clock:
    """The retry module's ``time``: ``monotonic()`` reads it, ``sleep(s)`` advances it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(retry_module, "time", c)
    return c


def same(exc: Exception) -> Exception:
    return exc


def test_errors_that_heard_nothing_are_retried_past_the_attempt_count(clock: Clock) -> None:
    calls = []

    def refused_20_times() -> str:
        calls.append(1)
        clock.now += 0.5                # each try: a refused connection, at once
        if len(calls) <= 20:
            raise Failed("connection refused", unanswered=True)
        return "ok"

    assert retrying(refused_20_times, RetryPolicy(attempts=3, base=0.0), classify=same) == "ok"
    assert len(calls) == 21


def test_errors_the_other_end_answered_with_are_counted(clock: Clock) -> None:
    calls = []

    def slow_down() -> None:
        calls.append(1)
        raise Failed("503 SlowDown", unanswered=False)

    with pytest.raises(Failed, match="SlowDown"):
        retrying(slow_down, RetryPolicy(attempts=3, base=0.0, stall_timeout=3600), classify=same)
    assert len(calls) == 3


@pytest.mark.parametrize("first_contact", [False, True])
def test_silence_is_given_up_on_after_the_stall_timeout_or_half_of_it_for_a_first_contact(
        clock: Clock, first_contact: bool) -> None:
    """Every try waits 10 s for nothing: the policy gives up once its budget is spent, counted from
    the first try: the stall timeout and a few seconds (125 s) for an endpoint that answered before,
    half the stall timeout (60 s) for one that never did."""
    policy = RetryPolicy(attempts=2, base=0.0, stall_timeout=120)
    assert (policy.outage, policy.first_contact) == (125, 60)
    start = clock.now
    tries = []

    def silent() -> None:
        tries.append(clock.now - start)
        clock.now += 10
        raise Failed("timed out", unanswered=True, first_contact=first_contact)

    with pytest.raises(Failed):
        retrying(silent, policy, classify=same)
    spent = 60 if first_contact else 130     # the try that reached the budget was the last
    assert clock.now - start == spent and len(tries) == spent // 10


def test_an_answer_in_between_starts_the_silence_budget_again(clock: Clock) -> None:
    """A server that answers (a 503) between two silent spells is not one silence of both."""
    policy = RetryPolicy(attempts=10, base=0.0, stall_timeout=60)
    script = ["silent"] * 5 + ["503"] + ["silent"] * 5 + ["ok"]     # 50 s, an answer, 50 s

    def next_answer() -> str:
        what = script.pop(0)
        clock.now += 10
        if what == "ok":
            return what
        raise Failed(what, unanswered=what == "silent")

    assert retrying(next_answer, policy, classify=same) == "ok"


def test_cancel_ends_the_wait_between_tries_with_the_last_error() -> None:
    cancel = threading.Event()
    calls = []

    def refused() -> None:
        calls.append(1)
        raise Failed("connection refused", unanswered=True)

    patient = RetryPolicy(base=1e6, cap=1e6, stall_timeout=1e9)   # a wait that would outlive the test
    with pytest.raises(Failed, match="refused"):
        retrying(refused, patient, classify=same, on_retry=lambda err: cancel.set(), cancel=cancel)
    assert len(calls) == 1

    async def arefused() -> None:
        calls.append(1)
        raise Failed("connection refused", unanswered=True)

    cancel.clear()
    with pytest.raises(Failed, match="refused"):
        asyncio.run(aretrying(arefused, patient, classify=same, on_retry=lambda err: cancel.set(),
                              cancel=cancel))
    assert len(calls) == 2


def test_the_async_twin_keeps_the_same_budgets(clock: Clock) -> None:
    calls = []

    async def refused_20_times() -> str:
        calls.append(1)
        if len(calls) <= 20:
            raise Failed("connection refused", unanswered=True)
        return "ok"

    assert asyncio.run(aretrying(refused_20_times, RetryPolicy(attempts=3, base=0.0), classify=same)) == "ok"

    async def slow_down() -> None:
        calls.append(1)
        raise Failed("503", unanswered=False)

    calls.clear()
    with pytest.raises(Failed):
        asyncio.run(aretrying(slow_down, RetryPolicy(attempts=3, base=0.0), classify=same))
    assert len(calls) == 3


# -- the run's stall watch ---------------------------------------------------------------------------

def test_the_watch_says_stalled_after_a_while_and_stops_at_its_limits() -> None:
    watch = StallWatch(120, first_limit=65, show_after=5)
    t0 = watch.since
    assert watch.check(t0 + 4) is None
    assert watch.check(t0 + 5) == Stall(5, None)
    assert str(watch.check(t0 + 12)) == "stalled 12s: last error: none yet"
    watch.failed("http://10.0.0.5:9000: timed out (no answer in 60 s)")
    assert str(watch.check(t0 + 30)) == \
        "stalled 30s: last error: http://10.0.0.5:9000: timed out (no answer in 60 s)"
    assert not watch.expired(t0 + 64) and watch.expired(t0 + 65)      # nothing ever moved: the first limit
    assert watch.message("http://10.0.0.5:9000") == \
        "http://10.0.0.5:9000: no answer for 65 s (last error: timed out (no answer in 60 s))"
    watch.moving = True
    assert watch.check(t0 + 66) is None                               # moved: not stalled
    assert not watch.expired(t0 + 66 + 119) and watch.expired(t0 + 66 + 120)
    watch.check(t0 + 66 + 120)
    assert watch.message("http://10.0.0.5:9000") == ("http://10.0.0.5:9000: stalled, nothing moved for 120 s "
                                                      "(last error: timed out (no answer in 60 s))")


def test_a_stall_is_a_plain_value() -> None:
    """What the cluster side sends from a worker: a tuple of a float and a string, nothing else."""
    stall = Stall(12.5, "http://10.0.0.5:9000: connection refused")
    assert tuple(stall) == (12.5, "http://10.0.0.5:9000: connection refused")
    assert str(stall) == "stalled 12s: last error: http://10.0.0.5:9000: connection refused"


# -- the defaults' arithmetic ---------------------------------------------------------------------


def test_the_defaults_ride_out_a_minute_and_give_up_on_a_silent_endpoint_within_90_s(clock: Clock) -> None:
    """The defaults (docs/s3pull.md, "Network errors and stalls"), played on the test's clock."""
    policy = RetryPolicy()
    assert (CONNECT_TIMEOUT, READ_TIMEOUT, policy.stall_timeout, policy.first_contact) == (10, 60, 120, 60)

    # An endpoint that accepts and never answers: every try waits READ_TIMEOUT.  The first request
    # (the listing) gives up with its own error once the first-contact budget is spent; the run's
    # watch, the backstop for a run that keeps starting new requests, comes a few seconds later.
    start = clock.now

    def never_answers() -> None:
        clock.now += READ_TIMEOUT
        raise Failed("timed out", unanswered=True, first_contact=True)

    with pytest.raises(Failed):
        retrying(never_answers, policy, classify=same)
    assert clock.now - start <= 90
    watch = StallWatch.for_policy(policy)
    assert watch.first_limit == policy.first_contact + policy.GRACE <= 90

    # A minute's outage in the middle of a job, the worst case: a request sent just before it
    # waits READ_TIMEOUT for its answer, then every try fails at once (no route, refused) until the
    # outage ends; the request after the last backoff (at most the cap) connects within
    # CONNECT_TIMEOUT.  The request is not given up, and the answer comes before the run's watch
    # (nothing moved since the outage began) reaches the stall timeout.
    outage = 60.0
    start = clock.now

    def through_the_outage() -> str:
        if clock.now == start:
            clock.now += READ_TIMEOUT
            raise Failed("timed out", unanswered=True)
        if clock.now - start < outage:
            raise Failed("no route to host", unanswered=True)
        clock.now += CONNECT_TIMEOUT
        return "answered"

    assert retrying(through_the_outage, policy, classify=same) == "answered"
    assert clock.now - start <= outage + policy.cap + CONNECT_TIMEOUT < policy.stall_timeout < policy.outage
    watch = StallWatch.for_policy(policy)
    watch.answered = True
    assert not watch.expired(watch.since + outage + policy.cap + CONNECT_TIMEOUT)
