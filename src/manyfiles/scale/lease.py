"""The lease of a cluster job: its shards work only while the client that started them is there.

Without it, a client killed mid-job left its running shards at work: Dask releases the tasks of
a client that disconnects, but a task already running is a thread it cannot stop, so the shards
went on writing into DEST (for 95 s in one try), overlapping the rerun the user had started.

How it works (the Dask side is in :mod:`manyfiles.scale._dask`):

* the client holds a **lease anchor**: a tiny Dask task of its own (``manyfiles-lease-<token>``),
  submitted before the first shard and released after the last one.  The anchor's scheduler-side
  metadata holds a beat counter, which the client renews every ``seconds / 6``;
* each worker process watches the lease of a job it runs (:class:`LeaseWatch`): the first attempt
  there reads that metadata (no anchor: it does nothing), then a watcher thread reads it every
  ``min(seconds / 10, 2 s)`` for all the job's attempts on the process; an attempt **holds the
  lease while the beat keeps changing**;
* the lease **lapses** when the anchor is gone -- the client released it (the job ended, failed
  or was interrupted) or the scheduler dropped it because the client disconnected (a SIGKILLed
  client's connection closes at once: its shards stop within one poll) -- or when the beat has
  not changed for ``seconds`` (a hung or cut-off client, or a worker that cannot reach the
  scheduler), measured on the worker's own monotonic clock (no clock skew between machines);
* a shard finds out between two objects: ``publish(...)``, which every job calls as it goes, raises
  :class:`LeaseLapsed` on the shard's thread once the lease has lapsed.  Each tool stops there as
  it stops on Ctrl-C: the object in flight is finished or abandoned, never installed half-written
  (temp + rename, journaled renames), temp files are removed or left for the next run's clean-up.

The lease is ``MANYFILES_CLUSTER_LEASE`` seconds (default 30); it only bounds how long shards of a
client that hangs without disconnecting go on.

An attempt also learns what **earlier attempts of the same shard** (in this run: their worker died
and Dask ran the shard again) noted before they worked (:meth:`Attempt.note`,
:attr:`Attempt.earlier`: registering costs two requests, only for the jobs that ask), so a re-run
can count the work those attempts did and it cannot see any more (the files fastrm removed, the
objects s3pull installed): every summary counts what happened, once.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from manyfiles.errors import ManyfilesError, UsageError

LEASE_ENV = "MANYFILES_CLUSTER_LEASE"
DEFAULT_SECONDS = 30.0
MAX_POLL = 2.0           # seconds between two looks at the lease, at most


class LeaseLapsed(ManyfilesError):
    """The job's client stopped renewing its lease (it ended, died or hung): the shard stopped."""


def lease_seconds(value: str | float | None = None) -> float:
    """The lease length: ``value``, else ``$MANYFILES_CLUSTER_LEASE``, else 30 s (UsageError if bad)."""
    if value is None:
        value = os.environ.get(LEASE_ENV) or DEFAULT_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds >= 0.5 or seconds == float("inf"):
        raise UsageError(f"{LEASE_ENV}={value}: the cluster lease is a number of seconds >= 0.5")
    return seconds


@dataclass(frozen=True)
class LeaseTerms:
    """What a shard task carries: the anchor's key (where the beat is) and the lease length."""

    key: str
    seconds: float

    @property
    def renew_every(self) -> float:
        return self.seconds / 6

    @property
    def poll_every(self) -> float:
        return min(self.seconds / 10, MAX_POLL)


class Attempt:
    """One run of one shard, as the job sees it (:func:`current`).

    This base class is the in-process one: it never lapses and no attempt came before it.
    """

    #: True where a shard can be run again after its worker died (a cluster): a job that counts
    #: the work of earlier attempts only prepares for it (:meth:`note`) there.
    rerun_possible = False
    #: True once this attempt told the scheduler it runs (see :class:`LeasedAttempt`).
    registered = False

    def __init__(self) -> None:
        self.earlier: dict[str, Any] = {}      # attempt id -> its note, oldest first

    def check(self) -> None:
        """Raise :class:`LeaseLapsed` if the lease has lapsed (the job's ``publish`` calls this)."""

    @property
    def lapsed(self) -> bool:
        return False

    def note(self, value: Any) -> None:
        """Record ``value`` (small, msgpack-able) for later attempts of this shard, before doing work."""

    def chain(self) -> dict[str, Any]:
        """The notes to hand to a re-run of this shard (in process there is none)."""
        return {}

    def first_note(self, mine: Any) -> Any:
        """The note of the oldest attempt that left one, else ``mine`` (this attempt's)."""
        for value in self.earlier.values():
            if value is not None:
                return value
        return mine


NO_LEASE = Attempt()
_CURRENT: contextvars.ContextVar[Attempt] = contextvars.ContextVar("manyfiles_attempt", default=NO_LEASE)


def current() -> Attempt:
    """The attempt of the shard running on this thread (in process: one that never lapses)."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(attempt: Attempt) -> Iterator[Attempt]:
    """``attempt`` is the :func:`current` one on this thread for the duration of the block."""
    token = _CURRENT.set(attempt)
    try:
        yield attempt
    finally:
        _CURRENT.reset(token)


def guarded(publish: Callable[..., None], attempt: Attempt) -> Callable[..., None]:
    """``publish`` that first checks the lease when called on this (the shard's) thread.

    Only there: from a tool's own threads an exception would land in the middle of its work;
    the tools render progress on the thread that runs the shard.
    """
    owner = threading.get_ident()

    def checked(done: int, nbytes: int = 0, failures: int = 0, stall: Any = None) -> None:
        if threading.get_ident() == owner:
            attempt.check()
        publish(done, nbytes, failures, stall)

    return checked


class LeaseWatch:
    """A worker process's view of one job's lease, shared by the attempts it runs.

    ``read()`` returns the anchor's metadata (a dict with ``"beat"``), None when the anchor is
    gone, or raises when the scheduler cannot be asked.  The first look is made by the caller
    (the first attempt of the job here); then a watcher thread looks every ``poll_every`` s, until
    the lease ends, or until no attempt has used it for ``seconds`` (the next one starts another).
    :meth:`check` only compares clocks: a hung request cannot keep a shard working.
    """

    def __init__(self, terms: LeaseTerms, read: Callable[[], Any]) -> None:
        self.terms = terms
        self._read = read
        self._beat: Any = None
        self._confirmed = time.monotonic()
        self._gone = ""
        self._users = 0
        self._used = time.monotonic()
        self._lock = threading.Lock()
        self._look()
        if not self._gone and self._beat is None:
            self._gone = "the scheduler could not confirm it"
        self._thread = threading.Thread(target=self._watch, name="manyfiles-lease", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Still watching (a new attempt may use it)."""
        return self._thread.is_alive() and not self._gone

    def _look(self) -> None:
        try:
            value = self._read()
        except Exception:             # unreachable, timed out: not a renewal
            return
        with self._lock:
            if not isinstance(value, dict) or "beat" not in value:
                self._gone = "its client released it or disconnected"
            elif self._beat is None or value["beat"] > self._beat:     # (a late answer is no renewal)
                self._beat = value["beat"]
                self._confirmed = time.monotonic()

    def refresh(self) -> None:
        """Look now (from the thread of a new attempt): a worker back from a cut must not turn
        away the shards it is given while its watcher waits for an answer lost in the cut."""
        if self.lapsed and not self._gone:
            self._look()

    def _watch(self) -> None:
        while not self._gone:
            time.sleep(self.terms.poll_every)
            with self._lock:
                if not self._users and time.monotonic() - self._used > self.terms.seconds:
                    return
            self._look()

    @contextlib.contextmanager
    def used(self) -> Iterator[LeaseWatch]:
        """The block of an attempt (keeps the watcher going)."""
        with self._lock:
            self._users += 1
        try:
            yield self
        finally:
            with self._lock:
                self._users -= 1
                self._used = time.monotonic()

    @property
    def lapsed(self) -> bool:
        return bool(self._gone) or time.monotonic() - self._confirmed > self.terms.seconds

    def check(self) -> None:
        if self._gone:
            raise LeaseLapsed(f"the job's lease ended ({self._gone}): shard stopped")
        idle = time.monotonic() - self._confirmed
        if idle > self.terms.seconds:
            raise LeaseLapsed(f"the job's lease lapsed (not renewed for {idle:.0f} s, lease "
                              f"{self.terms.seconds:g} s: ${LEASE_ENV}): shard stopped")


class LeasedAttempt(Attempt):
    """An attempt on a cluster: its lease is the process's :class:`LeaseWatch` of the job.

    It registers with the scheduler only when the job asks for :attr:`earlier` or calls
    :meth:`note` (a job that never counts lost work pays no request per shard): ``attempts()``
    returns the registrations of this shard's attempts so far (id -> note), ``write(value)``
    records this one's.
    """

    rerun_possible = True

    def __init__(self, watch: LeaseWatch, attempts: Callable[[], dict[str, Any]],
                 write: Callable[[Any], None], *, name: str = "",
                 carried: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.watch = watch
        self.name = name                       # this attempt's id among the shard's registrations
        self._attempts = attempts
        self._write = write
        self._registered = False
        self._carried = dict(carried or {})    # notes of attempts of earlier tasks of this shard
        self._mine: Any = None

    @property  # type: ignore[override]
    def earlier(self) -> dict[str, Any]:
        """What the attempts of this shard before this one noted (registering this one first
        fetches them: a later attempt will see this one)."""
        if not self._registered:
            self.note(None)
        return self._earlier

    @earlier.setter
    def earlier(self, value: dict[str, Any]) -> None:
        self._earlier = value

    @property
    def registered(self) -> bool:
        return self._registered

    @property
    def lapsed(self) -> bool:
        return self.watch.lapsed

    def check(self) -> None:
        self.watch.check()

    def note(self, value: Any) -> None:
        if not self._registered:
            self._earlier = {**self._carried, **(self._attempts() or {})}
        self._write(value)
        self._mine = value
        self._registered = True

    def chain(self) -> dict[str, Any]:
        """The notes of this attempt and of every earlier one, oldest first: what the next task
        of this shard is given when this one stopped (its lease lapsed) and the client runs the
        shard again under a new key, whose registrations start empty."""
        if not self._registered:
            return dict(self._carried)
        return {**self._earlier, self.name: self._mine}


__all__ = ["DEFAULT_SECONDS", "LEASE_ENV", "NO_LEASE", "Attempt", "LeaseLapsed", "LeaseTerms",
           "LeaseWatch", "LeasedAttempt", "current", "guarded", "lease_seconds", "running"]
