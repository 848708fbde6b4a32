"""``s3push --cluster`` / ``push(cluster=...)``: the same job on Dask workers, sliced as s3pull's.

The client lists the files (the C walker, or ``--files-from``), counts what it refuses, sorts the
files by key and cuts them into slices (:func:`manyfiles.scale.slices.cut_slices`, for a fixed
number of workers: the same tree cuts the same on any cluster, so a rerun finds each slice's
journal).  A slice is one shard: its worker uploads its files with the single-machine execute
step (:func:`manyfiles.push._run.upload_files`: checksums, multipart, re-reads), under a journal
of its own (the destination and the slice's id), so a slice re-run after its worker died, or
the whole command again, resumes the slice's multipart uploads and skips its finished files.
The files must be at the same path on every worker (a shared folder), as s3pull's DEST; the
journals live in ``state_dir`` (give a shared folder when a rerun may land on another host).
The lease, the re-run of a lost worker's shard and the merged report are the executor's
(:mod:`manyfiles.scale.executor`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from manyfiles._core.progress import ProgressArg, progress_for
from manyfiles.push._list import LocalFile
from manyfiles.push._run import Uploads, refused, upload_files, where_of
from manyfiles.push.report import PushReport
from manyfiles.s3.retry import RetryPolicy
from manyfiles.s3.store import store_for
from manyfiles.scale import executor
from manyfiles.scale.executor import ClusterArg, ClusterReport, Publish, ShardResult
from manyfiles.scale.slices import SLICE_KEYS, Slice, cut_slices

SLICE_WORKERS = 16      # the cut's worker count: fixed, so that a rerun on any cluster cuts the same


@dataclass(frozen=True)
class PushJob(executor.Job):
    """Upload slices of files (``(key, size, path, mtime_ns, dev, ino)`` each) to ``bucket``/``prefix``."""

    bucket: str
    prefix: str
    settings: Any
    uploads: Uploads
    retry: Any = None
    name = "s3push"
    unit = "files"

    def new_report(self) -> PushReport:
        return PushReport(dest=f"s3://{self.bucket}/{self.prefix}", checksum=self.uploads.algorithm)

    def run(self, shard: Slice, publish: Publish) -> ShardResult:
        report = self.new_report()
        files = [LocalFile(path, key, size, mtime, dev, ino)
                 for key, size, path, mtime, dev, ino in shard.objects]
        cancel = threading.Event()
        store = store_for(self.settings, self.bucket, retry=self.retry or RetryPolicy(), cancel=cancel)

        def handled() -> int:
            return report.uploaded + report.skipped + len(report.failures)

        def counters() -> None:     # (in the shard's thread: where a lapsed lease is found)
            publish(handled(), report.bytes, len(report.failures))

        with progress_for(False, "s3push", unit="files") as shown:
            where = f"{where_of(self.settings, self.bucket, self.prefix)}|{shard.id}"
            upload_files(files, store, cancel, where, report, self.uploads, shown=shown,
                         emit=lambda rec: None, drain=counters)
        return ShardResult(report=report, items=handled(), bytes=report.bytes)


def push_on_cluster(listing: Iterable[Any], bucket: str, prefix: str, *, cluster: ClusterArg, settings: Any,
                    uploads: Uploads, retry: RetryPolicy | None, progress: ProgressArg = False,
                    slice_keys: int = SLICE_KEYS) -> ClusterReport:
    """The cluster form of :func:`manyfiles.push.push`: ``listing`` (from ``list_files`` or
    ``list_named``, absolute paths) read here, its files uploaded by slices on ``cluster``;
    returns a ClusterReport whose ``result`` is the push's report, the refusals included."""
    job = PushJob(bucket=bucket, prefix=prefix, settings=settings, uploads=uploads, retry=retry)
    here = job.new_report()
    with progress_for(False, "s3push", unit="files") as shown:
        files = sorted((item.key, item.size, item.path, item.mtime_ns, item.dev, item.ino)
                       for item in listing if not refused(item, here, lambda rec: None, shown))
    report = executor.run_job(job, cluster, shards=cut_slices(files, SLICE_WORKERS, slice_keys, whole=True),
                              progress=progress)
    if report.result is not None:
        report.result.failures[:0] = here.failures
        report.result.skipped += here.skipped
    return report


__all__ = ["SLICE_WORKERS", "PushJob", "push_on_cluster"]
