"""Block files on disk, the background filler, batched accounting and eviction.

Readers call :meth:`BlockStore.open_block` (a hit: one open and one pread of the header)
and hand what they fetched from the origin to :meth:`BlockStore.fill_async`, which never
blocks: when the bounded queue is full the block is dropped (the cache disk is slower
than the network), counted, and the read goes on.  Four writer threads per store write
queued blocks (temp file, then rename) at a lower CPU priority; one accounting thread
records them in the index in batches, flushes batched accesses and counters about once a
second, and evicts by LRU past the watermarks.

A block being read is never taken away from its reader: readers hold an open descriptor,
and an unlinked file's data lives until its last descriptor is closed.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import queue
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

FILLERS = 4                          # writer threads per process
# Fills are background work: their CPU (mostly the kernel's, allocating page-cache pages for new
# block files: ~2 ms per MiB on a VM, more than receiving the bytes) yields to the readers' --
# until the fill queue is BACKLOG full: then half the writers run at normal priority, since a
# dropped fill costs a fetch again later.
FILLER_NICE = 10
BACKLOG = 0.75
FLUSH_INTERVAL = 1.0                 # seconds between flushes of accesses and counters


def _default_fill_queue() -> int:
    """Bytes of lazy fills that may wait for the disk: 1/16 of the RAM, 256 MiB to 1 GiB.  Enough
    for bursts of parallel sequential readers; a disk slower than the network for longer drops."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        ram = 0
    return max(256 << 20, min(1 << 30, ram // 16))


FILL_QUEUE_BYTES = _default_fill_queue()
DEGRADED_RETRY = 30.0                # seconds of pass-through after the cache disk failed
STALE_TEMP_AGE = 3600.0
_O_READ = os.O_RDONLY | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _trace(op: str, path: Any, offset: int, length: int, t0: int, result: int = 0) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _fs_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


class BlockStore:
    """One cache directory: its index, its block files, its filler threads."""

    def __init__(self, root: str | os.PathLike, *, block_size: int | None = None, max_size: int | None = None,
                 min_free: float | int | None = 0.1, low_water: float = 0.9, verify: bool = False,
                 fill_queue_bytes: int | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        if not 0.0 < low_water <= 1.0:
            raise UsageError(f"low_water {low_water}: must be in (0, 1]")
        self.low_water = low_water
        self.max_size = max_size
        self.verify = verify
        self.fill_queue_bytes = FILL_QUEUE_BYTES if fill_queue_bytes is None else fill_queue_bytes
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
        self._closed = False
        self._fresh_process_state()
        self._degraded_until = 0.0
        self._warned = False
        self._verified: set[tuple[bytes, int, int]] = set()
        self.clean_stale_temps()

    def _fresh_process_state(self) -> None:
        """What belongs to one process: locks, the fill queue, the filler threads, batched counters.
        Also called in a forked child (a DataLoader worker), whose parent's threads do not exist."""
        self._lock = threading.Lock()
        self._queue: queue.Queue = queue.Queue()              # blocks to write (the writers')
        self._accounting: queue.Queue = queue.Queue()         # what was written (the accounting thread's)
        self._backlog = threading.Event()                     # wakes the writers at normal priority
        self._queued_bytes = 0
        # Blocks queued for writing stay readable from memory until they are on disk, so a
        # reader coming back to a block it just fetched does not fetch it again.
        self._inflight: dict[tuple[bytes, int], bytes] = {}
        self._accesses: dict[bytes, tuple[float, float]] = {}
        self._counts: dict[str, int] = {}
        self._last_flush = time.monotonic()
        self._threads: list[threading.Thread] = []
        self._evicting = threading.Lock()
        # objid -> the fill sequence number when its whole-object check failed: fills queued
        # before that are never written; a later fetch of the same version fills again
        self._rejected: dict[bytes, int] = {}
        self._fill_seq = itertools.count(1)

    def after_fork(self) -> None:
        self._fresh_process_state()

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

    def has_block(self, objid: bytes, index: int) -> bool:
        return os.path.exists(self.block_path(objid, index))

    # -- reading (hot path) -------------------------------------------------------------------------

    def open_block(self, objid: bytes, index: int, length: int) -> int | None:
        """A descriptor on block ``index`` of ``objid`` if it is cached and sound, else None.

        The header must name this block and length; with ``verify`` the payload's CRC is
        checked too, once per block file and process.  A bad block is removed (a miss).
        """
        path = self.block_path(objid, index)
        try:
            fd = os.open(path, _O_READ)
        except OSError:
            return None
        try:
            h = fmt.unpack_header(os.pread(fd, fmt.HEADER_SIZE, 0))
            ok = h is not None and h.objid == objid and h.index == index and h.length == length
            if ok and self.verify:
                ino = os.fstat(fd).st_ino
                key = (objid, index, ino)
                if key not in self._verified:
                    ok = fmt.crc_ok(h, os.pread(fd, length + 1, fmt.HEADER_SIZE))
                    if ok:
                        if len(self._verified) > 1_000_000:
                            self._verified.clear()
                        self._verified.add(key)
        except OSError:
            ok = False
        if not ok:
            self.discard(objid, index, fd)
            os.close(fd)
            return None
        return fd

    def read_block(self, objid: bytes, index: int, length: int) -> bytes | None:
        """The whole payload of a cached block, or None (a miss)."""
        fd = self.open_block(objid, index, length)
        if fd is None:
            return None
        try:
            data = os.pread(fd, length, fmt.HEADER_SIZE)
            if len(data) != length:
                self.discard(objid, index, fd)
                return None
            return data
        finally:
            os.close(fd)

    def discard(self, objid: bytes, index: int, fd: int) -> None:
        """Remove a corrupt block file (unless another process already replaced it)."""
        path = self.block_path(objid, index)
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                os.unlink(path)
        self.count(corrupt=1)
        warnings.warn(f"{self.root}: corrupt cache block {objid.hex()}.{index} removed; "
                      "reading it from the origin", RuntimeWarning, stacklevel=3)

    def queued_block(self, objid: bytes, index: int) -> bytes | None:
        """A block waiting in the fill queue (not yet on disk), if any."""
        return self._inflight.get((objid, index))

    def count(self, **counts: int) -> None:
        with self._lock:
            c = self._counts
            for k, n in counts.items():
                c[k] = c.get(k, 0) + n
        if not self._threads:
            # a process that only hits (epoch 2) fills nothing: its accounting thread still writes
            # the counters within FLUSH_INTERVAL of the reads, not only at exit
            self._start_filler()

    def note_access(self, objid: bytes, validated_at: float) -> None:
        t = time.time()
        with self._lock:
            old = self._accesses.get(objid)
            self._accesses[objid] = (t, validated_at if old is None else max(old[1], validated_at))

    # -- filling ------------------------------------------------------------------------------------

    def fill_async(self, version: Version, index: int, data: bytes, *, checked: bool = False) -> None:
        """Queue a block for writing; drop it (and count it) if the queue is full or the disk failed.
        ``checked``: the block comes from a whole-object GET whose check is pending or passed (any
        other block, e.g. from a ranged GET, un-marks a verified object)."""
        n = len(data)
        with self._lock:
            if self._closed or self._degraded() or self._queued_bytes + n > self.fill_queue_bytes:
                self._counts["fills_dropped"] = self._counts.get("fills_dropped", 0) + 1
                return
            self._queued_bytes += n
            self._inflight[(version.objid, index)] = data
            if self._queued_bytes > BACKLOG * self.fill_queue_bytes:
                self._backlog.set()
        self._start_filler()
        self._queue.put(("checked" if checked else "data", version, index, data, next(self._fill_seq)))

    def mark_verified(self, version: Version, method: str) -> None:
        """Record, after the blocks queued before, that the whole object passed ``method``."""
        self._start_filler()
        self._queue.put(("verified", version, 0, method, next(self._fill_seq)))

    def reject(self, version: Version) -> None:
        """The whole object failed its check: never keep a block of it (queued, being written or on
        disk) in this process, and remove what is on disk and in the index now."""
        with self._lock:
            if len(self._rejected) > 100_000:
                self._rejected.clear()
            self._rejected[version.objid] = next(self._fill_seq)
            for key in [k for k in self._inflight if k[0] == version.objid]:
                del self._inflight[key]
        self._remove_object(version.objid, version.size)

    def _is_rejected(self, objid: bytes, seq: int) -> bool:
        """Was ``objid`` rejected after the fill numbered ``seq`` was queued?"""
        return self._rejected.get(objid, 0) > seq

    def _remove_object(self, objid: bytes, size: int) -> None:
        try:
            self.index.remove_objects([objid])
        except sqlite3.Error as exc:
            self._degrade(exc)
        for i in range(max(1, -(-size // self.block_size))):
            self._unlink_block(objid, i)

    def account_async(self, fill: Fill) -> None:
        """Queue the accounting of a block already renamed into place (warm)."""
        self._start_filler()
        self._queue.put(("fill", fill, 0, b"", next(self._fill_seq)))

    def write_temp(self, version: Version, index: int, data: bytes | memoryview) -> str:
        """Write a complete block file under tmp/; returns its path (rename with :meth:`install`)."""
        header = fmt.pack_header(version.objid, index, index * self.block_size, data, version.size)
        tmp = os.path.join(self._tmp, f"{os.getpid()}-{threading.get_native_id()}-{next(self._temp_names)}")
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

    def install(self, tmp: str, objid: bytes, index: int) -> None:
        final = self.block_path(objid, index)
        try:
            os.rename(tmp, final)
        except FileNotFoundError:
            if not os.path.exists(tmp):
                raise
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.rename(tmp, final)

    def write_block(self, version: Version, index: int, data: bytes | memoryview) -> Fill:
        """Write one block (temp + rename); returns the Fill to account."""
        t0 = time.monotonic_ns()
        tmp = self.write_temp(version, index, data)
        try:
            self.install(tmp, version.objid, index)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _trace("cache.fill", version.source, index * self.block_size, len(data), t0)
        return self.fill_record(version, index)

    def fill_record(self, version: Version, index: int) -> Fill:
        """The accounting record of block ``index`` of ``version`` (once it is in place)."""
        return Fill(version, index, block_disk_bytes(version.size, index, self.block_size),
                    max(1, -(-version.size // self.block_size)))

    def _start_filler(self) -> None:
        if not self._threads:
            with self._lock:
                if not self._threads and not self._closed:
                    # Several writers: creating and renaming a file waits on the filesystem's journal
                    # (with the GIL released), and a busy disk makes one writer fall behind the network.
                    for i in range(FILLERS):
                        t = threading.Thread(target=self._run, args=(i % 2 == 0,),
                                             name=f"manyfiles-cache-filler-{i}", daemon=True)
                        t.start()
                        self._threads.append(t)
                    t = threading.Thread(target=self._run_accounting, name="manyfiles-cache-accounting",
                                         daemon=True)
                    t.start()
                    self._threads.append(t)

    def _run(self, niced: bool) -> None:
        """A writer: block files only; ``niced``: at a lower CPU priority, else only while the queue
        has a backlog.  Everything that holds the GIL for long (SQLite batches, counters, eviction)
        is the accounting thread's: a niced thread preempted while holding the GIL would stall
        every reader of the process."""
        if niced:
            with contextlib.suppress(OSError, AttributeError):     # this thread only (Linux: a tid)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                               max(FILLER_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
        while True:
            if not niced:
                self._backlog.wait()
            batch = [self._queue.get()]
            while len(batch) < 64 and batch[-1][0] != "stop":   # one stop per writer
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._accounting.put(self._write_batch([b for b in batch if b[0] != "stop"]))
            except Exception as exc:  # never let a writer die: flush() would wait for it forever
                self._degrade(exc)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if batch[-1][0] == "stop":
                return

    def _write_batch(self, batch: list) -> tuple:
        """Write the blocks of ``batch``; returns what the accounting thread records of it."""
        fills: list[Fill] = []
        marks: dict[bytes, str] = {}
        unchecked: set[bytes] = set()
        written: dict[tuple[bytes, int], int] = {}
        for kind, a, index, data, seq in batch:
            if kind == "fill":
                fills.append(a)
                written[(a.version.objid, a.index)] = seq
                continue
            if kind == "verified":
                if not self._is_rejected(a.objid, seq):
                    marks[a.objid] = data
                continue
            try:
                if self._degraded() or self._is_rejected(a.objid, seq):
                    self.count(fills_dropped=1)
                    continue
                fills.append(self.write_block(a, index, data))
                written[(a.objid, index)] = seq
                if kind == "data":
                    unchecked.add(a.objid)
            except OSError as exc:
                self.count(fills_dropped=1)
                self._degrade(exc)
            finally:
                with self._lock:
                    self._queued_bytes -= len(data)
                    if self._inflight.get((a.objid, index)) is data:
                        del self._inflight[(a.objid, index)]
                    if self._queued_bytes < BACKLOG / 2 * self.fill_queue_bytes:
                        self._backlog.clear()
        return fills, marks, unchecked, written

    def _run_accounting(self) -> None:
        """Records what the writers wrote, flushes accesses and counters about once a second,
        evicts past the watermarks."""
        while True:
            try:
                items = [self._accounting.get(timeout=FLUSH_INTERVAL)]
            except queue.Empty:
                items = []
            while items and items[-1] is not None:
                try:
                    items.append(self._accounting.get_nowait())
                except queue.Empty:
                    break
            try:
                self._record([i for i in items if i is not None])
            except Exception as exc:  # never let it die: flush() would wait for it forever
                self._degrade(exc)
            finally:
                for _ in items:
                    self._accounting.task_done()
            if items and items[-1] is None:
                return

    def _record(self, items: list[tuple]) -> None:
        fills: list[Fill] = []
        marks: dict[bytes, str] = {}
        unchecked: set[bytes] = set()
        written: dict[tuple[bytes, int], int] = {}
        for f, m, u, w in items:
            fills += f
            marks.update(m)
            unchecked |= u
            written.update(w)
        if fills:
            self._account(fills)
        if marks or unchecked:
            try:
                self.index.mark_verified(marks, unchecked - marks.keys(), time.time())
            except sqlite3.Error as exc:
                self._degrade(exc)
        # a check that failed while its blocks were being written: take them back out
        rejected = {(f.version.objid, f.version.size) for f in fills
                    if self._is_rejected(f.version.objid, written.get((f.version.objid, f.index), 0))}
        for objid, size in rejected:
            self._remove_object(objid, size)
        if fills or time.monotonic() - self._last_flush >= FLUSH_INTERVAL:
            self.flush_counters()
            self.evict_to_watermarks()

    def _account(self, fills: list[Fill]) -> None:
        try:
            stale, superseded, new = self.index.record_fills(fills, time.time())
        except sqlite3.Error as exc:
            # Not accounted means not evictable: take the blocks back out.
            for f in fills:
                self._unlink_block(f.version.objid, f.index)
            self.count(fills_dropped=len(fills))
            self._degrade(exc)
            return
        self.count(fills=new,
                   fill_bytes=sum(f.disk_bytes for f in fills) - len(stale) * fmt.HEADER_SIZE)
        for objid, index in stale:
            self._unlink_block(objid, index)
        self.unlink_victims(superseded)

    def flush_counters(self) -> None:
        """Write batched accesses and counters to the index (the filler does it every second)."""
        with self._lock:
            accesses, self._accesses = self._accesses, {}
            counts, self._counts = self._counts, {}
            self._last_flush = time.monotonic()
        if not accesses and not any(counts.values()):
            return
        try:
            self.index.touch(accesses, counts)
        except sqlite3.Error as exc:
            self._degrade(exc)

    def flush(self) -> None:
        """Wait until every queued fill is written and accounted, then flush the counters."""
        if any(t.is_alive() for t in self._threads):
            self._queue.join()          # the writers hand their batch over before task_done
            self._accounting.join()
        self.flush_counters()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        writers, accounting = self._threads[:-1], self._threads[-1:]
        self._backlog.set()
        for _ in writers:
            self._queue.put(("stop", None, 0, b"", 0))
        for t in writers:
            t.join()
        for _ in accounting:
            self._accounting.put(None)
        for t in accounting:
            t.join()
        self.flush_counters()
        self.index.close()

    # -- failure of the cache disk ------------------------------------------------------------------

    def _degraded(self) -> bool:
        return self._degraded_until > time.monotonic()

    def _degrade(self, exc: BaseException) -> None:
        """Stop filling for a while: reads go on from the origin (and from blocks already cached)."""
        self._degraded_until = time.monotonic() + DEGRADED_RETRY
        if self._warned:
            return
        self._warned = True
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = "the cache disk is full"
        else:
            why = f"cannot write to the cache ({getattr(exc, 'strerror', None) or exc})"
        warnings.warn(f"{self.root}: {why}; reading through without caching", RuntimeWarning, stacklevel=2)

    # -- space --------------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        return self.index.counters().get("bytes", 0)

    def evict_to_watermarks(self) -> list[Victim]:
        """Evict LRU entries when above ``max_size`` (down to ``low_water`` of it) or below ``min_free``."""
        if not self._evicting.acquire(blocking=False):
            return []               # another filler is at it
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
            self._degrade(exc)
            return []
        self.unlink_victims(victims)
        if self.min_free and not victims and _free_bytes(self.root) < self.min_free:
            self._degrade(OSError(errno.ENOSPC, f"less than {self.min_free} bytes free and nothing to evict"))
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
            for i in bits_set(v.present):
                self._unlink_block(v.objid, i)
            _trace("cache.evict", v.objid.hex(), 0, v.disk_bytes, t0)

    def _unlink_block(self, objid: bytes, index: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.block_path(objid, index))

    def block_length(self, size: int, index: int) -> int:
        return min(self.block_size, size - index * self.block_size)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
