"""The execute step of a push on one machine or in one cluster slice: the listed files through a
:class:`~manyfiles.push._execute.Pusher`, with the journal, the report and the events.

:func:`upload_files` is what :func:`manyfiles.push.push` runs after its listing (and its sync plan),
and what a slice of ``push(cluster=...)`` runs on a Dask worker (``push/_cluster.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from manyfiles.errors import from_oserror
from manyfiles.push._execute import Pusher, abort_unneeded
from manyfiles.push._journal import Journal, default_state_dir
from manyfiles.push._list import LocalFile, Refusal, Skip
from manyfiles.push.report import PushReport
from manyfiles.s3.store import S3Store

Emit = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class Uploads:
    """How the files of a push are sent (the arguments of :func:`manyfiles.push.push`): picklable,
    it travels with a cluster job."""

    jobs: int
    threshold: int
    part_size: int
    algorithm: str
    reread: int
    memory: int
    follow_symlinks: bool
    state_dir: str | None


def where_of(settings: Any, bucket: str, prefix: str) -> str:
    """What names a destination's journal: the endpoint, the bucket, the prefix."""
    return f"{settings.endpoint_url or 'aws'}|{bucket}|{prefix}"


def upload_files(listing: Iterable[LocalFile | Refusal | Skip], store: S3Store, cancel: threading.Event,
                 where: str, report: PushReport, uploads: Uploads, *, shown: Any, emit: Emit,
                 drain: Callable[[], None], wanted: set[str] | None = None) -> None:
    """Upload every file of ``listing`` (only the keys in ``wanted`` when given) into ``report``.
    ``where`` names the journal (one per destination, or per cluster slice); ``drain`` is called
    in this thread between files and while the last ones finish (the events, a shard's
    counters); a failure every file would meet is raised."""
    journal: Journal | None = None      # opened with the first file (nothing listed: nothing written)
    lock = threading.Lock()

    def record(kind: str, file: LocalFile, **info: Any) -> None:
        path = os.fsdecode(file.path)
        with lock:
            if kind == "done":
                report.uploaded += 1
                report.bytes += file.size
                if info["how"] == "put":
                    report.puts += 1
                else:
                    report.multipart += 1
                    report.parts += info["parts"] - info["resumed"]
                    report.resumed_parts += info["resumed"]
                shown.add(1, bytes=file.size)
                emit({"event": "done", "key": file.key, "path": path, "size": file.size, **info})
            elif kind == "failed":
                report.add_failure(path, info["reason"], info.get("code", ""))
                shown.add(failures=1)
                emit({"event": "failed", "key": file.key, "path": path, **info})
            elif kind == "retry":
                report.retried += 1
                emit({"event": "retry", "key": file.key, "path": path, **info})

    pusher = Pusher(store, None, jobs=uploads.jobs, threshold=uploads.threshold, part_size=uploads.part_size,
                    algorithm=uploads.algorithm, reread=uploads.reread, budget=uploads.memory,
                    follow_symlinks=uploads.follow_symlinks, record=record, cancel=cancel)
    try:
        for item in listing:
            if refused(item, report, emit, shown, lock):
                continue
            if wanted is not None and item.key not in wanted:
                continue        # the same as its object (counted in report.same)
            with lock:
                report.listed += 1
            if journal is None:
                journal = pusher.journal = _journal(uploads.state_dir, where)
            if journal.is_done(item.key, item.path, item.size, item.mtime_ns, item.ino):
                with lock:
                    report.skipped += 1
                shown.add(1)
                emit({"event": "skip", "key": item.key, "path": os.fsdecode(item.path),
                      "reason": "uploaded by the run that was interrupted"})
            else:
                pusher.push(item)
            drain()
            if cancel.is_set():
                break
        pusher.wait(drain)
    except BaseException:      # Ctrl-C, a closed output, a lapsed lease: requests in flight end now
        cancel.set()
        store.interrupt()
        pusher.wait()
        if journal is not None:
            journal.close()
        raise
    drain()
    if journal is not None:
        if pusher.stop is not None:
            journal.close()
            raise pusher.stop
        report.aborted = abort_unneeded(store, journal, pusher.touched)
        journal.finish(complete=report.ok)


def _journal(state_dir: str | os.PathLike | None, where: str) -> Journal:
    folder = os.fspath(state_dir or default_state_dir())
    try:
        return Journal(folder, where)
    except OSError as exc:
        raise from_oserror(exc, folder) from exc


def refused(item: LocalFile | Refusal | Skip, report: PushReport, emit, shown, lock=None) -> bool:
    """Count a refused or skipped listing entry (``lock``: while uploads run); True if ``item`` is
    not a file to push."""
    if isinstance(item, LocalFile):
        return False
    path = os.fsdecode(item.path)
    if lock is not None:
        lock.acquire()
    try:
        if isinstance(item, Refusal):
            report.add_failure(path, item.reason, item.code)
            shown.add(failures=1)
            emit({"event": "failed", "path": path, "reason": item.reason, "code": item.code})
        else:
            report.skipped += 1
            emit({"event": "skip", "path": path, "reason": item.reason})
    finally:
        if lock is not None:
            lock.release()
    return True


