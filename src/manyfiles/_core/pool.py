"""The worker pool of every tool: bounded, cancellable, first error wins, progress ticks.

Like s5cmd's ``parallel`` package, it knows nothing about files or S3: :meth:`Pool.run`
calls ``fn(item)`` for every item on ``workers`` threads.  Items come from an iterable
(consumed lazily, at most ``max_pending`` waiting, so a 10^8-key listing never sits in
memory) and from the tasks themselves (:meth:`Pool.submit`, for tree walks).

* The first exception raised by ``fn`` cancels the pool and is re-raised by ``run``;
  tools that want per-item failures catch them inside ``fn`` and record them.
* Ctrl-C (or any exception) in the waiting thread cancels the pool, waits for the
  running items to finish, and leaves the items never started in ``Pool.leftover``
  (so the caller can release what they hold, e.g. directory fds).
* ``tick`` is called from the waiting thread every ``interval`` seconds: that is where
  progress is rendered and where KeyboardInterrupt lands.
* With ``workers == 1`` items run inline in the calling thread: no hand-off cost.

Example:
    >>> out = []
    >>> Pool(out.append, workers=4).run(range(5))
    >>> sorted(out)
    [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class Pool(Generic[T]):
    """Run ``fn(item)`` over items on ``workers`` threads; see the module docstring."""

    def __init__(self, fn: Callable[[T], object], workers: int, *, name: str = "manyfiles",
                 lifo: bool = False, max_pending: int | None = None) -> None:
        self.fn = fn
        self.workers = max(1, int(workers))
        self.name = name
        self.lifo = lifo              # depth-first for tree walks: fewer directories open at once
        self.max_pending = max_pending if max_pending is not None else 64 * self.workers
        self.leftover: list[T] = []
        self._items: collections.deque[T] = collections.deque()
        # one lock, three conditions, so that a wake-up goes to whoever can use it: idle
        # workers (new items), the feeder (room in the queue), the waiting thread (all done)
        lock = threading.Lock()
        self._cv = threading.Condition(lock)
        self._room = threading.Condition(lock)
        self._idle = threading.Condition(lock)
        self._busy = 0
        self._feeding = True
        self._cancelled = False
        self._error: BaseException | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """Stop handing out items; running ones finish."""
        with self._cv:
            self._cancelled = True
            self._wake_all()

    def submit(self, *items: T) -> None:
        """Add items (from a task, or from the feeding thread)."""
        with self._cv:
            self._items.extend(items)
            self._cv.notify(len(items))

    def run(self, items: Iterable[T] = (), *, tick: Callable[[], None] | None = None,
            interval: float = 0.2) -> None:
        """Process ``items`` and everything submitted meanwhile; return when no work is left."""
        if self.workers == 1:
            self._run_inline(items, tick)
            return
        threads = [threading.Thread(target=self._worker, name=f"{self.name}-{i}", daemon=True)
                   for i in range(self.workers)]
        for t in threads:
            t.start()
        try:
            self._feed(items, tick, interval)
            with self._cv:
                self._feeding = False
                self._wake_all()
            self._wait(tick, interval)
        except BaseException:
            self.cancel()
            raise
        finally:
            for t in threads:
                t.join()
            self.leftover = list(self._items)
            self._items.clear()
        if self._error is not None:
            raise self._error

    # -- internals ------------------------------------------------------------------------------

    def _run_inline(self, items: Iterable[T], tick: Callable[[], None] | None) -> None:
        source = iter(items)
        try:
            while not self._cancelled:
                if self._items:      # submitted by a task: finish those first (depth-first)
                    item = self._items.pop() if self.lifo else self._items.popleft()
                else:
                    item = next(source, _END)
                    if item is _END:
                        break
                self.fn(item)   # type: ignore[arg-type]
                if tick is not None:
                    tick()
        except BaseException:
            self._cancelled = True
            raise
        finally:
            self.leftover = list(self._items)
            self._items.clear()

    def _feed(self, items: Iterable[T], tick: Callable[[], None] | None, interval: float) -> None:
        for item in items:
            with self._cv:
                while len(self._items) >= self.max_pending and not self._cancelled:
                    self._room.wait(interval)
                    if tick is not None:
                        self._cv.release()
                        try:
                            tick()
                        finally:
                            self._cv.acquire()
                if self._cancelled:
                    return
                self._items.append(item)
                self._cv.notify()

    def _wait(self, tick: Callable[[], None] | None, interval: float) -> None:
        while True:
            with self._cv:
                if self._cancelled or (not self._items and not self._busy):
                    return
                self._idle.wait(interval)
            if tick is not None:
                tick()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._items and not self._cancelled and (self._feeding or self._busy):
                    self._cv.wait()
                if self._cancelled or not self._items:
                    self._wake_all()
                    return
                item = self._items.pop() if self.lifo else self._items.popleft()
                self._busy += 1
                if self._feeding:
                    self._room.notify()
            try:
                self.fn(item)
            except BaseException as exc:
                with self._cv:
                    if self._error is None:
                        self._error = exc
                    self._cancelled = True
            finally:
                with self._cv:
                    self._busy -= 1
                    if self._cancelled or (not self._items and not self._busy):
                        self._wake_all()  # the end: idle workers exit, the waiting thread returns

    def _wake_all(self) -> None:
        self._cv.notify_all()
        self._room.notify_all()
        self._idle.notify_all()


_END = object()

__all__ = ["Pool"]
