"""A removal from checked targets to report, and the dry run as a plan that can be executed."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from manyfiles._progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import UsageError
from manyfiles.remove._executor import (
    _NOT_PLANNED,
    DEFAULT_RETRIES,
    DEFAULT_WORKERS,
    OnRemoved,
    Remover,
    raise_fd_limit,
)
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import Rules, Target, check_paths, resolve


@dataclass(kw_only=True)
class RemovePlan(RemoveReport):
    """A dry run: what would be removed (the counts) and how (:meth:`execute`).

    The plan fixes the arguments by identity -- each must still be the same file or
    directory (st_dev, st_ino) when executed, or it is left alone and reported -- and the
    rules (globs, excludes, kept roots).  It does not freeze a list of names: entries
    created below an argument after the plan and matching its rules go too, as with
    ``rm -r``.  ``on_removed`` of the dry run lists what it found.  (Identity is the
    inode number: a file deleted and re-created may get the same one and then passes.)
    """

    dry_run: bool = True
    targets: list[Target] = field(default_factory=list)
    rules: Rules = field(default_factory=Rules)
    missing_ok: bool = False
    force_root: bool = False

    def execute(self, *, workers: int = DEFAULT_WORKERS, retries: int = DEFAULT_RETRIES,
                progress: ProgressArg = False, on_removed: OnRemoved | None = None) -> RemoveReport:
        """Remove what this plan found; returns the :class:`RemoveReport` of the real run."""
        check_options(workers, retries, progress, on_removed)
        # refused arguments are refused again: a directory can have become a mount root
        checked = check_paths([t.path for t in self.targets], self.force_root)
        report = RemoveReport()
        planned = {t.path: t for t in self.targets}
        same = []
        for now in resolve(checked, self.missing_ok, report.failures):
            then = planned[now.path]
            if (now.dev, now.ino, now.is_dir) != (then.dev, then.ino, then.is_dir):
                report.add_failure(now.path, _NOT_PLANNED, "ESTALE")
            else:
                same.append(now)
        return run(same, self.rules, report, workers=workers, retries=retries, progress=progress,
                   on_removed=on_removed, check_identity=True)


def check_options(workers: object, retries: object, progress: object, on_removed: object) -> None:
    """Every execution argument, checked before anything is touched (UsageError)."""
    check_progress(progress)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise UsageError(f"retries must be an integer >= 0, not {retries!r}")
    if on_removed is not None and not callable(on_removed):
        raise UsageError(f"on_removed must be a callable taking a list of paths, not {on_removed!r}")


def run(targets: list[Target], rules: Rules, report: RemoveReport, *, workers: int, retries: int,
        progress: ProgressArg, on_removed: Callable[[list[str]], None] | None,
        check_identity: bool = False) -> RemoveReport:
    """Remove (or, for a dry-run ``report``, count) ``targets`` under ``rules``; fills ``report``."""
    raise_fd_limit()
    t0 = time.monotonic()
    remover = Remover(rules, report, workers=workers, retries=retries, on_removed=on_removed,
                      check_identity=check_identity)
    task = "remove (dry run)" if report.dry_run else "remove"
    with progress_for(progress, task, unit="entries") as p:

        def tick() -> None:
            # the total grows while the walk discovers entries: the ETA is a lower bound
            done = report.files + report.dirs
            p.set(done=done, total=max(remover.found, done), failures=len(report.failures))

        try:
            remover.run(targets, tick if p else None)
        finally:
            report.seconds = time.monotonic() - t0
            if p:
                tick()
    return report
