"""One cache directory: its files (whole files, block files, temp files), its space, its counters.

Readers call :meth:`BlockStore.open_whole` (a hit on an object held whole: one ``open``) or
:meth:`BlockStore.open_block` (one ``open`` and one ``pread`` of the header) and hand what they
fetched from the origin to the write-behind (:attr:`BlockStore.fills`, see _fills.py), which
never blocks them.  Eviction is by LRU past the watermarks, in batches.

A file being read is never taken away from its reader: readers hold an open descriptor, and
an unlinked file's data lives until its last descriptor is closed.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import shutil
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable
from typing import Any

from manyfiles import iotrace
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Fill, Index, Version, Victim, bits_set, block_disk_bytes
from manyfiles.errors import ManyfilesError, UsageError, from_oserror

DEGRADED_RETRY = 30.0                # seconds of pass-through after the cache disk failed
STALE_TEMP_AGE = 3600.0
_O_READ = os.O_RDONLY | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def trace(op: str, path: Any, offset: int, length: int, t0: int, result: int = 0) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fs_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` every byte of ``data`` at ``offset`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


class BlockStore:
    """One cache directory: its index, its files, its write-behind."""

    def __init__(self, root: str | os.PathLike, *, block_size: int | None = None, max_size: int | None = None,
                 min_free: float | int | None = 0.1, low_water: float = 0.9, verify: bool = False,
                 fill_queue_bytes: int | None = None) -> None:
        from manyfiles.cache._fills import Fills

        self.root = os.path.abspath(os.fspath(root))
        if not 0.0 < low_water <= 1.0:
            raise UsageError(f"low_water {low_water}: must be in (0, 1]")
        self.low_water = low_water
        self.max_size = max_size
        self.verify = verify
        try:
            desc = self._open_dir(block_size)
            self.block_size = int(desc["block_size"])
            self.index = Index(os.path.join(self.root, fmt.INDEX), self.block_size)
        except OSError as exc:
            raise from_oserror(exc, self.root) from exc
        except sqlite3.DatabaseError as exc:
            raise ManyfilesError(f"{self.root}: cannot use the cache index: {exc}") from exc
        if min_free is not None and 0 <= min_free < 1 and isinstance(min_free, float):
            min_free = int(min_free * _fs_bytes(self.root))
        self.min_free = int(min_free or 0)
        self._tmp = os.path.join(self.root, fmt.TMP)
        self._temp_names = itertools.count()
        self._degraded_until = 0.0
        self._warned = False
        self._checked: set[tuple[bytes, int, int]] = set()     # (objid, index, inode) CRC-checked here
        self._fresh_process_state()
        self.fills = Fills(self, fill_queue_bytes)
        self.clean_stale_temps()

    def _fresh_process_state(self) -> None:
        """What belongs to one process: locks, batched counters and accesses.  Also called in a
        forked child (a DataLoader worker), whose parent's threads do not exist."""
        self._lock = threading.Lock()
        self._accesses: dict[bytes, tuple[float, float]] = {}
        self._counts: dict[str, int] = {}
        self.last_flush = self.last_count = time.monotonic()
        self._evicting = threading.Lock()

    def after_fork(self) -> None:
        self._fresh_process_state()
        self.fills.after_fork()

    # -- the directory ------------------------------------------------------------------------------

    def _open_dir(self, block_size: int | None) -> dict:
        os.makedirs(self.root, exist_ok=True)
        desc = fmt.read_descriptor(self.root)
        if desc is None:
            foreign = fmt.foreign_entries(self.root)
            if foreign:
                shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
                raise UsageError(f"{self.root}: not a manyfiles cache and not empty ({shown}); "
                                 "refusing to use it")
            os.makedirs(os.path.join(self.root, fmt.TMP), exist_ok=True)
            os.makedirs(os.path.join(self.root, fmt.BLOCKS), exist_ok=True)
            size = fmt.check_block_size(block_size or fmt.DEFAULT_BLOCK_SIZE)
            desc = fmt.create_descriptor(self.root, size)
        if block_size is not None and block_size != desc["block_size"]:
            raise UsageError(f"{self.root}: the cache was created with block size {desc['block_size']}, "
                             f"not {block_size}")
        os.makedirs(os.path.join(self.root, fmt.TMP), exist_ok=True)
        return desc

    def clean_stale_temps(self) -> int:
        """Remove what killed processes left in tmp/ (their pid is gone, or it is old); returns how many."""
        now = time.time()
        me = str(os.getpid())
        removed = 0
        with contextlib.suppress(OSError), os.scandir(self._tmp) as it:
            for e in it:
                pid = e.name.partition("-")[0]
                try:
                    dead = not pid.isdigit() or not _alive(int(pid))
                    old = now - e.stat(follow_symlinks=False).st_mtime > STALE_TEMP_AGE
                    if pid == me or not (dead or old):
                        continue
                    if e.is_dir(follow_symlinks=False):
                        shutil.rmtree(e.path)      # a `clear` cut short
                    else:
                        os.unlink(e.path)
                    removed += 1
                except OSError:
                    pass
        return removed

    def block_path(self, objid: bytes, index: int) -> str:
        return os.path.join(self.root, fmt.block_relpath(objid, index))

    def whole_path(self, objid: bytes) -> str:
        return os.path.join(self.root, fmt.whole_relpath(objid))

    def has_block(self, objid: bytes, index: int) -> bool:
        return os.path.exists(self.block_path(objid, index))

    def has_whole(self, objid: bytes) -> bool:
        return os.path.exists(self.whole_path(objid))

    def nblocks(self, size: int) -> int:
        return max(1, -(-size // self.block_size))

    def block_length(self, size: int, index: int) -> int:
        return min(self.block_size, size - index * self.block_size)

    # -- reading (hot paths) ------------------------------------------------------------------------

    def open_whole(self, objid: bytes, size: int) -> int | None:
        """A descriptor on the whole file of ``objid`` if there is one of ``size`` bytes, else None
        (a file of another length is removed: a miss).  It passed its object's check when it was
        written; ``verify``: it is re-hashed against that check once per file and process."""
        try:
            fd = os.open(self.whole_path(objid), _O_READ)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            ok = st.st_size == size
            if ok and self.verify and (objid, -1, st.st_ino) not in self._checked:
                ok = self._whole_sound(objid, fd, size)
                if ok:
                    self._remember_checked((objid, -1, st.st_ino))
        except OSError:
            ok = False
        if not ok:
            self.discard_whole(objid, fd)
            os.close(fd)
            return None
        return fd

    def _whole_sound(self, objid: bytes, fd: int, size: int) -> bool:
        from manyfiles.cache._verify import whole_sound

        return whole_sound(self.index, objid, fd, size)

    def _remember_checked(self, key: tuple[bytes, int, int]) -> None:
        if len(self._checked) > 1_000_000:
            self._checked.clear()
        self._checked.add(key)

    def open_block(self, objid: bytes, index: int, length: int) -> tuple[int, bool] | None:
        """(descriptor, checked) on block ``index`` of ``objid`` if it is cached and sound, else None.

        The header must name this block and length; with ``verify`` the payload's CRC is checked
        too, once per block file and process.  A bad block is removed (a miss).  ``checked``: the
        payload passed a check of the origin's (see _format.py), else it is unverified.
        """
        path = self.block_path(objid, index)
        try:
            fd = os.open(path, _O_READ)
        except OSError:
            return None
        checked = False
        try:
            h = fmt.unpack_header(os.pread(fd, fmt.HEADER_SIZE, 0))
            ok = h is not None and h.objid == objid and h.index == index and h.length == length
            if ok and self.verify:
                key = (objid, index, os.fstat(fd).st_ino)
                if key not in self._checked:
                    ok = fmt.crc_ok(h, os.pread(fd, length + 1, fmt.HEADER_SIZE))
                    if ok:
                        self._remember_checked(key)
            checked = ok and h.checked
        except OSError:
            ok = False
        if not ok:
            self.discard(objid, index, fd)
            os.close(fd)
            return None
        return fd, checked

    def read_block(self, objid: bytes, index: int, length: int) -> tuple[bytes, bool] | None:
        """(payload, checked) of a cached block, or None (a miss)."""
        got = self.open_block(objid, index, length)
        if got is None:
            return None
        fd, checked = got
        try:
            data = os.pread(fd, length, fmt.HEADER_SIZE)
            if len(data) != length:
                self.discard(objid, index, fd)
                return None
            return data, checked
        finally:
            os.close(fd)

    def discard(self, objid: bytes, index: int, fd: int) -> None:
        """Remove a corrupt block file (unless another process already replaced it)."""
        self._discard(self.block_path(objid, index), fd, f"{objid.hex()}.{index}")

    def discard_whole(self, objid: bytes, fd: int) -> None:
        """Remove a whole file found short or failing its check, and its entry."""
        self._discard(self.whole_path(objid), fd, f"{objid.hex()}.w")
        with contextlib.suppress(sqlite3.Error):
            self.index.remove_objects([objid])

    def _discard(self, path: str, fd: int, name: str) -> None:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
        self.count(corrupt=1)
        warnings.warn(f"{self.root}: corrupt cache file {name} removed; reading it from the origin",
                      RuntimeWarning, stacklevel=4)

    def count(self, **counts: int) -> None:
        with self._lock:
            c = self._counts
            for k, n in counts.items():
                c[k] = c.get(k, 0) + n
            self.last_count = time.monotonic()
        # a process that only hits (epoch 2) fills nothing: its accounting thread still writes the
        # counters within a second of the reads, not only at exit
        self.fills.start()

    def note_access(self, objid: bytes, validated_at: float) -> None:
        t = time.time()
        with self._lock:
            old = self._accesses.get(objid)
            self._accesses[objid] = (t, validated_at if old is None else max(old[1], validated_at))

    # -- writing files ------------------------------------------------------------------------------

    def temp_path(self, suffix: str = "") -> str:
        return os.path.join(self._tmp, f"{os.getpid()}-{threading.get_native_id()}-{next(self._temp_names)}"
                                       f"{suffix}")

    def write_temp(self, version: Version, index: int, data: bytes | memoryview, checked: bool) -> str:
        """Write a complete block file under tmp/; returns its path (rename with :meth:`install`)."""
        flags = fmt.FLAG_CHECKED if checked else 0
        header = fmt.pack_header(version.objid, index, index * self.block_size, data, version.size, flags)
        tmp = self.temp_path()
        fd = os.open(tmp, _O_NEW, 0o644)
        try:
            view = [memoryview(header), memoryview(data)]
            while view:
                n = os.writev(fd, view)
                while view and n >= len(view[0]):
                    n -= len(view[0])
                    view.pop(0)
                if view and n:
                    view[0] = view[0][n:]
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def install(self, tmp: str, final: str) -> None:
        """Rename a complete temp file into place (creating its folders on first use)."""
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(tmp, final)

    def write_block(self, version: Version, index: int, data: bytes | memoryview, checked: bool) -> Fill:
        """Write one block (temp + rename); returns the Fill to account."""
        t0 = time.monotonic_ns()
        tmp = self.write_temp(version, index, data, checked)
        try:
            self.install(tmp, self.block_path(version.objid, index))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        trace("cache.fill", version.source, index * self.block_size, len(data), t0)
        return self.fill_record(version, index)

    def fill_record(self, version: Version, index: int) -> Fill:
        """The accounting record of block ``index`` of ``version`` (once it is in place)."""
        return Fill(version, index, block_disk_bytes(version.size, index, self.block_size),
                    self.nblocks(version.size))

    def remove_object(self, objid: bytes, size: int) -> None:
        """Remove a version from the index and the disk (its whole file and every block)."""
        try:
            self.index.remove_objects([objid])
        except sqlite3.Error as exc:
            self.degrade(exc)
        self.unlink_files(objid, size)

    def unlink_files(self, objid: bytes, size: int) -> None:
        self._unlink(self.whole_path(objid))
        for i in range(self.nblocks(size)):
            self._unlink(self.block_path(objid, i))

    def _unlink(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def unlink_block(self, objid: bytes, index: int) -> None:
        self._unlink(self.block_path(objid, index))

    # -- failure of the cache disk ------------------------------------------------------------------

    def degraded(self) -> bool:
        return self._degraded_until > time.monotonic()

    def degrade(self, exc: BaseException) -> None:
        """Stop filling for a while: reads go on from the origin (and from what is cached)."""
        self._degraded_until = time.monotonic() + DEGRADED_RETRY
        if self._warned:
            return
        self._warned = True
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = "the cache disk is full"
        else:
            why = f"cannot write to the cache ({getattr(exc, 'strerror', None) or exc})"
        warnings.warn(f"{self.root}: {why}; reading through without caching", RuntimeWarning, stacklevel=2)

    # -- counters -----------------------------------------------------------------------------------

    def counts_pending(self) -> bool:
        return bool(self._counts or self._accesses)

    def flush_counters(self) -> None:
        """Write batched accesses and counters to the index (the accounting thread does it every second)."""
        with self._lock:
            accesses, self._accesses = self._accesses, {}
            counts, self._counts = self._counts, {}
            self.last_flush = time.monotonic()
        if not accesses and not any(counts.values()):
            return
        try:
            self.index.touch(accesses, counts)
        except sqlite3.Error as exc:
            self.degrade(exc)

    def flush(self) -> None:
        """Wait until every queued fill is written and accounted, then flush the counters."""
        self.fills.flush()
        self.flush_counters()

    def close(self) -> None:
        self.fills.close()
        self.flush_counters()
        self.index.close()

    # -- space --------------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        return self.index.counters().get("bytes", 0)

    def evict_to_watermarks(self) -> list[Victim]:
        """Evict LRU entries when above ``max_size`` (down to ``low_water`` of it) or below ``min_free``."""
        if not self._evicting.acquire(blocking=False):
            return []               # another thread is at it
        try:
            return self._evict_to_watermarks()
        finally:
            self._evicting.release()

    def watermark_need(self) -> int:
        """Bytes to evict now: above ``max_size`` down to ``low_water`` of it, or to get ``min_free``."""
        need = 0
        if self.max_size is not None:
            used = self.used_bytes()
            if used > self.max_size:
                need = used - int(self.max_size * self.low_water)
        if self.min_free:
            free = _free_bytes(self.root)
            if free < self.min_free:
                need = max(need, int(self.min_free / self.low_water) - free)
        return need

    def _evict_to_watermarks(self) -> list[Victim]:
        try:
            need = self.watermark_need()
            if need <= 0:
                return []
            self.flush_counters()   # our own recent accesses count for the LRU order
            victims = self.index.pop_lru(need)
        except (OSError, sqlite3.Error) as exc:
            self.degrade(exc)
            return []
        self.unlink_victims(victims)
        if self.min_free and not victims and _free_bytes(self.root) < self.min_free:
            self.degrade(OSError(errno.ENOSPC, f"less than {self.min_free} bytes free and nothing to evict"))
        return victims

    def evict(self, need_bytes: int | None, *, older_than: float | None = None) -> list[Victim]:
        self.flush_counters()
        victims = self.index.pop_lru(need_bytes, older_than=older_than)
        self.unlink_victims(victims)
        return victims

    def remove_sources(self, sources: Iterable[bytes]) -> list[Victim]:
        victims = self.index.remove_sources(sources)
        self.unlink_victims(victims)
        return victims

    def unlink_victims(self, victims: list[Victim]) -> None:
        for v in victims:
            t0 = time.monotonic_ns()
            if v.whole:
                self._unlink(self.whole_path(v.objid))
            else:
                for i in bits_set(v.present):
                    self.unlink_block(v.objid, i)
            trace("cache.evict", v.objid.hex(), 0, v.disk_bytes, t0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
