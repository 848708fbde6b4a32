"""A removal from checked targets to report, and the dry run as a plan that can be executed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import IO

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import UsageError
from manyfiles.remove import _walker
from manyfiles.remove._executor import (
    DEFAULT_RETRIES,
    DEFAULT_WORKERS,
    NOT_PLANNED,
    OnRemoved,
    Remover,
    path_writer,
    raise_fd_limit,
)
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import Rules, Target, check_paths, resolve

Output = int | IO[bytes] | None


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
                progress: ProgressArg = False, on_removed: OnRemoved | None = None, output: Output = None,
                sep: bytes = b"\n") -> RemoveReport:
        """Remove what this plan found; returns the :class:`RemoveReport` of the real run."""
        check_options(workers, retries, progress, on_removed, output, sep)
        # refused arguments are refused again: a directory can have become a mount root
        checked = check_paths([t.path for t in self.targets], self.force_root)
        report = RemoveReport()
        planned = {t.path: t for t in self.targets}
        same = []
        for now in resolve(checked, self.missing_ok, report.failures):
            then = planned[now.path]
            if (now.dev, now.ino, now.is_dir) != (then.dev, then.ino, then.is_dir):
                report.add_failure(now.path, NOT_PLANNED, "ESTALE")
            else:
                same.append(now)
        return run(same, self.rules, report, workers=workers, retries=retries, progress=progress,
                   on_removed=on_removed, output=output, sep=sep, check_identity=True)


def check_options(workers: object, retries: object, progress: object, on_removed: object,
                  output: object = None, sep: object = b"\n") -> None:
    """Every execution argument, checked before anything is touched (UsageError)."""
    check_progress(progress)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise UsageError(f"retries must be an integer >= 0, not {retries!r}")
    if on_removed is not None and not callable(on_removed):
        raise UsageError(f"on_removed must be a callable taking a list of paths, not {on_removed!r}")
    if output is not None:
        if on_removed is not None:
            raise UsageError("give on_removed or output, not both")
        fd_ok = isinstance(output, int) and not isinstance(output, bool) and output >= 0
        if not (fd_ok or (not isinstance(output, int) and hasattr(output, "fileno"))):
            raise UsageError(f"output must be a file descriptor or a binary file, not {output!r}")
    if not isinstance(sep, bytes) or len(sep) != 1:
        raise UsageError(f"sep must be one byte (b'\\n' or b'\\0'), not {sep!r}")


def _output_fd(output: Output) -> int | None:
    """The fd the removed paths go to (a file object's buffer is flushed first: the C threads
    write to the fd itself)."""
    if output is None or isinstance(output, int):
        return output
    output.flush()
    return output.fileno()


def run(targets: list[Target], rules: Rules, report: RemoveReport, *, workers: int, retries: int,
        progress: ProgressArg, on_removed: OnRemoved | None, output: Output = None, sep: bytes = b"\n",
        check_identity: bool = False) -> RemoveReport:
    """Remove (or, for a dry-run ``report``, count) ``targets`` under ``rules``; fills ``report``.

    The C walker does it where the core is built (:mod:`manyfiles.remove._walker`), the
    Python engine (:mod:`manyfiles.remove._executor`) elsewhere; both give the same results.
    """
    raise_fd_limit()
    t0 = time.monotonic()
    out_fd = _output_fd(output)
    task = "remove (dry run)" if report.dry_run else "remove"
    with progress_for(progress, task, unit="entries") as p:
        try:
            if _walker.usable(rules):
                native = _walker.NativeRemover(rules, report, workers=workers, retries=retries,
                                               on_removed=on_removed, output=out_fd, sep=sep,
                                               check_identity=check_identity)
                native.run(targets, p)
            else:
                if out_fd is not None:
                    on_removed = path_writer(out_fd, sep)
                _run_python(targets, rules, report, p, workers=workers, retries=retries,
                            on_removed=on_removed, check_identity=check_identity)
        finally:
            report.seconds = time.monotonic() - t0
    return report


def _run_python(targets: list[Target], rules: Rules, report: RemoveReport, p, *, workers: int, retries: int,
                on_removed: OnRemoved | None, check_identity: bool) -> None:
    remover = Remover(rules, report, workers=workers, retries=retries, on_removed=on_removed,
                      check_identity=check_identity)

    def tick() -> None:
        # the total grows while the walk discovers entries: the ETA is a lower bound
        done = report.files + report.dirs
        p.set(done=done, total=max(remover.found, done), failures=len(report.failures))

    try:
        remover.run(targets, tick if p else None)
    finally:
        if p:
            tick()
