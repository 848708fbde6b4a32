"""This process's counters and accesses: batched in memory, written to the index in one transaction.

Readers count every hit and miss and note every access (for the LRU order) here, under one short
lock and with no SQLite: the accounting thread (_fills.py) writes the batch about once a second,
and within ``QUIET`` of the last count once reads pause, so another process's ``cache stats``
sees them soon, and :meth:`Cache.flush` / ``close`` write what is left.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

from manyfiles.cache._index import Index


class Counters:
    """The counters (``hits``, ``misses``, ``fills``...) and accesses not yet in the index.

    ``degrade(exc)``: told when the index cannot be written; ``wake()``: starts the accounting
    thread that writes the batches (a process that only hits fills nothing, yet its counters must
    reach the index within a second of its reads, not only at exit).
    """

    def __init__(self, index: Index, *, degrade: Callable[[BaseException], None],
                 wake: Callable[[], None]) -> None:
        self._index = index
        self._degrade = degrade
        self._wake = wake
        self.after_fork()

    def after_fork(self) -> None:
        """What belongs to one process (called again in a forked child, whose parent's threads
        do not exist): the lock and the batch."""
        self._lock = threading.Lock()
        self._accesses: dict[bytes, tuple[float, float]] = {}
        self._pack_accesses: dict[int, float] = {}
        self._counts: dict[str, int] = {}
        #: everything this process counted since it started (or forked): never reset, never shared
        self.totals: dict[str, int] = {}
        self.last_flush = self.last_count = time.monotonic()

    def count(self, **counts: int) -> None:
        with self._lock:
            c, t = self._counts, self.totals
            for k, n in counts.items():
                c[k] = c.get(k, 0) + n
                t[k] = t.get(k, 0) + n
            self.last_count = time.monotonic()
        self._wake()

    def note_access(self, objid: bytes, validated_at: float) -> None:
        t = time.time()
        with self._lock:
            old = self._accesses.get(objid)
            self._accesses[objid] = (t, validated_at if old is None else max(old[1], validated_at))

    def note_pack_access(self, pack: int, t: float) -> None:
        """A record of ``pack`` was read by a reader that knew where it was (the LRU order of packs)."""
        with self._lock:
            self._pack_accesses[pack] = t

    def pending(self) -> bool:
        return bool(self._counts or self._accesses or self._pack_accesses)

    def flush(self) -> None:
        """Write batched accesses and counters to the index (the accounting thread does it every second)."""
        with self._lock:
            accesses, self._accesses = self._accesses, {}
            packs, self._pack_accesses = self._pack_accesses, {}
            counts, self._counts = self._counts, {}
            self.last_flush = time.monotonic()
        if not accesses and not packs and not any(counts.values()):
            return
        try:
            self._index.touch(accesses, counts, packs)
        except sqlite3.Error as exc:
            self._degrade(exc)
