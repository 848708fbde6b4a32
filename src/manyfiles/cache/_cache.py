"""The public face: :class:`Cache` and :func:`open`.

A :class:`Cache` is one cache directory seen from one process.  Any number of ``Cache``
objects, threads and processes may use the same directory at once.  Reports of the bulk
operations (warm, verify, evict) and the statistics are plain dataclasses.
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
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from manyfiles._pool import Pool
from manyfiles._progress import ProgressArg, check_progress, progress_for
from manyfiles._report import Report
from manyfiles._units import format_size
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Version
from manyfiles.cache._origin import FileOrigin, First, S3Origin, parse_source
from manyfiles.cache._reader import CachedReader
from manyfiles.cache._store import BlockStore
from manyfiles.cache._write import WriteThrough
from manyfiles.errors import ManyfilesError, NotFound, UsageError, from_oserror

DEFAULT_BUFFER = io.DEFAULT_BUFFER_SIZE     # as open(): small random reads stay cheap
FETCH_THREADS = 32
MODES = ("rb", "wb")
Source = str | bytes | os.PathLike


# -- reports ---------------------------------------------------------------------------------------

@dataclass(kw_only=True)
class WarmReport(Report):
    """What :meth:`Cache.warm` did: ``fetched`` objects were read from their origin, ``cached`` were
    already complete in the cache (and were validated now)."""

    objects: int = 0
    cached: int = 0
    fetched: int = 0
    bytes: int = 0

    def summary(self) -> str:
        rate = f", {format_size(self.bytes / self.seconds)}/s" if self.seconds > 0 and self.bytes else ""
        return (f"{self.objects:,} objects: {self.fetched:,} fetched ({format_size(self.bytes)}{rate}), "
                f"{self.cached:,} already cached in {self.seconds:.1f} s")


@dataclass(kw_only=True)
class VerifyReport(Report):
    """What :meth:`Cache.verify` checked and repaired."""

    entries: int = 0
    blocks: int = 0
    bytes: int = 0
    corrupt: int = 0            # blocks whose header or CRC was wrong: removed
    missing: int = 0            # blocks the index listed but that were not on disk
    adopted: int = 0            # sound blocks the index did not list (a fill cut short by a kill)
    orphans: int = 0            # block files of no entry: removed
    temps: int = 0              # temporary files of dead processes: removed
    # complete entries by whole-object check (see docs/cache.md, "Integrity"):
    verified: int = 0           # matched the origin's ETag MD5 / multipart ETag / S3 checksum
    unverifiable: int = 0       # read whole, nothing to compare with (SSE-KMS without checksum, files)
    unverified: int = 0         # assembled from ranged reads, never checked as a whole

    def summary(self) -> str:
        return (f"{self.entries:,} entries, {self.blocks:,} blocks ({format_size(self.bytes)}) checked: "
                f"{self.corrupt:,} corrupt and {self.orphans:,} orphan blocks removed, "
                f"{self.missing:,} missing, {self.adopted:,} adopted, "
                f"{self.temps:,} stale temporary files removed in {self.seconds:.1f} s; complete objects: "
                f"{self.verified:,} verified whole, {self.unverifiable:,} unverifiable, "
                f"{self.unverified:,} unverified")


@dataclass(kw_only=True)
class EvictReport(Report):
    """What :meth:`Cache.evict` (or :meth:`Cache.clear`) removed, or would remove (``dry_run``)."""

    entries: int = 0
    bytes: int = 0
    dry_run: bool = False
    verb: str = "evicted"

    def summary(self) -> str:
        would = "would be " if self.dry_run else ""
        return f"{self.entries:,} entries {would}{self.verb} ({format_size(self.bytes)})"


@dataclass
class CacheStats:
    """Counters of a cache directory, summed over every process that used it."""

    dir: str
    entries: int
    bytes: int
    block_size: int
    max_size: int | None
    min_free: int
    free_bytes: int
    hits: int              # blocks served from the cache
    misses: int            # blocks read from the origin
    hit_bytes: int
    miss_bytes: int
    fills: int             # blocks written to the cache (each counted once)
    fill_bytes: int
    fills_dropped: int     # blocks not cached: queue full or cache disk failing
    evictions: int         # entries evicted by the watermarks or `evict`
    evicted_bytes: int
    corrupt: int           # blocks found corrupt and removed
    object_hits: int = 0   # object reads served whole from the cache (get_bytes, a reader closed)
    object_misses: int = 0  # object reads that fetched at least one block from the origin

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    @property
    def object_hit_ratio(self) -> float:
        total = self.object_hits + self.object_misses
        return self.object_hits / total if total else 0.0

    def _repr_html_(self) -> str:
        import html

        cap = format_size(self.max_size) if self.max_size is not None else "unlimited"
        rows = [
            ("objects read", f"{self.object_hits + self.object_misses:,}: {self.object_hits:,} hits, "
                             f"{self.object_misses:,} misses ({self.object_hit_ratio:.1%} hits)"),
            ("blocks read", f"{self.hits:,} hits ({format_size(self.hit_bytes)}), {self.misses:,} misses "
                            f"({format_size(self.miss_bytes)}); {self.hit_ratio:.1%} hits"),
            ("entries", f"{self.entries:,} ({format_size(self.bytes)} of {cap}; "
                        f"{format_size(self.free_bytes)} free, keeps {format_size(self.min_free)})"),
            ("fills", f"{self.fills:,} blocks ({format_size(self.fill_bytes)}), "
                      f"{self.fills_dropped:,} dropped"),
            ("evictions", f"{self.evictions:,} entries ({format_size(self.evicted_bytes)})"),
            ("corrupt", f"{self.corrupt:,} blocks removed"),
        ]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
        return (f"<div><b>CacheStats</b>: {html.escape(self.dir)} (block size "
                f"{format_size(self.block_size)})<table>{body}</table></div>")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_ratio": round(self.hit_ratio, 6),
                "object_hit_ratio": round(self.object_hit_ratio, 6)}

    def __str__(self) -> str:
        cap = format_size(self.max_size) if self.max_size is not None else "unlimited"
        return "\n".join([
            f"cache       {self.dir}",
            f"entries     {self.entries:,}",
            f"size        {format_size(self.bytes)} (max {cap}, keep {format_size(self.min_free)} free; "
            f"{format_size(self.free_bytes)} free)",
            f"objects     {self.object_hits:,} hits, {self.object_misses:,} misses "
            f"({self.object_hit_ratio:.1%} hits)",
            f"hits        {self.hits:,} blocks ({format_size(self.hit_bytes)})",
            f"misses      {self.misses:,} blocks ({format_size(self.miss_bytes)})",
            f"hit ratio   {self.hit_ratio:.1%}",
            f"fills       {self.fills:,} ({format_size(self.fill_bytes)}), {self.fills_dropped:,} dropped",
            f"evictions   {self.evictions:,} entries ({format_size(self.evicted_bytes)})",
            f"corrupt     {self.corrupt:,} blocks removed",
        ])


# -- the cache -------------------------------------------------------------------------------------

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
        block_size: size of the cached blocks (fixed when the directory is created;
            default 4 MiB).  Objects up to one block are cached whole.
        verify: check the CRC-32 of every block before its first use in this process.
        ttl: seconds a validation stays trusted.  0 (default): every open asks the origin
            (a ``stat`` or a ``HEAD``); > 0: opens within ``ttl`` of the last validation, by
            any process, skip it (changes may then be seen up to ``ttl`` late).
        settings: :class:`manyfiles.s3.ClientSettings` for ``s3://`` sources.
        prefetch: blocks fetched ahead of a sequential reader.
        fill_queue: bytes fetched on misses that may wait for the cache disk (default: 1/16 of the
            RAM, 256 MiB to 1 GiB); past it, blocks are not cached (``fills_dropped``).

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
                 fill_queue: int | None = None) -> None:
        self._store = BlockStore(dir, block_size=block_size, max_size=max_size, min_free=min_free,
                                 low_water=low_water, verify=verify, fill_queue_bytes=fill_queue)
        #: the keyword arguments this cache was opened with (a cluster worker opens its own with them)
        self.options = {"max_size": max_size, "min_free": min_free, "block_size": self._store.block_size,
                        "verify": verify, "ttl": ttl, "settings": settings, "prefetch": prefetch,
                        "low_water": low_water, "fill_queue": fill_queue}
        self.dir = self._store.root
        self.block_size = self._store.block_size
        self.ttl = float(ttl)
        self.settings = settings
        self.prefetch = prefetch
        self._memo: dict[bytes, Version] = {}
        self._pool = _TrackedPool(FETCH_THREADS, thread_name_prefix="manyfiles-cache-fetch")
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
        self._store.after_fork()

    def __repr__(self) -> str:
        return f"Cache({self.dir!r}, block_size={self.block_size})"

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Write queued fills and counters, stop the background threads (done at exit too)."""
        _OPEN.discard(self)
        self._pool.shutdown(wait=True)
        self._store.close()

    def flush(self) -> None:
        """Wait until every fetch started by this process (prefetches of closed readers too) is on
        disk and accounted, and the counters are written."""
        self._pool.wait_idle()
        self._store.flush()

    # -- reading -----------------------------------------------------------------------------------

    def origin(self, src: Source | FileOrigin | S3Origin, settings: Any = None) -> FileOrigin | S3Origin:
        return parse_source(src, settings or self.settings)

    def version(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False) -> Version:
        """The version of ``origin`` to read: trusted within ``ttl``, else asked of the origin."""
        return self._resolve(origin, revalidate=revalidate)[0]

    def _resolve(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False, whole: bool = False,
                 ttl: float | None = None, listed: Listed | None = None) -> tuple[Version, First | None]:
        """(version, what opening it fetched if that was the cheapest way to learn the version).

        Opening an S3 object the cache has never seen (``whole``) starts a GET of the whole object
        and reads its first block, whose answer tells the version too: a miss costs one round trip,
        not a HEAD and a GET, and a sequential reader goes on reading that one stream.  (A reader
        that then only wants the end of the object has paid for one block.)  ``listed``: the
        version a listing gave (no request at all); ``ttl``: this call's instead of the cache's.
        """
        if listed is not None:
            if not isinstance(origin, S3Origin):
                raise UsageError(f"{origin.display}: etag= is for s3:// objects (a listing's ETag)")
            at = time.time() if listed.at is None else listed.at
            validator = S3Origin.validator(listed.etag, listed.size)
            return self._validated(origin, validator, listed.size, at), None
        now = time.time()
        ttl = self.ttl if ttl is None else float(ttl)
        known = None
        if ttl > 0 and not revalidate:
            known = self._memo.get(origin.source)
            if known is None or now - known.validated_at >= ttl:
                known = self._store.index.latest(origin.source)
            if known is not None and now - known.validated_at < ttl:
                self._memo[origin.source] = known
                return known, None
        if whole and isinstance(origin, S3Origin):
            if known is None and (ttl == 0 or revalidate):
                known = self._store.index.latest(origin.source)
            if known is None:
                first = origin.open_first(self.block_size)
                return self._validated(origin, first.validator, first.size, now, ttl), first
        validator, size = origin.stat()
        return self._validated(origin, validator, size, now, ttl), None

    def _validated(self, origin: FileOrigin | S3Origin, validator: bytes, size: int, now: float,
                   ttl: float | None = None) -> Version:
        v = Version(fmt.object_id(origin.source, validator), origin.source, validator, size, now)
        if (self.ttl if ttl is None else ttl) > 0:
            self._memo[origin.source] = v
        return v

    def reader(self, src: Source, *, settings: Any = None, ttl: float | None = None,
               etag: str | None = None, size: int | None = None,
               listed_at: float | None = None) -> CachedReader:
        """The raw reader of ``src`` (what :meth:`open` wraps in a BufferedReader)."""
        origin = self.origin(src, settings)
        v, first = self._resolve(origin, whole=True, ttl=ttl, listed=_listed(etag, size, listed_at))
        return self._reader(origin, v, first)

    def _reader(self, origin: FileOrigin | S3Origin, v: Version, first: First | None) -> CachedReader:
        if first is not None and first.checked is not None:     # the whole object, checked
            self._store.mark_verified(v, first.checked)
        return CachedReader(origin, v, store=self._store, block_size=self.block_size, pool=self._pool,
                            prefetch=self.prefetch, first_block=None if first is None else first.data,
                            stream=None if first is None else first.stream, first_checked=first is not None)

    def open(self, src: Source, mode: str = "rb", *, buffering: int = -1, settings: Any = None,
             ttl: float | None = None, etag: str | None = None, size: int | None = None,
             listed_at: float | None = None) -> Any:
        """``src`` as a binary file object: a seekable reader (``"rb"``) or a write-through writer
        (``"wb"``: the origin is written on close, then this cache's entry is invalidated).

        ``ttl``: this open's instead of the cache's.  ``etag`` and ``size``: the version of an S3
        object that a listing gave (``manyfiles.s3.list``, ``list_objects``), taken at ``listed_at``
        (default: now): no HEAD; that version is read, from its cached blocks or by GETs pinned to
        the ETag (``If-Match``: an object changed since raises ObjectChanged, never mixes versions).
        """
        _check_mode(mode)
        if mode == "wb":
            origin = self.origin(src, settings)
            return WriteThrough(origin, on_commit=lambda: self.invalidate(origin))
        raw = self.reader(src, settings=settings, ttl=ttl, etag=etag, size=size, listed_at=listed_at)
        if buffering == 0:
            return raw
        return io.BufferedReader(raw, buffer_size=DEFAULT_BUFFER if buffering < 0 else buffering)

    def get_bytes(self, src: Source, *, settings: Any = None, ttl: float | None = None,
                  etag: str | None = None, size: int | None = None, listed_at: float | None = None) -> bytes:
        """The whole content of ``src``, through the cache (``ttl``, ``etag``, ``size``, ``listed_at``:
        as for :meth:`open`)."""
        origin = self.origin(src, settings)
        v, first = self._resolve(origin, whole=True, ttl=ttl, listed=_listed(etag, size, listed_at))
        store = self._store
        if v.size <= self.block_size:           # one block: no reader needed
            if first is not None:
                if v.size:
                    store.fill_async(v, 0, first.data, checked=True)
                    store.mark_verified(v, first.checked or fmt.SIZE_ONLY)
                    store.count(misses=1, miss_bytes=v.size, object_misses=1)
                store.note_access(v.objid, v.validated_at)
                return first.data
            data = store.read_block(v.objid, 0, v.size) if v.size else b""
            if data is not None:
                store.note_access(v.objid, v.validated_at)
                if v.size:
                    store.count(hits=1, hit_bytes=len(data), object_hits=1)
                return data
        reader = self._reader(origin, v, first)
        try:
            return reader.readall()
        finally:
            reader.close()

    # -- exchange with other tools (s3pull --cache) ---------------------------------------------------

    def export(self, src: Source | S3Origin, etag: str, size: int, write: Callable[[bytes], Any]) -> bool:
        """Hand the cached content of ``src`` at version (``etag``, ``size``) to ``write``, block by
        block, if every block of it is cached; False, writing nothing, if one is missing.  (A block
        found short while writing raises OSError: the caller drops what it wrote.)

        For tools that know the version from a listing (``s3pull --cache``): no request is made.
        """
        origin = self.origin(src)
        v = self._validated(origin, S3Origin.validator(etag, size), size, time.time())
        store, nblocks = self._store, -(-size // self.block_size)
        fds: list = []     # a block file's descriptor, or a block still queued for writing
        try:
            for i in range(nblocks):
                fd = store.open_block(v.objid, i, store.block_length(size, i))
                if fd is None:
                    fd = store.queued_block(v.objid, i)     # fetched a moment ago, not on disk yet
                    if fd is None:
                        return False
                fds.append(fd)
            for i, fd in enumerate(fds):
                if not isinstance(fd, int):
                    write(bytes(fd))
                    continue
                data = os.pread(fd, store.block_length(size, i), fmt.HEADER_SIZE)
                if len(data) != store.block_length(size, i):
                    store.discard(v.objid, i, fd)
                    raise OSError(5, f"{origin.display}: a cached block is shorter than its header says")
                write(data)
        finally:
            for fd in fds:
                if isinstance(fd, int):
                    os.close(fd)
        store.note_access(v.objid, v.validated_at)
        store.count(hits=nblocks, hit_bytes=size, object_hits=1)
        return True

    def fill(self, src: Source, data: bytes, *, etag: str, checked: str | None = None,
             listed_at: float | None = None, settings: Any = None) -> None:
        """Keep ``data``: the whole content of the S3 object ``src`` at version ``etag``, which the
        caller fetched itself for a read that missed the cache (counted as one).  ``checked``: how
        the caller checked the whole object against its claim ("md5", "crc32c"... as s3pull's
        engines report it): the entry is then verified, else it counts as unverified.  Written in
        the background, like any fill (dropped, and counted, when the fill queue is full)."""
        origin = self.origin(src, settings)
        v = self._resolve(origin, listed=_listed(etag, len(data), listed_at))[0]
        store, bs = self._store, self.block_size
        nblocks = -(-len(data) // bs)
        view = memoryview(data)
        for i in range(nblocks):
            store.fill_async(v, i, data if nblocks == 1 else bytes(view[i * bs:(i + 1) * bs]),
                             checked=checked is not None)
        if checked is not None and nblocks:
            store.mark_verified(v, checked)
        store.note_access(v.objid, v.validated_at)
        store.count(misses=nblocks, miss_bytes=len(data), object_misses=1)

    def import_file(self, src: Source | S3Origin, etag: str, size: int, path: str | os.PathLike) -> None:
        """Fill the cache, in the background, from a local copy of ``src`` at version (``etag``, ``size``)
        that another tool just downloaded and verified (``s3pull --cache``).  The copy is read back
        and checked again (size, and MD5 when the ETag is one); any doubt and nothing is cached."""
        origin = self.origin(src)
        v = self._validated(origin, S3Origin.validator(etag, size), size, time.time())
        self._pool.submit(self._import_file, origin, v, os.fsencode(path))

    def _import_file(self, origin: FileOrigin | S3Origin, v: Version, path: bytes) -> None:
        import hashlib

        fetcher = origin.fetcher(v.validator)
        try:
            with builtins.open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size != v.size:
                    return
                if getattr(fetcher, "md5", False):      # first pass: is it still what S3 has?
                    md5 = hashlib.md5(usedforsecurity=False)
                    while chunk := f.read(1 << 20):
                        md5.update(chunk)
                    if md5.hexdigest() != fetcher.etag:
                        return
                    f.seek(0)
                for i in range(-(-v.size // self.block_size)):
                    data = f.read(self.block_size)
                    if len(data) != self._store.block_length(v.size, i):
                        return
                    self._put(v, i, data)
        except (OSError, ManyfilesError):
            return

    def invalidate(self, src: Source | FileOrigin | S3Origin) -> int:
        """Forget every cached version of ``src`` (done after a write-through); returns entries removed."""
        origin = self.origin(src)
        self._memo.pop(origin.source, None)
        return len(self._store.remove_sources([origin.source]))

    # -- bulk --------------------------------------------------------------------------------------

    def warm(self, srcs: Iterable[Source] | Source, *, jobs: int = 8,
             progress: ProgressArg = False, cluster: object = None) -> WarmReport:
        """Fetch ``srcs`` into the cache: files, folders (recursively), ``s3://`` objects and
        prefixes (``s3://bucket/prefix/``, wildcards allowed).  Complete entries are only
        validated (a listing's ETags, or one HEAD / stat each).  Failures are collected in the
        report, not raised.  ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a
        ``distributed.Client``): the objects are partitioned across the Dask workers, each
        warming its own cache at this path (``cache/_cluster.py``)."""
        check_progress(progress)
        if jobs < 1:
            raise UsageError(f"jobs {jobs}: must be at least 1")
        if isinstance(srcs, (str, bytes, os.PathLike)):
            srcs = [srcs]
        if cluster is not None:
            from manyfiles.cache._cluster import warm_on_cluster

            return warm_on_cluster(self, srcs, report_type=WarmReport, cluster=cluster, jobs=jobs,
                                   progress=progress)
        report = WarmReport()
        lock = threading.Lock()
        t0 = time.monotonic()
        with progress_for(progress, "cache warm", unit="objects") as p:

            def failed(shown: str, exc: ManyfilesError) -> None:
                with lock:
                    report.objects += 1
                    report.add_failure(shown, _reason(exc, shown), type(exc).__name__)
                p.add(1, failures=1)

            def work(item: tuple) -> None:
                try:
                    kind, n = self._warm_one(item)
                except ManyfilesError as exc:
                    failed(item[0].display, exc)
                    return
                with lock:
                    report.objects += 1
                    report.bytes += n
                    if kind == "cached":
                        report.cached += 1
                    else:
                        report.fetched += 1
                p.add(1, bytes=n)

            Pool(work, jobs, name="manyfiles-cache-warm").run(self._expand(srcs, failed), tick=p.tick)
            self.flush()
        report.seconds = time.monotonic() - t0
        return report

    def _expand(self, srcs: Iterable[Source],
                failed: Callable[[str, ManyfilesError], None]) -> Iterator[tuple]:
        """(origin, known (validator, size) or None) for every object named or under a prefix."""
        for src in srcs:
            try:
                yield from self._expand_one(src)
            except ManyfilesError as exc:
                failed(src if isinstance(src, str) else os.fsdecode(src), exc)

    def _expand_one(self, src: Source) -> Iterator[tuple]:
        if isinstance(src, str) and src.startswith("s3://"):
            yield from self._expand_s3(src)
            return
        origin = self.origin(src)
        assert isinstance(origin, FileOrigin)
        if not os.path.isdir(origin.path):
            yield origin, None
            return
        from manyfiles.listing import walk

        for d in walk(origin.path):
            if d.error is not None:
                raise from_oserror(d.error, os.fsdecode(d.path))
            for e in d.entries:
                if e.type in ("f", "?"):
                    yield FileOrigin(os.path.join(d.path, e.name)), None

    def _expand_s3(self, url: str) -> Iterator[tuple]:
        from manyfiles.s3.keys import parse_url
        from manyfiles.s3.listing import list_objects

        parsed = parse_url(url)
        if parsed.pattern is None and parsed.prefix and not parsed.prefix.endswith("/"):
            origin = self.origin(url)
            try:
                validator, size = origin.stat()
            except NotFound:
                parsed = parse_url(url + "/")    # not an object: maybe a "folder"
            else:
                yield origin, (validator, size)
                return
        settings = self.origin(f"s3://{parsed.bucket}/x").settings
        found = False
        try:
            for info in list_objects(settings, parsed):
                if info.key.endswith("/") and not info.size:
                    continue      # a "folder" marker
                found = True
                known = None if info.size is None else (S3Origin.validator(info.etag, info.size), info.size)
                yield S3Origin(parsed.bucket, info.key, settings), known
        except ManyfilesError:
            raise
        except Exception as exc:
            from manyfiles.cache._origin import s3_error

            raise s3_error(exc, url) from exc
        if not found:
            raise NotFound(f"{url}: no such object or prefix")

    def _warm_one(self, item: tuple) -> tuple[str, int]:
        origin, known = item
        validator, size = known if known is not None else origin.stat()
        v = self._validated(origin, validator, size, time.time())
        store, bs = self._store, self.block_size
        nblocks = -(-size // bs)
        missing = [i for i in range(nblocks) if not store.has_block(v.objid, i)]
        if not missing:
            store.note_access(v.objid, v.validated_at)
            return "cached", 0
        fetcher = origin.fetcher(validator)
        got = 0
        try:
            if isinstance(origin, S3Origin) and len(missing) == nblocks:
                got = self._warm_whole(v, fetcher)
            else:
                for i in missing:
                    data = fetcher.fetch(i * bs, min(bs, size - i * bs))
                    self._put(v, i, data)
                    got += len(data)
        finally:
            fetcher.close()
        return "fetched", got

    def _put(self, v: Version, index: int, data: bytes) -> None:
        try:
            fill = self._store.write_block(v, index, data)
        except OSError as exc:
            raise ManyfilesError(f"{self.dir}: cannot write to the cache: {exc.strerror or exc}") from exc
        self._store.account_async(fill)

    def _warm_whole(self, v: Version, fetcher: Any) -> int:
        """One GET for the whole object, checked whole (ETag MD5, multipart ETag or S3 checksum)
        before any of its blocks is installed; the entry is then marked verified."""
        from manyfiles.cache._origin import with_retries

        store = self._store

        def attempt() -> int:
            temps: list[str] = []
            stream = fetcher.open_stream(self.block_size)
            try:
                for i in range(-(-v.size // self.block_size)):
                    temps.append(store.write_temp(v, i, stream.next_block()))
                method = stream.finish()
                for i, tmp in enumerate(temps):
                    store.install(tmp, v.objid, i)
                    store.account_async(store.fill_record(v, i))
                store.mark_verified(v, method)
                return v.size
            except OSError as exc:
                raise ManyfilesError(f"{self.dir}: cannot write to the cache: {exc.strerror or exc}") from exc
            finally:
                stream.close()
                for tmp in temps:
                    if os.path.exists(tmp):
                        os.unlink(tmp)

        return with_retries(attempt)

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

    def verify(self, *, progress: ProgressArg = False) -> VerifyReport:
        """Check every block against its header and CRC-32; remove what is corrupt, orphaned or
        left over by killed processes; make the index match what is on disk."""
        from manyfiles.cache._verify import verify

        check_progress(progress)
        self.flush()
        with progress_for(progress, "cache verify", unit="entries") as p:
            return verify(self._store, VerifyReport(), p)


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


def _reason(exc: BaseException, shown: str) -> str:
    text = str(exc)
    return text[len(shown) + 2:] if text.startswith(shown + ": ") else text


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
    validator, size = origin.stat()
    v = Version(b"", origin.source, validator, size, time.time())
    raw = CachedReader(origin, v, store=None, block_size=fmt.DEFAULT_BLOCK_SIZE, pool=_passthrough_pool())
    if buffering == 0:
        return raw
    return io.BufferedReader(raw, buffer_size=DEFAULT_BUFFER if buffering < 0 else buffering)


__all__ = ["Cache", "CacheStats", "EvictReport", "VerifyReport", "WarmReport", "open", "shared_cache"]
