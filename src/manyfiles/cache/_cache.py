"""The public face: :class:`Cache` and :func:`open`.

A :class:`Cache` is one cache directory seen from one process.  Any number of ``Cache``
objects, threads and processes may use the same directory at once.  Reports of the bulk
operations (warm, verify, evict) and the statistics are plain dataclasses (_reports.py).

``Cache`` holds three parts and hands each call to the one it is about:

* :class:`~manyfiles.cache._versions.Versions` -- which version of a source to read (a ``stat``,
  a ``HEAD``, a GET's answer, a listing, or a validation younger than ``ttl``);
* :class:`~manyfiles.cache._opener.Opener` -- the open path: that version as the reader that
  serves it (its whole file, a checked copy in memory, or a :class:`CachedReader`), and the
  background fetches and completions readers start;
* :class:`~manyfiles.cache._store.BlockStore` -- the directory: its files and index (the file layer),
  with the write-behind (_fills.py), counters and space (eviction, _space.py) that :func:`open_store`
  builds over it from (files, index, counters).

The bulk operations live in modules of their own: _warm.py, _verify.py, _handover.py (what is handed
to and taken from s3pull).
"""

from __future__ import annotations

import atexit
import builtins
import io
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles._core.retry import RetryPolicy
from manyfiles.cache import _format as fmt
from manyfiles.cache._counters import Counters
from manyfiles.cache._fills import Fills
from manyfiles.cache._index import Version
from manyfiles.cache._kept import Kept, KeptListing, KeptObject
from manyfiles.cache._offline import PROBE, REACH, check_mode, endpoint_of, fall_back
from manyfiles.cache._opener import FETCH_THREADS, Opener
from manyfiles.cache._origin import FileOrigin, Head, S3Origin, parse_source
from manyfiles.cache._reader import CachedReader, MemoryFile
from manyfiles.cache._reports import CacheStats, EvictReport, VerifyReport, WarmReport
from manyfiles.cache._space import Space, check_low_water
from manyfiles.cache._store import BlockStore
from manyfiles.cache._versions import Source, Versions, listed
from manyfiles.cache._write import WriteThrough
from manyfiles.errors import ManyfilesError, OfflineMiss, UsageError, from_oserror

if TYPE_CHECKING:
    from manyfiles.cache._hits import HitTable

DEFAULT_BUFFER = io.DEFAULT_BUFFER_SIZE     # as open(): small random reads stay cheap
VERIFY_WHOLE_MAX = 64 << 20
MODES = ("rb", "wb")
PROCESS_COUNTERS = ("hits", "misses", "hit_bytes", "miss_bytes", "object_hits", "object_misses", "fills",
                    "fill_bytes", "fills_dropped", "fills_queued", "fill_bytes_queued", "fills_done",
                    "fill_bytes_done")


def open_store(dir: str | os.PathLike, *, block_size: int | None, max_size: int | None,
               min_free: float | int | None, low_water: float, verify: bool,
               fill_queue_bytes: int | None) -> BlockStore:
    """The cache directory's file layer, with the space keeper, the write-behind and the counters
    built over it (they see it as :class:`~manyfiles.cache._blockfiles.BlockFiles`)."""
    check_low_water(low_water)          # before the directory is made
    files = BlockStore(dir, block_size=block_size, verify=verify)
    space = Space(files, max_size=max_size, min_free=min_free, low_water=low_water)
    fills = Fills(files, fill_queue_bytes)
    files.attach(space, fills, Counters(files.index, degrade=files.degrade, wake=fills.start))
    return files


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
        offline: None (default): when the S3 endpoint cannot be reached, serve the versions validated
            last that the cache holds (one :class:`~manyfiles.errors.OfflineWarning` per process);
            True: never ask the origin; False: never fall back.  See docs/ml.md, "Offline".

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
                 strict: bool = False, retry: RetryPolicy | None = None, offline: bool | None = None) -> None:
        offline = check_mode(offline)
        if verify_whole_max < 0:
            raise UsageError(f"verify_whole_max {verify_whole_max}: must not be negative")
        self._store = open_store(dir, block_size=block_size, max_size=max_size, min_free=min_free,
                                 low_water=low_water, verify=verify, fill_queue_bytes=fill_queue)
        #: the keyword arguments this cache was opened with (a cluster worker opens its own with them)
        self.options = {"max_size": max_size, "min_free": min_free, "block_size": self._store.block_size,
                        "verify": verify, "ttl": ttl, "settings": settings, "prefetch": prefetch,
                        "low_water": low_water, "fill_queue": fill_queue,
                        "verify_whole_max": verify_whole_max, "strict": strict, "retry": retry,
                        "offline": offline}
        self.dir = self._store.root
        self.block_size = self._store.block_size
        self.ttl = float(ttl)
        self.settings = settings
        self.prefetch = prefetch
        self.verify_whole_max = verify_whole_max
        self.strict = strict
        self.retry = retry or RetryPolicy()
        self.offline = offline
        self._kept = Kept(self.dir)
        self._versions = Versions(self._store.index, ttl=self.ttl, settings=settings, retry=self.retry,
                                  kept=self._kept, offline=offline)
        self._opener = Opener(self._store, self._versions, prefetch=prefetch,
                              verify_whole_max=verify_whole_max, strict=strict, retry=self.retry)
        self._versions.held = self._opener.holds_checked
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
        self._opener.after_fork()
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
        self._opener.close()
        self._store.close()

    def flush(self) -> None:
        """Wait until every fetch started by this process (prefetches of closed readers, background
        completions too) is on disk and accounted, and the counters are written."""
        self._opener.flush()
        self._store.flush()

    # -- versions (_versions.py) -------------------------------------------------------------------

    def origin(self, src: Source | FileOrigin | S3Origin, settings: Any = None) -> FileOrigin | S3Origin:
        return self._versions.origin(src, settings)

    def version(self, origin: FileOrigin | S3Origin, *, revalidate: bool = False) -> Version:
        """The version of ``origin`` to read: trusted within ``ttl``, else asked of the origin."""
        return self._versions.resolve(origin, revalidate=revalidate, whole=False)[0]

    def validated(self, origin: FileOrigin | S3Origin, head: Head, now: float | None = None,
                  ttl: float | None = None) -> Version:
        """The version ``head`` names, validated ``now`` (remembered within ``ttl``)."""
        return self._versions.validated(origin, head, now, ttl)

    def holds_checked(self, v: Version) -> bool:
        """Does the cache hold ``v`` whole and checked (its whole file, or every block checked)?"""
        return self._opener.holds_checked(v)

    # -- reading (_opener.py) ----------------------------------------------------------------------

    def reader(self, src: Source, *, settings: Any = None, strict: bool | None = None,
               ttl: float | None = None, etag: str | None = None, size: int | None = None,
               listed_at: float | None = None, offline: bool | None = None) -> Any:
        """The raw reader of ``src`` (what :meth:`open` wraps in a BufferedReader): an ``io.FileIO``
        on its whole file, a :class:`MemoryFile` or a :class:`CachedReader` (``ttl``, ``etag``,
        ``size``, ``listed_at``: as for :meth:`open`)."""
        return self._opener.reader(src, settings=settings, strict=strict, ttl=ttl,
                                   listed=listed(etag, size, listed_at), offline=check_mode(offline))

    def open(self, src: Source, mode: str = "rb", *, buffering: int = -1, settings: Any = None,
             ttl: float | None = None, etag: str | None = None, size: int | None = None,
             listed_at: float | None = None, offline: bool | None = None) -> Any:
        """``src`` as a binary file object: a seekable reader (``"rb"``) or a write-through writer
        (``"wb"``: the origin is written on close, then this cache's entry is invalidated).

        ``ttl``: this open's instead of the cache's.  ``etag`` and ``size``: the version of an S3
        object that a listing gave (``manyfiles.s3.list``, ``list_objects``), taken at ``listed_at``
        (default: now): no HEAD; that version is read, from the cache or by GETs pinned to the ETag
        (``If-Match``: an object changed since raises ObjectChanged, never mixes versions).
        ``offline``: this open's instead of the cache's (see :class:`Cache`).
        """
        _check_mode(mode)
        if mode == "wb":
            origin = self.origin(src, settings)
            return WriteThrough(origin, on_commit=lambda: self.invalidate(origin))
        raw = self._opener.reader(src, settings=settings, ttl=ttl, listed=listed(etag, size, listed_at),
                                  offline=check_mode(offline))
        if buffering == 0 or isinstance(raw, MemoryFile):
            return raw
        if buffering < 0:      # as open() chooses: the file's block size
            buffering = os.fstat(raw.fileno()).st_blksize if isinstance(raw, io.FileIO) else DEFAULT_BUFFER
        return io.BufferedReader(raw, buffer_size=buffering)

    def get_bytes(self, src: Source, *, settings: Any = None, ttl: float | None = None,
                  etag: str | None = None, size: int | None = None, listed_at: float | None = None,
                  offline: bool | None = None) -> bytes:
        """The whole content of ``src``, through the cache (``ttl``, ``etag``, ``size``, ``listed_at``,
        ``offline``: as for :meth:`open`)."""
        raw = self._opener.reader(src, settings=settings, ttl=ttl, listed=listed(etag, size, listed_at),
                                  offline=check_mode(offline))
        try:
            if isinstance(raw, MemoryFile):
                return raw.getvalue()
            data = raw.readall()
            if len(data) != raw.size:
                raise ManyfilesError(f"{raw.name}: read {len(data)} of {raw.size} bytes from the cache")
            return data
        finally:
            raw.close()

    # -- the hit path of datasets (_hits.py) ----------------------------------------------------------

    def object_ids(self, sources: Sequence[Source], *, etags: Sequence[str] | None = None,
                   sizes: Sequence[int] | None = None, stats: Sequence[os.stat_result] | None = None,
                   settings: Any = None) -> bytes:
        """The ids of these object versions (16 bytes each, concatenated, in order): ``s3://`` URLs
        at the ``etags`` and ``sizes`` a listing gave (``settings``: their endpoint), or local/NFS
        paths as their ``stats`` (``os.stat``) give them.  For :meth:`hit_table`."""
        from manyfiles.cache._origin import file_validator

        if stats is not None:
            return b"".join(fmt.object_id(FileOrigin(p).source, file_validator(st))
                            for p, st in zip(sources, stats, strict=True))
        if etags is None or sizes is None:
            raise UsageError("object_ids: give etags= and sizes= (S3 URLs) or stats= (files)")
        if not sources:
            return b""
        first = self.origin(sources[0], settings)
        prefix = first.source[:len(first.source) - len(f"{first.bucket}/{first.key}".encode())]
        return b"".join(fmt.object_id(prefix + os.fspath(u)[5:].encode(), S3Origin.validator(e, n))
                        for u, e, n in zip(sources, etags, sizes, strict=True))

    def hit_table(self, ids: bytes) -> HitTable:
        """For one thread: where the packs hold each of the versions ``ids`` (:meth:`object_ids`), read
        with one ``pread`` each (``table.get(i)``: bytes, or None when not packed: read it with
        :meth:`get_bytes`), no SQLite per read.  Call ``table.refresh()`` before a batch of reads and
        ``table.settle()`` after (its hits then count in :meth:`stats`)."""
        from manyfiles.cache._hits import HitTable

        return HitTable(self._store, ids, packed_max=self.verify_whole_max)

    # -- listings, kept for offline reads (_kept.py) ------------------------------------------------

    def list_objects(self, url: Any, *, settings: Any = None, delimiter: str | None = None,
                     offline: bool | None = None) -> KeptListing:
        """The objects under the S3 ``url`` (``s3://bucket/prefix``, s3pull's wildcards; or a
        :class:`manyfiles.s3.keys.S3Url`) with their sizes, ETags and mtimes, in key order
        (``delimiter="/"``: one level, common prefixes as objects of size None).  Every listing is
        kept in the cache; when the endpoint cannot be reached (``offline``: as for :meth:`open`),
        the kept one is served (its ``offline`` says why), or :class:`~manyfiles.errors.OfflineMiss`
        when none is kept."""
        return self._list_objects(url, settings, delimiter, offline)

    def _list_objects(self, url: Any, settings: Any, delimiter: str | None, offline: bool | None, *,
                      watch: Any = None, fetching: bool = False) -> KeptListing:
        """:meth:`list_objects`; ``watch``: a run's stall watch (``cache warm``'s), moved by every
        page; ``fetching``: a listing that must be made offline raises the network error (_offline.py)."""
        from manyfiles.s3.keys import parse_url
        from manyfiles.s3.object_listing import list_objects_lean
        from manyfiles.s3.objects import resolve

        parsed = parse_url(url) if isinstance(url, str) else url
        shown = url if isinstance(url, str) else f"s3://{parsed.bucket}/{parsed.pattern or parsed.prefix}"
        resolved = resolve(settings or self.settings)
        offline = self.offline if check_mode(offline) is None else offline
        endpoint = endpoint_of(resolved)
        key = "\n".join((endpoint, parsed.bucket, parsed.prefix, parsed.pattern or "", delimiter or ""))

        def run(retry: RetryPolicy) -> list[KeptObject]:
            return [KeptObject(*o) for o in list_objects_lean(resolved, parsed, retry=retry, mtime=True,
                                                              delimiter=delimiter, watch=watch)]

        def keep(objects: list[KeptObject]) -> KeptListing:
            try:
                self._kept.keep(key, objects, at)
            except (OSError, sqlite3.Error) as exc:      # the listing stands; only offline loses it
                warnings.warn(f"manyfiles: {self.dir}: cannot keep the listing of {shown}: {exc}",
                              stacklevel=3)
            return KeptListing(objects, at, None)

        def kept() -> tuple[KeptListing, str] | None:
            got = self._kept.listing(key)
            if got is None:
                return None
            objects = [self._newest(parsed.bucket, o, got[1], resolved) for o in got[0]]
            why = "offline=True" if offline else REACH.reason_down(endpoint)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(got[1]))
            return KeptListing(objects, got[1], why), f"the listing of {shown} made {when}"

        at = time.time()
        return fall_back(shown, endpoint, offline, probe=lambda: keep(run(PROBE)),
                         retried=lambda: keep(run(self.retry)), cached=kept,
                         missing=lambda why: OfflineMiss(f"{shown}: offline ({why}), and the cache keeps no "
                                                         "listing of it"), fetching=fetching)

    def _newest(self, bucket: str, o: KeptObject, at: float, settings: Any) -> KeptObject:
        """``o`` of a kept listing made ``at``, at the version validated last (a HEAD or GET after
        the listing may have seen a newer one: never serve an older one offline)."""
        if o.size is None or o.key.endswith("/"):
            return o
        origin = self._versions.origin(f"s3://{bucket}/{o.key}", settings)
        newest = [(at, S3Origin.validator(o.etag, o.size))]
        latest = self._store.index.latest(origin.source)
        if latest is not None:
            newest.append((latest.validated_at, latest.validator))
        seen = self._kept.superseded(origin.source)
        if seen is not None:
            newest.append((seen[1], seen[0]))
        validator = max(newest)[1]
        if validator == newest[0][1]:
            return o
        fields = dict(p.split(b"=", 1) for p in validator.split(b";"))
        return o._replace(etag=fields[b"etag"].decode() or None, size=int(fields[b"size"]))

    def head(self, src: Source, *, settings: Any = None, offline: bool | None = None
             ) -> tuple[int, str | None, float | None]:
        """(size, ETag, mtime) of the S3 object ``src``: one HEAD (offline, as for :meth:`open`: the
        version validated last that the cache holds, mtime None).  NotFound when there is no such object."""
        origin = self.origin(src, settings)
        v, head, _ = self._versions.resolve(origin, whole=False, ttl=0, offline=offline)
        mtime = None
        info = head.info if head is not None else None
        if info is not None:
            from email.utils import parsedate_to_datetime

            stamp = info.headers.get("last-modified") or info.headers.get("Last-Modified")
            if stamp:
                mtime = parsedate_to_datetime(stamp).timestamp()
        return v.size, S3Origin.etag_of(v.validator) if isinstance(origin, S3Origin) else None, mtime

    def offline_reason(self, src: Source, *, settings: Any = None, offline: bool | None = None) -> str | None:
        """Why reads of ``src`` are served offline now (``offline=True``, or its S3 endpoint was
        found unreachable by this process less than a minute ago), None when the origin is asked."""
        return self._versions.offline_reason(self.origin(src, settings), offline)

    # -- handed over to and from other tools (s3pull --cache: _handover.py) -------------------------

    def export(self, src: Source | S3Origin, etag: str, size: int, write: Callable[[bytes], Any]) -> bool:
        """Hand the cached content of ``src`` at version (``etag``, ``size``) to ``write`` if the
        cache holds it checked (whole, or every block checked); False, writing nothing, otherwise.
        (A file found short while writing raises OSError: the caller drops what it wrote.)

        For tools that know the version from a listing (``s3pull --cache``): no request is made.
        """
        from manyfiles.cache._handover import export

        origin = self.origin(src)
        return export(self._store, origin, self.validated(origin, Head(S3Origin.validator(etag, size), size)),
                      write)

    def fill(self, src: Source, data: bytes, *, etag: str, checked: str | None = None,
             listed_at: float | None = None, settings: Any = None) -> None:
        """Keep ``data``: the whole content of the S3 object ``src`` at version ``etag``, which the
        caller fetched itself for a read that missed the cache (counted as one).  ``checked``: how
        the caller checked the whole object against its claim ("md5", "crc32c"... as s3pull's
        engines report it): it is then kept as its whole file (a CRC-32 computed here protects it
        at rest).  Unchecked, it is kept as unverified blocks and checked whole in the background,
        like any range no check covered.  Written in the background, like any fill (dropped, and
        counted, when the fill queue is full).  ``settings``: those the caller fetched with (a
        dataset's, resolved when it listed); resolved once per cache and settings, not per fill:
        the bytes are kept under the endpoint they came from (docs/ml.md)."""
        from manyfiles.cache._handover import fill

        origin = self._versions.origin(src, settings, fetched=True)
        v = self._versions.resolve(origin, listed=listed(etag, len(data), listed_at))[0]
        fill(self._store, self._opener.completions, origin, v, data, checked)

    def import_file(self, src: Source | S3Origin, etag: str, size: int, path: str | os.PathLike, *,
                    claim: Any = None) -> None:
        """Fill the cache, in the background, from a local copy of ``src`` at version (``etag``, ``size``)
        that another tool just downloaded and checked (``s3pull --cache``).  The copy is hashed
        again against ``claim`` (a :class:`manyfiles.s3.integrity.Claim`; default: the MD5 when the
        ETag is one); nothing is cached when there is nothing to check it against, or it fails."""
        from manyfiles.cache._handover import import_file

        origin = self.origin(src)
        v = self.validated(origin, Head(S3Origin.validator(etag, size), size))
        self._opener.pool.submit(import_file, self._store, v, os.fsencode(path), claim)

    # -- bulk (_warm.py, _verify.py) ---------------------------------------------------------------

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

    # -- space (_space.py) -------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        """Counters of this cache directory (all processes), after flushing this process's."""
        self.flush()
        c = self._store.index.counters()
        space = self._store.space
        try:
            free = os.statvfs(self.dir).f_bavail * os.statvfs(self.dir).f_frsize
        except OSError:
            free = 0
        names = ("hits", "misses", "hit_bytes", "miss_bytes", "fills", "fill_bytes", "fills_dropped",
                 "evictions", "evicted_bytes", "corrupt", "object_hits", "object_misses")
        return CacheStats(self.dir, c.get("entries", 0), c.get("bytes", 0), self.block_size, space.max_size,
                          space.min_free, free, **{n: c.get(n, 0) for n in names})

    def process_stats(self) -> dict[str, int]:
        """This process's own counters since it started (a forked worker: since the fork), read
        from memory: ``hits``, ``misses``, ``hit_bytes``, ``miss_bytes``, ``object_hits``,
        ``object_misses``, ``fills`` (accounted), ``fill_bytes``, ``fills_dropped``, and the
        write-behind's ``fills_queued``/``fill_bytes_queued`` and ``fills_done``/``fill_bytes_done``
        (written, or given up at the disk).  :meth:`stats` sums every process's, from the index."""
        out = dict.fromkeys(PROCESS_COUNTERS, 0)
        out.update(self._store.counters.totals)
        out.update(self._store.fills.tally())
        return out

    def invalidate(self, src: Source | FileOrigin | S3Origin) -> int:
        """Forget every cached version of ``src`` (done after a write-through); returns entries removed."""
        origin = self.origin(src)
        self._versions.forget(origin.source)
        return len(self._store.space.remove_sources([origin.source]))

    def evict(self, srcs: Iterable[Source] | None = None, *, to_size: int | None = None,
              older_than: float | None = None, dry_run: bool = False) -> EvictReport:
        """Remove entries: those of ``srcs``; or least recently used ones until the cache holds
        ``to_size`` bytes; or those not used for ``older_than`` seconds; with no argument, apply
        the ``max_size`` / ``min_free`` watermarks now.  ``dry_run``: report what would go (the
        same choice, made by the same code inside a rolled-back index transaction); nothing is
        removed."""
        t0 = time.monotonic()
        self.flush()
        sources = None if srcs is None else [self.origin(s).source for s in srcs]
        victims = self._store.space.evict(sources, to_size=to_size, older_than=older_than, dry_run=dry_run)
        if sources is not None:
            self._versions.forget()
        return EvictReport(entries=sum(v.entries for v in victims), bytes=sum(v.frees for v in victims),
                           seconds=time.monotonic() - t0, dry_run=dry_run)

    def clear(self, *, dry_run: bool = False) -> EvictReport:
        """Remove every entry and block file (the directory stays a cache); the report counts
        what was indexed.  ``dry_run``: only count."""
        t0 = time.monotonic()
        self.flush()
        c = self._store.index.counters()
        report = EvictReport(entries=c.get("entries", 0), bytes=c.get("bytes", 0), dry_run=dry_run,
                             verb="removed")
        if dry_run:
            return report
        self._store.space.clear()
        self._kept.clear()
        self._versions.forget()
        report.seconds = time.monotonic() - t0
        return report


# -- module-level open and the shared caches -------------------------------------------------------

def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise UsageError(f"mode {mode!r}: manyfiles.open supports 'rb' and 'wb'")


_SHARED: dict[str, Cache] = {}
_SHARED_LOCK = threading.Lock()
_PASSTHROUGH_POOL: ThreadPoolExecutor | None = None
_OPEN: weakref.WeakSet[Cache] = weakref.WeakSet()     # closed at exit: queued fills reach the disk


def default_dir() -> str:
    """The cache directory when none is given: ``$MANYFILES_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/manyfiles``, else ``~/.cache/manyfiles``."""
    env = os.environ.get("MANYFILES_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "manyfiles")


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
         settings: Any = None, buffering: int = -1, ttl: float | None = None,
         offline: bool | None = None) -> Any:
    """Open a local/NFS path or an ``s3://bucket/key`` URL as a binary file object.

    ``"rb"`` gives a seekable reader (``read``, ``readinto``, ``seek``/``tell``, context
    manager); with ``cache`` (a :class:`Cache` or a cache directory) it reads through that
    cache.  ``"wb"`` writes through to the origin: a local file is replaced atomically on
    close, an S3 object is uploaded on close; the cached entry is then invalidated.
    ``settings`` is a :class:`manyfiles.s3.ClientSettings` for S3 URLs.  ``ttl`` (with
    ``cache``): seconds a validation of ``src`` stays trusted for this open (default: the
    cache's, 0: a ``stat`` or ``HEAD`` per open), as ``Cache(dir, ttl=...)``.  ``offline`` (with
    ``cache``): None (default) serves the version validated last from the cache when the S3 endpoint
    cannot be reached (warned once per process); True never asks it; False never falls back.

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
        return cache.open(src, mode, buffering=buffering, settings=settings, ttl=ttl, offline=offline)
    if ttl is not None:
        raise UsageError("ttl= is for reads through a cache (give cache=DIR too)")
    if offline:
        raise UsageError("offline= is for reads through a cache (give cache=DIR too)")
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


__all__ = ["Cache", "CacheStats", "EvictReport", "VerifyReport", "WarmReport", "default_dir", "open",
           "shared_cache"]
