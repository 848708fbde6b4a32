"""The open path: one version of a source handed out as the reader that serves it.

How an open is served (docs/cache.md, "Integrity" and "Reading"), once the version is known
(_versions.py):

1. held whole (checked): the stdlib file object on its whole file (``io.FileIO``);
2. up to ``verify_whole_max``: fetched whole and checked before any byte reaches the reader
   (:class:`MemoryFile`), written behind;
3. larger: :class:`CachedReader` (a stream read ahead and checked at its end, cached blocks,
   ranged GETs checked per part where the store allows; with ``strict``, the object is checked
   whole before anything unverified would be handed out).

The background work that readers start is this module's too: the fetch threads (prefetches of
:class:`CachedReader`, imports from s3pull) and the completions of objects that got unverified
blocks (_complete.py).
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from manyfiles._core.retry import RetryPolicy, retrying
from manyfiles.cache import _format as fmt
from manyfiles.cache._complete import Completions, complete
from manyfiles.cache._index import Version
from manyfiles.cache._origin import FileOrigin, Head, S3Origin, WholeRead
from manyfiles.cache._reader import CachedReader, MemoryFile, whole_file
from manyfiles.cache._store import BlockStore
from manyfiles.cache._versions import Listed, Source, Versions
from manyfiles.errors import ManyfilesError
from manyfiles.trace import iotrace

FETCH_THREADS = 32
PART_MAX = 64 << 20              # larger parts are not fetched whole for a read of one block


class Opener:
    """Opens versions of sources for reading from one store; owns the fetch threads (:attr:`pool`)
    and the background completions (:attr:`completions`) its readers start."""

    def __init__(self, store: BlockStore, versions: Versions, *, prefetch: int, verify_whole_max: int,
                 strict: bool, retry: RetryPolicy) -> None:
        self._store = store
        self._versions = versions
        self.prefetch = prefetch
        self.verify_whole_max = verify_whole_max
        self.strict = strict
        self.retry = retry
        self.pool = TrackedPool(FETCH_THREADS, thread_name_prefix="manyfiles-cache-fetch")
        self.completions = Completions(store, lambda: self.retry)

    def after_fork(self) -> None:
        # A forked child (a DataLoader worker) has none of the parent's threads: new ones.
        self.pool = TrackedPool(FETCH_THREADS, thread_name_prefix="manyfiles-cache-fetch")
        self.completions.after_fork()

    def flush(self) -> None:
        """Wait until every fetch started here (prefetches of closed readers, completions) has ended."""
        self.pool.wait_idle()
        self.completions.wait()

    def close(self) -> None:
        """Stop the fetch threads; completions still running stop (their objects' unverified blocks
        are dropped)."""
        self.pool.shutdown(wait=True)
        self.completions.cancel()

    def reader(self, src: Source, *, settings: Any = None, strict: bool | None = None,
               ttl: float | None = None, listed: Listed | None = None, offline: bool | None = None) -> Any:
        """The raw reader of ``src``: see :meth:`Cache.reader`."""
        versions = self._versions
        origin = versions.origin(src, settings)
        v, head, stream = versions.resolve(origin, ttl=ttl, listed=listed, offline=offline)
        return self.open_version(origin, v, head, stream, self.strict if strict is None else strict)

    def holds_checked(self, v: Version) -> bool:
        """Does the store hold ``v`` whole and checked (its whole file, or every block checked)?"""
        store = self._store
        if store.has_whole(v.objid):
            return True
        if v.size <= self.verify_whole_max:
            return False
        for i in range(store.nblocks(v.size)):
            got = store.open_block(v.objid, i, store.block_length(v.size, i))
            if got is None:
                return False
            os.close(got[0])
            if not got[1]:
                return False
        return True

    def open_version(self, origin: FileOrigin | S3Origin, v: Version, head: Head | None,
                     stream: WholeRead | None, strict: bool) -> Any:
        """The reader of version ``v`` (``head``: what its validation learnt; ``stream``: the whole
        read that validation opened, handed on or closed)."""
        store = self._store
        fd = store.open_whole(v.objid, v.size)
        if fd is not None:
            if stream is not None:          # the GET named a version held whole already
                stream.close()
            return self._whole_file(origin, v, fd)
        if v.size <= self.verify_whole_max:
            queued = store.fills.queued_whole(v.objid)          # checked, on its way to the disk
            if queued is not None:
                if stream is not None:
                    stream.close()
                store.counters.count(hits=store.nblocks(v.size), hit_bytes=v.size, object_hits=1)
                return MemoryFile(queued, origin.display)
            return MemoryFile(self._read_whole(origin, v, stream), origin.display)
        open_stream = None
        if stream is None and isinstance(origin, FileOrigin) and store.index.entry(v.objid) is None:
            open_stream = lambda: origin.open_whole(head)   # noqa: E731 - a cold file read from its start
        reader = origin.reader(head if head is not None else Head(v.validator, v.size))
        if strict and isinstance(origin, S3Origin) and reader.part_spans(PART_MAX) is None:
            self._complete_now(origin, v, stream)
            fd = store.open_whole(v.objid, v.size)
            if fd is None:
                raise ManyfilesError(f"{origin.display}: the cache could not keep the checked object "
                                     "(strict needs room on the cache disk)")
            return self._whole_file(origin, v, fd)
        return CachedReader(origin, v, store=store, block_size=store.block_size, pool=self.pool,
                            origin_reader=reader, prefetch=self.prefetch, stream=stream, strict=strict,
                            max_part=PART_MAX,
                            on_unverified=lambda ver: self.completions.schedule(origin, ver),
                            complete_now=lambda: self._complete_now(origin, v, None), open_stream=open_stream)

    def _whole_file(self, origin: FileOrigin | S3Origin, v: Version, fd: int) -> io.FileIO:
        """A hit on a whole file: accounted (and traced) once, at the open; its reads are the stdlib's."""
        store = self._store
        counters = store.counters
        counters.note_access(v.objid, v.validated_at)
        counters.count(hits=store.nblocks(v.size) if v.size else 0, hit_bytes=v.size, object_hits=1)
        if iotrace.TRACER is not None:
            iotrace.TRACER.record("cache.hit", v.source, 0, v.size, time.monotonic_ns(), 0, 0)
        return whole_file(fd, origin.display, v.size)

    def _read_whole(self, origin: FileOrigin | S3Origin, v: Version, stream: WholeRead | None) -> bytes:
        """The whole object, checked (a failed check fetches it again); queued for its whole file."""
        first = [stream]
        got: list[WholeRead] = []

        def attempt() -> bytes:
            s = first[0] if first and first[0] is not None else origin.open_whole(Head(v.validator, v.size))
            first.clear()
            try:
                data = s.read(v.size) if v.size else b""
                if s.method is None:
                    s.read(1)           # the end: its check
                if len(data) != v.size:
                    raise ManyfilesError(f"{origin.display}: got {len(data)} of {v.size} bytes")
                got.append(s)
                return data
            finally:
                s.close()

        data = retrying(attempt, self.retry, classify=lambda exc: exc)
        store = self._store
        store.fills.whole(v, data, got[-1].method or fmt.SIZE_ONLY, got[-1].claim or {})
        counters = store.counters
        counters.note_access(v.objid, v.validated_at)
        counters.count(misses=store.nblocks(v.size) if v.size else 0, miss_bytes=v.size, object_misses=1)
        return data

    def _complete_now(self, origin: FileOrigin | S3Origin, v: Version, stream: WholeRead | None) -> None:
        """Fetch ``v`` whole, checked, into its whole file before going on (strict reads)."""
        try:
            complete(self._store, origin, v, self.retry, stream=stream)
        except OSError as exc:
            raise ManyfilesError(f"{self._store.root}: cannot write to the cache: "
                                 f"{exc.strerror or exc}") from exc


class TrackedPool(ThreadPoolExecutor):
    """The fetch threads, knowing how many fetches are still running (see :meth:`Opener.flush`)."""

    def __init__(self, workers: int, thread_name_prefix: str) -> None:
        super().__init__(workers, thread_name_prefix=thread_name_prefix)
        self._running = 0
        self._idle = threading.Condition()

    def submit(self, fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
        with self._idle:
            self._running += 1
        fut = super().submit(fn, *args, **kwargs)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, _fut: Any) -> None:
        with self._idle:
            self._running -= 1
            if not self._running:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        with self._idle:
            self._idle.wait_for(lambda: not self._running)
