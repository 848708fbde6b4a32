"""The file objects ``mf.open(..., "rb")`` returns.

* :func:`whole_file`: an object the cache holds whole (checked): the stdlib's own file object
  on its whole file (``io.FileIO``, in an ``io.BufferedReader`` as ``open()`` makes it); reads,
  seeks and random reads cost what a local file's cost, with no Python of ours per read.
* :class:`MemoryFile`: an object up to ``verify_whole_max`` that was just fetched whole and
  checked (the cache writes it behind the reader's back).
* :class:`CachedReader`: a larger object not held whole: blocks from the cache, from the one
  whole-object GET a cold open started (read ahead by a pump thread and written behind into the
  object's whole file, installed once the object passed its check), or by ranged GETs.  A
  ranged block that nothing could check is served (not with ``strict``), kept as unverified,
  and its object is completed and checked whole in the background (_complete.py).

Without a cache (``store`` None) the same reader serves S3 objects straight from the origin;
its random reads then fetch only the bytes asked for.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Any

from manyfiles.cache._format import HEADER_SIZE, RECORD_HEADER_SIZE
from manyfiles.cache._index import Version
from manyfiles.cache._store import BlockStore
from manyfiles.errors import IntegrityError, ManyfilesError
from manyfiles.trace import iotrace

KEEP_FETCHED = 2      # blocks fetched from the origin kept in memory per reader
OPEN_BLOCKS = 16      # cached blocks kept open per reader (random reads skip the open/header read)


def whole_file(fd: int, name: str, size: int) -> io.FileIO:
    """The whole file of a cached object: the stdlib's own ``io.FileIO`` (exactly that type, so
    that an ``io.BufferedReader`` over it takes its fast paths), named after the source."""
    f = io.FileIO(fd, "rb", closefd=True)
    f.name = name
    f.size = size  # type: ignore[attr-defined]
    return f


class MemoryFile(io.BytesIO):
    """A whole object in memory (just fetched and checked), named after the source."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name
        self.size = len(data)

    @property
    def raw(self) -> MemoryFile:
        return self


class CachedReader(io.RawIOBase):
    """Seekable raw binary reader of one version of one source (wrap in io.BufferedReader).

    ``origin_reader``: ranged reads of this version (``fetch``; ``part_spans`` for S3);
    ``stream``: the whole-object read a cold open started (its first bytes unread); ``open_stream``:
    how to start one if the first read is at the start (a cold local file);
    ``on_unverified(version)``: called once when an unverified block was kept (the cache then
    completes the object in the background); ``complete_now()``: a strict reader's way to
    unverified bytes it must not hand out (the object checked whole, then read from its file).
    """

    def __init__(self, origin: Any, version: Version, *, store: BlockStore | None, block_size: int,
                 pool: Executor, origin_reader: Any, prefetch: int = 4, stream: Any = None,
                 strict: bool = False, max_part: int = 0,
                 on_unverified: Callable[[Version], None] | None = None,
                 complete_now: Callable[[], None] | None = None,
                 open_stream: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self.name = origin.display
        self.size = version.size
        self._v = version
        self._store = store
        self._bs = block_size
        self._nblocks = -(-version.size // block_size)
        self._pool = pool
        self._origin = origin_reader
        self._max_ahead = max(0, prefetch)
        self._strict = strict
        self._max_part = max_part
        self._parts: tuple[int, ...] | bool | None = False     # False: not asked yet
        self._on_unverified = on_unverified
        self._complete_now = complete_now
        self._told = False
        self._pos = 0
        self._fds: OrderedDict[int, int] = OrderedDict()    # block index -> open block file
        self._whole_fd: int | None = None
        self._whole_base = 0          # where the object starts in that file (in a pack: its record's payload)
        self._whole_owned = True      # ours to close (a pack's descriptor is the store's)
        self._fetched: OrderedDict[int, bytes] = OrderedDict()
        self._pending: dict[int, Future] = {}
        self._seq_end = 0           # where the previous read ended
        self._window = 1            # prefetch window, doubling on sequential reads
        self._ahead_from = 0        # blocks below this were already considered for prefetch
        self._hits = self._misses = self._hit_bytes = self._miss_bytes = 0
        self._pump: _Pump | None = None
        self._open_stream = open_stream
        if stream is not None:
            self._start_pump(stream)
        if store is not None:
            store.counters.note_access(version.objid, version.validated_at)

    def _start_pump(self, stream: Any) -> None:
        if self._store is not None and self._nblocks > 0 and not self._strict:
            futures = {j: Future() for j in range(self._nblocks)}
            self._pending.update(futures)
            self._pump = _Pump(stream, self._store, self._v, futures, self._bs, max(1, self._max_ahead))
        else:
            stream.close()

    # -- io.RawIOBase ------------------------------------------------------------------------------

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if self.closed:
            raise ValueError("seek of closed file")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence ({whence})")
        if pos < 0:
            raise OSError(22, "Invalid argument: negative seek position")
        self._pos = pos
        return pos

    def readinto(self, b: Any) -> int:
        if self.closed:
            raise ValueError("read of closed file")
        view = memoryview(b).cast("B")
        pos, size, bs = self._pos, self.size, self._bs
        if self._open_stream is not None:       # a cold file: streamed if read from its start
            opener, self._open_stream = self._open_stream, None
            if pos == 0:
                self._start_pump(opener())
        sequential = pos == self._seq_end
        fd = self._fds.get(pos // bs) if sequential else None
        if fd is not None and iotrace.TRACER is None:
            # More of a block already open (so its prefetch was considered when it was opened).
            index, off = divmod(pos, bs)
            if len(view) <= min(bs, size - index * bs) - off:
                got = os.preadv(fd, [view], HEADER_SIZE + off)
                if got == len(view):
                    self._hit_bytes += got
                    self._pos = self._seq_end = pos + got
                    return got
        if not sequential and (self._pending or self._ahead_from or self._pump is not None):
            self._restart_prefetch()
        done = 0
        n = len(view)
        while done < n and pos < size:
            index, off = divmod(pos, bs)
            length = min(bs, size - index * bs)
            take = min(n - done, length - off)
            dst = view[done:done + take]
            data = self._fetched.get(index)
            if data is None and index in self._pending:
                data = self._from_origin(index, length)
            if data is not None:
                dst[:] = memoryview(data)[off:off + take]
            elif not self._read_cached(index, off, dst, length):
                if self._store is None and not sequential:
                    dst[:] = self._origin.fetch(pos, take).data     # pass-through: just these bytes
                    self._misses += 1
                    self._miss_bytes += take
                else:
                    data = self._from_origin(index, length)
                    dst[:] = memoryview(data)[off:off + take]
            if sequential and self._max_ahead and self._pump is None:
                self._prefetch(index)
            done += take
            pos += take
        self._pos = self._seq_end = pos
        return done

    def readall(self) -> bytes:
        out = bytearray(max(0, self.size - self._pos))
        got = 0
        while got < len(out):
            n = self.readinto(memoryview(out)[got:])
            if not n:
                break
            got += n
        del out[got:]
        return bytes(out)

    def close(self) -> None:
        if self.closed:
            return
        if self._pump is not None:
            self._pump.stop()
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()
        self._fetched.clear()
        self._close_fds()
        self._origin.close()
        if self._store is not None:
            # one object read: a hit if no byte of it came from the origin
            objects = ({"object_misses": 1} if self._misses else
                       {"object_hits": 1} if self._hit_bytes else {})
            self._store.counters.count(hits=self._hits, misses=self._misses, hit_bytes=self._hit_bytes,
                              miss_bytes=self._miss_bytes, **objects)
        self._hits = self._misses = self._hit_bytes = self._miss_bytes = 0
        super().close()

    # -- blocks ------------------------------------------------------------------------------------

    def _read_cached(self, index: int, off: int, dst: memoryview, length: int) -> bool:
        """Copy from the cache into ``dst``; False on a miss (or an unverified block, when strict)."""
        store = self._store
        if store is None:
            return False
        tr = iotrace.TRACER
        t0 = time.monotonic_ns() if tr is not None else 0
        fd = self._fds.get(index)
        base = HEADER_SIZE
        if fd is None:
            wfd = self._whole()
            if wfd is not None:
                fd, base = wfd, self._whole_base + index * self._bs
            else:
                got = store.open_block(self._v.objid, index, length)
                if got is not None and not got[1] and self._strict:
                    os.close(got[0])
                    got = None
                if got is None:
                    return self._read_queued(index, off, dst, tr, t0, length)
                fd = got[0]
                if not got[1]:
                    self._unverified()
                self._fds[index] = fd
                if len(self._fds) > OPEN_BLOCKS:
                    os.close(self._fds.popitem(last=False)[1])
            self._hits += 1
        got = os.preadv(fd, [dst], base + off)
        if got != len(dst):          # truncated on disk: drop it, read from the origin
            if base == HEADER_SIZE:
                store.discard(self._v.objid, index, fd)
                os.close(self._fds.pop(index))
            return False
        self._hit_bytes += got
        if tr is not None:
            tr.record("cache.hit", self._v.source, index * self._bs + off, got, t0,
                      time.monotonic_ns() - t0, 0)
        return True

    def _read_queued(self, index: int, off: int, dst: memoryview, tr: Any, t0: int, length: int) -> bool:
        queued = self._store.fills.queued(self._v.objid, index, checked_only=self._strict)
        if queued is not None:         # fetched a moment ago, not on disk yet
            dst[:] = memoryview(queued)[off:off + len(dst)]
            self._hits += 1
            self._hit_bytes += len(dst)
            return True
        if tr is not None:
            tr.record("cache.miss", self._v.source, index * self._bs, length, t0, time.monotonic_ns() - t0, 0)
        return False

    def _whole(self) -> int | None:
        """A descriptor on the object held whole, once it is (a completion installed it): its whole
        file, or the pack holding its record."""
        if self._whole_fd is None:
            store = self._store
            self._whole_fd = store.open_whole(self._v.objid, self.size)
            if self._whole_fd is None and store.held_whole(self._v.objid, self.size):
                loc = store.packs.locate(self._v.objid)
                fd = store.packs.fd(loc.pack) if loc is not None and loc.length == self.size else None
                if fd is not None:
                    self._whole_fd, self._whole_owned = fd, False
                    self._whole_base = loc.offset + RECORD_HEADER_SIZE
            if self._whole_fd is not None:
                self._close_block_fds()
        return self._whole_fd

    def _unverified(self) -> None:
        if not self._told and self._on_unverified is not None:
            self._told = True
            self._on_unverified(self._v)

    def _close_block_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

    def _close_fds(self) -> None:
        self._close_block_fds()
        if self._whole_fd is not None:
            if self._whole_owned:
                os.close(self._whole_fd)
            self._whole_fd = None

    def _from_origin(self, index: int, length: int) -> bytes:
        fut = self._pending.pop(index, None)
        if self._pump is not None:
            self._pump.reading(index)
        try:
            data = fut.result() if fut is not None else None
        except IntegrityError:      # what this reader holds of the object is suspect too
            self._fetched.clear()
            raise
        if data is None:            # not asked for yet, or the stream gave up on it
            data = self._fetch(index, length)
        self._misses += 1
        self._miss_bytes += length
        self._fetched[index] = data
        while len(self._fetched) > KEEP_FETCHED:
            self._fetched.popitem(last=False)
        return data

    def _part_spans(self) -> tuple[int, ...] | None:
        if self._parts is False:
            spans = getattr(self._origin, "part_spans", None)
            self._parts = spans(self._max_part) if spans is not None and self._store is not None else None
        return self._parts  # type: ignore[return-value]

    def _fetch(self, index: int, length: int) -> bytes:
        """Fetch a block from the origin and queue it for the cache (runs in prefetch threads too)."""
        start = index * self._bs
        parts = self._part_spans()
        if parts:
            return self._fetch_parts(index, parts)
        piece = self._origin.fetch(start, length)
        if not piece.checked and self._strict:
            return self._checked_whole(index, length)
        store = self._store
        if store is not None:
            store.fills.block(self._v, index, piece.data, checked=piece.checked)
            if not piece.checked:
                self._unverified()
        return piece.data

    def _fetch_parts(self, index: int, parts: tuple[int, ...]) -> bytes:
        """The parts covering block ``index``, each checked against its own checksum; every block
        they cover whole is kept (checked)."""
        start, end = index * self._bs, min(self.size, (index + 1) * self._bs)
        pos, pieces, checked = 0, [], True
        for size in parts:
            if pos + size > start and pos < end:
                piece = self._origin.fetch(pos, size, part=True)
                pieces.append((pos, piece.data))
                checked = checked and piece.checked
            pos += size
        if not checked and self._strict:
            return self._checked_whole(index, end - start)
        lo = pieces[0][0]
        span = b"".join(p[1] for p in pieces)
        store = self._store
        first, last = -(-lo // self._bs), (lo + len(span)) // self._bs
        if lo + len(span) == self.size:
            last = self._nblocks
        for j in range(first, last):
            a = j * self._bs - lo
            store.fills.block(self._v, j, span[a:a + self._bs], checked=checked)
        if not checked:
            self._unverified()
        a = start - lo
        return span[a:a + end - start]

    def _checked_whole(self, index: int, length: int) -> bytes:
        """Strict: the object checked whole first, then the block from its whole file."""
        if self._complete_now is None:
            raise IntegrityError(f"{self.name}: no check covers this range (strict)")
        self._complete_now()
        fd = self._whole()
        if fd is None:
            raise ManyfilesError(f"{self.name}: the cache could not keep the checked object (strict)")
        data = os.pread(fd, length, index * self._bs)
        if len(data) != length:
            raise ManyfilesError(f"{self.name}: the cached object is shorter than expected")
        return data

    def _restart_prefetch(self) -> None:
        """After a seek: blocks fetched ahead for the old position are not wanted any more, nor is
        the stream (the rest comes by range; what it read is not kept: it was not checked)."""
        if self._pump is not None:
            self._pump.stop()
            self._pump = None
        for fut in self._pending.values():
            fut.cancel()          # a fetch already running still fills the cache
        self._pending.clear()
        self._ahead_from = 0
        self._window = 1

    def _prefetch(self, index: int) -> None:
        """Start fetching the blocks after ``index`` that are neither cached nor on their way."""
        first = max(index + 1, self._ahead_from)
        last = min(index + 1 + self._window, self._nblocks)
        if first >= last:
            return
        store = self._store
        if store is not None and self._whole() is not None:
            return
        for j in range(first, last):
            if j in self._pending or j in self._fetched:
                continue
            if store is not None and (store.fills.queued(self._v.objid, j) is not None
                                      or store.has_block(self._v.objid, j)):
                continue
            length = min(self._bs, self.size - j * self._bs)
            self._pending[j] = self._pool.submit(self._fetch, j, length)
        self._ahead_from = last
        self._window = min(self._window * 2, self._max_ahead)


class _Pump(threading.Thread):
    """Reads the blocks of a whole-object GET in order, at most ``ahead`` blocks ahead of the
    reader; each block goes to its Future and, behind the reader, into the object's whole file.
    The last block comes (to the reader and the file) only after the object passed its check; then the whole
    file is installed.  On a network error the remaining Futures get None (the reader fetches
    those blocks by range) and nothing is kept; on a failed check the last block's Future raises
    IntegrityError."""

    def __init__(self, stream: Any, store: BlockStore, version: Version, futures: dict[int, Future],
                 block_size: int, ahead: int) -> None:
        super().__init__(name="manyfiles-cache-stream", daemon=True)
        self._stream, self._store, self._v = stream, store, version
        self._futures = futures
        self._bs = block_size
        self._ahead = ahead
        self._cond = threading.Condition()
        self._at = 0            # the block the reader is at
        self._stopped = False
        self._writer = store.fills.writer(version)
        self.start()

    def reading(self, index: int) -> None:
        if index > self._at:
            with self._cond:
                self._at = index
                self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._stream.interrupt()    # a read blocked on a stalled server returns now (nothing kept)

    def run(self) -> None:
        stream, writer, futures = self._stream, self._writer, self._futures
        buffers = self._store.fills.buffers
        bs, size = self._bs, self._v.size
        # Straight into the whole file where the stream can (plain HTTP) and the file has its room:
        # the kernel moves each block into the file's pages, and the reader reads it from there.
        landing = getattr(stream, "readinto_file", None)
        fd = writer.landing_fd() if landing is not None else None
        fut = None
        try:
            for j in range(max(futures) + 1):
                with self._cond:
                    self._cond.wait_for(lambda j=j: self._stopped or j <= self._at + self._ahead)
                    if self._stopped:
                        return
                fut = futures.pop(j)        # (once settled, only the reader holds it, and its block)
                n = min(bs, size - j * bs)
                data = landing(fd, n) if fd is not None else None
                if data is None:
                    fd = None
                    buf = buffers.get()     # received into a recycled buffer: no copy, no fresh pages
                    data = buf if n == len(buf) else memoryview(buf)[:n]
                    if stream.readinto(data) != n:  # the last block only once the object passed its check
                        raise ManyfilesError(f"{self._v.source!r}: the stream ended early")
                elif len(data) != n:
                    raise ManyfilesError(f"{self._v.source!r}: the stream ended early")
                if fd is not None:
                    writer.landed()         # in the file already
                    if stream.claim is not None:    # the last block, checked: the file is installed
                        writer.seal(stream.method, stream.claim)    # before the reader has it
                _settle(fut, data)
                fut = None
                if fd is None:
                    writer.part(j * bs, data)   # dropped when the queue is full: then nothing is kept
            if writer.sealed is None:
                writer.seal(stream.method, stream.claim)
        except IntegrityError as exc:   # the whole object is not what the server says it is
            if fut is not None:
                _settle(fut, exc=exc)
        except Exception:           # the stream broke: the reader fetches the rest by range
            pass
        finally:
            if fut is not None:
                _settle(fut, None)
            for f in futures.values():
                _settle(f, None)
            futures.clear()
            if writer.sealed is None:
                writer.abort()
            stream.close()


def _settle(fut: Future, data: bytes | None = None, exc: BaseException | None = None) -> None:
    with contextlib.suppress(InvalidStateError):     # cancelled by a seek or close
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(data)
