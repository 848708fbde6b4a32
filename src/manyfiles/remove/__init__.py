"""Parallel deletion planned around the per-directory unlink lock (fastrm).

Work is split by directory: unlink(2) and rmdir(2) serialize on the parent directory's
lock, so one worker per directory, files first, deepest directories first (see
:mod:`manyfiles.remove._executor` for the rules).  Nothing follows a symlink.

Modules: ``_targets`` (checked arguments and glob rules), ``_walker`` (the removal in the C
walker's native threads, where the core is built), ``_executor`` (the same plan as Python
tasks on the shared worker pool, without the core), ``_plan`` (a run from targets to report;
the dry run as an executable plan), ``_report`` (RemoveReport).

Example:
    >>> import manyfiles as mf
    >>> report = mf.remove_tree("/scratch/run-42", workers=8, progress=True)  # doctest: +SKIP
    >>> report.files, report.dirs, report.ok                                  # doctest: +SKIP
    (1000000, 65793, True)
    >>> plan = mf.remove.plan("/scratch/cache", include=["*.tmp"])           # doctest: +SKIP
    >>> print(plan)                                                           # doctest: +SKIP
    would remove 1,204 files and 0 directories in 0.31 s
    >>> plan.execute().raise_for_failures()                                   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence

from manyfiles._core.progress import ProgressArg
from manyfiles.errors import UsageError
from manyfiles.remove._executor import DEFAULT_RETRIES, DEFAULT_WORKERS, OnRemoved
from manyfiles.remove._plan import Output, RemovePlan, check_options, run
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import PathArg, Rules, Target, as_paths, check_paths, patterns, resolve

__all__ = ["RemovePlan", "RemoveReport", "Rules", "Target", "plan", "purge", "remove_tree"]


def remove_tree(
    path: PathArg | Sequence[PathArg],
    *,
    workers: int = DEFAULT_WORKERS,
    dry_run: bool = False,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    keep_root: bool | None = None,
    force_root: bool = False,
    cross_mounts: bool = False,
    missing_ok: bool = False,
    retries: int = DEFAULT_RETRIES,
    progress: ProgressArg = False,
    on_removed: OnRemoved | None = None,
    cluster: object = None,
    output: Output = None,
    sep: bytes = b"\n",
) -> RemoveReport:
    """Remove ``path`` (or several) and everything below it; return a :class:`RemoveReport`.

    Args:
        path: a file, symlink (removed, never followed, even as ``link/``) or directory;
            or a list of them, removed by one shared pool.
        workers: threads; each works on one directory at a time (the GIL is released in
            unlink/rmdir, and that is where the time goes).
        dry_run: list and count what would be removed; remove nothing.  Returns a
            :class:`RemovePlan` (a report with ``execute()``), as :func:`plan` does.
        include: glob patterns; when given, only matching entries are removed (a matching
            directory with all its content) and the argument directories stay.  A pattern
            with ``/`` matches the path relative to the argument, otherwise the name.
        exclude: glob patterns of entries to keep (a kept directory is not entered).
        keep_root: keep the argument directories themselves (default: only with ``include``).
        force_root: allow a mount root: its content is removed, the mount point stays.
            ``/`` is always refused.
        cross_mounts: descend into file systems mounted inside the tree (off: reported).
        missing_ok: an argument that does not exist is not a failure (``rm -f``).
        retries: how often an rmdir that meets new entries (ENOTEMPTY) is cleaned and retried.
        progress: True for a live display (terminal bar, Jupyter, or plain lines), or a
            callable receiving a :class:`~manyfiles._core.progress.Snapshot` (``done`` = files
            and directories removed, ``total`` = entries found so far).
        on_removed: called with batches of removed paths, one call at a time, before the
            directory holding them is removed.
        output: a file descriptor or binary file: every removed path + ``sep`` is written
            to it as the walk goes (every entry before its directory), with no Python call
            per path.  Not together with ``on_removed``.
        sep: what ends each path in ``output``: ``b"\n"`` or ``b"\0"`` (names may hold newlines).
        cluster: ``"local:N"``, ``"tcp://HOST:8786"`` or a ``distributed.Client``: subtrees
            are removed by Dask workers, then the levels above them here
            (``remove/_cluster.py``); the report comes with per-worker figures.
            Not with ``include``/``exclude``/``dry_run``/``on_removed``/``output``.

    Failures (permission denied, ...) are collected in ``report.failures``; nothing is
    raised for them (``report.raise_for_failures()`` does).  Bad or refused arguments raise
    :class:`~manyfiles.errors.UsageError` before anything is removed.
    """
    paths = as_paths(path)
    include, exclude = patterns(include, "include"), patterns(exclude, "exclude")
    check_options(workers, retries, progress, on_removed, output, sep)
    if cluster is not None:
        from manyfiles.remove._cluster import check_cluster_call

        check_cluster_call(include, exclude, dry_run, on_removed, output)
    rules = Rules(include, exclude, keep_root=include is not None if keep_root is None else bool(keep_root),
                  cross_mounts=bool(cross_mounts))
    checked = check_paths(paths, force_root)
    report: RemoveReport = (RemovePlan(rules=rules, missing_ok=missing_ok, force_root=force_root)
                            if dry_run else RemoveReport())
    targets = resolve(checked, missing_ok, report.failures)
    if cluster is not None:
        from manyfiles.remove._cluster import remove_on_cluster

        return remove_on_cluster(targets, rules, report, cluster=cluster, workers=workers, retries=retries,
                                 progress=progress)
    if isinstance(report, RemovePlan):
        report.targets = targets
    return run(targets, rules, report, workers=workers, retries=retries, progress=progress,
               on_removed=on_removed, output=output, sep=sep)


def plan(
    path: PathArg | Sequence[PathArg],
    *,
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    keep_root: bool | None = None,
    force_root: bool = False,
    cross_mounts: bool = False,
    missing_ok: bool = False,
    workers: int = DEFAULT_WORKERS,
    progress: ProgressArg = False,
    on_removed: OnRemoved | None = None,
    output: Output = None,
    sep: bytes = b"\n",
) -> RemovePlan:
    """What :func:`remove_tree` would remove, as a :class:`RemovePlan`; nothing is removed.

    ``on_removed`` (or ``output``) receives the paths that would go.  ``plan(...).execute()``
    then removes them (arguments checked again by identity; see :class:`RemovePlan`).
    """
    found = remove_tree(path, workers=workers, dry_run=True, include=include, exclude=exclude,
                        keep_root=keep_root, force_root=force_root, cross_mounts=cross_mounts,
                        missing_ok=missing_ok, progress=progress, on_removed=on_removed, output=output,
                        sep=sep)
    assert isinstance(found, RemovePlan)
    return found


def purge(
    directory: PathArg,
    pattern: str | Sequence[str],
    *,
    workers: int = DEFAULT_WORKERS,
    dry_run: bool = False,
    exclude: str | Sequence[str] | None = None,
    progress: ProgressArg = False,
    on_removed: OnRemoved | None = None,
    output: Output = None,
    sep: bytes = b"\n",
) -> RemoveReport:
    """Remove every entry under ``directory`` whose name matches ``pattern`` (glob, or a list).

    ``directory`` itself stays; a matching directory goes with all its content.
    Same report and failure handling as :func:`remove_tree`.

    Example:
        >>> mf.purge("/scratch/ckpt", ["*.tmp", "core.*"]).files     # doctest: +SKIP
        42
    """
    if not patterns(pattern, "pattern"):
        raise UsageError("purge: no pattern given")
    return remove_tree(directory, workers=workers, dry_run=dry_run, include=pattern, exclude=exclude,
                       keep_root=True, progress=progress, on_removed=on_removed, output=output, sep=sep)
