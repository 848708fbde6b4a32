"""One cache directory: its files (whole files, packs, block files, temp files) and what looks after them.

Readers call :meth:`BlockStore.open_whole` (a hit on an object held whole in its own file: one
``open``), :meth:`BlockStore.read_packed` (a small object held whole as a record of a pack: one
``pread``, _packs.py) or :meth:`BlockStore.open_block` (one ``open`` and one ``pread`` of the
header) and hand what they fetched from the origin to the write-behind (:attr:`BlockStore.fills`,
_fills.py), which never blocks them.

An object held whole and checked is in one of two stores that answer the same questions (is it
held, read it, write it, remove it): its own *whole file* (larger objects) or a *record* in a pack
(objects up to ``PACK_MAX_OBJECT``: :attr:`BlockStore.packs`).  Everything above this module asks
:meth:`BlockStore.held_whole` and reads through the one that holds it.

The store holds the directory's other parts too: its index (:attr:`BlockStore.index`, _index.py),
this process's batched counters (:attr:`BlockStore.counters`, _counters.py) and its space, the
watermarks and LRU eviction (:attr:`BlockStore.space`, _space.py).

A file being read is never taken away from its reader: readers hold an open descriptor, and
an unlinked file's data lives until its last descriptor is closed.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import shutil
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from manyfiles._core.procs import pid_alive
from manyfiles.cache import _format as fmt
from manyfiles.cache._counters import Counters
from manyfiles.cache._format import trace
from manyfiles.cache._index import Fill, Index, Version, Victim, Whole, bits_set, block_disk_bytes
from manyfiles.cache._packs import PACK_MAX_OBJECT, Location, Packs
from manyfiles.errors import IntegrityError, ManyfilesError, from_oserror

if TYPE_CHECKING:
    from manyfiles.cache._fills import Fills
    from manyfiles.cache._space import Space

DEGRADED_RETRY = 30.0                # seconds of pass-through after the cache disk failed
STALE_TEMP_AGE = 3600.0
_O_READ = os.O_RDONLY | os.O_CLOEXEC
_O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class BlockStore:
    """One cache directory's files and index: the file layer
    (:class:`~manyfiles.cache._blockfiles.BlockFiles`) under the write-behind, counters and space that
    the Cache builds over it (:meth:`attach`)."""

    space: Space
    fills: Fills
    counters: Counters

    def __init__(self, root: str | os.PathLike, *, block_size: int | None = None,
                 verify: bool = False) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.verify = verify
        try:
            desc = fmt.open_dir(self.root, block_size)
            self.block_size = int(desc["block_size"])
            self.index = Index(os.path.join(self.root, fmt.INDEX), self.block_size)
            fmt.upgrade_descriptor(self.root, desc)       # (after the index: it is migrated first)
            self.packs = Packs(self.root, self.index)
            self.index.on_removed = self.unlink_victims
            self.index.on_disk = self._on_disk
        except OSError as exc:
            raise from_oserror(exc, self.root) from exc
        except sqlite3.DatabaseError as exc:
            raise ManyfilesError(f"{self.root}: cannot use the cache index: {exc}") from exc
        self.tmp = os.path.join(self.root, fmt.TMP)
        self._temp_names = itertools.count()
        self._degraded_until = 0.0
        self._warned = False
        self._checked: set[tuple[bytes, int, int]] = set()     # (objid, index, inode) CRC-checked here
        clean_stale_temps(self.tmp)

    def attach(self, space: Space, fills: Fills, counters: Counters) -> None:
        """The parts built over these files (by the Cache: :func:`manyfiles.cache._cache.open_store`)."""
        self.space, self.fills, self.counters = space, fills, counters
        self.packs.pack_bytes = space.pack_bytes()

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker) has none of the parent's threads: fresh locks and batches."""
        self.packs.after_fork()
        self.counters.after_fork()
        self.space.after_fork()
        self.fills.after_fork()

    # -- the files ----------------------------------------------------------------------------------

    def block_path(self, objid: bytes, index: int) -> str:
        return os.path.join(self.root, fmt.block_relpath(objid, index))

    def whole_path(self, objid: bytes) -> str:
        return os.path.join(self.root, fmt.whole_relpath(objid))

    def has_block(self, objid: bytes, index: int) -> bool:
        return os.path.exists(self.block_path(objid, index))

    def has_whole(self, objid: bytes) -> bool:
        """Is ``objid`` held in its own whole file?"""
        return os.path.exists(self.whole_path(objid))

    def held_whole(self, objid: bytes, size: int) -> bool:
        """Is ``objid`` held whole and checked: its whole file, or a record in a pack?"""
        if self.has_whole(objid):
            return True
        if size > PACK_MAX_OBJECT:
            return False
        try:
            return self.packs.locate(objid) is not None
        except sqlite3.Error:
            return False

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
                if not self._has_check(objid):
                    # installed, not accounted yet (the write-behind is a moment behind): nothing to
                    # re-hash it against yet, so not used now; not discarded either
                    os.close(fd)
                    return None
                ok = self.whole_sound(objid, fd, size)
                if ok:
                    self._remember_checked((objid, -1, st.st_ino))
        except OSError:
            ok = False
        if not ok:
            self.discard_whole(objid, fd)
            os.close(fd)
            return None
        return fd

    def _has_check(self, objid: bytes) -> bool:
        try:
            return self.index.verification(objid) is not None
        except sqlite3.Error:
            return False

    def read_packed(self, objid: bytes, size: int) -> bytes | None:
        """The object if it is held as a record of a pack (one ``pread``), else None.  With
        ``verify``, the record's header and CRC-32 are checked once per record and process first
        (a record that fails is dropped: a miss)."""
        if size > PACK_MAX_OBJECT:
            return None
        try:
            loc = self.packs.locate(objid)
        except sqlite3.Error:
            return None
        if loc is None or loc.length != size:
            return None
        try:
            key = (objid, -2 - loc.offset, loc.pack)
            if self.verify and key not in self._checked:
                data = self.packs.read_record(loc, objid)
                if data is None:
                    named, data = self.reread_record(objid, loc)
                    if data is None:
                        if named:
                            self.discard_packed(objid, loc)
                        return None
                self._remember_checked(key)
                return data
            return self.packs.read(loc)
        except OSError:
            return None

    def reread_record(self, objid: bytes, loc: Location, sound: Callable[[bytes], bool] | None = None
                      ) -> tuple[bool, bytes | None]:
        """A record that failed its check, read again on a descriptor of its own and judged while
        this holds the index's write lock: a removal of its pack or of the object (another thread's
        or process's eviction) unlinks files and empties descriptors before its transaction commits,
        and none is in flight then.  Returns (the index still names it there, its payload if its
        record is sound now and the payload passes ``sound``, if given)."""
        try:
            with self.index.write():
                if self.index.packed(objid) != tuple(loc):
                    return False, None
                try:
                    data = self.packs.read_record(loc, objid, fresh=True)
                except OSError:
                    data = None
                return True, data if data is not None and (sound is None or sound(data)) else None
        except sqlite3.Error:
            return False, None

    def discard_packed(self, objid: bytes, loc: Location) -> None:
        """Forget a packed object whose record failed its check (its bytes stay dead in the pack)."""
        self.packs.pending.pop(objid, None)
        with contextlib.suppress(sqlite3.Error):
            self.index.remove_objects([objid])
        self.counters.count(corrupt=1)
        warnings.warn(f"{self.root}: corrupt cache record {objid.hex()} in pack {loc.pack:016x} dropped; "
                      "reading it from the origin", RuntimeWarning, stacklevel=3)

    def whole_sound(self, objid: bytes, fd: int, size: int) -> bool:
        """Does the whole file on ``fd`` still pass the check recorded for it?"""
        from manyfiles.s3.integrity import rehash_file

        return self._passes_check(objid, lambda claim: rehash_file(fd, size, claim))

    def packed_sound(self, objid: bytes, data: bytes) -> bool:
        """Do a packed object's bytes (its record's payload) still pass the check recorded for it?"""
        from manyfiles.s3.integrity import digest_for

        def rehash(claim: object) -> None:
            d = digest_for(claim, len(data), lambda off, n: data[off:off + n])
            d.stream(data)
            d.check()

        return self._passes_check(objid, rehash)

    def _passes_check(self, objid: bytes, rehash: Callable[[object], object]) -> bool:
        from manyfiles.s3.integrity import Claim

        check = self.index.verification(objid)
        if check is None or not check[1]:
            return False
        try:
            rehash(Claim.from_record(json.loads(check[1])))
        except (IntegrityError, ValueError, KeyError, OSError):
            return False
        return True

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
        self.counters.count(corrupt=1)
        warnings.warn(f"{self.root}: corrupt cache file {name} removed; reading it from the origin",
                      RuntimeWarning, stacklevel=4)

    # -- writing files ------------------------------------------------------------------------------

    def temp_path(self, suffix: str = "") -> str:
        return os.path.join(self.tmp, f"{os.getpid()}-{threading.get_native_id()}-{next(self._temp_names)}"
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

    def _on_disk(self, fill: Fill | Whole) -> bool:
        objid = fill.version.objid
        path = self.whole_path(objid) if isinstance(fill, Whole) else self.block_path(objid, fill.index)
        return os.path.exists(path)

    def fill_record(self, version: Version, index: int) -> Fill:
        """The accounting record of block ``index`` of ``version`` (once it is in place)."""
        return Fill(version, index, block_disk_bytes(version.size, index, self.block_size),
                    self.nblocks(version.size))

    def remove_object(self, objid: bytes, size: int) -> None:
        """Remove a version from the index and the disk (its whole file and every block; a record
        stays dead in its pack)."""
        self.packs.pending.pop(objid, None)
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

    def flush(self) -> None:
        """Wait until every queued fill is written and accounted, then flush the counters."""
        self.fills.flush()
        self.counters.flush()

    def close(self) -> None:
        self.fills.close()
        self.packs.close()
        self.counters.flush()
        self.index.close()

    def unlink_victims(self, victims: list[Victim]) -> None:
        """Remove the files of entries the index no longer lists (evicted, superseded): whole
        files, blocks, whole packs (an object removed alone leaves its record dead in its pack)."""
        packs = 0
        for v in victims:
            t0 = time.monotonic_ns()
            if v.is_pack:
                self.packs.unlink(v.pack)
                packs += 1
            elif v.pack is not None:
                self.packs.pending.pop(v.objid, None)
            elif v.whole:
                self._unlink(self.whole_path(v.objid))
            else:
                for i in bits_set(v.present):
                    self.unlink_block(v.objid, i)
            trace("cache.evict", v.objid.hex() if v.objid else f"pack:{v.pack:016x}", 0, v.disk_bytes, t0)
        self.packs.removed(packs)


def clean_stale_temps(tmp: str) -> int:
    """Remove what killed processes left in ``tmp`` (their pid is gone, or it is old); returns how many."""
    now = time.time()
    me = str(os.getpid())
    removed = 0
    with contextlib.suppress(OSError), os.scandir(tmp) as it:
        for e in it:
            pid = e.name.partition("-")[0]
            try:
                dead = not pid.isdigit() or not pid_alive(int(pid))
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

