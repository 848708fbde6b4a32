"""Bulk uploads to S3 (``s3push``): list -> plan -> execute -> report, every file checked end to end.

Public API:

* :func:`push` -- upload files and folders to ``s3://bucket/prefix/``; returns a :class:`PushReport`.
* :func:`abort_stale` -- abort the multipart uploads under a prefix older than an age.
* :class:`PushReport`, :class:`AbortReport`.

Small files go as concurrent PUTs, large ones as multipart uploads with parallel parts; every body
carries a checksum the server verifies (CRC64NVME with awscrt, else Content-MD5) and every answer
is checked; a file that changes while it is read is read again, then reported, never uploaded as
is; a multipart upload completes only with every part checked, and a journal lets a rerun after
kill -9 resume it (see ``_journal.py``, docs/s3push.md).

Example:
    >>> from manyfiles.push import push
    >>> report = push(["./shards/"], "s3://bucket/shards/", progress=True)   # doctest: +SKIP
    >>> report.raise_for_failures()                                          # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import UsageError, shown
from manyfiles.mirror.options import BY, MAX_DELETE
from manyfiles.push._execute import MiB, route
from manyfiles.push._list import list_files, list_named
from manyfiles.push._run import Uploads, refused, upload_files, where_of
from manyfiles.push.report import AbortReport, PushReport
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import make_filter, parse_url
from manyfiles.s3.retry import RetryPolicy
from manyfiles.s3.store import store_for

CHECKSUMS = ("auto", "crc64nvme", "crc32c", "md5")
PART_SIZE = 16 * MiB
MULTIPART_THRESHOLD = 16 * MiB


def _algorithm(checksum: str) -> str:
    if checksum not in CHECKSUMS:
        raise UsageError(f"checksum must be one of {', '.join(CHECKSUMS)}, not {checksum!r}")
    has_crt = importlib.util.find_spec("awscrt") is not None
    if checksum == "auto":
        return "crc64nvme" if has_crt else "md5"
    if checksum != "md5" and not has_crt:
        raise UsageError(f"checksum {checksum} needs awscrt: pip install 'manyfiles[checksums]'")
    return checksum


def _dest(dest: str) -> tuple[str, str]:
    url = parse_url(dest)
    if url.pattern is not None:
        raise UsageError(f"{dest}: a destination is a prefix, not a pattern")
    prefix = url.prefix
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    return url.bucket, prefix


def push(sources: str | os.PathLike | Iterable[str | os.PathLike], dest: str, *, jobs: int = 64,
         include: Iterable[str] = (), exclude: Iterable[str] = (), dry_run: bool = False,
         settings: ClientSettings | None = None, progress: ProgressArg = False,
         on_event: Callable[[dict[str, Any]], None] | None = None, part_size: int = PART_SIZE,
         multipart_threshold: int = MULTIPART_THRESHOLD, checksum: str = "auto",
         follow_symlinks: bool = False,
         retry: RetryPolicy | None = None, reread: int = 3, memory: int = 512 * MiB,
         state_dir: str | os.PathLike | None = None, sync: bool = False, compare_by: str = "checksum",
         delete: bool = False, max_delete: int | None = MAX_DELETE,
         files_from: str | os.PathLike | Iterable[str | bytes] | None = None,
         cluster: object = None, memo: bool | str | os.PathLike = True) -> PushReport:
    """Upload every file under ``sources`` (files and folders; ``DIR/`` puts the folder's contents
    under the prefix, ``DIR`` keeps its name) to ``dest`` (``s3://bucket/prefix/``).

    Returns a :class:`PushReport`; per-file failures are collected there, not raised
    (``report.raise_for_failures()`` does).  A failure every file would meet (no such bucket,
    credentials refused) stops the run and is raised.  ``dry_run=True`` lists and plans only
    (``report.planned``).  ``on_event`` receives one dict per event (``plan``, ``done``,
    ``failed``, ``skip``, ``retry``) in the calling thread.  Files up to ``multipart_threshold``
    go as one PUT, larger ones in parts of ``part_size``; ``jobs`` requests in flight, with at
    most ``memory`` bytes of bodies read.  ``checksum``: ``auto`` (CRC64NVME with awscrt, else
    MD5), ``crc64nvme``, ``crc32c`` or ``md5`` (Content-MD5).  ``reread``: tries of a file that
    changes while read.  ``state_dir``: where the journal lives (default
    ``$XDG_STATE_HOME/manyfiles/s3push``).

    ``sync=True`` (one folder as the source): only the files missing under the prefix or differing
    from their object (``compare_by``: ``checksum``, ``size-mtime`` or ``size``; the comparison of
    :func:`manyfiles.mirror.compare`) are uploaded; with ``delete`` the objects no file has are then
    removed (not after a run with failures), refused up front beyond ``max_delete`` (None: no limit).
    ``memo``: the checksum memo of the folder (a file unchanged since it was hashed is not read
    again; False: every file is read; a path: the memo's folder; see docs/s3push.md).

    ``files_from`` (one folder as the source): only the files named there, relative to it (a list
    file, ``"-"`` for stdin, one name a line or NUL-terminated, or an iterable of names); a name
    outside the folder, through a symlink, missing or not a file is a failure of the report.

    ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``): the files are
    listed here and uploaded by slices on Dask workers, which must see them at the same path; the
    result is then a ``ClusterReport`` whose ``result`` is this report merged over every slice
    (not with ``sync``, ``dry_run`` or ``on_event``; see docs/s3push.md).
    """
    check_progress(progress)
    if isinstance(sources, (str, os.PathLike)):
        sources = [sources]
    sources = [os.fspath(s) for s in sources]
    if not sources:
        raise UsageError("push needs at least one source")
    if on_event is not None and not callable(on_event):
        raise UsageError(f"on_event must be a callable taking a dict, not {on_event!r}")
    for name, value, low in (("jobs", jobs, 1), ("part_size", part_size, 5 * MiB), ("reread", reread, 1),
                             ("multipart_threshold", multipart_threshold, 0), ("memory", memory, MiB)):
        if not isinstance(value, int) or value < low:
            raise UsageError(f"{name} must be an integer >= {low:,}, not {value!r}")
    if part_size > 5 << 30:
        raise UsageError("part_size must be at most 5 GiB (S3's limit)")
    bucket, prefix = _dest(dest)
    alg = _algorithm(checksum)
    if delete and not sync:
        raise UsageError("delete removes what the source does not have: it needs sync")
    if sync:
        _check_sync(sources, compare_by, max_delete)
    if files_from is not None and (sync or len(sources) != 1 or not os.path.isdir(sources[0])):
        raise UsageError("files_from names files of one folder: give exactly one SRC, a folder"
                         if not sync else "sync mirrors the whole folder: not with files_from")
    keep = make_filter(tuple(include), tuple(exclude))
    uploads = Uploads(jobs=jobs, threshold=multipart_threshold, part_size=part_size, algorithm=alg,
                      reread=reread, memory=memory, follow_symlinks=follow_symlinks,
                      state_dir=None if state_dir is None else os.path.abspath(state_dir))
    report = PushReport(dest=f"s3://{bucket}/{prefix}", dry_run=dry_run, checksum=alg)
    t0 = time.monotonic()
    events: queue.SimpleQueue = queue.SimpleQueue()

    def emit(rec: dict[str, Any]) -> None:
        if on_event is not None:
            events.put(rec)

    def drain() -> None:
        while on_event is not None:
            try:
                rec = events.get_nowait()
            except queue.Empty:
                return
            on_event(rec)

    if cluster is not None:
        if sync or dry_run or on_event is not None:
            raise UsageError("sync, dry_run and on_event: not with a cluster (its workers upload)")
        sources = [os.path.abspath(s) + ("/" if s.endswith("/") else "") for s in sources]   # for the workers
    if files_from is None:
        listing = list_files(sources, prefix, keep=keep, follow_symlinks=follow_symlinks)
    else:
        if isinstance(files_from, (str, os.PathLike)):
            from manyfiles._core.files_from import read_names

            files_from = read_names(files_from)
        listing = list_named(sources[0], files_from, prefix, keep=keep, follow_symlinks=follow_symlinks)
    if cluster is not None:
        from manyfiles.push._cluster import push_on_cluster

        return push_on_cluster(listing, bucket, prefix, cluster=cluster, uploads=uploads, retry=retry,
                               settings=(settings or ClientSettings()).resolved(), progress=progress)
    wanted: set[str] | None = None      # --sync: the keys to upload
    deletions: list[str] = []
    if sync:
        settings = (settings or ClientSettings()).resolved()
        listing = list(listing)     # the one walk: the comparison's local side and the uploads
        store = store_for(settings, bucket, retry=retry or RetryPolicy())
        wanted, deletions = _sync_plan(sources[0], listing, store, prefix, compare_by, include, exclude,
                                       delete, max_delete, report, memo)
    with progress_for(progress, "s3push (dry run)" if dry_run else "s3push", unit="files") as shown:
        if dry_run:
            for item in listing:
                if refused(item, report, emit, shown):
                    continue
                if wanted is not None and item.key not in wanted:
                    continue
                how = route(item.size, multipart_threshold, part_size)
                rec = {"key": item.key, "path": os.fsdecode(item.path), "size": item.size, "how": how.how,
                       "parts": how.parts, "part_size": how.part_size}
                report.listed += 1
                report.planned.append(rec)
                emit({"event": "plan", **rec})
                drain()
            for key in deletions:
                report.planned.append({"key": key, "how": "delete", "size": 0})
                emit({"event": "plan", "key": key, "how": "delete", "size": 0})
            drain()         # (the refusals too: one line each in a dry run as well)
            report.seconds = time.monotonic() - t0
            return report
        settings = (settings or ClientSettings()).resolved()
        cancel = threading.Event()
        store = store_for(settings, bucket, retry=retry or RetryPolicy(), cancel=cancel)
        upload_files(listing, store, cancel, where_of(settings, bucket, prefix), report, uploads,
                     shown=shown, emit=emit, drain=drain, wanted=wanted)
        if deletions and report.ok:       # (after failures nothing is deleted: rclone's rule too)
            failed = store.delete_objects(deletions)
            report.deleted = len(deletions) - len(failed)
            for f in failed:
                report.add_failure(f.key, f"not deleted: {f.message or f.code}", f.code)
            for key in sorted(set(deletions) - {f.key for f in failed}):
                emit({"event": "deleted", "key": key})
            drain()
        elif deletions:
            report.add_failure(report.dest, f"{len(deletions):,} objects with no file were not deleted: "
                               "some uploads failed", "not-deleted")
    report.seconds = time.monotonic() - t0
    return report


def _check_sync(sources: list[str], compare_by: str, max_delete: int | None) -> None:
    if len(sources) != 1 or not os.path.isdir(sources[0]):
        raise UsageError("sync mirrors one folder: give exactly one SRC, a folder")
    if compare_by not in BY:
        raise UsageError(f"compare_by must be one of {', '.join(BY)}, not {compare_by!r}")
    if max_delete is not None and (isinstance(max_delete, bool) or not isinstance(max_delete, int)
                                   or max_delete < 0):
        raise UsageError(f"max_delete must be an integer >= 0 or None, not {max_delete!r}")


def _sync_plan(source: str, listing: list, store: Any, prefix: str, compare_by: str, include: Iterable[str],
               exclude: Iterable[str], delete: bool, max_delete: int | None,
               report: PushReport, memo: bool | str | os.PathLike = True) -> tuple[set[str], list[str]]:
    """The keys a sync uploads (missing or differing) and, with ``delete``, the keys it removes;
    the local side is the push's own ``listing`` (the folder is walked once)."""
    from manyfiles._core.checksum_memo import Identity
    from manyfiles.mirror import compare  # (only a sync loads the comparison)
    from manyfiles.mirror.comparison import LocalFile as Walked
    from manyfiles.mirror.sync import check_deletions
    from manyfiles.push._list import LocalFile
    from manyfiles.s3.keys import STATE_DIR

    root = os.fspath(source)
    below = prefix if root.endswith("/") else prefix + os.path.basename(root.rstrip("/")) + "/"
    walked = {}
    for item in listing:
        if isinstance(item, LocalFile):
            rel = item.key[len(below):]
            if not rel.startswith(STATE_DIR + "/"):     # (s3pull's state folder: never compared)
                walked[rel] = Walked(item.size, item.mtime_ns / 1e9,
                                     Identity(item.dev, item.ino, item.size, item.mtime_ns, item.ctime_ns)
                                     if item.ctime_ns else None)
    c = compare(root, store, below, by=compare_by, source="local", include=include, exclude=exclude,
                local=walked, memo=memo)
    report.same = len(c.same)
    deletions = sorted(e.key for e in c.missing_local) if delete else []
    check_deletions(len(deletions), c.local_files, max_delete,
                    empty_source=f"{shown(root)}: no file; nothing deleted (an empty folder never empties "
                                 f"{report.dest})",
                    too_many=lambda n, limit: f"{report.dest}: the sync would delete {n:,} objects, more "
                                              f"than --max-delete {limit:,}; nothing was uploaded or deleted "
                                              "(raise --max-delete, or check SRC)")
    for f in c.failures:
        report.failures.append(f)
    return {below + e.path for e in [*c.missing_remote, *c.differing]}, deletions


def abort_stale(prefix_url: str, older_than: float, *, dry_run: bool = False,
                settings: ClientSettings | None = None, retry: RetryPolicy | None = None) -> AbortReport:
    """Abort the multipart uploads under ``prefix_url`` (``s3://bucket/prefix``) started more than
    ``older_than`` seconds ago (as the server dates them); ``dry_run``: only list them."""
    if not isinstance(older_than, (int, float)) or older_than < 0:
        raise UsageError(f"older_than must be a number of seconds >= 0, not {older_than!r}")
    url = parse_url(prefix_url)
    if url.pattern is not None:
        raise UsageError(f"{prefix_url}: a prefix, not a pattern")
    settings = (settings or ClientSettings()).resolved()
    store = store_for(settings, url.bucket, retry=retry or RetryPolicy())
    report = AbortReport(prefix=f"s3://{url.bucket}/{url.prefix}", dry_run=dry_run)
    t0 = time.monotonic()
    now = time.time()
    for upload in store.list_multipart_uploads(url.prefix):
        report.listed += 1
        if upload.initiated is not None and now - upload.initiated < older_than:
            continue
        if not dry_run:
            store.abort_multipart(upload.key, upload.upload_id)
        report.aborted.append({"key": upload.key, "upload_id": upload.upload_id,
                               "initiated": upload.initiated})
    report.seconds = time.monotonic() - t0
    return report


__all__ = ["CHECKSUMS", "AbortReport", "PushReport", "abort_stale", "push"]
