"""What travels on ``ctx.events`` (a pull's one channel, :class:`~manyfiles.s3.engines.base.Ctx`): one
small class per kind, each a NamedTuple (a tuple: as cheap to make and to send through a process's
pipe as the untyped ``(kind, job, value)`` it replaces), read by the consumer with ``type(ev) is``.

From the engines: :class:`BytesIn`, :class:`Retried`, :class:`JobDone`, :class:`JobFailed`, several of
those at once in a :class:`Batch` (the loop engine's), and the processes engine's :class:`WorkerExit`
(between a worker and its parent only).  From the producer:
:class:`Planned`, :class:`Skipped`, :class:`JobFailed` (an unsafe key), :class:`JobDone` (a cache
hit), :class:`Listed`, :class:`Fatal`, :class:`End`.  From a memory sink: :class:`Delivered`.
What a job's transfer ended with travels in its event as :class:`Done` or :class:`Failed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from manyfiles.errors import ManyfilesError
from manyfiles.s3.integrity import Claim

if TYPE_CHECKING:
    from manyfiles.s3.transfer import Download


@dataclass(frozen=True)
class Done:
    """A :class:`JobDone`'s outcome: the object is installed (or delivered) and passed ``claim``."""

    engine: str
    size: int
    claim: Claim
    resumed_parts: int = 0
    installed: tuple[int, int] | None = None   # the installed file's (inode, mtime_ns), for the state


@dataclass(frozen=True)
class Failed:
    """A :class:`JobFailed`'s outcome; ``stop`` is set when no other object can succeed either
    (full disk, no such bucket, refused credentials): the run ends with that error."""

    reason: str
    code: str
    stop: ManyfilesError | None = None


class BytesIn(NamedTuple):
    """``n`` bytes received (a batch of them: see ``Ctx.bytes``)."""

    n: int


class Retried(NamedTuple):
    """A request of ``job`` (None: not a job's, a range of the fetcher's) is tried again after ``reason``."""

    job: Download | None
    reason: str


class JobDone(NamedTuple):
    """``job`` is installed (or delivered), having passed ``outcome.claim``."""

    job: Download
    outcome: Done


class JobFailed(NamedTuple):
    job: Download
    outcome: Failed


class Batch(NamedTuple):
    """Several engine events at once, in order: what one turn of the loop engine's loop ended with,
    handed to the consumer in one put (one wake-up of its thread instead of one per object)."""

    events: tuple


class Planned(NamedTuple):
    """The planner chose ``job.engine`` for ``job`` (``part_size`` > 0: in ranges of that size)."""

    job: Download
    part_size: int


class Skipped(NamedTuple):
    job: Download
    reason: str


class Listed(NamedTuple):
    """The listing ended with ``count`` objects planned, skipped or failed."""

    count: int


class Fatal(NamedTuple):
    """The producer failed (listing, submitting): the consumer raises ``error``."""

    error: BaseException


class End(NamedTuple):
    """Every engine finished: nothing more comes."""


class Delivered(NamedTuple):
    """A memory sink's object: its ``key`` and bytes, for the caller."""

    key: str
    data: Any


class WorkerExit(NamedTuple):
    """A worker process of the processes engine ended (its last outcomes are before this)."""

    pid: int
