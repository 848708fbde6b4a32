"""The write-behind: what readers fetched reaches the cache disk without the readers waiting.

Readers hand bytes to :class:`Fills` and go on: a block fetched by range (:meth:`Fills.block`),
a whole object already checked (:meth:`Fills.whole`), or the parts of a whole-object stream
still being checked (:meth:`WholeWriter.part`, then :meth:`WholeWriter.seal` once the check
passed).  The queue is bounded (``fill_queue`` bytes): when the cache disk is slower than the
network for longer than that, fills are dropped (``fills_dropped``), never waited for.  Writer
threads write the files at a lower CPU priority (temp file, then rename: a file under its final
name is always complete, and a whole file is renamed into place only after its object passed
its check); one accounting thread records them in the index in batches, flushes batched
accesses and counters about once a second and evicts past the watermarks.

A whole file is written into a temp file preallocated to the object's size (one extent, large
``pwrite`` s), which costs the kernel less than one new file per block.  A small object (up to
``PACK_MAX_OBJECT``) is appended to this process's pack instead, as one record (_packs.py): its
parts are gathered in memory, and the record is written once the object passed its check.

The writers run at a lower priority, so they must never hold anything a reader waits for: they
take no lock that readers take.  Items reach them through a ``queue.SimpleQueue`` (a put never
waits), they count what they wrote in counters of their own, and they drop what readers could
still find in memory with single dict operations.  A stream's blocks are received into recycled
buffers (:class:`BlockBuffers`): a fresh 4 MiB buffer per block costs the kernel more (page faults,
zeroing) than writing the block to the cache disk.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import sqlite3
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from manyfiles.cache._format import trace, write_all
from manyfiles.cache._index import Fill, Packed, Version, Whole
from manyfiles.cache._packs import PACK_MAX_OBJECT

if TYPE_CHECKING:
    from manyfiles.cache._blockfiles import BlockFiles

FILLERS = 4                          # writer threads per process
# Fills are background work: their CPU (mostly the kernel's, allocating page-cache pages for new
# files) yields to the readers' -- until the fill queue is BACKLOG full: then half the writers
# run at normal priority, since a dropped fill costs a fetch again later.
FILLER_NICE = 10
BACKLOG = 0.75
FLUSH_INTERVAL = 1.0                 # seconds between flushes of accesses and counters while reads go on
QUIET = 0.05                         # ... and once reads paused this long (a worker between batches)
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_O_NEW_RW = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


def _default_fill_queue() -> int:
    """Bytes of lazy fills that may wait for the disk: 1/16 of the RAM, 256 MiB to 1 GiB.  Enough
    for bursts of parallel sequential readers; a disk slower than the network for longer drops."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        ram = 0
    return max(256 << 20, min(1 << 30, ram // 16))


FILL_QUEUE_BYTES = _default_fill_queue()
IDLE_BUFFERS = 8                     # recycled block buffers kept while no stream needs them


# Recycling trusts sys.getrefcount, which is exact only while the GIL serializes every change of a
# count (a free-threaded build counts per thread and merges later).
_GIL = getattr(sys, "_is_gil_enabled", lambda: True)()


def _refs_when_idle() -> int:
    """What ``sys.getrefcount`` says of a pooled buffer nobody else holds, seen from the loop of
    :meth:`BlockBuffers.get` (the list, the loop variable, the argument)."""
    bufs = [bytearray(1)]
    for b in bufs:
        return sys.getrefcount(b)
    raise AssertionError


class BlockBuffers:
    """Block-sized ``bytearray`` s recycled between the blocks of streams (see the module docs).

    A buffer is handed out again only when nothing but this pool refers to it: the reader that
    got its block, the fill queue, the dict readers find queued blocks in and a ``pwrite`` in
    progress all hold references to it (CPython's reference count says so exactly), so a buffer
    is never rewritten while someone may still read it.  At most ``limit`` buffers are pooled
    (past that, fresh ones); :meth:`trim` (the accounting thread, every second) gives idle ones
    beyond IDLE_BUFFERS back.
    """

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, max(1, limit)
        self._bufs: list[bytearray] = []
        self._lock = threading.Lock()
        self._idle_refs = _refs_when_idle()

    def get(self) -> bytearray:
        if not _GIL:            # reference counts are not exact without the GIL: never recycle
            return bytearray(self.size)
        with self._lock:
            for b in self._bufs:
                if sys.getrefcount(b) <= self._idle_refs:
                    return b
            b = bytearray(self.size)
            if len(self._bufs) < self.limit:
                self._bufs.append(b)
            return b

    def trim(self, keep: int = IDLE_BUFFERS) -> None:
        """Drop idle buffers beyond ``keep``."""
        with self._lock:
            pooled = []
            for b in self._bufs:
                if sys.getrefcount(b) <= self._idle_refs:
                    if not keep:
                        continue
                    keep -= 1
                pooled.append(b)
            self._bufs = pooled

    def __len__(self) -> int:
        return len(self._bufs)


class WholeWriter:
    """One object version on its way into its whole file: parts written at their offsets into a
    temp file preallocated to the object's size, renamed into place once every part is written
    *and* the object passed its check (:meth:`seal`); aborted otherwise (nothing kept).

    Parts come queued (:meth:`part`: write-behind, from one reader's stream) or are written at
    once (:meth:`write`: warm and background completions, which are background work already).
    A small object's parts go into memory instead, and it is appended to a pack once sealed.
    No lock is shared with the stream: parts queued are counted by the stream's thread, parts
    written in a list the writers append to, and whoever sees the last of them finishes, once.
    """

    def __init__(self, fills: Fills, version: Version) -> None:
        self.fills, self.version = fills, version
        self._lock = threading.Lock()       # the temp file's creation (writers only)
        self._once = threading.Lock()       # taken once, never released: _finish runs once
        self._fd: int | None = None
        self._allocated = False             # the temp file's room reserved (posix_fallocate)
        self._tmp: str | None = None
        self.packed = version.size <= PACK_MAX_OBJECT
        self._buf: bytes | bytearray | None = None      # a packed object's bytes
        self.seq = next(fills._seq)         # a rejection of the object after this gives the file up
        self.queued = 0                     # parts queued (the stream's thread only)
        self._written: list[bool] = []      # one entry per queued part written, failed or dropped
        self.sealed: tuple[str, dict] | None = None
        self.failed = False
        self.done = False

    def _file(self) -> int:
        fd = self._fd
        if fd is not None:
            return fd
        with self._lock:
            if self._fd is None:
                store = self.fills.store
                self._tmp = store.temp_path(".w")
                fd = os.open(self._tmp, _O_NEW_RW, 0o644)     # (read too: a stream lands through it)
                if self.version.size:
                    # one extent for the whole object: cheaper for the kernel than growing the file
                    with contextlib.suppress(OSError):
                        os.posix_fallocate(fd, 0, self.version.size)
                        self._allocated = True
                self._fd = fd
            return self._fd

    def landing_fd(self) -> int | None:
        """The temp file, preallocated to the object's size, that a stream may land its parts in
        directly (then :meth:`landed`); None: a packed object, or no room was reserved (a full disk
        must fail a write, never a page of a mapping), or the file was given up."""
        if self.packed or self.failed or self.done:
            return None
        try:
            fd = self._file()
        except OSError:
            return None
        return fd if self._allocated else None

    def landed(self) -> None:
        """A part landed in the file directly (the stream's thread): counted as queued and written."""
        self.queued += 1
        self._written_one(ok=True)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` now (raises OSError: the caller aborts)."""
        if not self.packed:
            write_all(self._file(), data, offset)
            return
        with self._lock:
            if self._buf is None:
                self._buf = bytearray(self.version.size)
        self._buf[offset:offset + len(data)] = data      # (a copy: stream buffers are recycled)

    def hold(self, data: bytes) -> None:
        """The whole (immutable) object at once: kept by reference, no copy."""
        if self.packed:
            self._buf = data
        else:
            self.write(0, data)

    def part(self, offset: int, data: Any) -> bool:
        """Queue ``data`` for ``offset``; False when it was dropped (the whole file is then given up)."""
        if self.failed or self.done:
            return False
        self.queued += 1
        if self.fills.enqueue("part", self, offset, data, key=(self.version.objid,
                                                              offset // self.fills.store.block_size)):
            return True
        self._written_one(ok=False)
        return False

    def _written_one(self, ok: bool) -> None:
        """A queued part was written (or failed, or was dropped)."""
        if not ok:
            self.failed = True
        self._written.append(ok)
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if len(self._written) == self.queued and (self.sealed is not None or self.failed):
            self._finish()

    def seal(self, method: str, claim: dict) -> None:
        """The object passed its check (``method``; ``claim``: what the file is re-hashed against at
        rest): install the file once every part is written."""
        self.sealed = (method, claim)
        self._maybe_finish()

    def abort(self) -> None:
        self.failed = True
        self._maybe_finish()

    def _finish(self) -> None:
        """Install (sealed, every part written) or give up (failed, rejected): once."""
        if not self._once.acquire(blocking=False):
            return
        store, v = self.fills.store, self.version
        self.done = True
        install = (self.sealed is not None and not self.failed
                   and not self.fills.rejected(v.objid, self.seq))
        fd, tmp = self._fd, self._tmp
        self._fd = None
        if self.packed:
            data, self._buf = self._buf, None
            if install:
                self._append(data if data is not None else b"")
            return
        try:
            if not install:
                return
            if fd is None:                 # an empty object: nothing was written
                tmp = store.temp_path(".w")
                fd = os.open(tmp, _O_NEW, 0o644)
            t0 = time.monotonic_ns()
            os.close(fd)
            fd = None
            store.install(tmp, store.whole_path(v.objid))
            tmp = None
            trace("cache.fill", v.source, 0, v.size, t0)
            method, claim = self.sealed
            self.fills.account(Whole(v, method, json.dumps(claim, sort_keys=True), store.nblocks(v.size)))
        except OSError as exc:
            self.fills.count_dropped(1)
            store.degrade(exc)
        finally:
            if fd is not None:
                os.close(fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)


    def _append(self, data: bytes | bytearray) -> None:
        """Append the sealed small object to this process's pack, and account the record."""
        store, v = self.fills.store, self.version
        method, claim = self.sealed
        t0 = time.monotonic_ns()
        try:
            rec = store.packs.append(v, data, method, json.dumps(claim, sort_keys=True),
                                     store.nblocks(v.size))
        except OSError as exc:
            self.fills.count_dropped(1)
            store.degrade(exc)
            return
        trace("cache.fill", v.source, 0, v.size, t0)
        self.fills.account(rec)


class Fills:
    """The fill queue of one store, its writer threads and its accounting thread."""

    def __init__(self, store: BlockFiles, queue_bytes: int | None) -> None:
        self.store = store
        self.queue_bytes = FILL_QUEUE_BYTES if queue_bytes is None else queue_bytes
        self._closed = False
        self.after_fork()

    def after_fork(self) -> None:
        """What belongs to one process (called again in a forked child)."""
        self._lock = threading.Lock()                         # the producers' (readers); no writer takes it
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # files to write (the writers')
        self._accounting: queue.SimpleQueue = queue.SimpleQueue()   # what was written (accounting's)
        self._backlog = threading.Event()                     # wakes the writers at normal priority
        self._enqueued_bytes = self._enqueued = 0             # what producers queued (under _lock)
        self._written_bytes = [0] * FILLERS                   # what each writer wrote (its own slot)
        self._written = [0] * FILLERS
        self._progress = threading.Condition()                # flush() waits on it
        self._flushing = 0
        # What is queued stays readable from memory until it is on disk, so a reader coming back
        # to a block it just fetched does not fetch it again: (objid, index) -> (bytes, checked),
        # and objid -> a whole object already checked.
        self._inflight: dict[tuple[bytes, int], tuple[Any, bool]] = {}
        self._inflight_whole: dict[bytes, bytes] = {}
        self._threads: list[threading.Thread] = []
        # objid -> the fill sequence number when it was rejected (its whole-object check failed):
        # fills queued before that are never written; a later fetch of the same version fills again
        self._rejected: dict[bytes, int] = {}
        self._seq = itertools.count(1)
        self.buffers = BlockBuffers(self.store.block_size, self.queue_bytes // self.store.block_size + 64)

    # -- what readers call ---------------------------------------------------------------------------

    def block(self, version: Version, index: int, data: Any, *, checked: bool) -> None:
        """Queue a block fetched by range (``checked``: a check of the origin's covered it)."""
        self.enqueue("block", version, index, data, key=(version.objid, index), checked=checked)

    def whole(self, version: Version, data: bytes, method: str, claim: dict) -> None:
        """Queue a whole object that passed its check, to become its whole file."""
        w = WholeWriter(self, version)
        w.sealed = (method, claim)
        self.enqueue("whole", w, 0, data, key=None)

    def writer(self, version: Version) -> WholeWriter:
        return WholeWriter(self, version)

    def queued(self, objid: bytes, index: int, *, checked_only: bool = False) -> Any:
        """A block waiting in the queue (not yet on disk), if any."""
        got = self._inflight.get((objid, index))
        if got is not None and (got[1] or not checked_only):
            return got[0]
        return None

    def queued_whole(self, objid: bytes) -> bytes | None:
        """A whole object (checked) waiting in the queue, if any."""
        return self._inflight_whole.get(objid)

    def queued_bytes(self) -> int:
        """Bytes queued and not yet written (an estimate while writers run: never below the truth)."""
        return self._enqueued_bytes - sum(self._written_bytes)

    def tally(self) -> dict[str, int]:
        """This process's fills so far: queued (items, bytes), and done by the writers (written, or
        given up at the disk)."""
        return {"fills_queued": self._enqueued, "fill_bytes_queued": self._enqueued_bytes,
                "fills_done": sum(self._written), "fill_bytes_done": sum(self._written_bytes)}

    def account(self, fill: Fill | Whole | Packed) -> None:
        """Queue the accounting of a file already renamed into place."""
        self.start()
        self._accounting.put([(fill, next(self._seq))])

    def count_dropped(self, n: int) -> None:
        self.store.counters.count(fills_dropped=n)

    def reject(self, version: Version) -> None:
        """The object failed its whole-object check: never keep a file of it (queued, being written
        or on disk) in this process, and remove what is on disk and in the index now."""
        with self._lock:
            if len(self._rejected) > 100_000:
                self._rejected.clear()
            self._rejected[version.objid] = next(self._seq)
            for key in [k for k in list(self._inflight) if k[0] == version.objid]:
                self._inflight.pop(key, None)
            self._inflight_whole.pop(version.objid, None)
        self.store.remove_object(version.objid, version.size)

    def rejected(self, objid: bytes, seq: int) -> bool:
        """Was ``objid`` rejected after the fill numbered ``seq`` was queued?"""
        return self._rejected.get(objid, 0) > seq

    # -- the queue -----------------------------------------------------------------------------------

    def enqueue(self, kind: str, target: Any, at: int, data: Any, *, key: tuple[bytes, int] | None,
                checked: bool = False) -> bool:
        """Queue one write (``target``: a Version for a block, a WholeWriter for a part or a whole
        object; ``at``: the block's index or the part's offset); False, counted as dropped, when the
        queue is full, the disk failed or the store is closed.  ``key``: where readers find the
        bytes until they are on disk."""
        store, n = self.store, len(data)
        with self._lock:
            queued = self.queued_bytes()
            dropped = self._closed or store.degraded() or queued + n > self.queue_bytes
            if not dropped:
                self._enqueued_bytes += n
                self._enqueued += 1
                if key is not None:
                    self._inflight[key] = (data, checked)
                elif kind == "whole":
                    self._inflight_whole[target.version.objid] = data
                seq = next(self._seq)
        if dropped:        # (counted outside the lock: counting may start the threads, which takes it)
            store.counters.count(fills_dropped=store.nblocks(n) if kind == "whole" else 1)
            return False
        if queued + n > BACKLOG * self.queue_bytes:
            self._backlog.set()
        self.start()
        self._queue.put((kind, target, at, data, seq, checked, key))
        return True

    def start(self) -> None:
        """Start the writer and accounting threads (once per process)."""
        if not self._threads:
            with self._lock:
                if not self._threads and not self._closed:
                    # Several writers: creating and renaming a file waits on the filesystem's journal
                    # (with the GIL released), and a busy disk makes one writer fall behind the network.
                    for i in range(FILLERS):
                        t = threading.Thread(target=self._run, args=(i, i % 2 == 0),
                                             name=f"manyfiles-cache-filler-{i}", daemon=True)
                        t.start()
                        self._threads.append(t)
                    t = threading.Thread(target=self._run_accounting, name="manyfiles-cache-accounting",
                                         daemon=True)
                    t.start()
                    self._threads.append(t)

    def _run(self, me: int, niced: bool) -> None:
        """Writer ``me``: files only; ``niced``: at a lower CPU priority, else only while the queue
        has a backlog.  It takes no lock a reader takes (see the module docs); everything that holds
        the GIL for long (SQLite batches, counters, eviction) is the accounting thread's: a niced
        thread preempted while holding the GIL would stall every reader of the process."""
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
            done, nbytes = [], 0
            for item in batch:
                if item[0] == "stop":
                    continue
                try:
                    d = self._write(*item)
                    if d is not None:
                        done.append(d)
                except Exception as exc:  # never let a writer die: flush() would wait for it forever
                    self.store.degrade(exc)
                finally:
                    self._forget(item)
                nbytes += len(item[3])
            if done:
                self._accounting.put(done)
            # counted once accounted: flush() waits for these counts, then for the accounting
            self._written_bytes[me] += nbytes
            self._written[me] += len(batch) - (batch[-1][0] == "stop")
            if self._flushing:
                with self._progress:
                    self._progress.notify_all()
            if not niced and self.queued_bytes() < BACKLOG / 2 * self.queue_bytes:
                self._backlog.clear()
            if batch[-1][0] == "stop":
                return

    def _forget(self, item: tuple) -> None:
        """Readers no longer find a written item in memory (single dict operations: no lock)."""
        kind, target, _, data, _, _, key = item
        if key is not None:
            got = self._inflight.get(key)
            if got is not None and got[0] is data:
                # (a newer copy of the same block stored between the get and the pop is popped
                # too: the same bytes, read from the disk or fetched again)
                self._inflight.pop(key, None)
        elif kind == "whole":
            objid = target.version.objid
            if self._inflight_whole.get(objid) is data:
                self._inflight_whole.pop(objid, None)

    def _write(self, kind: str, target: Any, at: int, data: Any, seq: int, checked: bool,
               key: tuple[bytes, int] | None) -> tuple[Fill, int] | None:
        """Write one queued item; returns the block to account (and its sequence number)."""
        store = self.store
        if kind == "part":
            self._write_part(target, at, data, seq)
            return None
        if kind == "whole":
            self._write_whole(target, data, seq)
            return None
        v = target
        if store.held_whole(v.objid, v.size):      # held whole already: the block adds nothing
            return None
        if store.degraded() or self.rejected(v.objid, seq):
            self.count_dropped(1)
            return None
        try:
            return store.write_block(v, at, data, checked), seq
        except OSError as exc:
            self.count_dropped(1)
            store.degrade(exc)
            return None

    def _write_part(self, w: WholeWriter, offset: int, data: Any, seq: int) -> None:
        ok = False
        try:
            if not (w.failed or self.rejected(w.version.objid, seq)):
                w.write(offset, data)
                ok = True
        except OSError as exc:
            self.count_dropped(1)
            self.store.degrade(exc)
        finally:
            w._written_one(ok)

    def _write_whole(self, w: WholeWriter, data: bytes, seq: int) -> None:
        try:
            store = self.store
            v = w.version
            if store.degraded() or self.rejected(v.objid, seq) or store.held_whole(v.objid, v.size):
                w.abort()
                return
            w.hold(data)
        except OSError as exc:
            self.count_dropped(1)
            self.store.degrade(exc)
            w.abort()
            return
        w._finish()

    # -- accounting ----------------------------------------------------------------------------------

    def _run_accounting(self) -> None:
        """Records what the writers wrote, flushes accesses and counters about once a second,
        evicts past the watermarks.  Also sets the events flush() puts in its queue."""
        while True:
            try:
                wait = QUIET if self.store.counters.pending() else FLUSH_INTERVAL
                items = [self._accounting.get(timeout=wait)]
            except queue.Empty:
                items = []
            while items and items[-1] is not None:
                try:
                    items.append(self._accounting.get_nowait())
                except queue.Empty:
                    break
            try:
                self._record([f for batch in items if isinstance(batch, list) for f in batch])
            except Exception as exc:  # never let it die: flush() would wait for it forever
                self.store.degrade(exc)
            finally:
                for marker in items:
                    if isinstance(marker, threading.Event):
                        marker.set()
            if items and items[-1] is None:
                return

    def _record(self, items: list[tuple[Fill | Whole | Packed, int]]) -> None:
        store = self.store
        fills = [f for f, _ in items]
        if fills:
            packed = [f for f in fills if isinstance(f, Packed)]
            try:
                done = store.index.record_fills(fills, time.time())
            except sqlite3.Error as exc:
                # Not accounted means not evictable: take the files back out (records stay dead).
                for f in fills:
                    if isinstance(f, Whole):
                        store.unlink_files(f.version.objid, 0)
                    elif isinstance(f, Fill):
                        store.unlink_block(f.version.objid, f.index)
                store.packs.accounted(packed, set(), set())
                self.count_dropped(len(fills))
                store.degrade(exc)
                return
            if packed:
                store.packs.accounted(packed, done.packs_seen, done.lost_packs)
            lost = done.lost + sum(f.pack in done.lost_packs for f in packed)
            if lost:
                self.count_dropped(lost)
            store.counters.count(fills=done.new, fill_bytes=done.new_bytes)
            for objid, index in (*done.stale_blocks, *done.replaced):
                store.unlink_block(objid, index)
            for objid in done.stale_wholes:
                store.unlink_files(objid, 0)
            # a whole-object check that failed while these were being written: take them back out
            for objid, size in {(f.version.objid, f.version.size) for f, seq in items
                                if self.rejected(f.version.objid, seq)}:
                store.remove_object(objid, size)
        now = time.monotonic()
        if len(self.buffers) > IDLE_BUFFERS:
            self.buffers.trim()
        store.packs.sync()          # descriptors of packs removed meanwhile: closed, their space freed
        counters = store.counters
        if fills or now - counters.last_flush >= FLUSH_INTERVAL or (counters.pending()
                                                                   and now - counters.last_count >= QUIET):
            counters.flush()
            store.space.to_watermarks()

    # -- flush and close -----------------------------------------------------------------------------

    def flush(self) -> None:
        """Wait until every fill queued so far is written and accounted."""
        if not any(t.is_alive() for t in self._threads):
            return
        with self._lock:
            target = self._enqueued
        with self._progress:
            self._flushing += 1
            try:
                self._progress.wait_for(lambda: sum(self._written) >= target)
            finally:
                self._flushing -= 1
        marker = threading.Event()        # everything accounted before it is accounted
        self._accounting.put(marker)
        marker.wait()

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        with self._lock:
            self._closed = True
        writers, accounting = self._threads[:-1], self._threads[-1:]
        self._backlog.set()
        for _ in writers:
            self._queue.put(("stop",))
        for t in writers:
            t.join()
        for _ in accounting:
            self._accounting.put(None)
        for t in accounting:
            t.join()
