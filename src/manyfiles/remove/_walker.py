"""fastrm in the C walker: one ``manyfiles._dents.remove_tree`` call per argument directory.

The walker's native threads list each directory, unlink its non-directories (unlinkat
relative to the directory's fd, in inode order) and rmdir it once everything below it is
gone, on the thread that finished its last child -- without the GIL and without a Python
object per file (docs/fastls.md, "The walker's API", documents the call).  This module
turns checked targets into those calls and the C results into the :class:`RemoveReport`;
the plan itself is the one of :mod:`manyfiles.remove._executor`'s docstring.

Paths go out while the walk runs: to an fd (``output``: written by the workers in whole
lines, every entry before its directory) or to ``on_removed`` (one batch at a time, from
the calling thread; the worker that removed them waits, so the callback sees every path
before the directory holding it is removed).  Progress and the I/O log (``--trace``: each
syscall attributed to the worker thread that made it) are fed from the calling thread
about ten times a second; Ctrl-C there stops the threads and closes every fd.
"""

from __future__ import annotations

import errno
import os

from manyfiles._core import fsops as _fsops
from manyfiles._core.progress import Progress
from manyfiles._core.report import Failure
from manyfiles.remove._executor import NOT_CROSSED, NOT_PLANNED, OnRemoved, path_writer
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import Rules, Target
from manyfiles.trace import iotrace

try:
    from manyfiles import _dents
except ImportError:  # no C core: the Python engine (remove._executor) runs instead
    _dents = None

#: The C core is built with the removal walk: fastrm uses it (the Python engine otherwise).
NATIVE = _dents is not None and hasattr(_dents, "remove_tree")

_REASONS = {errno.EXDEV: NOT_CROSSED, errno.ESTALE: NOT_PLANNED}


def usable(rules: Rules) -> bool:
    """True when the C walker can run ``rules``: the core is built and every glob compiled to C
    (a pattern no file name can hold, e.g. a lone high surrogate, stays a Python matcher)."""
    return NATIVE and all(m is None or isinstance(m, _dents.Glob) for m in rules.matchers())


class NativeRemover:
    """One removal (dry run or not) of checked targets in the C walker."""

    def __init__(self, rules: Rules, report: RemoveReport, *, workers: int, retries: int,
                 on_removed: OnRemoved | None, output: int | None, sep: bytes,
                 check_identity: bool = False) -> None:
        self.rules = rules
        self.include, self.exclude = rules.matchers()
        self.report = report
        self.workers = workers
        self.retries = retries
        self.on_removed = on_removed
        self.output = output
        self.sep = sep
        # the arguments that are not directories are removed here, and go out the same way
        self.emit = path_writer(output, sep) if output is not None else on_removed or (lambda paths: None)
        self.check_identity = check_identity
        self.found = 0  # entries seen so far (the growing total of the progress display)

    def run(self, targets: list[Target], progress: Progress) -> None:
        for target in targets:
            parent, base = os.path.split(target.path)
            if self.exclude is not None and self.exclude.match(base):
                self.report.kept += 1
                continue
            try:
                anchor = _fsops.open_dir(parent or ".", follow_symlinks=True)
            except OSError as exc:
                self.report.failures.append(_failure(parent or ".", exc.errno or 0))
                continue
            try:
                if target.is_dir:
                    self.remove_dir(anchor, base, target, progress)
                elif self.include is None or self.include.match(base):
                    self.remove_file(anchor, base, target.path)
            finally:
                os.close(anchor)
            progress.set(done=self.report.files + self.report.dirs, total=self.found,
                         failures=len(self.report.failures))

    def remove_file(self, anchor: int, base: str, path: str) -> None:
        """An argument that is not a directory (a symlink is removed as one, never followed)."""
        self.found += 1
        if not self.report.dry_run:
            try:
                _fsops.unlink(base, dir_fd=anchor)
            except FileNotFoundError:
                return
            except OSError as exc:
                self.report.failures.append(_failure(path, exc.errno or 0))
                return
        self.report.files += 1
        self.emit([path])

    def remove_dir(self, anchor: int, base: str, target: Target, progress: Progress) -> None:
        rep = self.report
        done, found, failed = rep.files + rep.dirs, self.found, len(rep.failures)

        def tick(counts: tuple[int, int, int, int]) -> None:
            files, dirs, seen, failures = counts
            now = done + files + dirs
            progress.set(done=now, total=max(found + seen, now), failures=failed + failures)

        take = self.include is None
        tracer = iotrace.TRACER
        files, dirs, seen, kept, retries, failures = _dents.remove_tree(
            anchor, os.fsencode(base), os.fsencode(target.path), threads=self.workers,
            include=self.include, exclude=self.exclude, take=take,
            rmdir_root=take and not self.rules.keep_root and not target.mount_root,
            dry_run=rep.dry_run, cross_mounts=self.rules.cross_mounts, dev=target.dev,
            expect=(target.dev, target.ino) if self.check_identity else None, retries=self.retries,
            out_fd=-1 if self.output is None else self.output, sep=self.sep, on_removed=self.on_removed,
            progress=tick if progress else None,
            trace=None if tracer is None else iotrace.native_sink(tracer))
        rep.files += files
        rep.dirs += dirs
        rep.kept += kept
        rep.retries += retries
        self.found += seen + 1  # + the argument itself
        rep.failures.extend(_failure(path, err, detail) for path, err, _depth, detail in failures)


def _failure(path: str | bytes, err: int, detail: bytes | None = None) -> Failure:
    reason = os.fsdecode(detail) if detail else _REASONS.get(err) or os.strerror(err)
    return Failure(os.fsdecode(path), reason, errno.errorcode.get(err, ""))

