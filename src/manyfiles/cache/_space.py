"""The cache's space: its watermarks (``max_size``, ``min_free``) and eviction, least recently used first.

The accounting thread (_fills.py) calls :meth:`Space.to_watermarks` after each batch of fills it
recorded; ``Cache.evict`` and ``Cache.clear`` call :meth:`Space.evict` and :meth:`Space.clear`.
The index chooses the victims and forgets them in the same transaction (``pop_lru``), which also
unlinks their files before it commits (``Index.on_removed``): a fill of the same version that
another process accounts after it finds its file gone, instead of naming a file the eviction then
removes.  A reader holding a file open reads on (an unlinked file's data lives until its last
descriptor is closed).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Victim
from manyfiles.cache._packs import MIN_PACK_BYTES, PACK_BYTES
from manyfiles.errors import UsageError, from_oserror

if TYPE_CHECKING:
    from manyfiles.cache._blockfiles import BlockFiles


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_low_water(low_water: float) -> float:
    if not 0.0 < low_water <= 1.0:
        raise UsageError(f"low_water {low_water}: must be in (0, 1]")
    return low_water


def _fs_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


class Space:
    """The watermarks of one store and the eviction that keeps it under them.

    Past ``max_size``, least recently used entries are evicted down to ``low_water * max_size``;
    below ``min_free`` bytes free (a float below 1: that fraction of the filesystem), until
    ``min_free / low_water`` is free.
    """

    def __init__(self, store: BlockFiles, *, max_size: int | None, min_free: float | int | None,
                 low_water: float) -> None:
        self.store = store
        self.low_water = check_low_water(low_water)
        self.max_size = max_size
        if min_free is not None and 0 <= min_free < 1 and isinstance(min_free, float):
            min_free = int(min_free * _fs_bytes(store.root))
        self.min_free = int(min_free or 0)
        self.after_fork()

    def after_fork(self) -> None:
        self._evicting = threading.Lock()

    def pack_bytes(self) -> int:
        """How large this process lets a pack grow: 1/32 of the space the cache may take (``max_size``,
        or the filesystem less ``min_free``), between 64 KiB and ``PACK_BYTES``.  Packs are the unit
        of eviction: a small cache gets small packs, so that evicting one frees a small part."""
        budget = self.max_size
        with contextlib.suppress(OSError):
            room = _fs_bytes(self.store.root) - self.min_free
            budget = room if budget is None else min(budget, room)
        if budget is None:
            return PACK_BYTES
        return max(MIN_PACK_BYTES, min(PACK_BYTES, budget // 32))

    def used_bytes(self) -> int:
        return self.store.index.counters().get("bytes", 0)

    def need(self) -> int:
        """Bytes to evict now: above ``max_size`` down to ``low_water`` of it, or to get ``min_free``."""
        need = 0
        if self.max_size is not None:
            used = self.used_bytes()
            if used > self.max_size:
                need = used - int(self.max_size * self.low_water)
        if self.min_free:
            free = free_bytes(self.store.root)
            if free < self.min_free:
                need = max(need, int(self.min_free / self.low_water) - free)
        return need

    def to_watermarks(self) -> list[Victim]:
        """Evict LRU entries when above ``max_size`` (down to ``low_water`` of it) or below ``min_free``."""
        if not self._evicting.acquire(blocking=False):
            return []               # another thread is at it
        try:
            return self._to_watermarks()
        finally:
            self._evicting.release()

    def _to_watermarks(self) -> list[Victim]:
        store = self.store
        try:
            need = self.need()
            if need <= 0:
                return []
            store.counters.flush()   # our own recent accesses count for the LRU order
            victims = store.index.pop_lru(need)
        except (OSError, sqlite3.Error) as exc:
            store.degrade(exc)
            return []
        if self.min_free and not victims and free_bytes(store.root) < self.min_free:
            store.degrade(OSError(errno.ENOSPC, f"less than {self.min_free} bytes free and nothing to evict"))
        return victims

    def remove_sources(self, sources: Iterable[bytes]) -> list[Victim]:
        """Every entry of ``sources``, out of the index and off the disk."""
        return self.store.index.remove_sources(sources)      # (its files unlinked in its transaction)

    def evict(self, sources: list[bytes] | None = None, *, to_size: int | None = None,
              older_than: float | None = None, dry_run: bool = False) -> list[Victim]:
        """What ``Cache.evict`` removes (see there): the entries of ``sources``; or LRU ones down to
        ``to_size`` bytes or not used for ``older_than`` seconds; else down to the watermarks.
        ``dry_run``: the same choice, made by the same code inside a rolled-back index
        transaction; nothing is removed."""
        store, index = self.store, self.store.index
        with index.rehearsal() if dry_run else contextlib.nullcontext():
            if sources is not None:
                return index.remove_sources(sources) if dry_run else self.remove_sources(sources)
            if to_size is not None or older_than is not None:
                need = None if to_size is None else max(0, self.used_bytes() - to_size)
                cutoff = None if older_than is None else time.time() - older_than
                if need == 0:
                    return []
                if dry_run:
                    return index.pop_lru(need, older_than=cutoff)
                store.counters.flush()      # our own recent accesses count for the LRU order
                return index.pop_lru(need, older_than=cutoff)      # (files unlinked in its transaction)
            if dry_run:
                need = self.need()
                return index.pop_lru(need) if need > 0 else []
            return self.to_watermarks()

    def clear(self) -> None:
        """Forget every entry and remove every block file and pack; the directory stays a cache (the
        old blocks/ is renamed into tmp/ first, so a kill part way leaves a trash folder that the
        next open of the cache removes, never a half-emptied blocks/; packs left by a kill are
        orphans that ``verify`` removes).  Other processes' packs are theirs no more: the index
        counts clears, and their records taken before this one are never accounted."""
        store = self.store
        store.packs.close()
        store.index.clear()
        packs = store.packs.files()
        for pack in packs:
            store.packs.unlink(pack)
        store.packs.removed(len(packs) or 1)
        blocks = os.path.join(store.root, fmt.BLOCKS)
        trash = os.path.join(store.root, fmt.TMP, f"{os.getpid()}-trash-{os.urandom(4).hex()}")
        try:
            os.rename(blocks, trash)
            os.makedirs(blocks, exist_ok=True)
        except FileNotFoundError:
            os.makedirs(blocks, exist_ok=True)
        except OSError as exc:
            raise from_oserror(exc, blocks) from exc
        else:
            shutil.rmtree(trash, ignore_errors=True)
