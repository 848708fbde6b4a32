"""The file object ``mf.open(..., "rb")`` returns: a seekable raw reader over blocks.

Each block comes, in this order, from the few blocks this reader fetched last (kept in
memory), from the cache (a descriptor on the block file: ``preadv`` straight into the
caller's buffer), or from the origin.  What comes from the origin goes to the caller at
once and to the cache in the background.  Sequential reading prefetches the next blocks
that are not cached yet, in a window that doubles up to ``prefetch`` blocks.

An object the cache has never seen is opened with one GET of the whole object
(:meth:`S3Origin.open_first`): a sequential reader then gets every block from that one
stream, read ahead by a pump thread (up to ``prefetch`` blocks), as a reader without a cache
would, instead of one ranged GET per block.  The stream is checked whole at its end (ETag
MD5, multipart ETag or S3 checksum): the last block is handed out, and cached, only after the
check passed; a failed check removes every block of the object from the cache and raises
:class:`~manyfiles.errors.IntegrityError` to the reader.  A seek elsewhere ends the stream (the
rest comes by ranged GETs, as before).

Without a cache (``store`` None) the same reader serves S3 objects straight from the
origin; its random reads then fetch only the bytes asked for.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Any

from manyfiles import iotrace
from manyfiles.cache._format import HEADER_SIZE
from manyfiles.cache._index import Version
from manyfiles.cache._store import BlockStore
from manyfiles.errors import IntegrityError

KEEP_FETCHED = 2      # blocks fetched from the origin kept in memory per reader
OPEN_BLOCKS = 16      # cached blocks kept open per reader (random reads skip the open/header read)


class CachedReader(io.RawIOBase):
    """Seekable raw binary reader of one version of one source (wrap in io.BufferedReader)."""

    def __init__(self, origin: Any, version: Version, *, store: BlockStore | None, block_size: int,
                 pool: Executor, prefetch: int = 4, first_block: bytes | None = None,
                 stream: Any = None, first_checked: bool = False) -> None:
        super().__init__()
        self.name = origin.display
        self.size = version.size
        self._origin = origin
        self._v = version
        self._store = store
        self._bs = block_size
        self._nblocks = -(-version.size // block_size)
        self._pool = pool
        self._max_ahead = max(0, prefetch)
        self._fetcher_obj: Any = None
        self._pos = 0
        self._fds: OrderedDict[int, int] = OrderedDict()    # block index -> open block file
        self._fetched: OrderedDict[int, bytes] = OrderedDict()
        self._pending: dict[int, Future] = {}
        self._seq_end = 0           # where the previous read ended
        self._window = 1            # prefetch window, doubling on sequential reads
        self._ahead_from = 0        # blocks below this were already considered for prefetch
        self._hits = self._misses = self._hit_bytes = self._miss_bytes = 0
        self._stream = stream if store is not None and self._nblocks > 1 else None
        self._pump: _Pump | None = None
        if stream is not None and self._stream is None:
            stream.close()
        if store is not None:
            store.note_access(version.objid, version.validated_at)
        if first_block is not None:     # fetched along with the validation (Cache.get_bytes)
            self._fetched[0] = first_block
            self._misses += 1
            self._miss_bytes += len(first_block)
            if store is not None:
                store.fill_async(version, 0, first_block, checked=first_checked)

    @property
    def _fetcher(self) -> Any:
        if self._fetcher_obj is None:           # only a miss needs one
            self._fetcher_obj = self._origin.fetcher(self._v.validator)
        return self._fetcher_obj

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
        sequential = pos == self._seq_end
        fd = self._fds.get(pos // bs) if sequential else None
        if fd is not None and iotrace.TRACER is None:
            # The hot path of a sequential reread: more of a block already open (so its prefetch
            # was considered when it was opened).  Reads at memory speed are bound by the Python
            # run per call under the GIL, so this one does the least it can.
            index, off = divmod(pos, bs)
            if len(view) <= min(bs, size - index * bs) - off:
                got = os.preadv(fd, [view], HEADER_SIZE + off)
                if got == len(view):
                    self._hit_bytes += got
                    self._pos = self._seq_end = pos + got
                    return got
        if not sequential and (self._pending or self._ahead_from or self._stream is not None):
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
                if self._store is None and not sequential and index not in self._pending:
                    dst[:] = self._fetcher.fetch(pos, take)     # pass-through random read: just these bytes
                    self._misses += 1
                    self._miss_bytes += take
                else:
                    data = self._from_origin(index, length)
                    dst[:] = memoryview(data)[off:off + take]
            if sequential and self._max_ahead:
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
        self._end_stream()
        for fut in self._pending.values():
            fut.cancel()
        self._pending.clear()
        self._fetched.clear()
        self._close_fds()
        if self._fetcher_obj is not None:
            self._fetcher_obj.close()
        if self._store is not None:
            # one object read: a hit if no byte of it came from the origin
            objects = ({"object_misses": 1} if self._misses else
                       {"object_hits": 1} if self._hit_bytes else {})
            self._store.count(hits=self._hits, misses=self._misses, hit_bytes=self._hit_bytes,
                              miss_bytes=self._miss_bytes, **objects)
        self._hits = self._misses = self._hit_bytes = self._miss_bytes = 0
        super().close()

    # -- blocks ------------------------------------------------------------------------------------

    def _read_cached(self, index: int, off: int, dst: memoryview, length: int) -> bool:
        """Copy from the cached block into ``dst``; False on a miss."""
        store = self._store
        if store is None:
            return False
        tr = iotrace.TRACER
        t0 = time.monotonic_ns() if tr is not None else 0
        fd = self._fds.get(index)
        if fd is None:
            fd = store.open_block(self._v.objid, index, length)
            if fd is None:
                queued = store.queued_block(self._v.objid, index)
                if queued is not None:         # fetched a moment ago, not on disk yet
                    dst[:] = memoryview(queued)[off:off + len(dst)]
                    self._hits += 1
                    self._hit_bytes += len(dst)
                    return True
                if tr is not None:
                    tr.record("cache.miss", self._v.source, index * self._bs, length, t0,
                              time.monotonic_ns() - t0, 0)
                return False
            self._fds[index] = fd
            if len(self._fds) > OPEN_BLOCKS:
                os.close(self._fds.popitem(last=False)[1])
            self._hits += 1
        got = os.preadv(fd, [dst], HEADER_SIZE + off)
        if got != len(dst):          # truncated on disk: drop it, read from the origin
            store.discard(self._v.objid, index, fd)
            os.close(self._fds.pop(index))
            return False
        self._hit_bytes += got
        if tr is not None:
            tr.record("cache.hit", self._v.source, index * self._bs + off, got, t0,
                      time.monotonic_ns() - t0, 0)
        return True

    def _close_fds(self) -> None:
        while self._fds:
            os.close(self._fds.popitem()[1])

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

    def _fetch(self, index: int, length: int) -> bytes:
        """Fetch a block from the origin and queue it for the cache (runs in prefetch threads too)."""
        data = self._fetcher.fetch(index * self._bs, length)
        if self._store is not None:
            self._store.fill_async(self._v, index, data)
        return data

    def _restart_prefetch(self) -> None:
        """After a seek: blocks fetched ahead for the old position are not wanted any more."""
        self._end_stream()
        for fut in self._pending.values():
            fut.cancel()          # a fetch already running still fills the cache
        self._pending.clear()
        self._ahead_from = 0
        self._window = 1

    def _end_stream(self) -> None:
        if self._pump is not None:
            self._pump.stop()
        elif self._stream is not None:
            self._stream.close()
        self._stream = None

    def _prefetch(self, index: int) -> None:
        """Start fetching the blocks after ``index`` that are neither cached nor on their way."""
        if self._stream is not None:
            if self._pump is None:      # the rest of the object comes from the open whole-object GET
                futures = {j: Future() for j in range(1, self._nblocks)}
                self._pending.update(futures)
                self._pump = _Pump(self._stream, self._store, self._v, futures, max(1, self._max_ahead))
            return
        first = max(index + 1, self._ahead_from)
        last = min(index + 1 + self._window, self._nblocks)
        if first >= last:
            return
        store = self._store
        for j in range(first, last):
            if j in self._pending or j in self._fetched:
                continue
            if store is not None and (store.queued_block(self._v.objid, j) is not None
                                      or store.has_block(self._v.objid, j)):
                continue
            length = min(self._bs, self.size - j * self._bs)
            self._pending[j] = self._pool.submit(self._fetch, j, length)
        self._ahead_from = last
        self._window = min(self._window * 2, self._max_ahead)


class _Pump(threading.Thread):
    """Reads the blocks of an open whole-object GET, in order, at most ``ahead`` blocks ahead of
    the reader; each block goes to its Future and to the cache.  The last one goes only after
    the whole-object check passed.  On a network error the remaining Futures get None (the
    reader fetches those blocks by range); on a failed check the object is rejected from the
    cache and the last block's Future raises IntegrityError."""

    def __init__(self, stream: Any, store: BlockStore, version: Version, futures: dict[int, Future],
                 ahead: int) -> None:
        super().__init__(name="manyfiles-cache-stream", daemon=True)
        self._stream, self._store, self._v = stream, store, version
        self._futures = futures
        self._ahead = ahead
        self._cond = threading.Condition()
        self._at = 0            # the block the reader is at
        self._stopped = False
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

    def run(self) -> None:
        stream, store, v = self._stream, self._store, self._v
        last = max(self._futures)
        j = 1
        try:
            for j in range(1, last + 1):
                with self._cond:
                    self._cond.wait_for(lambda j=j: self._stopped or j <= self._at + self._ahead)
                    if self._stopped:
                        return
                data = stream.next_block()
                if j == last:
                    method = stream.finish()
                    store.fill_async(v, j, data, checked=True)
                    store.mark_verified(v, method)
                else:
                    store.fill_async(v, j, data, checked=True)
                _settle(self._futures[j], data)
            j += 1
        except IntegrityError as exc:   # the whole object is not what the server says it is
            store.reject(v)
            _settle(self._futures[j], exc=exc)
            j += 1
        except Exception:           # the stream broke: the reader fetches the rest by range
            pass
        finally:
            for k in range(j, last + 1):
                _settle(self._futures[k], None)
            stream.close()


def _settle(fut: Future, data: bytes | None = None, exc: BaseException | None = None) -> None:
    with contextlib.suppress(InvalidStateError):     # cancelled by a seek or close
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(data)
