"""Small objects packed: records appended to a few large pack files instead of one file each.

A cache of ten million small objects as ten million files is the problem this project exists
for (every open a path walk, an inode, a dentry).  Objects up to ``PACK_MAX_OBJECT`` that are
held whole (checked) are kept as *records* in *packs* instead (format: _format.py):

    DIR/packs/<16 hex>.pack    a 64-byte header, then records: a 64-byte header and the payload
    DIR/packs/generation       two counters: records accounted, packs removed (readers compare them)

* **Appending.** Each process appends to one pack of its own at a time, which it holds with
  ``flock`` (released by the kernel when the process dies, ``kill -9`` included).  A writer thread
  reserves the record's place under a lock only the writers take, then writes header and payload
  with one ``pwritev``; the record is accounted in the index (which then names it) only after that
  returned: a torn append is never named, so never served.  A pack is only ever appended to: an
  offset the index names always holds its record, which is what lets readers keep what they know
  of the packs without asking the index again.  A full pack (``pack_bytes``) is left, and a pack
  whose appender died is taken over by the next process that needs one (at its end, and only if
  that end is past every record the index names in it).
* **Reading.** A record is read with one ``pread`` of its payload on the pack's descriptor, kept
  open per process.  Where a record is: the index (one query), or a reader's own table loaded in
  bulk (_hits.py), refreshed when :class:`Generation` says records were added or packs removed.
* **Removing.** Space is freed a pack at a time (LRU of packs, _index.py ``pop_lru``); an object
  removed alone leaves its record dead in its pack until the pack goes (a pack whose last live
  record goes, goes too).  Every process lets go of a removed pack once it sees the removal (its
  accounting thread looks every second): the descriptor is pointed at ``/dev/null`` at once
  (``dup2``: the pack's space is freed, and a read racing with it finds nothing, never other
  bytes), and closed ``RETIRE_AFTER`` seconds later (a thread may be between taking the
  descriptor's number and reading it: a number closed at once could be reused by another open).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import random
import struct
import threading
import time
import zlib
from typing import TYPE_CHECKING, NamedTuple

from manyfiles._core.checkpoints import reached
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Packed, Version

if TYPE_CHECKING:
    from manyfiles.cache._index import Index

PACK_MAX_OBJECT = 1 << 20          # objects up to this are packed (docs/benchmarks.md: the measurement)
PACK_BYTES = 256 << 20             # a pack is left for a new one once it would grow past this
MIN_PACK_BYTES = 64 << 10          # ... at least (a small cache's: packs are the unit of eviction)
RETIRE_AFTER = 5.0                 # seconds a removed pack's descriptor stays open (see the module docs)
_GEN = struct.Struct("<QQ")        # records accounted (batches), packs removed
_O_READ = os.O_RDONLY | os.O_CLOEXEC


class Generation:
    """Two counters every process of the cache shares through one small mapped file: batches of
    records accounted, and packs removed.  A reader compares them with what it saw last (a memory
    read, no system call); a writer bumps them under ``flock``."""

    def __init__(self, path: str) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            if os.fstat(fd).st_size < _GEN.size:
                os.ftruncate(fd, _GEN.size)
            self._map = mmap.mmap(fd, _GEN.size)
        finally:
            os.close(fd)
        self._lock_fd: int | None = None

    def read(self) -> tuple[int, int]:
        return _GEN.unpack_from(self._map)

    def bump(self, added: int = 0, removed: int = 0) -> None:
        pid = os.getpid()
        if self._lock_fd is None or self._lock_pid != pid:
            # (a descriptor of this process's own: a lock on one inherited across fork is shared)
            self._lock_fd, self._lock_pid = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC), pid
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            a, r = _GEN.unpack_from(self._map)
            _GEN.pack_into(self._map, 0, a + added, r + removed)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)


class Location(NamedTuple):
    """Where a packed object's record is."""

    pack: int
    offset: int
    length: int
    crc: int


class _Active:
    """The pack this process appends to: its descriptor (holding the ``flock``), where the next
    record goes, and the writes in flight (its descriptor is closed after the last one)."""

    def __init__(self, pack: int, fd: int, end: int, cleared: int) -> None:
        self.pack, self.fd, self.end, self.cleared = pack, fd, end, cleared
        self.inflight = 0
        self.retired = False


class Packs:
    """The packs of one cache directory, seen from one process: appending, reading, removing."""

    def __init__(self, root: str, index: Index, *, pack_bytes: int = PACK_BYTES) -> None:
        self.root = root
        self.dir = os.path.join(root, fmt.PACKS)
        os.makedirs(self.dir, exist_ok=True)
        self.index = index
        self.pack_bytes = pack_bytes
        self.generation = Generation(os.path.join(self.dir, "generation"))
        self._active: _Active | None = None
        self.after_fork()

    def after_fork(self) -> None:
        """What belongs to one process.  A forked child must not append to its parent's pack (the
        ``flock`` is shared across fork): it lets go of its copy and takes a pack of its own."""
        active = getattr(self, "_active", None)
        if active is not None and getattr(self, "_pid", os.getpid()) != os.getpid():
            with contextlib.suppress(OSError):
                os.close(active.fd)
        self._pid = os.getpid()
        self._active = None
        self._append_lock = threading.Lock()      # the appenders' (writer threads); no reader takes it
        self._fds: dict[int, int] = {}            # pack -> read descriptor (inherited ones stay valid)
        self._gone: set[int] = set()              # packs found removed
        self._retired: list[tuple[int, float]] = []
        self._fd_lock = threading.Lock()
        self._removed_seen = self.generation.read()[1]
        #: records appended here and not accounted yet: objid -> Location (readers find them here)
        self.pending: dict[bytes, Location] = {}

    def path(self, pack: int) -> str:
        return os.path.join(self.root, fmt.pack_relpath(pack))

    # -- appending (writer threads) ------------------------------------------------------------------

    def append(self, version: Version, data: bytes | memoryview, method: str, claim: str,
               nblocks: int, crc: int | None = None) -> Packed:
        """Append ``data`` (the whole object ``version``, checked by ``method``) as one record;
        returns its accounting record.  Raises OSError (the caller drops the fill)."""
        n = len(data)
        crc = zlib.crc32(data) if crc is None else crc
        with self._append_lock:
            a = self._active
            if a is None or (a.end + fmt.RECORD_HEADER_SIZE + n > self.pack_bytes
                             and a.end > fmt.PACK_HEADER_SIZE):
                a = self._next_pack()
            offset = a.end
            a.end += fmt.RECORD_HEADER_SIZE + n
            a.inflight += 1
        try:
            record = [memoryview(fmt.record_header(version.objid, offset, data, crc)), memoryview(data)]
            reached("pack-append", (a.fd, tuple(record), offset))
            _write_all(a.fd, record, offset)
            reached("pack-written")
        finally:
            with self._append_lock:
                a.inflight -= 1
                if a.retired and not a.inflight:
                    os.close(a.fd)
        loc = Location(a.pack, offset, n, crc)
        self.pending[version.objid] = loc
        return Packed(version, a.pack, offset, n, crc, method, claim, nblocks, a.cleared)

    def accounted(self, fills: list[Packed], seen: set[int], lost: set[int]) -> None:
        """The index now names ``fills`` (or lost them with their pack): not pending any more.
        ``seen``: packs that have their row; ``lost``: packs removed under their appender."""
        for f in fills:
            if self.pending.get(f.version.objid) == (f.pack, f.offset, f.length, f.crc):
                self.pending.pop(f.version.objid, None)
        with self._append_lock:
            a = self._active
            if a is not None and a.pack in lost:
                self._retire(a)
                self._active = None
        if seen:
            self.generation.bump(added=1)

    def _retire(self, a: _Active) -> None:
        a.retired = True
        if not a.inflight:
            os.close(a.fd)

    def _next_pack(self) -> _Active:
        """Leave the current pack (full) for another: one whose appender died, else a new one."""
        if self._active is not None:
            self._retire(self._active)
            self._active = None
        self._active = self._adopt() or self._create()
        return self._active

    def _create(self) -> _Active:
        cleared = self.index.cleared()
        while True:
            pack = random.getrandbits(63) or 1
            path = self.path(pack)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                continue
            except FileNotFoundError:      # packs/ removed under us (a clear of an old version)
                os.makedirs(self.dir, exist_ok=True)
                continue
            break
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_all(fd, [memoryview(fmt.pack_file_header(pack))], 0)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return _Active(pack, fd, fmt.PACK_HEADER_SIZE, cleared)

    def _adopt(self) -> _Active | None:
        """A pack the index accounts, not full, that no live process holds, whose file ends past
        every record the index names in it (a file cut short, by a power loss, is not appended to:
        its records would be overwritten)."""
        try:
            cleared = self.index.cleared()
            rows = sorted((r for r in self.index.packs() if r.size < self.pack_bytes * 3 // 4),
                          key=lambda r: -r.size)
        except Exception:
            return None
        for r in rows[:16]:
            try:
                fd = os.open(self.path(r.id), os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            try:
                end = os.fstat(fd).st_size
                ok = (fmt.pack_file_id(os.pread(fd, fmt.PACK_HEADER_SIZE, 0)) == r.id
                      and end >= self._indexed_end(r.id) and end < self.pack_bytes)
            except OSError:
                ok = False
            if ok:
                return _Active(r.id, fd, end, cleared)
            os.close(fd)
        return None

    def _indexed_end(self, pack: int) -> int:
        records = self.index.pack_records(pack)
        if not records:
            return fmt.PACK_HEADER_SIZE
        _, offset, length, _ = records[-1]
        return offset + fmt.RECORD_HEADER_SIZE + length

    def close(self) -> None:
        """Let go of the pack this process appends to (its ``flock``: another process may take it)."""
        with self._append_lock:
            if self._active is not None:
                self._retire(self._active)
                self._active = None

    # -- reading -------------------------------------------------------------------------------------

    def locate(self, objid: bytes) -> Location | None:
        """Where ``objid``'s record is: appended here and not accounted yet, else as the index says."""
        loc = self.pending.get(objid)
        if loc is not None:
            return loc
        row = self.index.packed(objid)
        return None if row is None else Location(*row)

    def fd(self, pack: int) -> int | None:
        """A read descriptor on ``pack``, kept open; None if the pack is gone."""
        fd = self._fds.get(pack)
        if fd is not None:
            return fd
        if pack in self._gone:
            return None
        with self._fd_lock:
            fd = self._fds.get(pack)
            if fd is None:
                try:
                    fd = os.open(self.path(pack), _O_READ)
                except FileNotFoundError:
                    self._gone.add(pack)
                    return None
                self._fds[pack] = fd
        return fd

    def read(self, loc: Location) -> bytes | None:
        """The payload of the record at ``loc`` (one ``pread``), or None if its pack is gone or cut short."""
        self.sync()
        fd = self.fd(loc.pack)
        if fd is None:
            return None
        data = os.pread(fd, loc.length, loc.offset + fmt.RECORD_HEADER_SIZE)
        return data if len(data) == loc.length else None

    def read_record(self, loc: Location, objid: bytes, *, fresh: bool = False) -> bytes | None:
        """The payload at ``loc`` after checking its record: header (this object, this place) and
        CRC-32 (``verify=True``, ``cache verify``); None if it fails or is gone.  ``fresh``: on a
        descriptor opened for it (not one kept open, which a removal may have emptied)."""
        if fresh:
            try:
                fd = os.open(self.path(loc.pack), _O_READ)
            except FileNotFoundError:
                return None
            try:
                raw = os.pread(fd, fmt.RECORD_HEADER_SIZE + loc.length, loc.offset)
            finally:
                os.close(fd)
        else:
            fd = self.fd(loc.pack)
            if fd is None:
                return None
            raw = os.pread(fd, fmt.RECORD_HEADER_SIZE + loc.length, loc.offset)
        if not fmt.record_sound(raw, objid, loc.offset, loc.length):
            return None
        return raw[fmt.RECORD_HEADER_SIZE:]

    def sync(self) -> None:
        """If packs were removed since this process last looked: retire their descriptors (closed
        ``RETIRE_AFTER`` seconds later), so that their space is freed."""
        removed = self.generation.read()[1]
        if removed == self._removed_seen and not self._retired:
            return
        now = time.monotonic()
        with self._fd_lock:
            if removed != self._removed_seen:
                self._removed_seen = removed
                try:
                    live = {r.id for r in self.index.packs()}
                except Exception:
                    live = None
                if live is not None:
                    # (a pack not in the index may be one whose first records are not accounted yet,
                    # read here from ``pending``: its descriptor goes, but it is not taken for gone --
                    # the next read opens it again, or finds it removed)
                    for pack in [p for p in self._fds if p not in live]:
                        self._retired.append((_emptied(self._fds.pop(pack)), now))
            keep = []
            for fd, at in self._retired:
                if now - at >= RETIRE_AFTER:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                else:
                    keep.append((fd, at))
            self._retired = keep

    def forget(self, pack: int) -> None:
        """``pack`` was removed by this process: no more reads of it here."""
        self._gone.add(pack)
        with self._fd_lock:
            fd = self._fds.pop(pack, None)
            if fd is not None:
                self._retired.append((_emptied(fd), time.monotonic()))

    # -- removing ------------------------------------------------------------------------------------

    def unlink(self, pack: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(pack))
        with self._append_lock:
            if self._active is not None and self._active.pack == pack:    # ours: its space is freed now
                self._retire(self._active)
                self._active = None
        self.forget(pack)

    def removed(self, n: int) -> None:
        """``n`` packs were removed from the index (and their files unlinked): readers re-check."""
        if n:
            self.generation.bump(removed=n)

    def files(self) -> dict[int, str]:
        """pack id -> path of every pack file in the directory."""
        out = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self.dir) as it:
            for e in it:
                pack = fmt.pack_id_of(e.name)
                if pack is not None:
                    out[pack] = e.path
        return out

    def held_by_a_live_process(self, path: str) -> bool:
        """Does a process hold this pack to append to it (its ``flock``)?"""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        finally:
            os.close(fd)       # (closing it releases the lock we may have taken)
        return False


def _emptied(fd: int) -> int:
    """Point ``fd`` at ``/dev/null`` (the file it was on is let go of: a removed pack's space is
    freed; a read of it now finds nothing); returns ``fd``, still to be closed."""
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    return fd


def _write_all(fd: int, views: list[memoryview], offset: int) -> None:
    """``pwritev`` every byte of ``views`` at ``offset`` (a short write is continued)."""
    while views:
        n = os.pwritev(fd, views, offset)
        offset += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]
