"""Whole-object fills: one GET of an object, checked, installed as its whole file.

:func:`complete` is the one way an object becomes *verified whole* outside a reader's own
stream: ``cache warm``, the background completion of objects that got unverified blocks,
a strict reader's first read of a large object, and ``cache verify --complete``.  It reads
the object whole (pinned to the version), writes it into a temp file, and renames that into
place only after every byte passed the object's check (retried: bytes flipped on the way are
worth another GET).  The version's block files are then compared with the checked bytes (a
block that differs was wrong data the cache held: counted, and reported by ``cache verify``)
and removed, the whole file replacing them.  If the object cannot be checked (the check keeps
failing, or the version is gone), every block of it is dropped: nothing unverified is kept.

:class:`Completions` runs them in the background, one per object and process at a time.
``Cache.flush()`` waits for them; ``Cache.close()`` stops those still running and drops the
unverified blocks of their objects (a process that ends leaves no unverified block behind,
unless it is killed: then the next reader or ``cache verify`` finds them marked unverified).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

from manyfiles._core.retry import RetryPolicy, retrying
from manyfiles.cache._index import Version
from manyfiles.cache._origin import Head, WholeRead
from manyfiles.cache._store import BlockStore
from manyfiles.errors import ManyfilesError, ObjectChanged

COMPLETERS = 2          # background completions at once per process (each one GET of a whole object)


class Cancelled(ManyfilesError):
    """The cache was closed while an object was being completed."""


class Completed(NamedTuple):
    """A whole-object fill that passed: its check, and the cached blocks it found wrong."""

    method: str
    size: int
    wrong_blocks: int


def complete(store: BlockStore, origin: Any, version: Version, policy: RetryPolicy, *,
             stream: WholeRead | None = None, cancel: threading.Event | None = None,
             opened: Callable[[WholeRead | None], None] | None = None) -> Completed:
    """Fetch ``version`` of ``origin`` whole, check it, install its whole file (see the module docs).

    ``stream``: a whole read already open (its first attempt).  ``opened(stream)`` is told of each
    read opened (and of None when it ends), so that a canceller can close it.  Raises what the last
    attempt raised (IntegrityError, ObjectChanged, TransferError...); the caller drops the blocks."""
    head = Head(version.validator, version.size)
    first = [stream]

    def attempt() -> Completed:
        s = first.pop() if first and first[0] is not None else origin.open_whole(head)
        first.clear()
        if opened is not None:
            opened(s)
        try:
            return _fill(store, s, version, cancel)
        finally:
            if opened is not None:
                opened(None)
            s.close()

    return retrying(attempt, policy, classify=lambda exc: exc)


def _fill(store: BlockStore, stream: WholeRead, version: Version,
          cancel: threading.Event | None) -> Completed:
    bs = store.block_size
    writer = store.fills.writer(version)
    wrong = 0
    buf = memoryview(bytearray(min(bs, version.size)))    # one buffer, received into block after block
    try:
        for i in range(-(-version.size // bs)):
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"{version.source.decode(errors='replace')}: the cache was closed")
            data = buf[:store.block_length(version.size, i)]
            if stream.readinto(data) != len(data):     # the last block only once every byte passed
                raise ObjectChanged(f"{version.source.decode(errors='replace')}: shorter than its version")
            writer.write(i * bs, data)
            cached = store.read_block(version.objid, i, len(data))
            if cached is not None and cached[0] != data:
                wrong += 1
        if version.size == 0:
            stream.read(bs)
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"{version.source.decode(errors='replace')}: the cache was closed")
        writer.seal(stream.method, stream.claim)
    except BaseException:
        writer.abort()
        raise
    if wrong:
        store.counters.count(corrupt=wrong)
    return Completed(stream.method or "", version.size, wrong)


class Completions:
    """Objects to complete in the background (see the module docs); one per object at a time."""

    def __init__(self, store: BlockStore, policy: Callable[[], RetryPolicy]) -> None:
        self._store = store
        self._policy = policy
        self._lock = threading.Lock()
        self._running: dict[bytes, tuple[Future, Any, Version]] = {}
        self._streams: dict[bytes, WholeRead] = {}     # the GET each running completion reads
        self._cancel = threading.Event()
        self._pool: ThreadPoolExecutor | None = None

    def after_fork(self) -> None:
        self._lock = threading.Lock()
        self._running = {}
        self._streams = {}
        self._cancel = threading.Event()
        self._pool = None

    def schedule(self, origin: Any, version: Version) -> None:
        """Complete ``version`` of ``origin`` in the background unless that is under way already."""
        with self._lock:
            if version.objid in self._running or self._cancel.is_set():
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(COMPLETERS, thread_name_prefix="manyfiles-cache-complete")
            fut = self._pool.submit(self._run, origin, version)
            self._running[version.objid] = (fut, origin, version)

    def _run(self, origin: Any, version: Version) -> None:
        store = self._store
        try:
            if not store.held_whole(version.objid, version.size):
                done = complete(store, origin, version, self._policy(), cancel=self._cancel,
                                opened=lambda s: self._opened(version.objid, s))
                if done.wrong_blocks:
                    warnings.warn(f"{origin.display}: {done.wrong_blocks} cached blocks did not match the "
                                  "object checked whole; replaced", RuntimeWarning, stacklevel=1)
        except Cancelled:
            store.fills.reject(version)
        except Exception as exc:     # the object cannot be checked: keep nothing unverified of it
            store.fills.reject(version)
            if not isinstance(exc, ObjectChanged):
                warnings.warn(f"{origin.display}: could not be checked whole ({exc}); its cached blocks "
                              "were dropped", RuntimeWarning, stacklevel=1)
        finally:
            with self._lock:
                self._running.pop(version.objid, None)

    def _opened(self, objid: bytes, stream: WholeRead | None) -> None:
        with self._lock:
            if stream is None:
                self._streams.pop(objid, None)
            else:
                self._streams[objid] = stream
                if self._cancel.is_set():
                    stream.close()

    def wait(self) -> None:
        """Until every completion scheduled so far has ended."""
        while True:
            with self._lock:
                futures = [f for f, _, _ in self._running.values()]
            if not futures:
                return
            for f in futures:
                f.exception()

    def cancel(self) -> None:
        """Stop: completions still running give up (their GETs are closed under them: a stalled
        server does not hold ``close()`` up), and their objects' unverified blocks are dropped."""
        self._cancel.set()
        with self._lock:
            pool = self._pool
            streams = list(self._streams.values())
        for s in streams:
            s.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            left, self._running = list(self._running.values()), {}
        for _, _, version in left:            # never started: drop what it would have checked
            self._store.fills.reject(version)
