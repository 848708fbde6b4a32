"""``Cache.warm``: fetch files, folders, S3 objects and prefixes into the cache ahead of the readers.

Sources are expanded (S3 prefixes listed, folders walked) into objects, warmed by ``jobs``
threads.  An object counts as *cached* only when the cache holds it checked: its whole file, or
every block checked per part; anything else -- missing, partial, or holding unverified blocks --
is fetched whole in one GET and checked before it is installed (_complete.py).  An S3 object
named alone is opened by its GET (whose answer gives the version): no HEAD.

A warm has a stall watch as a pull does (:class:`~manyfiles._core.progress.StallWatch`, under
the cache's retry policy): every object warmed and every page listed moves it; while nothing
moves the progress says ``stalled Ns: last error ...``; past the stall timeout the warm ends with
:class:`~manyfiles.errors.Stalled`, its requests in flight interrupted (its S3 origins use an
object client of its own for that).  A source that fails because the endpoint never answered
(the retry policy's first-contact budget) ends the warm with that error: every other source
would wait as long.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.pool import Pool
from manyfiles._core.progress import ProgressArg, StallWatch, iter_ticking, progress_for
from manyfiles.cache._complete import complete
from manyfiles.cache._origin import FileOrigin, Head, S3Origin
from manyfiles.cache._reports import WarmReport
from manyfiles.errors import ManyfilesError, NotFound, OfflineMiss, from_oserror


def warm(cache: Any, srcs: Iterable[Any], *, jobs: int, progress: ProgressArg,
         fetched_since: float | None = None) -> WarmReport:
    """What :meth:`Cache.warm` does on this machine.  ``fetched_since`` (a time.time()): objects
    found complete whose files were written since then count as fetched, not cached -- a cluster
    shard run again on the node where its lost attempt fetched them (cache/_cluster.py)."""
    report = WarmReport()
    lock = threading.Lock()
    t0 = time.monotonic()
    run = _Run(cache)
    from manyfiles.s3.retry import NETWORK_CODES as network_codes

    with progress_for(progress, "cache warm", unit="objects") as p:

        def failed(shown: str, exc: ManyfilesError) -> None:
            code = _code(exc)
            if code in network_codes:
                if not run.watch.ever_moved:
                    # the endpoint never answered this run, for a request's whole first-contact
                    # budget: every other source would wait as long (one that went away: the watch)
                    run.stop.set()
                    raise exc
                run.watch.failed(str(exc))
            else:
                run.watch.moving = True     # an answer (a missing key...), or a local file
            with lock:
                report.objects += 1
                report.add_failure(shown, _reason(exc, shown), code)
            p.add(1, failures=1)

        def work(item: tuple) -> None:
            try:
                kind, n = warm_one(cache, item, run.stop, fetched_since)
            except ManyfilesError as exc:
                failed(item[0].display, exc)
                return
            run.watch.moving = True
            with lock:
                report.objects += 1
                report.bytes += n
                if kind == "cached":
                    report.cached += 1
                else:
                    report.fetched += 1
            p.add(1, bytes=n)
            checkpoint("warm")

        def tick() -> None:
            run.tick(p)
            p.tick()

        items = iter_ticking(expand(cache, srcs, failed, run), tick)
        try:
            Pool(work, jobs, name="manyfiles-cache-warm").run(items, tick=tick)
        finally:
            items.close()
        cache.flush()
    report.seconds = time.monotonic() - t0
    return report


class _Run:
    """What one warm shares between its threads: the stall watch, the event that stops it, and
    the object client of its S3 origins (whose requests a stall interrupts)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.watch = StallWatch.for_policy(cache.retry)
        self.stop = threading.Event()
        self.where: str | None = None       # the endpoint, once an S3 source was seen
        self._client: Any = None

    def origin(self, url: str) -> S3Origin:
        """The origin of an S3 URL, on this warm's object client."""
        origin = self.cache.origin(url)         # its settings resolved by the cache
        if self._client is None:
            from manyfiles.s3.objects import ObjectClient
            from manyfiles.s3.retry import endpoint_name, has_answered

            self._client = ObjectClient(origin.settings, retry=self.cache.retry, cancel=self.stop)
            self.where = endpoint_name(origin.settings.endpoint_url) or f"s3://{origin.bucket}"
            self.watch.answered = self.watch.answered or has_answered(self.where)
        return S3Origin(origin.bucket, origin.key, origin.settings, self.cache.retry, self._client)

    def tick(self, progress: Any) -> None:
        """Show the stall; past the timeout stop every request in flight and raise Stalled."""
        try:
            self.watch.tick(progress, self.where)
        except ManyfilesError:
            self.stop.set()
            if self._client is not None:
                self._client.interrupt()
            raise


def expand(cache: Any, srcs: Iterable[Any], failed: Callable[[str, ManyfilesError], None],
           run: _Run | None = None) -> Iterator[tuple]:
    """(origin, known Head or None) for every object named or under a prefix."""
    run = run or _Run(cache)
    for src in srcs:
        try:
            yield from _expand_one(cache, src, run)
        except ManyfilesError as exc:
            failed(src if isinstance(src, str) else os.fsdecode(src), exc)


def _expand_one(cache: Any, src: Any, run: _Run) -> Iterator[tuple]:
    if isinstance(src, str) and src.startswith("s3://"):
        yield from _expand_s3(cache, src, run)
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


def _expand_s3(cache: Any, url: str, run: _Run) -> Iterator[tuple]:
    """Objects of ``url`` from its listing (kept in the cache, served from there offline; a source
    the cache cannot answer for offline fails with the network error, as any fetch would)."""
    from manyfiles.s3.keys import parse_url

    parsed = parse_url(url)
    if parsed.pattern is None and parsed.prefix and not parsed.prefix.endswith("/"):
        origin = run.origin(url)
        try:        # one HEAD (offline: the version validated last)
            v = cache._versions.resolve(origin, whole=False, ttl=0, fetching=True)[0]
        except NotFound as exc:
            if isinstance(exc, OfflineMiss):
                raise
            parsed = parse_url(url + "/")    # not an object: maybe a "folder"
        else:
            run.watch.moving = True
            yield origin, Head(v.validator, v.size)
            return
    found = False
    for info in cache._list_objects(parsed, None, None, None, watch=run.watch, fetching=True).objects:
        if info.key.endswith("/") and not info.size:
            continue      # a "folder" marker
        found = True
        yield run.origin(f"s3://{parsed.bucket}/{info.key}"), Head(S3Origin.validator(info.etag, info.size),
                                                                   info.size)
    if not found:
        raise NotFound(f"{url}: no such object or prefix")


def warm_one(cache: Any, item: tuple, stop: threading.Event | None = None,
             fetched_since: float | None = None) -> tuple[str, int]:
    """("cached", 0) when the cache holds the object checked (and did before ``fetched_since``),
    else ("fetched", bytes) once it does (``stop``: set when the warm stopped, which ends the fill)."""
    origin, known = item
    stream = None
    if known is None:
        stream = origin.open_whole(None)       # its answer is the version: no HEAD first
        known = stream.head
    try:
        v = cache.validated(origin, known)
        if cache.holds_checked(v):
            cache._store.counters.note_access(v.objid, v.validated_at)
            if fetched_since is not None and _written_since(cache._store, v, fetched_since):
                return "fetched", v.size
            return "cached", 0
        cache._versions.fetch_miss(origin, lambda: complete(cache._store, origin, v, cache.retry,
                                                            stream=stream, cancel=stop), fetching=True)
        stream = None
    except OSError as exc:
        raise ManyfilesError(f"{cache.dir}: cannot write to the cache: {exc.strerror or exc}") from exc
    finally:
        if stream is not None:
            stream.close()
    return "fetched", v.size


MTIME_SLACK = 0.05     # seconds: file times come from the kernel's coarse clock, behind time.time()


def _written_since(store: Any, v: Any, since: float) -> bool:
    """Was ``v`` written at or after ``since``: its whole file, else its record in a pack (when it was
    accounted: a pack's own time is that of its latest record, maybe another object's), else its
    blocks?"""
    if store.has_whole(v.objid):
        paths = [store.whole_path(v.objid)]
    elif store.packs.locate(v.objid) is not None:
        at = store.index.verified_at(v.objid)
        return at is not None and at >= since - MTIME_SLACK
    else:
        paths = [store.block_path(v.objid, i) for i in range(store.nblocks(v.size))]
    try:
        return max(os.stat(p).st_mtime for p in paths) >= since - MTIME_SLACK
    except FileNotFoundError:         # evicted meanwhile: it was there, not ours to count
        return False


def _code(exc: BaseException) -> str:
    """A failure's code: the S3 or network one it carries (``timeout``, ``SlowDown``...), else its kind."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else type(exc).__name__


def _reason(exc: BaseException, shown: str) -> str:
    text = str(exc)
    return text[len(shown) + 2:] if text.startswith(shown + ": ") else text
