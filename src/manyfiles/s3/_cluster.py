"""``s3pull --cluster`` / ``pull(cluster=...)``: the listing cut into key ranges, the downloads
into slices of keys, on Dask workers (:mod:`manyfiles.scale.executor`).

Two kinds of shard, both idempotent:

* :class:`~manyfiles.scale.keyranges.KeyRange` -- list ``(after, upto]`` (ListObjectsV2 from
  ``StartAfter=after``) until ``slice_keys`` keys are read; hand back the keys found as a
  :class:`Slice` and the rest of the range cut in two (:mod:`manyfiles.scale.keyranges`).  With
  ``--manifest`` the client reads the manifest and makes the slices itself.
* :class:`Slice` -- download up to ``slice_keys`` objects with the single-machine engine room
  (:func:`run`: the engines chosen by size, temp + rename, checksums, retries) into the
  shared DEST.  Its state goes to ``DEST/.s3pull/shards/<slice>.<attempt>.jsonl``, a new file per
  attempt, so workers on several machines never append to one file; a re-run of the slice (its
  worker died, or the whole command again) skips what its earlier attempts installed and
  resumes the large objects they left in parts.  A local ``s3pull`` of the same DEST reads every
  slice's records as well.

Downloads go first (slices are scheduled before listing ranges), so listed keys do not pile up
in the client.  The client checks the source (one listing request) before DEST is created,
tidies DEST's temp folder before any slice starts, and writes the merged ``failures.tsv`` at the
end.  Slices of a listing are reproducible when the bucket has not changed (the cuts follow the
keys), so a rerun finds its slices' records; after changes, shifted slices fetch again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from manyfiles._core.progress import ProgressArg
from manyfiles.errors import UsageError
from manyfiles.s3._pullconfig import PullConfig, _config
from manyfiles.s3._run import empty_tmp, run
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.integrity import Claim
from manyfiles.s3.keys import S3Url, make_filter, parse_url
from manyfiles.s3.object_listing import ObjectInfo, list_objects_lean, read_manifest
from manyfiles.s3.report import PullReport
from manyfiles.s3.state import State
from manyfiles.scale import executor, lease
from manyfiles.scale.executor import ClusterArg, ClusterReport, Publish, ShardResult, run_job
from manyfiles.scale.keyranges import KeyRange, take
from manyfiles.scale.slices import SLICE_KEYS, Slice, cut_slices

MOVING = frozenset({"done", "skip", "bytes"})    # the run's events that end a stall


def _installed_by_earlier_attempts(dest: str, slice_id: str) -> dict[str, dict]:
    """key -> state record of the objects that earlier attempts of this slice *in this run*
    installed (their worker died): the records of the slice's state files that are not among
    those the run's first attempt found (each attempt notes them before it starts)."""
    attempt = lease.current()
    if not attempt.rerun_possible:
        return {}
    state = State(dest)
    try:
        files = state.open(create=False, load=False).slice_records(slice_id)
    finally:
        state.release()
    attempt.note(sorted(files))
    before = set(attempt.first_note(sorted(files)))
    out: dict[str, dict] = {}
    for name, records in files.items():
        if name not in before:
            out.update(records)
    return out


@dataclass(frozen=True)
class PullJob(executor.Job):
    """Download everything under ``source`` into ``dest`` (an absolute path every worker sees)."""

    source: str
    dest: str
    settings: Any
    config: tuple = ()                 # PullConfig keyword arguments, as sorted pairs
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    manifest: str | None = None
    slice_keys: int = SLICE_KEYS
    workers: int = 1                   # shards the cluster runs at once (sized_for)
    name = "s3pull"
    unit = "objects"

    def sized_for(self, workers: int) -> PullJob:
        return dataclasses.replace(self, workers=workers)

    def shards(self) -> Iterator[Any]:
        if self.manifest is None:
            yield KeyRange(None, None)
            return
        batch: list[tuple] = []
        first = True
        for info in read_manifest(self.manifest, parse_url(self.source)):
            batch.append(tuple(info))
            if len(batch) >= self.slice_keys:
                yield from cut_slices(batch, self.workers, self.slice_keys)
                batch, first = [], False
        if batch:
            yield from cut_slices(batch, self.workers, self.slice_keys, whole=first)

    def priority(self, shard: Any) -> int:
        return 0 if isinstance(shard, Slice) else 1      # downloads before more listing

    def new_report(self) -> Any:
        return PullReport()

    def run(self, shard: Any, publish: Publish) -> ShardResult:
        url = parse_url(self.source)
        if isinstance(shard, KeyRange):
            return self._list(url, shard)
        return self._download(url, shard, publish)

    def _cfg(self) -> Any:
        return PullConfig(**dict(self.config))

    def _list(self, url: Any, rng: KeyRange) -> ShardResult:
        # every key under the prefix, the wildcard applied here: a range ends at its first key past
        # ``upto`` even when few keys match (the lister's work stays bounded)
        everything = S3Url(url.bucket, url.prefix, None, url.base)
        listing = list_objects_lean(self.settings, everything, retry=self._cfg().retry, start_after=rng.after)
        keep = None if url.pattern is None else (lambda info: url.matches(info.key))
        found, rest = take(listing, rng, self.slice_keys, url.prefix, keep=keep)
        whole = rng.after is None and rng.upto is None and not rest     # the job is these keys
        more: list[Any] = cut_slices(found, self.workers, self.slice_keys, whole=whole)
        return ShardResult(report=self.new_report(), more=more + rest)

    def _download(self, url: Any, sl: Slice, publish: Publish) -> ShardResult:
        """The slice's objects into DEST.  ``bytes``: the sizes of the objects installed (the
        parts a lost worker fetched and this attempt resumed included); an object a lost
        attempt of this run installed counts as downloaded ("lost worker"), not skipped."""
        report = self.new_report()
        objects = [ObjectInfo(*o) for o in sl.objects]
        keep = make_filter(self.include, self.exclude)
        theirs = _installed_by_earlier_attempts(self.dest, sl.id)
        installed = 0
        # closing(): a lapsed lease (publish raises) ends the engines here, as Ctrl-C does
        events = run(url, objects, self.dest, settings=self.settings, cfg=self._cfg(), keep=keep,
                     report=report, state_slice=sl.id)
        stall = None      # the run's stall, from its "stall" events until something moves again
        with contextlib.closing(events):
            for ev in events:
                if ev.kind == "done":
                    installed += ev.size
                elif ev.kind == "skip" and ev.key in theirs:
                    report.skipped -= 1
                    report.add_done("lost worker", ev.size, Claim.from_record(theirs[ev.key]).kind)
                    installed += ev.size
                if ev.kind == "stall":
                    stall = ev.value
                elif ev.kind in MOVING:
                    stall = None
                publish(report.done + report.skipped + len(report.failures), installed, len(report.failures),
                        stall)
        report.bytes = installed
        handled = report.done + report.skipped + len(report.failures)
        return ShardResult(report=report, items=handled, bytes=installed)

    def finish(self, report: ClusterReport) -> None:
        """The merged ``DEST/.s3pull/failures.tsv`` (slices write none); after a run without
        failures, an empty ``DEST/.s3pull/tmp`` (temps of lost workers included)."""
        state = State(self.dest)
        try:
            state.open(create=False, load=False)
            if report.result is not None:
                report.result.failures_file = state.write_failures(
                    [(f.path, f.reason) for f in report.result.failures])
        finally:
            state.release()
        if report.ok:
            empty_tmp(self.dest)


def pull_on_cluster(source: str, dest: str | os.PathLike, *, cluster: ClusterArg, settings: Any = None,
                    include: Iterable[str] = (), exclude: Iterable[str] = (), manifest: str | None = None,
                    dry_run: bool = False, on_event: Any = None, progress: ProgressArg = False,
                    slice_keys: int = SLICE_KEYS, **config: Any) -> ClusterReport:
    """The cluster form of :func:`manyfiles.s3.pull` (same arguments); returns a ClusterReport whose
    ``result`` is the pull's report merged over every slice."""
    from manyfiles.s3.sink import FolderSink

    if dry_run or on_event is not None:
        raise UsageError("dry_run and on_event: not with a cluster (the events stay on the workers)")
    if config.get("cache") is not None:
        raise UsageError("--cache: not with a cluster (each node would need its own; warm them with "
                         "`manyfiles cache warm --cluster`)")
    if config.get("strategy") == "processes":
        raise UsageError("--strategy processes: not with a cluster (Dask's workers are the processes)")
    url = parse_url(source)
    cfg = _config(**config)
    settings = (settings or ClientSettings()).resolved()
    if manifest is None:
        # the first listing request before DEST exists: no bucket, no credentials -> nothing created
        next(iter(list_objects_lean(settings, url, page_size=1, retry=cfg.retry)), None)
    elif manifest != "-" and not os.path.isfile(manifest):   # "-": stdin, read here by shards()
        raise UsageError(f"--files-from {manifest}: no such file")
    dest = os.path.abspath(os.fspath(dest))
    if os.path.exists(dest) and not os.path.isdir(dest):
        raise UsageError(f"{dest}: not a directory")
    sink = FolderSink(dest, layout=cfg.layout, fsync=cfg.fsync).open()    # checks DEST, tidies tmp/
    sink.state.close()
    sink.state.release()
    job = PullJob(source=source, dest=dest, settings=settings, config=tuple(sorted(config.items())),
                  include=tuple(include), exclude=tuple(exclude),
                  manifest=manifest if manifest in (None, "-") else os.path.abspath(manifest),
                  slice_keys=slice_keys)
    return run_job(job, cluster, progress=progress)
