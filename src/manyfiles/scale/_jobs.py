"""The core of scale: what both executors (in process, and :mod:`manyfiles.scale._dask`) run --
jobs, shard results, the merged report, the client's shard queue and live counters.  The public
face is :mod:`manyfiles.scale.executor`, which also picks the executor
(:func:`~manyfiles.scale.executor.connect`); this module imports neither executor.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.progress import Progress, ProgressArg, Stall, check_progress, progress_for
from manyfiles._core.report import Report
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.scale.lease import NO_LEASE, Attempt, LeaseLapsed, guarded, running

Publish = Callable[..., None]
"""``publish(done, bytes, failures, stall=None)``: a shard's running totals (absolute, not deltas),
and while nothing moves in it its :class:`~manyfiles._core.progress.Stall` (seconds, last error)."""

MAX_FAILURES_PER_SHARD = 10_000   # listed per shard; the rest are counted (a result stays small)
IN_FLIGHT_PER_THREAD = 4          # shards submitted per worker thread (running + queued on it)...
IN_FLIGHT_EXTRA = 16              # ...plus these: round trips overlap when shards are short
PUBLISH_INTERVAL = 0.5            # seconds between two counter events of one shard
CLUSTER_FEATURE = "running on a Dask cluster (--cluster)"
WALL_TIME = ("seconds", "elapsed")  # report fields holding the wall time: set by the client, not summed


# -- what a job is ---------------------------------------------------------------------------------

class Job:
    """A tool's work, split into shards.  Subclasses are small picklable (frozen) dataclasses:
    the job travels with every task."""

    name = "job"        # progress label and task-key prefix
    unit = "items"      # what ``ShardResult.items`` counts

    def shards(self) -> Iterable[Any]:
        """The first shards (consumed lazily on the client)."""
        raise NotImplementedError

    def run(self, shard: Any, publish: Publish) -> ShardResult:
        """Do one shard (on a worker); must be idempotent.  Per-item failures go in the report.

        Call ``publish`` between objects, on the thread that runs the shard: it is also where
        the shard finds that its lease lapsed (it raises :class:`~manyfiles.scale.lease.LeaseLapsed`;
        stop as on Ctrl-C).  :func:`manyfiles.scale.lease.current` is this attempt (what earlier
        attempts of the shard noted, for counting their work).
        """
        raise NotImplementedError

    def new_report(self) -> Report:
        """The empty report that the shards' reports are merged into."""
        raise NotImplementedError

    def sized_for(self, workers: int) -> Job:
        """This job tuned for an executor running ``workers`` shards at once (default: unchanged)."""
        return self

    def priority(self, shard: Any) -> int:
        """Shards found while running are scheduled lowest first (e.g. deepest directory first)."""
        return 0

    def finish(self, report: ClusterReport) -> None:
        """On the client, once every shard is done (e.g. write a merged failures file)."""


@dataclass
class ShardResult:
    """What one shard sends back: its report, its counters, and the work it found."""

    report: Any = None
    items: int = 0
    bytes: int = 0
    more: list = field(default_factory=list)
    worker: str = ""
    seconds: float = 0.0
    failures_not_listed: int = 0
    error: tuple[str, str] | None = None      # (exception class name, message): the job stops
    attempts: int = 1                         # runs of this shard known to this attempt (> 1: a worker died)
    notes: dict | None = None                 # a stopped attempt's Attempt.chain(), for its re-run

    @property
    def lapsed(self) -> bool:
        """Stopped because its worker lost the job's lease (cut off from the scheduler, or it
        could not confirm the lease): the shard is run again, the job goes on."""
        return self.error is not None and self.error[0] == LeaseLapsed.__name__


@dataclass
class WorkerStats:
    """One worker process: shards run, items and bytes done, seconds spent in shards."""

    shards: int = 0
    items: int = 0
    bytes: int = 0
    busy: float = 0.0

    @property
    def rate(self) -> float:
        """Items per second of shard time."""
        return self.items / self.busy if self.busy > 0 else 0.0


@dataclass(kw_only=True)
class ClusterReport(Report):
    """A job run by an executor: the tool's report merged over every shard (``result``), plus
    how the cluster ran it.  Attributes it does not have come from ``result``, so
    ``report.done`` reads the same as on the tool's own report."""

    job: str = ""
    cluster: str = ""
    result: Report | None = None
    shards: int = 0
    reruns: int = 0                  # shard runs again after their worker was lost or cut off (attempts - 1)
    items: int = 0
    bytes: int = 0
    workers: dict[str, WorkerStats] = field(default_factory=dict)
    failures_not_listed: int = 0     # failures beyond MAX_FAILURES_PER_SHARD in one shard

    def __post_init__(self) -> None:
        if self.result is not None:
            self.failures = self.result.failures   # one list: the tool's

    def __getattr__(self, name: str) -> Any:
        result = self.__dict__.get("result")
        if name.startswith("_") or result is None:
            raise AttributeError(name)
        return getattr(result, name)

    def summary(self) -> str:
        inner = (self.result.summary() if hasattr(self.result, "summary")
                 else f"{self.items:,} items, {self.bytes:,} bytes in {self.seconds:.2f} s")
        text = f"{inner} [{self.shards:,} shards on {len(self.workers)} workers"
        if self.reruns:
            text += f", {self.reruns} re-run after a worker was lost or cut off"
        return text + "]"

    def worker_lines(self) -> list[str]:
        """One line per worker: shards, items, bytes, rate."""
        lines = []
        for name, w in sorted(self.workers.items()):
            line = f"{name}: {w.shards:,} shards, {w.items:,} items in {w.busy:.2f} s ({w.rate:,.0f}/s)"
            if w.bytes:
                line += f", {w.bytes:,} bytes"
            lines.append(line)
        return lines

    def add(self, part: ShardResult) -> None:
        """Merge one shard's result (on the client)."""
        self.shards += 1
        self.items += part.items
        self.bytes += part.bytes
        self.failures_not_listed += part.failures_not_listed
        w = self.workers.setdefault(part.worker, WorkerStats())
        w.shards += 1
        w.items += part.items
        w.bytes += part.bytes
        w.busy += part.seconds
        if self.result is not None and part.report is not None:
            merge_report(self.result, part.report)


    def absorb(self, other: ClusterReport) -> None:
        """Add another run's cluster figures (a job run in rounds); results are merged by the caller."""
        self.shards += other.shards
        self.reruns += other.reruns
        self.items += other.items
        self.bytes += other.bytes
        self.failures_not_listed += other.failures_not_listed
        for name, w in other.workers.items():
            mine = self.workers.setdefault(name, WorkerStats())
            mine.shards += w.shards
            mine.items += w.items
            mine.bytes += w.bytes
            mine.busy += w.busy


def merge_report(into: Any, part: Any) -> None:
    """Add ``part`` (a report dataclass) into ``into``, field by field.

    Numbers add up, lists are concatenated (``notes``-like lists of text skip repeats), dicts
    merge key by key (recursively), nested (mutable) dataclasses merge the same way -- two equal
    tallies add up too --, booleans OR, text and frozen values (a layout) keep the first non-empty
    one.  ``seconds`` is the caller's wall time, not a sum.
    """
    for f in dataclasses.fields(into):
        if f.name in WALL_TIME:
            continue
        setattr(into, f.name, _merged(getattr(into, f.name), getattr(part, f.name)))


def _merged(a: Any, b: Any) -> Any:
    if dataclasses.is_dataclass(a) and type(a) is type(b) and not type(a).__dataclass_params__.frozen:
        merge_report(a, b)              # a tally (objects and bytes of an engine...): even when equal
        return a
    if type(a) is type(b) and not isinstance(a, (int, float, list, dict)) and a == b:
        return a                        # the same layout, root, operation name...
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) or bool(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    if isinstance(a, list) and isinstance(b, list):     # in place: others may hold the list
        if all(isinstance(x, str) for x in a + b):
            a.extend(x for x in b if x not in a)
        else:
            a.extend(b)
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        for k, v in b.items():
            a[k] = _merged(a[k], v) if k in a else v
        return a
    return a if a not in (None, "") else b


@dataclass(frozen=True)
class NoopJob(Job):
    """Shards that do nothing: what one shard costs an executor on your cluster (submit, run,
    result, merge).  ``executor.run(NoopJob(), shards=range(1000)).seconds / 1000``."""

    name = "noop"

    def new_report(self) -> Report:
        return Report()

    def run(self, shard: Any, publish: Publish) -> ShardResult:
        return ShardResult(report=Report(), items=1)


# -- running one shard (on a worker, or in process) -------------------------------------------------

def worker_name() -> str:
    """``host:pid`` of this process: the key of per-worker statistics."""
    return f"{socket.gethostname()}:{os.getpid()}"


def execute_shard(job: Job, shard: Any, publish: Publish, attempt: Attempt = NO_LEASE) -> ShardResult:
    """Run ``job.run(shard)`` as ``attempt`` (:func:`manyfiles.scale.lease.current` in the job),
    timed and labelled, its ``publish`` checking the lease; an exception becomes
    ``ShardResult.error`` (our exceptions do not all survive pickling, their class name and
    message do)."""
    t0 = time.monotonic()
    try:
        with running(attempt):
            result = job.run(shard, guarded(publish, attempt))
    except Exception as exc:
        result = ShardResult(error=(type(exc).__name__, str(exc) or "no message"), notes=attempt.chain())
    failures = getattr(result.report, "failures", None)
    if failures is not None and len(failures) > MAX_FAILURES_PER_SHARD:
        result.failures_not_listed = len(failures) - MAX_FAILURES_PER_SHARD
        del failures[MAX_FAILURES_PER_SHARD:]
    result.worker = worker_name()
    result.seconds = time.monotonic() - t0
    if attempt.registered:          # else the client counts re-runs from their "started" events
        result.attempts = len(attempt.earlier) + 1
    return result


class ClusterLost(ManyfilesError):
    """The client lost its Dask scheduler (it died, or the network between them failed) before
    the job ended: the shards done so far are kept, a rerun of the same command resumes."""


def _our_error(name: str) -> type[ManyfilesError] | None:
    """The manyfiles error class called ``name`` (errors.py's and the tools' own, LeaseLapsed...)."""
    todo: list[type[ManyfilesError]] = [ManyfilesError]
    while todo:
        cls = todo.pop()
        if cls.__name__ == name:
            return cls
        todo += cls.__subclasses__()
    return None


def raise_shard_error(result: ShardResult) -> None:
    """Re-raise a shard's error on the client as the manyfiles error it was (exit codes kept)."""
    if result.error is None:
        return
    name, message = result.error
    cls = _our_error(name)
    text = f"{message} (on worker {result.worker})"
    if cls is not None:
        try:
            raise cls(text)
        except TypeError:      # a class whose constructor wants more than a message
            raise ManyfilesError(text) from None
    raise ManyfilesError(f"unexpected error: {text}")      # a Python class name tells a user nothing


class Throttle:
    """Calls ``send(done, bytes, failures, stall)`` at most every ``interval`` seconds (and the first
    time), and at once when the stall starts or ends (a stall is news; a run that stalls publishes
    little else)."""

    def __init__(self, send: Callable[..., None], interval: float = PUBLISH_INTERVAL) -> None:
        self.send = send
        self.interval = interval
        self.last = float("-inf")
        self.stalled = False
        self.lock = threading.Lock()

    def __call__(self, done: int, nbytes: int = 0, failures: int = 0, stall: Stall | None = None) -> None:
        now = time.monotonic()
        changed = (stall is not None) != self.stalled
        if now - self.last < self.interval and not changed:
            return
        with self.lock:
            if now - self.last < self.interval and (stall is not None) == self.stalled:
                return
            self.last = now
            self.stalled = stall is not None
        self.send(done, nbytes, failures, stall)


# -- the client side: scheduling and live counters ----------------------------------------------------

class ShardQueue:
    """Where the next shard comes from: shards found by running ones first (lowest priority value
    first), then the job's own lazy list.  Each shard gets a sequence number, its id."""

    def __init__(self, job: Job, shards: Iterable[Any] | None = None) -> None:
        self.job = job
        self.source = iter(job.shards() if shards is None else shards)
        self.found: list[tuple[int, int, Any]] = []
        self.ids = itertools.count()
        self.exhausted = False       # the job's own list is used up (only found shards may follow)

    def add(self, shards: Iterable[Any]) -> None:
        for s in shards:
            heapq.heappush(self.found, (self.job.priority(s), next(self.ids), s))

    def next(self) -> tuple[int, Any] | None:
        if self.found:
            _, sid, shard = heapq.heappop(self.found)
            return sid, shard
        shard = next(self.source, _END)
        if shard is _END:
            self.exhausted = True
            return None
        return next(self.ids), shard


_END = object()


class LiveCounts:
    """The cluster total shown by the progress display: finished shards' final counters plus the
    latest counters of running ones (of a shard run again after its worker died: the newest
    attempt's), and the re-runs: attempts seen starting, or registered (``ShardResult.attempts``:
    a worker may die before its "started" event leaves)."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.lock = threading.Lock()
        self.final = [0, 0, 0]
        self.running: dict[int, tuple[str, int, int, int]] = {}
        self.stalls: dict[int, tuple[Stall, float]] = {}   # stalled running shard -> its stall, when heard
        self.finished: set[int] = set()
        self.attempts: dict[int, set[str]] = {}
        self.reruns = 0

    def update(self, sid: int, attempt: str, done: int, nbytes: int, failures: int,
               stall: Stall | tuple | None = None) -> None:
        """A shard's running totals and stall (called from whichever thread receives them: Dask's
        event loop; a stall arrives as a plain tuple or list)."""
        with self.lock:
            if sid in self.finished:
                return
            self.running[sid] = (attempt, done, nbytes, failures)
            self.attempts.setdefault(sid, set()).add(attempt)
            if stall is None:
                self.stalls.pop(sid, None)
            else:
                self.stalls[sid] = (Stall(*stall), time.monotonic())
        self._show()

    def finish(self, sid: int, result: ShardResult) -> None:
        with self.lock:
            self.finished.add(sid)
            self.running.pop(sid, None)
            self.stalls.pop(sid, None)
            self.reruns += max(len(self.attempts.pop(sid, ())), result.attempts) - 1
            self.final[0] += result.items
            self.final[1] += result.bytes
            self.final[2] += len(getattr(result.report, "failures", ()) or ()) + result.failures_not_listed
        self._show()

    def _show(self) -> None:
        # Rendered without the lock: the renderer is the caller's progress callback, which may ask
        # Dask something, and Dask's event loop delivers update() -- it must never wait for us.
        if not self.progress:
            return
        with self.lock:
            done, nbytes, failures = self.final
            for _, d, b, f in self.running.values():
                done, nbytes, failures = done + d, nbytes + b, failures + f
            stall = self.stall()
        self.progress.set(done=done, bytes=nbytes, failures=failures)
        self.progress.set_stall(stall)

    def show_stall(self) -> None:
        """Show the job's stall as of now (its seconds go on between two workers' messages)."""
        if self.progress and self.stalls:
            with self.lock:
                stall = self.stall()
            self.progress.set_stall(stall)

    def stall(self) -> Stall | None:
        """The job's stall: when every running shard has stalled (nothing moves anywhere), the
        shortest of their stalls, aged since it was heard, with the newest error; else None."""
        if not self.running or self.stalls.keys() != self.running.keys():
            return None
        now = time.monotonic()
        aged = [(s.seconds + now - heard, heard, s.error) for s, heard in self.stalls.values()]
        errors = [(heard, e) for _, heard, e in aged if e]
        return Stall(min(a[0] for a in aged), max(errors)[1] if errors else None)


# -- executors -----------------------------------------------------------------------------------------

class Executor:
    """Runs a :class:`Job`'s shards and merges their results into one :class:`ClusterReport`."""

    address = ""

    @property
    def workers(self) -> int:
        """Shards that can run at once (worker threads)."""
        return 1

    def run(self, job: Job, *, shards: Iterable[Any] | None = None,
            progress: ProgressArg = False) -> ClusterReport:
        """Run every shard of ``job`` (``shards``, default ``job.shards()``, and every shard they
        find); the first shard error stops it.  Shards travel alone: the job must not hold them."""
        check_progress(progress)
        job = job.sized_for(self.workers)
        report = ClusterReport(job=job.name, cluster=self.address, result=job.new_report())
        t0 = time.monotonic()
        with progress_for(progress, job.name, unit=job.unit) as p:
            live = LiveCounts(p)
            self._run(job, ShardQueue(job, shards), report, live)
            report.reruns = live.reruns
        report.seconds = time.monotonic() - t0
        if report.result is not None:
            for f in dataclasses.fields(report.result):
                if f.name in WALL_TIME:
                    setattr(report.result, f.name, report.seconds)
        job.finish(report)
        return report

    def _run(self, job: Job, queue: ShardQueue, report: ClusterReport, live: LiveCounts) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Release what this executor started (a LocalCluster, a client connection)."""


class InProcessExecutor(Executor):
    """Every shard in this process, one after another: the reference the Dask executor must match."""

    address = "in-process"

    def _run(self, job: Job, queue: ShardQueue, report: ClusterReport, live: LiveCounts) -> None:
        while (item := queue.next()) is not None:
            sid, shard = item
            result = execute_shard(job, shard, Throttle(
                lambda d, b, f, s, sid=sid: live.update(sid, "here", d, b, f, s), interval=0.0))
            raise_shard_error(result)
            live.finish(sid, result)
            report.add(result)
            queue.add(result.more)
            live.progress.tick()


# -- choosing one ------------------------------------------------------------------------------------

_LOCAL = re.compile(r"local:(\d+)\Z")
_ADDRESS = re.compile(r"(tcp|tls|ucx|inproc|ws|wss)://\S+\Z")


def parse_cluster(text: str) -> tuple[str, Any]:
    """``"local:N"`` -> ``("local", N)``; ``"tcp://HOST:PORT"`` (any Dask scheme) -> ``("address", text)``."""
    m = _LOCAL.match(text)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise UsageError(f"--cluster {text}: local:N needs at least 1 worker")
        return "local", n
    if _ADDRESS.match(text):
        return "address", text
    raise UsageError(f"--cluster {text}: expected tcp://HOST:PORT (a Dask scheduler) or local:N "
                     f"(N worker processes on this machine)")


__all__ = [
    "ClusterLost",
    "ClusterReport",
    "Executor",
    "InProcessExecutor",
    "Job",
    "NoopJob",
    "ShardResult",
    "WorkerStats",
    "execute_shard",
    "merge_report",
    "parse_cluster",
]
