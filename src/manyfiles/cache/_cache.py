"""The public face: :class:`Cache` and :func:`open`.

A :class:`Cache` is one cache directory seen from one process.  Any number of ``Cache``
objects, threads and processes may use the same directory at once.  Reports of the bulk
operations (warm, verify, evict) and the statistics are plain dataclasses (_reports.py).

How an open is served (docs/cache.md, "Integrity" and "Reading"):

1. the version: trusted within ``ttl``, else a ``stat`` (files) or a ``HEAD`` (an S3 object the
   cache holds a version of); an S3 object the cache holds nothing of is opened by its GET,
   whose answer is the version.  A HEAD that contradicts the cached entry (size or ETag) is a
   miss whose version the GET's own answer gives, never a size from the HEAD alone;
2. held whole (checked): the stdlib file object on its whole file (``io.FileIO``);
3. up to ``verify_whole_max``: fetched whole and checked before any byte reaches the reader
   (:class:`MemoryFile`), written behind;
4. larger: :class:`CachedReader` (a stream read ahead and checked at its end, cached blocks,
   ranged GETs checked per part where the store allows; with ``strict``, the object is checked
   whole before anything unverified would be handed out).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import io
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles._core.retry import RetryPolicy, retrying
from manyfiles.cache import _format as fmt
from manyfiles.cache._complete import Completions, complete
from manyfiles.cache._index import Version
from manyfiles.cache._origin import FileOrigin, Head, S3Origin, WholeRead, parse_source
from manyfiles.cache._reader import CachedReader, MemoryFile, whole_file
from manyfiles.cache._reports import CacheStats, EvictReport, VerifyReport, WarmReport
from manyfiles.cache._store import BlockStore
from manyfiles.cache._write import WriteThrough
from manyfiles.errors import (
    AccessDenied,
    CredentialsError,
    ManyfilesError,
    NotFound,
    UsageError,
    from_oserror,
)
from manyfiles.trace import iotrace

DEFAULT_BUFFER = io.DEFAULT_BUFFER_SIZE     # as open(): small random reads stay cheap
FETCH_THREADS = 32
VERIFY_WHOLE_MAX = 64 << 20
PART_MAX = 64 << 20              # larger parts are not fetched whole for a read of one block
MODES = ("rb", "wb")
Source = str | bytes | os.PathLike


class Cache:
    """A persistent local read cache for files and S3 objects in directory ``dir``.

    Args:
        dir: the cache directory (created if missing; an existing non-empty directory must
            be a manyfiles cache, of this format version).
        max_size: bytes the cache may hold; past it, least recently used entries are evicted
            down to ``low_water * max_size``.  None: no limit but ``min_free``.
        min_free: bytes to keep free on the cache's filesystem (a float below 1: that
            fraction of the filesystem).  Past it, entries are evicted until
            ``min_free / low_water`` is free.
        block_size: size of the blocks of objects cached in part (fixed when the directory is
            created; default 4 MiB).
        verify: re-check what is read from the cache disk before its first use in this process
            (a block's CRC-32, a whole file against its object's check).
        ttl: seconds a validation stays trusted.  0 (default): every open asks the origin
            (a ``stat`` or a ``HEAD``); > 0: opens within ``ttl`` of the last validation, by
            any process, skip it (changes may then be seen up to ``ttl`` late).
        settings: :class:`manyfiles.s3.ClientSettings` for ``s3://`` sources.
        prefetch: blocks fetched ahead of a sequential reader.
        fill_queue: bytes fetched on misses that may wait for the cache disk (default: 1/16 of the
            RAM, 256 MiB to 1 GiB); past it, blocks are not cached (``fills_dropped``).
        verify_whole_max: objects up to this size reach a reader only after the whole object was
            fetched and checked (default 64 MiB); larger ones are streamed (checked at the end) or
            read by range (checked per part where the store allows, else in the background).
        strict: never hand out bytes that no check covered (a large object is checked whole
            before a random read of it returns).
        retry: the :class:`manyfiles.s3.RetryPolicy` of every request to S3 (default: s3pull's).

    Example:
        >>> import manyfiles as mf
        >>> cache = mf.Cache("/scratch/cache", max_size=200 << 30)            # doctest: +SKIP
        >>> cache.warm(["s3://bucket/train/"], jobs=32)                      # doctest: +SKIP
        >>> with mf.open("s3://bucket/train/000.tar", cache=cache) as f:    # doctest: +SKIP
        ...     header = f.read(512)
    """

    def __init__(self, dir: str | os.PathLike, *, max_size: int | None = None,
                 min_free: float | int | None = 0.1, block_size: int | None = None, verify: bool = False,
                 ttl: float = 0.0, settings: Any = None, prefetch: int = 4, low_water: float = 0.9,
                 fill_queue: int | None = None, verify_whole_max: int = VERIFY_WHOLE_MAX,
                 strict: bool = False, retry: RetryPolicy | None = None) -> None:
        if verify_whole_max < 0:
            raise UsageError(f"verify_whole_max {verify_whole_max}: must not be negative")
        self._store = BlockStore(dir, block_size=block_size, max_size=max_size, min_free=min_free,
                                 low_water=low_water, verify=verify, fill_queue_bytes=fill_queue)
        #: the keyword arguments this cache was opened with (a cluster worker opens its own with them)
        self.options = {"max_size": max_size, "min_free": min_free, "block_size": self._store.block_size,
                        "verify": verify, "ttl": ttl, "settings": settings, "prefetch": prefetch,
                        "low_water": low_water, "fill_queue": fill_queue,
                        "verify_whole_max": verify_whole_max, "strict": strict, "retry": retry}
        self.dir = self._store.root
        self.block_size = self._store.block_size
        self.ttl = float(ttl)
        self.settings = settings
        self.prefetch = prefetch
        self.verify_whole_max = verify_whole_max
        self.strict = strict
        self.retry = retry or RetryPolicy()
        self._memo: dict[bytes, Version] = {}
        self._clients: dict[Any, Any] = {}
        self._pool = _TrackedPool(FETCH_THREADS, thread_name_prefix="manyfiles-cache-fetch")
        self._completions = Completions(self._store, lambda: self.retry)
        _OPEN.add(self)
        # multiprocessing's children (DataLoader workers) leave by os._exit, without atexit, and
        # clear the finalizers they inherit: give each child its own finalizer that closes us.
        import multiprocessing.util

        multiprocessing.util.register_after_fork(self, Cache._in_multiprocessing_child)
        if multiprocessing.parent_process() is not None:    # opened in a (spawned) worker itself
            self._in_multiprocessing_child()

    def _in_multiprocessing_child(self) -> None:
        import multiprocessing.util

        multiprocessing.util.Finalize(self, self.close, exitpriority=10)

    def _after_fork(self) -> None:
        # A forked child (a DataLoader worker) has none of the parent's threads: new ones.
        self._pool = _TrackedPool(FETCH_THREADS, thread_name_prefix="manyfiles-cache-fetch")
        self._completions.after_fork()
        self._store.after_fork()

    def __repr__(self) -> str:
        return f"Cache({self.dir!r}, block_size={self.block_size})"

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Write queued fills and counters, stop the background threads (done at exit too).
        Background completions still running stop, and the unverified blocks of their objects
        are dropped (see docs/cache.md)."""
        _OPEN.discard(self)
        self._pool.shutdown(wait=True)
        self._completions.cancel()
        self._store.close()

    def flush(self) -> None:
        """Wait until every fetch started by this process (prefetches of closed readers, background
        completions too) is on disk and accounted, and the counters are written."""
        self._pool.wait_idle()
        self._completions.wait()
        self._store.flush()

    # -- versions ----------------------------------------------------------------------------------

    def origin(self, src: Source | FileOrigin | S3Origin, settings: Any = None) -> FileOrigin | S3Origin:
        if isinstance(src, str) and src.startswith("s3://"):
            from manyfiles.s3.objects import ObjectClient, resolve

            resolved = resolve(settings or self.settings)
            client = self._clients.get(resolved)
            if client is None:
                client = self._clients[resolved] = ObjectClient(resolved, retry=self.retry)
            return parse_source(src, resolved, self.retry, client, resolved=True)
        return parse_source(src)

    def version(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False) -> Version:
        """The version of ``origin`` to read: trusted within ``ttl``, else asked of the origin."""
        return self._resolve(origin, revalidate=revalidate, whole=False)[0]

    def _resolve(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False, whole: bool = True,
                 ttl: float | None = None, listed: Listed | None = None
                 ) -> tuple[Version, Head | None, WholeRead | None]:
        """(version, what the validation learnt, the whole read it opened if that was the way).

        ``whole``: an S3 object the cache holds nothing of is opened by its GET (``whole``), whose
        answer is the version: a miss costs one round trip, not a HEAD and a GET.  A HEAD whose
        answer contradicts the cached entry does the same: the object changed (or the HEAD lies),
        and only the GET's answer says what is there.  ``listed``: the version a listing gave (no
        request at all); ``ttl``: this call's instead of the cache's.
        """
        if listed is not None:
            if not isinstance(origin, S3Origin):
                raise UsageError(f"{origin.display}: etag= is for s3:// objects (a listing's ETag)")
            head = Head(S3Origin.validator(listed.etag, listed.size), listed.size)
            at = time.time() if listed.at is None else listed.at
            return self.validated(origin, head, at, ttl), None, None
        now = time.time()
        ttl = self.ttl if ttl is None else float(ttl)
        known = None
        asked = False
        if ttl > 0 and not revalidate:
            known = self._memo.get(origin.source)
            if known is None or now - known.validated_at >= ttl:
                known, asked = self._store.index.latest(origin.source), True
            if known is not None and now - known.validated_at < ttl:
                self._memo[origin.source] = known
                return known, None, None
        if isinstance(origin, S3Origin) and whole:
            if not asked:
                known = self._store.index.latest(origin.source)
            if known is not None:
                try:
                    head = origin.stat()
                except (NotFound, AccessDenied, CredentialsError):
                    raise
                except ManyfilesError:      # a HEAD that contradicts itself: only a GET can tell
                    head = None
                if head is not None and head.validator == known.validator:
                    return self.validated(origin, head, now, ttl), head, None
            stream = origin.open_whole(None)
            return self.validated(origin, stream.head, now, ttl), stream.head, stream
        head = origin.stat()
        return self.validated(origin, head, now, ttl), head, None

    def validated(self, origin: FileOrigin | S3Origin, head: Head, now: float | None = None,
                  ttl: float | None = None) -> Version:
        """The version ``head`` names, validated ``now`` (remembered within ``ttl``)."""
        v = Version(fmt.object_id(origin.source, head.validator), origin.source, head.validator, head.size,
                    time.time() if now is None else now)
        if (self.ttl if ttl is None else ttl) > 0:
            self._memo[origin.source] = v
        return v

    def holds_checked(self, v: Version) -> bool:
        """Does the cache hold ``v`` whole and checked (its whole file, or every block checked)?"""
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

    # -- reading -----------------------------------------------------------------------------------

    def reader(self, src: Source, *, settings: Any = None, strict: bool | None = None,
               ttl: float | None = None, etag: str | None = None, size: int | None = None,
               listed_at: float | None = None) -> Any:
        """The raw reader of ``src`` (what :meth:`open` wraps in a BufferedReader): an ``io.FileIO``
        on its whole file, a :class:`MemoryFile` or a :class:`CachedReader` (``ttl``, ``etag``,
        ``size``, ``listed_at``: as for :meth:`open`)."""
        origin = self.origin(src, settings)
        v, head, stream = self._resolve(origin, ttl=ttl, listed=_listed(etag, size, listed_at))
        return self._open_version(origin, v, head, stream, self.strict if strict is None else strict)

    def _open_version(self, origin: FileOrigin | S3Origin, v: Version, head: Head | None,
                      stream: WholeRead | None, strict: bool) -> Any:
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
                store.count(hits=store.nblocks(v.size), hit_bytes=v.size, object_hits=1)
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
        return CachedReader(origin, v, store=store, block_size=self.block_size, pool=self._pool,
                            origin_reader=reader, prefetch=self.prefetch, stream=stream, strict=strict,
                            max_part=PART_MAX,
                            on_unverified=lambda ver: self._completions.schedule(origin, ver),
                            complete_now=lambda: self._complete_now(origin, v, None), open_stream=open_stream)

    def _whole_file(self, origin: FileOrigin | S3Origin, v: Version, fd: int) -> io.FileIO:
        """A hit on a whole file: accounted (and traced) once, at the open; its reads are the stdlib's."""
        store = self._store
        store.note_access(v.objid, v.validated_at)
        store.count(hits=store.nblocks(v.size) if v.size else 0, hit_bytes=v.size, object_hits=1)
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
        store.note_access(v.objid, v.validated_at)
        store.count(misses=store.nblocks(v.size) if v.size else 0, miss_bytes=v.size, object_misses=1)
        return data

    def _complete_now(self, origin: FileOrigin | S3Origin, v: Version, stream: WholeRead | None) -> None:
        """Fetch ``v`` whole, checked, into its whole file before going on (strict reads)."""
        try:
            complete(self._store, origin, v, self.retry, stream=stream)
        except OSError as exc:
            raise ManyfilesError(f"{self.dir}: cannot write to the cache: {exc.strerror or exc}") from exc

    def open(self, src: Source, mode: str = "rb", *, buffering: int = -1, settings: Any = None,
             ttl: float | None = None, etag: str | None = None, size: int | None = None,
             listed_at: float | None = None) -> Any:
        """``src`` as a binary file object: a seekable reader (``"rb"``) or a write-through writer
        (``"wb"``: the origin is written on close, then this cache's entry is invalidated).

        ``ttl``: this open's instead of the cache's.  ``etag`` and ``size``: the version of an S3
        object that a listing gave (``manyfiles.s3.list``, ``list_objects``), taken at ``listed_at``
        (default: now): no HEAD; that version is read, from the cache or by GETs pinned to the ETag
        (``If-Match``: an object changed since raises ObjectChanged, never mixes versions).
        """
        _check_mode(mode)
        if mode == "wb":
            origin = self.origin(src, settings)
            return WriteThrough(origin, on_commit=lambda: self.invalidate(origin))
        raw = self.reader(src, settings=settings, ttl=ttl, etag=etag, size=size, listed_at=listed_at)
        if buffering == 0 or isinstance(raw, MemoryFile):
            return raw
        if buffering < 0:      # as open() chooses: the file's block size
            buffering = os.fstat(raw.fileno()).st_blksize if isinstance(raw, io.FileIO) else DEFAULT_BUFFER
        return io.BufferedReader(raw, buffer_size=buffering)

    def get_bytes(self, src: Source, *, settings: Any = None, ttl: float | None = None,
                  etag: str | None = None, size: int | None = None, listed_at: float | None = None) -> bytes:
        """The whole content of ``src``, through the cache (``ttl``, ``etag``, ``size``, ``listed_at``:
        as for :meth:`open`)."""
        raw = self.reader(src, settings=settings, ttl=ttl, etag=etag, size=size, listed_at=listed_at)
        try:
            if isinstance(raw, MemoryFile):
                return raw.getvalue()
            data = raw.readall()
            if len(data) != raw.size:
                raise ManyfilesError(f"{raw.name}: read {len(data)} of {raw.size} bytes from the cache")
            return data
        finally:
            raw.close()

    # -- exchange with other tools (s3pull --cache) ---------------------------------------------------

    def export(self, src: Source | S3Origin, etag: str, size: int, write: Callable[[bytes], Any]) -> bool:
        """Hand the cached content of ``src`` at version (``etag``, ``size``) to ``write`` if the
        cache holds it checked (whole, or every block checked); False, writing nothing, otherwise.
        (A file found short while writing raises OSError: the caller drops what it wrote.)

        For tools that know the version from a listing (``s3pull --cache``): no request is made.
        """
        from manyfiles.cache._exchange import export

        return export(self, src, etag, size, write)

    def fill(self, src: Source, data: bytes, *, etag: str, checked: str | None = None,
             listed_at: float | None = None, settings: Any = None) -> None:
        """Keep ``data``: the whole content of the S3 object ``src`` at version ``etag``, which the
        caller fetched itself for a read that missed the cache (counted as one).  ``checked``: how
        the caller checked the whole object against its claim ("md5", "crc32c"... as s3pull's
        engines report it): it is then kept as its whole file (a CRC-32 computed here protects it
        at rest).  Unchecked, it is kept as unverified blocks and checked whole in the background,
        like any range no check covered.  Written in the background, like any fill (dropped, and
        counted, when the fill queue is full)."""
        import zlib

        from manyfiles.cache._origin import crc_claim

        origin = self.origin(src, settings)
        v = self._resolve(origin, listed=_listed(etag, len(data), listed_at))[0]
        store, bs = self._store, self.block_size
        if checked is not None:
            store.fills.whole(v, data, checked, crc_claim(zlib.crc32(data)))
        elif data:
            view = memoryview(data)
            for i in range(store.nblocks(len(data))):
                store.fills.block(v, i, bytes(view[i * bs:(i + 1) * bs]), checked=False)
            self._completions.schedule(origin, v)
        store.note_access(v.objid, v.validated_at)
        store.count(misses=store.nblocks(len(data)) if data else 0, miss_bytes=len(data), object_misses=1)

    def import_file(self, src: Source | S3Origin, etag: str, size: int, path: str | os.PathLike, *,
                    claim: Any = None) -> None:
        """Fill the cache, in the background, from a local copy of ``src`` at version (``etag``, ``size``)
        that another tool just downloaded and checked (``s3pull --cache``).  The copy is hashed
        again against ``claim`` (a :class:`manyfiles.s3.integrity.Claim`; default: the MD5 when the
        ETag is one); nothing is cached when there is nothing to check it against, or it fails."""
        from manyfiles.cache._exchange import import_file

        origin = self.origin(src)
        v = self.validated(origin, Head(S3Origin.validator(etag, size), size))
        self._pool.submit(import_file, self._store, v, os.fsencode(path), claim)

    def invalidate(self, src: Source | FileOrigin | S3Origin) -> int:
        """Forget every cached version of ``src`` (done after a write-through); returns entries removed."""
        origin = self.origin(src)
        self._memo.pop(origin.source, None)
        return len(self._store.remove_sources([origin.source]))

    # -- bulk --------------------------------------------------------------------------------------

    def warm(self, srcs: Iterable[Source] | Source, *, jobs: int = 8,
             progress: ProgressArg = False, cluster: object = None) -> WarmReport:
        """Fetch ``srcs`` into the cache: files, folders (recursively), ``s3://`` objects and
        prefixes (``s3://bucket/prefix/``, wildcards allowed).  Objects the cache holds checked are
        only validated (a listing's ETags, or one HEAD / stat each); anything else (missing,
        partial, unverified) is fetched whole and checked.  Failures are collected in the report,
        not raised.  ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``):
        the objects are partitioned across the Dask workers, each warming its own cache at this
        path (``cache/_cluster.py``)."""
        check_progress(progress)
        if jobs < 1:
            raise UsageError(f"jobs {jobs}: must be at least 1")
        if isinstance(srcs, (str, bytes, os.PathLike)):
            srcs = [srcs]
        if cluster is not None:
            from manyfiles.cache._cluster import warm_on_cluster

            return warm_on_cluster(self, srcs, report_type=WarmReport, cluster=cluster, jobs=jobs,
                                   progress=progress)
        from manyfiles.cache._warm import warm

        return warm(self, srcs, jobs=jobs, progress=progress)

    # -- space and health --------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        """Counters of this cache directory (all processes), after flushing this process's."""
        store = self._store
        self.flush()
        c = store.index.counters()
        try:
            free = os.statvfs(self.dir).f_bavail * os.statvfs(self.dir).f_frsize
        except OSError:
            free = 0
        names = ("hits", "misses", "hit_bytes", "miss_bytes", "fills", "fill_bytes", "fills_dropped",
                 "evictions", "evicted_bytes", "corrupt", "object_hits", "object_misses")
        return CacheStats(self.dir, c.get("entries", 0), c.get("bytes", 0), self.block_size, store.max_size,
                          store.min_free, free, **{n: c.get(n, 0) for n in names})

    def evict(self, srcs: Iterable[Source] | None = None, *, to_size: int | None = None,
              older_than: float | None = None, dry_run: bool = False) -> EvictReport:
        """Remove entries: those of ``srcs``; or least recently used ones until the cache holds
        ``to_size`` bytes; or those not used for ``older_than`` seconds; with no argument, apply
        the ``max_size`` / ``min_free`` watermarks now.  ``dry_run``: report what would go (the
        same choice, made by the same code inside a rolled-back index transaction); nothing is
        removed."""
        t0 = time.monotonic()
        store = self._store
        self.flush()
        with store.index.rehearsal() if dry_run else contextlib.nullcontext():
            if srcs is not None:
                sources = [self.origin(s).source for s in srcs]
                victims = store.index.remove_sources(sources) if dry_run else store.remove_sources(sources)
                self._memo.clear()
            elif to_size is not None or older_than is not None:
                need = None if to_size is None else max(0, store.used_bytes() - to_size)
                cutoff = None if older_than is None else time.time() - older_than
                victims = [] if need == 0 else (store.index.pop_lru(need, older_than=cutoff) if dry_run
                                                else store.evict(need, older_than=cutoff))
            elif dry_run:
                need = store.watermark_need()
                victims = store.index.pop_lru(need) if need > 0 else []
            else:
                victims = store.evict_to_watermarks()
        return EvictReport(entries=len(victims), bytes=sum(v.disk_bytes for v in victims),
                           seconds=time.monotonic() - t0, dry_run=dry_run)

    def clear(self, *, dry_run: bool = False) -> EvictReport:
        """Remove every entry and block file (the directory stays a cache); the report counts
        what was indexed.  ``dry_run``: only count."""
        import shutil

        t0 = time.monotonic()
        store = self._store
        self.flush()
        c = store.index.counters()
        report = EvictReport(entries=c.get("entries", 0), bytes=c.get("bytes", 0), dry_run=dry_run,
                             verb="removed")
        if dry_run:
            return report
        store.index.clear()
        self._memo.clear()
        blocks = os.path.join(self.dir, fmt.BLOCKS)
        trash = os.path.join(self.dir, fmt.TMP, f"{os.getpid()}-trash-{os.urandom(4).hex()}")
        try:
            os.rename(blocks, trash)
            os.makedirs(blocks, exist_ok=True)
        except FileNotFoundError:
            os.makedirs(blocks, exist_ok=True)
        except OSError as exc:
            raise from_oserror(exc, blocks) from exc
        else:
            shutil.rmtree(trash, ignore_errors=True)
        report.seconds = time.monotonic() - t0
        return report

    def verify(self, *, complete: bool = False, progress: ProgressArg = False) -> VerifyReport:
        """Check every cached file (a block against its header and CRC-32, a whole file against its
        object's check), remove what is wrong, orphaned or left over by killed processes, make the
        index match the disk, and sort objects by the check they passed.  ``complete``: first fetch
        (whole, checked) every object the cache holds in part or unverified."""
        from manyfiles.cache._verify import verify

        check_progress(progress)
        self.flush()
        with progress_for(progress, "cache verify", unit="entries") as p:
            return verify(self, VerifyReport(), p, complete=complete)


# -- helpers ---------------------------------------------------------------------------------------

class Listed(NamedTuple):
    """The version of an S3 object as a listing gave it (``at``: when; None: now)."""

    etag: str
    size: int
    at: float | None = None


def _listed(etag: str | None, size: int | None, at: float | None) -> Listed | None:
    if etag is None and size is None:
        return None
    if not etag or size is None or isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise UsageError(f"etag={etag!r}, size={size!r}: a listed version needs both, "
                         "an ETag and a size >= 0")
    return Listed(etag.strip('"'), size, at)


class _TrackedPool(ThreadPoolExecutor):
    """The fetch threads, knowing how many fetches are still running (see :meth:`Cache.flush`)."""

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


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise UsageError(f"mode {mode!r}: manyfiles.open supports 'rb' and 'wb'")


# -- module-level open and the shared caches -------------------------------------------------------

_SHARED: dict[str, Cache] = {}
_SHARED_LOCK = threading.Lock()
_PASSTHROUGH_POOL: ThreadPoolExecutor | None = None
_OPEN: weakref.WeakSet[Cache] = weakref.WeakSet()     # closed at exit: queued fills reach the disk


def shared_cache(dir: str | os.PathLike) -> Cache:
    """The process-wide :class:`Cache` for ``dir`` (default options), created on first use."""
    key = os.path.abspath(os.fspath(dir))
    cache = _SHARED.get(key)
    if cache is None:
        with _SHARED_LOCK:
            cache = _SHARED.get(key)
            if cache is None:
                cache = _SHARED[key] = Cache(key)
    return cache


@atexit.register
def _close_all() -> None:
    for cache in list(_OPEN):
        cache.close()
    _SHARED.clear()


def _after_fork_in_child() -> None:
    global _PASSTHROUGH_POOL, _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    _PASSTHROUGH_POOL = None
    for cache in list(_OPEN):
        cache._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _passthrough_pool() -> ThreadPoolExecutor:
    global _PASSTHROUGH_POOL
    with _SHARED_LOCK:
        if _PASSTHROUGH_POOL is None:
            _PASSTHROUGH_POOL = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="manyfiles-open")
    return _PASSTHROUGH_POOL


def open(src: Source, mode: str = "rb", *, cache: Cache | str | os.PathLike | None = None,
         settings: Any = None, buffering: int = -1, ttl: float | None = None) -> Any:
    """Open a local/NFS path or an ``s3://bucket/key`` URL as a binary file object.

    ``"rb"`` gives a seekable reader (``read``, ``readinto``, ``seek``/``tell``, context
    manager); with ``cache`` (a :class:`Cache` or a cache directory) it reads through that
    cache.  ``"wb"`` writes through to the origin: a local file is replaced atomically on
    close, an S3 object is uploaded on close; the cached entry is then invalidated.
    ``settings`` is a :class:`manyfiles.s3.ClientSettings` for S3 URLs.  ``ttl`` (with
    ``cache``): seconds a validation of ``src`` stays trusted for this open (default: the
    cache's, 0: a ``stat`` or ``HEAD`` per open), as ``Cache(dir, ttl=...)``.

    Example:
        >>> import manyfiles as mf
        >>> with mf.open("s3://bucket/data/part-0.parquet", cache="/scratch/cache") as f:  # doctest: +SKIP
        ...     f.seek(-8, 2)
        ...     footer = f.read()
    """
    _check_mode(mode)
    if cache is not None:
        if not isinstance(cache, Cache):
            cache = shared_cache(cache)
        return cache.open(src, mode, buffering=buffering, settings=settings, ttl=ttl)
    if ttl is not None:
        raise UsageError("ttl= is for reads through a cache (give cache=DIR too)")
    origin = parse_source(src, settings)
    if mode == "wb":
        return WriteThrough(origin)
    if isinstance(origin, FileOrigin):
        try:
            return builtins.open(origin.path, "rb", buffering=buffering)
        except OSError as exc:
            raise from_oserror(exc, origin.display) from exc
    head = origin.stat()
    v = Version(b"", origin.source, head.validator, head.size, time.time())
    raw = CachedReader(origin, v, store=None, block_size=fmt.DEFAULT_BLOCK_SIZE, pool=_passthrough_pool(),
                       origin_reader=origin.reader(head))
    if buffering == 0:
        return raw
    return io.BufferedReader(raw, buffer_size=DEFAULT_BUFFER if buffering < 0 else buffering)


__all__ = ["Cache", "CacheStats", "EvictReport", "VerifyReport", "WarmReport", "open", "shared_cache"]
