"""What the Dataset and the filesystem read: a listed source, the per-process cache, the fast fetcher.

* :func:`list_source` -- a source (``s3://bucket/prefix`` with s3pull's wildcards, or a local/NFS
  folder) listed once, in key order: one ListObjectsV2 request per 1,000 objects gives every key
  with its ETag and size, which *is* the validation of those objects (no HEAD per object).
* :class:`CacheRef` -- a cache directory and its options, picklable; ``.get()`` is this process's
  :class:`~manyfiles.cache.Cache` for it (opened once per process, after fork or spawn too).
* :class:`ObjectFetcher` -- whole-object GETs through s3pull's lean engine (raw sockets, signed
  by hand), each pinned to its listed ETag and checked whole (MD5 ETag, multipart ETag or S3
  checksum) before its bytes are handed out and kept in the cache.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from manyfiles.cache import Cache, shared_cache
from manyfiles.errors import ManyfilesError, NotFound, UsageError

PREFETCH_MAX_BYTES = 64 << 20     # larger objects are read through the cache's own streamed path


class Item(NamedTuple):
    """One object of a listed source: ``key`` (S3 key or file path), its URL or path for the cache,
    and the version the listing saw (``etag`` None for files: a stat validates them)."""

    key: str
    url: str
    size: int | None
    etag: str | None


@dataclass
class Listing:
    """A source listed at ``listed_at`` (time.time()): its items in key order."""

    source: str
    items: list[Item]
    listed_at: float
    bucket: str | None = None             # S3 sources
    settings: Any = None                  # ClientSettings (resolved) for S3 sources
    offline: str | None = None            # served from the cache's kept listing: why


def list_source(source: str | os.PathLike, *, settings: Any = None, include: Iterable[str] = (),
                exclude: Iterable[str] = (), cache: Cache | None = None, offline: bool | None = None
                ) -> Listing:
    """List ``source`` once: an S3 prefix (wildcards as s3pull) or a local/NFS folder (recursively) or
    file.  ``include``/``exclude``: s3pull's filters (a name pattern, or a path relative to the source).
    With ``cache``, an S3 listing is kept there, and served from there when the endpoint cannot be
    reached (``offline``: as :meth:`manyfiles.cache.Cache.list_objects`)."""
    from manyfiles.s3.keys import make_filter

    keep = make_filter(tuple(include), tuple(exclude))
    at = time.time()
    if isinstance(source, str) and source.startswith("s3://"):
        from manyfiles.s3 import ClientSettings
        from manyfiles.s3.keys import parse_url
        from manyfiles.s3.object_listing import list_objects_lean

        url = parse_url(source)
        settings = (settings or ClientSettings()).resolved()
        items = []
        why = None
        if cache is not None:
            kept = cache.list_objects(url, settings=settings, offline=offline)
            infos: Iterable[Any] = kept.objects
            at, why = kept.listed_at, kept.offline
        else:
            infos = list_objects_lean(settings, url)
        for info in infos:
            if info.key.endswith("/") and not info.size:
                continue             # a "folder" marker
            if keep is not None and not keep(info.key.removeprefix(url.base)):
                continue
            items.append(Item(info.key, f"s3://{url.bucket}/{info.key}", info.size, info.etag))
        if not items:
            raise NotFound(f"{source}: no objects there")
        return Listing(source, items, at, url.bucket, settings, why)
    root = os.path.abspath(os.fspath(source))
    if os.path.isfile(root):
        return Listing(root, [Item(root, root, os.path.getsize(root), None)], at)
    if not os.path.isdir(root):
        raise NotFound(f"{root}: no such file or directory")
    from manyfiles.listing import walk

    paths = []
    for d in walk(root):
        if d.error is not None:
            raise ManyfilesError(f"{os.fsdecode(d.path)}: {d.error.strerror or d.error}")
        for e in d.entries:
            if e.type in ("f", "?"):
                path = os.path.join(os.fsdecode(d.path), os.fsdecode(e.name))
                if keep is None or keep(os.path.relpath(path, root)):
                    paths.append(path)
    if not paths:
        raise NotFound(f"{root}: no files there")
    paths.sort()
    return Listing(root, [Item(p, p, None, None) for p in paths], at)


# -- the cache, per process --------------------------------------------------------------------------

@dataclass
class CacheRef:
    """A cache directory and the options to open it with; what goes through pickle to workers."""

    dir: str
    options: dict = field(default_factory=dict)

    @classmethod
    def of(cls, cache: Cache | str | os.PathLike, settings: Any = None) -> CacheRef:
        if isinstance(cache, Cache):
            options = {k: v for k, v in cache.options.items() if k != "block_size"}
            return cls(cache.dir, options)
        if not isinstance(cache, (str, os.PathLike)):
            raise UsageError(f"cache must be a directory or a manyfiles.Cache, not {cache!r}")
        return cls(os.path.abspath(os.fspath(cache)), {"settings": settings} if settings is not None else {})

    def get(self) -> Cache:
        """This process's Cache for the directory (every worker of the machine shares the directory)."""
        if not self.options:
            return shared_cache(self.dir)
        key = (self.dir, os.getpid(), repr(sorted(self.options.items(), key=lambda kv: kv[0])))
        cache = _OPENED.get(key)
        if cache is None:
            with _LOCK:
                cache = _OPENED.get(key)
                if cache is None:
                    cache = _OPENED[key] = Cache(self.dir, **self.options)
        return cache


_OPENED: dict[tuple, Cache] = {}
_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


# -- whole objects through the fast engine -------------------------------------------------------------

class Fetched(NamedTuple):
    data: bytes | None
    checked: str | None            # how the whole object was checked ("md5", "crc32c", "size-only")
    error: ManyfilesError | None


class ObjectFetcher:
    """Fetches whole objects of one bucket with s3pull's lean engine (``workers`` connections):
    ``submit(item)`` then ``result(item)`` (in any order).  One per process (not picklable)."""

    def __init__(self, bucket: str, settings: Any, workers: int) -> None:
        from manyfiles.s3.engines.base import Ctx, Options
        from manyfiles.s3.engines.threads import ThreadsEngine
        from manyfiles.s3.retry import RetryPolicy
        from manyfiles.s3.sink import MemorySink

        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._delivered: dict[str, bytes] = {}
        self._done: dict[str, Fetched] = {}
        self._abandoned: set[str] = set()
        self._ctx = Ctx(Options(bucket, settings, RetryPolicy(), verify=True), MemorySink(self._deliver))
        self._engine = ThreadsEngine(self._ctx, workers, name="lean", transport="lean")
        self.bucket = bucket

    def _deliver(self, key: str, data: bytes) -> None:       # an engine thread, before its "done"
        with self._lock:
            self._delivered[key] = data

    def submit(self, item: Item) -> None:
        from manyfiles.s3.transfer import Job

        self._engine.submit(Job(item.key, item.key, item.size, item.etag, "lean", 0))

    def result(self, item: Item) -> Fetched:
        """Wait for ``item`` (submitted before); other objects' outcomes are kept for their turn."""
        self._abandoned.discard(item.key)
        while item.key not in self._done:
            kind, job, value = self._ctx.events.get()
            if kind not in ("done", "failed"):
                continue
            with self._lock:
                data = self._delivered.pop(job.key, None)
            if job.key in self._abandoned:
                self._abandoned.discard(job.key)
            elif kind == "done":
                self._done[job.key] = Fetched(data, value.claim.method, None)
            else:
                self._done[job.key] = Fetched(None, None, _error(job.key, self.bucket, value))
        return self._done.pop(item.key)

    def abandon(self, item: Item) -> None:
        """``item`` was submitted but will not be waited for: drop its outcome when it comes."""
        if self._done.pop(item.key, None) is None:
            self._abandoned.add(item.key)

    def close(self) -> None:
        if os.getpid() == self.pid:
            self._engine.kill()


def _error(key: str, bucket: str, failed: Any) -> ManyfilesError:
    from manyfiles.errors import ObjectChanged, TransferError

    where = f"s3://{bucket}/{key}"
    if failed.stop is not None:
        return failed.stop
    if failed.code in ("changed", "PreconditionFailed"):
        return ObjectChanged(f"{where}: {failed.reason}")
    if failed.code in ("NoSuchKey", "NotFound"):
        return NotFound(f"{where}: {failed.reason}")
    return TransferError(f"{where}: {failed.reason}")


def chunks(seq: list, n: int) -> Iterator[list]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
