"""The ``fastls`` job as a library call: list directories to a file descriptor, get a report.

``run(request, out_fd)`` is what ``fastls`` (the click command) calls; notebooks usually want
:mod:`manyfiles.listing` directly.  The work itself is :mod:`manyfiles.listing._fastls_core`'s
(the click-free script runs it without this module's report, for start-up time).

Example:
    >>> import sys
    >>> from manyfiles import fastls
    >>> report = fastls.run(fastls.ListRequest(paths=("/data/flat",), count_only=True),
    ...                     sys.stdout.fileno())                       # doctest: +SKIP
    >>> report.entries, report.ok                                     # doctest: +SKIP
    (1000000, True)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.progress import Progress, ProgressArg, check_progress, progress_for
from manyfiles._core.report import Failure, Report
from manyfiles.errors import AccessDenied, NotFound, UsageError

# what the fastls CLI (manyfiles.cli.ls) uses besides run(): reached here, the module's public face
from manyfiles.listing._fastls_core import (  # noqa: F401
    FORMATS,
    ListRequest,
    count_lines,
    exit_code,
    failure_lines,
    list_to,
    progress_fits,
)

__all__ = ["FORMATS", "ListReport", "ListRequest", "count_lines", "decode_json_path", "failure_lines", "run"]


@dataclass(kw_only=True)
class ListReport(Report):
    """What a run did: ``entries`` printed (or counted), ``directories`` listed, ``counts`` per
    path, and the shared report fields (``failures``: each path or directory that could not be
    listed, ``ok``, ``seconds``, ``raise_for_failures()``...)."""

    entries: int = 0
    directories: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return f"listed {self.entries:,} entries in {self.directories:,} directories in {self.seconds:.2f} s"


def run(request: ListRequest, out_fd: int, progress: ProgressArg = False, *, cluster: object = None,
        parts_dir: str | None = None) -> ListReport:
    """List ``request.paths`` to ``out_fd`` (counts only, with ``count_only``); see ListRequest.

    ``progress``: True (a rich line on a terminal, a bar in Jupyter, plain lines otherwise) or
    a callable taking a :class:`~manyfiles._core.progress.Snapshot` (``done`` = entries so far).
    ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``): a recursive
    request runs on Dask workers (:mod:`manyfiles.listing._cluster`; paths printed absolute,
    part files in ``parts_dir``).
    """
    if cluster is not None:
        return _run_on_cluster(request, out_fd, cluster=cluster, parts_dir=parts_dir, progress=progress)
    # the one place the argument becomes a Progress (and is checked); it goes down as it is
    with progress_for(progress, "fastls", unit="entries") as shown:
        tally = list_to(request, out_fd, shown)
        shown.set(done=tally.entries, failures=len(tally.failures))
    return ListReport(entries=tally.entries, directories=tally.directories, counts=tally.counts,
                      failures=[Failure(*f) for f in tally.failures], seconds=tally.seconds)


def _run_on_cluster(request: ListRequest, out_fd: int, *, cluster: object, parts_dir: str | None,
                    progress: ProgressArg) -> ListReport:
    """``fastls -r --cluster``: listings are written by the workers to part files in ``parts_dir``
    (default: a temp folder here, enough for ``local:N``; on several machines give a folder they
    all see), then copied to ``out_fd`` and removed."""
    import shutil
    import tempfile
    import time

    from manyfiles.scale.executor import connect

    _check_cluster_request(request)
    # refused before connecting (which can take seconds); the display opens once connected, so a
    # cluster that cannot be reached is one line on stderr, not a finished display and a line
    check_progress(progress)
    report = ListReport()
    t0 = time.perf_counter()
    own = parts_dir is None
    with connect(cluster) as executor, progress_for(progress, "fastls", unit="entries") as shown:
        folder = tempfile.mkdtemp(prefix="fastls-parts-") if own else os.fspath(parts_dir)
        try:
            for path in request.paths:
                _list_on_cluster(executor, request, path, folder, report, shown, out_fd)
        finally:
            if own:
                shutil.rmtree(folder, ignore_errors=True)
        shown.set(done=report.entries, failures=len(report.failures))
    report.seconds = time.perf_counter() - t0
    return report


def _check_cluster_request(request: ListRequest) -> None:
    if not request.recursive:
        raise UsageError("--cluster lists trees: add -r")
    unsupported = [flag for flag, on in (("--sort", request.sort), ("--long", request.stat),
                                         ("-L", request.follow_symlinks),
                                         ("--backend", request.backend not in (None, "dents"))) if on]
    if unsupported:
        raise UsageError(f"{', '.join(unsupported)}: not with --cluster")


def _list_on_cluster(executor: Any, request: ListRequest, path: str, folder: str, report: ListReport,
                     shown: Progress, out_fd: int) -> None:
    """One path of the request as a tree job: its counts added to ``report``, its parts copied out."""
    from manyfiles.listing._cluster import copy_parts, make_job

    shown.start_part(done=report.entries, failures=len(report.failures))
    try:
        job = make_job(path, out_dir=None if request.count_only else folder, sep=request.sep,
                       json=request.format == "json", max_depth=request.max_depth, filter=request.filter,
                       threads=request.threads)
        run = executor.run(job, progress=shown.part_progress if shown else False).result
    except (NotFound, AccessDenied) as exc:        # fastls goes on with the next path
        report.failures.append(Failure(path, str(exc).split(": ", 1)[-1], type(exc).__name__))
        return
    report.directories += run.directories
    report.counts[path] = report.counts.get(path, 0) + run.entries
    report.entries += run.entries
    report.failures += run.failures
    if not request.count_only:
        copy_parts(run.parts, out_fd)


def decode_json_path(record: dict) -> bytes:
    """The exact path bytes of a ``--json`` record (inverse of the output format)."""
    if "path_b64" in record:
        import base64

        return base64.b64decode(record["path_b64"])
    return os.fsencode(record["path"])
