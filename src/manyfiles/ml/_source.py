"""What the Dataset and the filesystem read: a listed source, the per-process cache, the fast fetcher.

* :func:`list_source` -- a source (``s3://bucket/prefix`` with s3pull's wildcards, or a local/NFS
  folder) listed once, in key order: one ListObjectsV2 request per 1,000 objects gives every key
  with its ETag and size, which *is* the validation of those objects (no HEAD per object).
* :class:`CacheRef` -- a cache directory and its options, picklable; ``.get()`` is this process's
  :class:`~manyfiles.cache.Cache` for it (opened once per process, after fork or spawn too).
* :class:`ObjectFetcher` -- listed items fetched whole through the public many-objects fetch
  (:class:`manyfiles.s3.Fetcher`: s3pull's lean engine), each pinned to its listed ETag and checked
  whole (MD5 ETag, multipart ETag or S3 checksum) before its bytes are handed out and kept in the cache.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from manyfiles.cache import Cache, shared_cache
from manyfiles.errors import ManyfilesError, NotFound, UsageError

if TYPE_CHECKING:
    from manyfiles.s3 import FetchResult

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
    stats: list | None = None             # files: each one's lstat (None: gone), in order (see take_stats)

    def take_stats(self) -> list:
        """The files' stats, once (they are the versions the listing saw; not kept, not pickled)."""
        stats, self.stats = self.stats or [], None
        return stats


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
        return Listing(root, [Item(root, root, os.path.getsize(root), None)], at, stats=[os.stat(root)])
    if not os.path.isdir(root):
        raise NotFound(f"{root}: no such file or directory")
    from manyfiles.listing import walk

    found = []
    for d in walk(root, stat=True):       # (the stats: the versions the dataset's hit path expects)
        if d.error is not None:
            raise ManyfilesError(f"{os.fsdecode(d.path)}: {d.error.strerror or d.error}")
        for e, st in zip(d.entries, d.stats, strict=True):
            if e.type in ("f", "?"):
                path = os.path.join(os.fsdecode(d.path), os.fsdecode(e.name))
                if keep is None or keep(os.path.relpath(path, root)):
                    found.append((path, st))
    if not found:
        raise NotFound(f"{root}: no files there")
    found.sort(key=lambda f: f[0])
    return Listing(root, [Item(p, p, None, None) for p, _ in found], at, stats=[st for _, st in found])


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


# -- whole objects through the public many-objects fetch ------------------------------------------------

class ObjectFetcher:
    """The listed items of one bucket fetched whole by :class:`manyfiles.s3.Fetcher` (``workers``
    connections of s3pull's lean engine), each pinned to its listed ETag and size and checked whole:
    ``submit(item)`` then ``result(item)`` (a :class:`~manyfiles.s3.FetchResult`, in any order).
    One per process (not picklable)."""

    def __init__(self, bucket: str, settings: Any, workers: int) -> None:
        from manyfiles.s3 import Fetcher

        self._fetcher = Fetcher(bucket, settings=settings, workers=workers)
        self.pid, self.bucket = self._fetcher.pid, bucket

    def submit(self, item: Item) -> None:
        self._fetcher.submit(item.key, size=item.size, etag=item.etag)

    def result(self, item: Item) -> FetchResult:
        """Wait for ``item`` (submitted before); other objects' outcomes are kept for their turn."""
        return self._fetcher.result(item.key)

    def abandon(self, item: Item) -> None:
        """``item`` was submitted but will not be waited for: drop its outcome when it comes."""
        self._fetcher.abandon(item.key)

    def close(self) -> None:
        self._fetcher.close()


def chunks(seq: list, n: int) -> Iterator[list]:
    for i in range(0, len(seq), n):
        yield seq[i:i + n]
