"""``fastrm --cluster``: subtrees removed by Dask workers, then what is above them, deepest first.

The client lists the top levels of each directory argument (breadth first) until it has a few
subtrees per worker thread; each shard removes a handful of subtrees with the normal parallel
remover (one worker thread per directory, files first, deepest first).  Once every subtree is
gone, the client removes what is left -- the upper levels' files and directories and the
arguments themselves -- with the same remover and the same rules (``keep_root``, mount roots).
So across the cluster too, no directory is removed before everything below it.

A shard is idempotent: re-run after its worker died, it removes what is left of its subtrees
(a subtree already gone is not a failure).  Nothing follows a symlink: the planner only enters
real directories on the argument's filesystem (unless ``cross_mounts``), and the remover opens
everything with O_NOFOLLOW relative to its parent.

Filters (``include``/``exclude``), dry runs and ``on_removed`` stay single-machine: a pattern
with ``/`` is relative to the argument, which a subtree shard does not know.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from manyfiles import listing
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.progress import ProgressArg
from manyfiles.errors import UsageError
from manyfiles.remove._plan import run
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import Rules, check_paths, resolve
from manyfiles.scale import lease
from manyfiles.scale.executor import (
    ClusterArg,
    ClusterReport,
    Job,
    Publish,
    ShardResult,
    connect,
    merge_report,
)

PLAN_DEPTH = 3              # levels listed by the client at most
SUBTREES_PER_THREAD = 4     # subtrees wanted per worker thread (balance against their sizes)


def check_cluster_call(include: Any, exclude: Any, dry_run: bool, on_removed: Any,
                       output: Any = None) -> None:
    """UsageError for what ``remove_tree(cluster=...)`` does not do, before anything is touched."""
    given = [name for name, value in (("include (--glob)", include), ("exclude", exclude),
                                      ("dry_run", dry_run), ("on_removed", on_removed),
                                      ("output (-o)", output is not None)) if value]
    if given:
        raise UsageError(f"{', '.join(given)}: not with a cluster (filters and dry runs run on one machine)")


@dataclass(frozen=True)
class RemoveJob(Job):
    """Remove whole subtrees: a shard is a tuple of paths."""

    workers: int = 8
    retries: int = 5
    cross_mounts: bool = False
    name = "fastrm"
    unit = "entries"

    def new_report(self) -> Any:
        return RemoveReport()

    def run(self, paths: tuple[str, ...], publish: Publish) -> ShardResult:
        """``remove_tree(paths, missing_ok=True)``: a subtree already gone is not a failure.

        On a cluster the attempt first counts what its subtrees hold and notes it: a re-run
        (its worker died) then counts what the lost attempts removed -- gone, so it cannot see
        it any more -- as the difference between the first attempt's count and its own.
        """
        report = RemoveReport()
        attempt = lease.current()
        present = first = (0, 0)
        if attempt.rerun_possible:
            present = self.count(paths)
            attempt.note(present)
            first = attempt.first_note(present)
        rules = Rules(None, None, keep_root=False, cross_mounts=self.cross_mounts)
        targets = resolve(check_paths(list(paths), force_root=False), True, report.failures)
        def progress(snap: Any) -> None:
            publish(snap.done, 0, snap.failures)
            checkpoint("remove")          # mid-removal, at each progress report

        run(targets, rules, report, workers=self.workers, retries=self.retries, progress=progress,
            on_removed=None)
        report.files += first[0] - present[0]
        report.dirs += first[1] - present[1]
        return ShardResult(report=report, items=report.files + report.dirs)

    def count(self, paths: tuple[str, ...]) -> tuple[int, int]:
        """(files, directories) the removal of ``paths`` would remove, by the same rules (C walker)."""
        files = dirs = 0
        for path in paths:
            try:
                tally = listing.count_tree(path, threads=self.workers, one_filesystem=not self.cross_mounts)
            except OSError:
                continue                      # removed by an earlier attempt (or unreadable: not removed)
            files += tally.entries - (tally.directories - 1)     # entries below it, but its directories
            dirs += tally.directories                           # ... and the subtree itself
        return files, dirs


def plan_subtrees(targets: list[Any], want: int, cross_mounts: bool) -> list[str]:
    """Directories deep enough below the arguments that there are about ``want`` of them."""
    frontier = [(t.path, t.dev) for t in targets if t.is_dir]
    for _ in range(PLAN_DEPTH):
        if len(frontier) >= want:
            break
        deeper = []
        for path, dev in frontier:
            deeper += _subdirs(path, dev, cross_mounts)
        if not deeper:
            break
        frontier = deeper
    roots = {t.path for t in targets}
    return [path for path, _ in frontier if path not in roots]


def _subdirs(path: str, dev: int, cross_mounts: bool) -> list[tuple[str, int]]:
    out = []
    try:
        entries = list(listing.iter_entries(path, resolve_unknown=True))
    except OSError:
        return []          # the final pass meets it again and reports it
    for e in entries:
        if e.type != "d":
            continue
        sub = os.path.join(path, e.name)
        try:
            st = os.lstat(sub)
        except OSError:
            continue
        if st.st_dev == dev or cross_mounts:
            out.append((sub, st.st_dev))
    return out


def remove_on_cluster(targets: list[Any], rules: Any, report: Any, *, cluster: ClusterArg, workers: int,
                      retries: int, progress: ProgressArg) -> ClusterReport:
    """The cluster form of ``remove_tree``, after its argument checks (``targets``, ``rules``)."""
    t0 = time.monotonic()
    with connect(cluster) as executor:
        subtrees = plan_subtrees(targets, SUBTREES_PER_THREAD * max(1, executor.workers), rules.cross_mounts)
        per_shard = max(1, math.ceil(len(subtrees) / (4 * SUBTREES_PER_THREAD * max(1, executor.workers))))
        shards = [tuple(subtrees[i:i + per_shard]) for i in range(0, len(subtrees), per_shard)]
        job = RemoveJob(workers=workers, retries=retries, cross_mounts=rules.cross_mounts)
        out = executor.run(job, shards=shards, progress=progress)
    # everything below the subtrees is gone: now the levels above them, and the arguments
    run(targets, rules, report, workers=workers, retries=retries, progress=progress, on_removed=None)
    assert out.result is not None
    merge_report(report, out.result)
    report.seconds = time.monotonic() - t0
    out.result = report
    out.failures = report.failures
    out.seconds = report.seconds
    return out


__all__ = ["RemoveJob", "check_cluster_call", "plan_subtrees", "remove_on_cluster"]
