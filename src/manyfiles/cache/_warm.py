"""``Cache.warm``: fetch files, folders, S3 objects and prefixes into the cache ahead of the readers.

Sources are expanded (S3 prefixes listed, folders walked) into objects, warmed by ``jobs``
threads.  An object counts as *cached* only when the cache holds it checked: its whole file, or
every block checked per part; anything else -- missing, partial, or holding unverified blocks --
is fetched whole in one GET and checked before it is installed (_complete.py).  An S3 object
named alone is opened by its GET (whose answer gives the version): no HEAD.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from manyfiles._core.pool import Pool
from manyfiles._core.progress import ProgressArg, progress_for
from manyfiles.cache._complete import complete
from manyfiles.cache._origin import FileOrigin, Head, S3Origin
from manyfiles.cache._reports import WarmReport
from manyfiles.errors import ManyfilesError, NotFound, OfflineMiss, from_oserror


def warm(cache: Any, srcs: Iterable[Any], *, jobs: int, progress: ProgressArg) -> WarmReport:
    """What :meth:`Cache.warm` does on this machine."""
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
                kind, n = warm_one(cache, item)
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

        Pool(work, jobs, name="manyfiles-cache-warm").run(expand(cache, srcs, failed), tick=p.tick)
        cache.flush()
    report.seconds = time.monotonic() - t0
    return report


def expand(cache: Any, srcs: Iterable[Any], failed: Callable[[str, ManyfilesError], None]) -> Iterator[tuple]:
    """(origin, known Head or None) for every object named or under a prefix."""
    for src in srcs:
        try:
            yield from _expand_one(cache, src)
        except ManyfilesError as exc:
            failed(src if isinstance(src, str) else os.fsdecode(src), exc)


def _expand_one(cache: Any, src: Any) -> Iterator[tuple]:
    if isinstance(src, str) and src.startswith("s3://"):
        yield from _expand_s3(cache, src)
        return
    origin = cache.origin(src)
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


def _expand_s3(cache: Any, url: str) -> Iterator[tuple]:
    """Objects of ``url`` from its listing (kept in the cache, served from there offline)."""
    from manyfiles.s3.keys import parse_url

    parsed = parse_url(url)
    if parsed.pattern is None and parsed.prefix and not parsed.prefix.endswith("/"):
        origin = cache.origin(url)
        try:
            size, etag, _ = cache.head(url)     # one HEAD (offline: the version validated last)
        except NotFound as exc:
            if isinstance(exc, OfflineMiss):
                raise
            parsed = parse_url(url + "/")    # not an object: maybe a "folder"
        else:
            yield origin, Head(S3Origin.validator(etag, size), size)
            return
    found = False
    for info in cache.list_objects(parsed).objects:
        if info.key.endswith("/") and not info.size:
            continue      # a "folder" marker
        found = True
        yield cache.origin(f"s3://{parsed.bucket}/{info.key}"), Head(S3Origin.validator(info.etag, info.size),
                                                                     info.size)
    if not found:
        raise NotFound(f"{url}: no such object or prefix")


def warm_one(cache: Any, item: tuple) -> tuple[str, int]:
    """("cached", 0) when the cache holds the object checked, else ("fetched", bytes) once it does."""
    origin, known = item
    stream = None
    if known is None:
        stream = origin.open_whole(None)       # its answer is the version: no HEAD first
        known = stream.head
    try:
        v = cache.validated(origin, known)
        if cache.holds_checked(v):
            cache._store.counters.note_access(v.objid, v.validated_at)
            return "cached", 0
        cache._versions.fetch_miss(origin, lambda: complete(cache._store, origin, v, cache.retry,
                                                            stream=stream))
        stream = None
    except OSError as exc:
        raise ManyfilesError(f"{cache.dir}: cannot write to the cache: {exc.strerror or exc}") from exc
    finally:
        if stream is not None:
            stream.close()
    return "fetched", v.size


def _reason(exc: BaseException, shown: str) -> str:
    text = str(exc)
    return text[len(shown) + 2:] if text.startswith(shown + ": ") else text
