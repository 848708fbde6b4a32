"""One progress convention for every long call.

Every long call of the library takes ``progress: bool | Callable[[Snapshot], None] = False``:

* ``False`` / ``None`` -- nothing is shown and nothing is computed for it;
* ``True`` -- a live display: a rich bar on a terminal, an HTML bar in Jupyter that keeps
  its final state in the saved notebook, or a plain line every few seconds on stderr when
  neither is available;
* a callable -- receives a :class:`Snapshot` at most every ``interval`` seconds and once
  more at the end (never from two threads at once; not after an error: a run that stopped
  does not look finished).

While nothing moves, a run's :class:`StallWatch` puts a :class:`Stall` in the snapshots
(``stalled 35s: last error: ...``), shown by every display, and ends the run
(:class:`~manyfiles.errors.Stalled`) once it lasts too long; :func:`wait_ticking` and
:func:`iter_ticking` keep the ticks coming while the calling thread waits on a request.

A tool creates a :class:`Progress` with :func:`progress_for`, updates its counters from
any thread with :meth:`Progress.add`, and calls :meth:`Progress.tick` from the thread
that waits on its workers (or lets ``add`` from that thread render).  That one object goes
down to whatever does the work: a native walker is handed :meth:`Progress.part_done` as its
hook (a callable taking the running count), a nested run :meth:`Progress.part_progress` as its
``progress=``; :meth:`Progress.start_part` makes a run over several paths one growing count.

Example:
    >>> seen = []
    >>> with progress_for(seen.append, "copy", unit="files", total=2) as p:
    ...     p.add(1)
    ...     p.add(1)
    >>> seen[-1].done, seen[-1].total, seen[-1].finished
    (2, 2, True)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, TypeVar, Union

from manyfiles.errors import UsageError

T = TypeVar("T")
ProgressArg = Union[bool, Callable[["Snapshot"], None], None]  # noqa: UP007 -- a runtime alias on 3.10

INTERVAL = 0.1          # seconds between two renderings
LOG_INTERVAL = 5.0      # seconds between two plain lines when there is no terminal


class Stall(NamedTuple):
    """Nothing moved for ``seconds``; ``error``: the last error meanwhile (one line), or None.

    A plain value (a tuple of a float and a string): what a run's :class:`StallWatch` says, what a
    :class:`Snapshot` carries to the display, what a worker can send to the client that shows it.
    """

    seconds: float
    error: str | None = None

    def __str__(self) -> str:
        return f"stalled {self.seconds:.0f}s: last error: {self.error or 'none yet'}"


@dataclass(frozen=True)
class Snapshot:
    """The state of a long operation at one moment.

    ``total`` is None while unknown (it may also grow, e.g. while a walk discovers entries).
    ``stall``: set while nothing moves (see :class:`StallWatch`).
    """

    task: str
    done: int = 0
    total: int | None = None
    bytes: int = 0
    bytes_total: int | None = None
    failures: int = 0
    seconds: float = 0.0
    unit: str = "items"
    finished: bool = False
    stall: Stall | None = None

    @property
    def rate(self) -> float:
        """Items per second so far."""
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def byte_rate(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left at the current rate, when the total is known."""
        if self.total is None or self.done <= 0 or self.done >= self.total:
            return None
        return (self.total - self.done) / self.rate

    def __str__(self) -> str:
        text = f"{self.task}: {self.done:,}"
        if self.total is not None:
            text += f"/{self.total:,}"
        text += f" {self.unit}"
        if self.bytes:
            text += f", {_size(self.bytes)}"
        if self.seconds > 0:
            text += f" ({self.rate:,.0f} {self.unit}/s"
            text += f", {_size(self.byte_rate)}/s)" if self.bytes else ")"
        if self.failures:
            text += f", {self.failures:,} failed"
        if self.stall is not None:
            text += f", {self.stall}"
        return text


def check_progress(progress: object) -> None:
    """Raise UsageError unless ``progress`` is a bool, None or a callable (call before any work)."""
    if progress is None or isinstance(progress, bool) or callable(progress):
        return
    raise UsageError(f"progress must be True, False or a callable taking a Snapshot, not {progress!r}")


class Progress:
    """Counters of one operation, safe to update from many threads, rendered at a bounded rate."""

    def __init__(self, task: str, render: Callable[[Snapshot], None] | None, *, unit: str = "items",
                 total: int | None = None, bytes_total: int | None = None,
                 interval: float = INTERVAL) -> None:
        self._render = render
        self._base = Snapshot(task, total=total, bytes_total=bytes_total, unit=unit)
        self._done = self._bytes = self._failures = 0
        self._stall: Stall | None = None
        self._part_done = self._part_failures = 0   # the counts before the current part
        self._total, self._bytes_total = total, bytes_total
        self._t0 = time.monotonic()
        self._last = float("-inf")
        self._interval = interval
        self._lock = threading.Lock()
        self._render_lock = threading.Lock()
        self._owner = threading.get_ident()

    def __bool__(self) -> bool:
        """True if someone listens: tools may skip extra work (counting a total) otherwise."""
        return self._render is not None

    def add(self, done: int = 0, *, bytes: int = 0, failures: int = 0) -> None:
        """Add to the counters (any thread); renders when called from the owning thread."""
        if self._render is None:
            return
        with self._lock:
            self._done += done
            self._bytes += bytes
            self._failures += failures
        if threading.get_ident() == self._owner:
            self.tick()

    def set(self, *, done: int | None = None, total: int | None = None, bytes: int | None = None,
            bytes_total: int | None = None, failures: int | None = None) -> None:
        """Set counters to absolute values (e.g. a total once the listing is complete)."""
        if self._render is None:
            return
        with self._lock:
            self._done = self._done if done is None else done
            self._total = self._total if total is None else total
            self._bytes = self._bytes if bytes is None else bytes
            self._bytes_total = self._bytes_total if bytes_total is None else bytes_total
            self._failures = self._failures if failures is None else failures
        if threading.get_ident() == self._owner:
            self.tick()

    def set_stall(self, stall: Stall | None, *, force: bool = False) -> None:
        """Show ``stall`` (None: moving again) from the next rendering on (``force``: render it now,
        from the owning thread, however recent the last rendering)."""
        if self._render is None:
            return
        self._stall = stall
        if threading.get_ident() == self._owner:
            self.tick(force)

    def start_part(self, *, done: int | None = None, failures: int | None = None) -> None:
        """Start the next part of the operation (one path of several): :meth:`part_done` and
        :meth:`part_progress` then count on top of what is done now (``done``, ``failures``:
        set first, e.g. the exact totals of the parts before)."""
        if self._render is None:
            return
        with self._lock:
            self._done = self._done if done is None else done
            self._failures = self._failures if failures is None else failures
            self._part_done, self._part_failures = self._done, self._failures

    def part_done(self, n: int) -> None:
        """``n`` items done so far in the current part: the hook a native walker is given (it
        calls it with its running count, from the calling thread)."""
        self.set(done=self._part_done + n)

    def part_progress(self, snap: Snapshot) -> None:
        """The current part's own :class:`Snapshot` (the ``progress=`` callable of a nested run,
        e.g. a cluster job): its ``done`` and ``failures`` count on top of the earlier parts."""
        self.set(done=self._part_done + snap.done, failures=self._part_failures + snap.failures)

    def snapshot(self, finished: bool = False) -> Snapshot:
        with self._lock:
            return replace(self._base, done=self._done, total=self._total, bytes=self._bytes,
                           bytes_total=self._bytes_total, failures=self._failures,
                           seconds=time.monotonic() - self._t0, finished=finished,
                           stall=None if finished else self._stall)

    def tick(self, force: bool = False) -> None:
        """Render if ``interval`` has passed since the last rendering (or ``force``)."""
        if self._render is None:
            return
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        if not self._render_lock.acquire(blocking=force):
            return
        try:
            self._last = now
            self._render(self.snapshot())
        finally:
            self._render_lock.release()

    def finish(self) -> None:
        """The last rendering (``finished=True``); called by :func:`progress_for` on exit."""
        if self._render is None:
            return
        with self._render_lock:
            self._render(self.snapshot(finished=True))


class StallWatch:
    """Whether a run still moves, and when it has stalled for good.

    The run sets :attr:`moving` on every sign of progress (a byte, an item: one attribute store,
    cheap enough for every event) and calls :meth:`failed` with every error that moved nothing;
    :meth:`check`, called about once a second, turns that into a :class:`Stall` once nothing moved
    for ``show_after`` seconds (None before); :meth:`expired` says the run should stop: nothing
    moved for ``limit`` seconds, or for ``first_limit`` while nothing ever has (an endpoint that
    never answered is given up on sooner than one that went away).
    """

    def __init__(self, limit: float, *, first_limit: float | None = None, show_after: float = LOG_INTERVAL,
                 answered: bool = False) -> None:
        self.limit = limit
        self.first_limit = limit if first_limit is None else first_limit
        self.show_after = show_after
        self.answered = answered
        self.moving = False
        self.error: str | None = None
        self.since = time.monotonic()   # when it last moved (or began)

    @classmethod
    def for_policy(cls, policy: Any, *, answered: bool = False) -> StallWatch:
        """The watch of a run under ``policy`` (a :class:`~manyfiles._core.retry.RetryPolicy`): its
        ``stall_timeout``, and until something moved its ``first_contact`` and ``GRACE`` more, so
        that a first request that gets nothing ends the run with its own error (which says what it
        waited for) rather than this watch's.  ``answered``: the endpoint answered before this run
        (in this process): it is one that may have gone away, not one never seen."""
        return cls(policy.stall_timeout, first_limit=policy.first_contact + policy.GRACE,
                   show_after=min(LOG_INTERVAL, policy.stall_timeout / 8), answered=answered)

    def failed(self, error: str) -> None:
        """An error that moved nothing (any thread)."""
        self.error = error

    @property
    def ever_moved(self) -> bool:
        """Whether anything moved in this run yet (the endpoint answered)."""
        return self.answered or self.moving

    def tick(self, progress: Progress | None, where: str | None, now: float | None = None) -> Stall | None:
        """:meth:`check`, shown on ``progress``; raises :class:`~manyfiles.errors.Stalled` (naming
        ``where``, the endpoint) once :meth:`expired` (never while ``where`` is None)."""
        now = time.monotonic() if now is None else now
        stall = self.check(now)
        if progress:
            progress.set_stall(stall)
        if stall is not None and where is not None and self.expired(now):
            from manyfiles.errors import Stalled

            raise Stalled(self.message(where))
        return stall

    def show(self, progress: Progress | None) -> None:
        """Draw the stall as of now on ``progress`` at once, never raising: the last frame of a run
        that ends on an error says what the watch knows then (an error that came after its last
        :meth:`tick` included)."""
        if progress:
            progress.set_stall(self.check(), force=True)

    def check(self, now: float | None = None) -> Stall | None:
        """The stall as of ``now``, None while the run moves."""
        now = time.monotonic() if now is None else now
        if self.moving:
            self.moving = False
            self.answered = True
            self.since = now
        idle = now - self.since
        return Stall(idle, self.error) if idle >= self.show_after else None

    def expired(self, now: float | None = None) -> bool:
        """Nothing moved for the limit (call after :meth:`check`)."""
        now = time.monotonic() if now is None else now
        return now - self.since >= (self.limit if self.answered else self.first_limit)

    def message(self, where: str) -> str:
        """The line a run that stalled for good ends with: ``where`` (the endpoint) and the cause."""
        limit = self.limit if self.answered else self.first_limit
        text = f"{where}: {'stalled, nothing moved' if self.answered else 'no answer'} for {limit:g} s"
        error = self.error
        if error is None:
            return text
        if error.startswith(where + ": "):
            error = error[len(where) + 2:]
        return f"{text} (last error: {error})"


def wait_ticking(fn: Callable[[], T], tick: Callable[[], object], interval: float = 1.0) -> T:
    """``fn()``, run in another thread while this one calls ``tick()`` every ``interval`` seconds
    (a wait that shows progress, a stall, and where Ctrl-C or a stall's error land); ``fn``'s
    result, or its exception.  A ``tick`` that raises leaves ``fn`` to end on its own."""
    done = threading.Event()
    out: list = []

    def call() -> None:
        try:
            out.append((True, fn()))
        except BaseException as exc:
            out.append((False, exc))
        finally:
            done.set()

    waiter = threading.Thread(target=call, name="manyfiles-wait", daemon=True)
    waiter.start()
    while not done.wait(interval):
        tick()
    _ended(waiter)
    ok, value = out[0]
    if not ok:
        raise value
    return value


ENDED_WAIT = 1.0    # seconds at most that wait_ticking waits for its thread's C-level end


def _ended(thread: threading.Thread) -> None:
    """Until ``thread`` (whose function returned) has left the kernel: its C-level thread-local
    destructors have run then.  The caller may fork next (the processes engine does), and a thread
    ending meanwhile may hold a library's global lock -- OpenSSL's thread registry, which a thread
    that used TLS takes as it ends -- that the child would inherit taken for ever: its first TLS
    call hangs.  ``join`` is not enough: it returns before that end.  (Linux; elsewhere: ``join``.)"""
    thread.join()
    task = f"/proc/self/task/{thread.native_id}"
    deadline = time.monotonic() + ENDED_WAIT
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0002)


def iter_ticking(items: Iterable[T], tick: Callable[[], object], interval: float = 1.0) -> Iterator[T]:
    """``items``, produced by another thread (a listing) while this one calls ``tick()`` every
    ``interval`` seconds when it waits for the next; the producer's exception is raised here."""
    import queue

    q: queue.Queue = queue.Queue(maxsize=64)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put((True, item), timeout=interval)
                        break
                    except queue.Full:
                        pass
                if stop.is_set():
                    return
            q.put((True, _END))
        except BaseException as exc:
            q.put((False, exc))

    threading.Thread(target=produce, name="manyfiles-feed", daemon=True).start()
    try:
        while True:
            try:
                ok, item = q.get(timeout=interval)
            except queue.Empty:
                tick()
                continue
            if not ok:
                raise item
            if item is _END:
                return
            yield item
    finally:
        stop.set()


_END = object()


@contextlib.contextmanager
def progress_for(progress: ProgressArg, task: str, *, unit: str = "items", total: int | None = None,
                 bytes_total: int | None = None, interval: float = INTERVAL) -> Iterator[Progress]:
    """Turn a ``progress=`` argument into a :class:`Progress` for the duration of an operation."""
    check_progress(progress)
    display: _Display | None = None
    if progress is True:
        display = _display_for(task, unit)
        render: Callable[[Snapshot], None] | None = display.update
    else:
        render = progress or None   # type: ignore[assignment]
    p = Progress(task, render, unit=unit, total=total, bytes_total=bytes_total, interval=interval)
    try:
        yield p
    except GeneratorExit:       # the caller stopped reading a generator: that is an end too
        p.finish()
        raise
    else:
        p.finish()      # not after an error: a run that stopped must not look finished ([done])
    finally:
        if display is not None:
            display.close()


# -- displays for progress=True ------------------------------------------------------------------

class _Display:
    def update(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _display_for(task: str, unit: str) -> _Display:
    if _in_notebook():
        return _NotebookDisplay()
    if sys.stderr is not None and sys.stderr.isatty():
        return _TerminalDisplay(task, unit)
    return _LogDisplay()


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class _TerminalDisplay(_Display):
    """A rich bar on stderr; it stays on screen with its final numbers."""

    def __init__(self, task: str, unit: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichBar  # (our Progress is the counters this draws)

        self.bar = RichBar(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[text]}"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))
        self.bar.start()
        self.task = self.bar.add_task(task, total=None, text="")

    def update(self, snap: Snapshot) -> None:
        completed, total = _bar(snap)
        self.bar.update(self.task, completed=completed, total=total, text=_counts(snap))

    def close(self) -> None:
        self.bar.stop()


class _NotebookDisplay(_Display):
    """An HTML bar updated in place (``display_id``): the saved notebook keeps the final state."""

    def __init__(self) -> None:
        from IPython.display import HTML, display

        self._html = HTML
        self.handle = display(HTML(""), display_id=True)

    def update(self, snap: Snapshot) -> None:
        import html

        completed, total = _bar(snap)
        value = f"value='{completed}' max='{total}'" if total else ""
        state = "done" if snap.finished else f"{snap.seconds:.1f} s"
        text = html.escape(f"{_counts(snap)} [{state}]")
        self.handle.update(self._html(
            f"<div><code>{html.escape(snap.task)}</code> <progress {value} style='width:40%'></progress> "
            f"{text}</div>"))


class _LogDisplay(_Display):
    """No terminal, no notebook (a log file, CI): one plain line every few seconds, and the last."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def update(self, snap: Snapshot) -> None:
        now = time.monotonic()
        if snap.finished or now - self._last >= LOG_INTERVAL:
            self._last = now
            print(str(snap) + (" [done]" if snap.finished else ""), file=sys.stderr, flush=True)


def _bar(snap: Snapshot) -> tuple[int, int | None]:
    """What the bar (and its ETA) follows: bytes when their total is known (a few huge objects
    would leave an item bar still until the end), else items."""
    if snap.bytes_total:
        return snap.bytes, snap.bytes_total
    return snap.done, snap.total


def _counts(snap: Snapshot) -> str:
    text = f"{snap.done:,}" + (f"/{snap.total:,}" if snap.total is not None else "") + f" {snap.unit}"
    if snap.seconds > 0:
        text += f" {snap.rate:,.0f}/s"
    if snap.bytes:
        text += f" {_size(snap.bytes)}"
        if snap.seconds > 0:
            text += f" {_size(snap.byte_rate)}/s"
    if snap.failures:
        text += f" {snap.failures:,} failed"
    if snap.stall is not None:
        text += f" {snap.stall}"
    return text


def _size(n: float) -> str:
    from manyfiles._core.units import format_size

    return format_size(n)


__all__ = ["Progress", "ProgressArg", "Snapshot", "Stall", "StallWatch", "check_progress", "iter_ticking",
           "progress_for", "wait_ticking"]
