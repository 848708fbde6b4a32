"""The ``fastls`` job as a library call: list directories to a file descriptor, get a report.

``run(request, out_fd)`` is what ``fastls`` (the click command) calls; notebooks usually want
:mod:`manyfiles.listing` directly.  The work itself is :mod:`manyfiles._fastls_core`'s
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

from manyfiles._fastls_core import FORMATS, ListRequest, count_lines, failure_lines, list_to
from manyfiles._progress import ProgressArg, check_progress, progress_for
from manyfiles._report import Failure, Report

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
    a callable taking a :class:`~manyfiles._progress.Snapshot` (``done`` = entries so far).
    ``cluster`` (``"local:N"``, ``"tcp://HOST:8786"``, a ``distributed.Client``): a recursive
    request runs on Dask workers (:func:`manyfiles.scale.tree.run_request`; paths printed
    absolute, part files in ``parts_dir``).
    """
    check_progress(progress)
    if cluster is not None:
        from manyfiles.scale.tree import run_request

        return run_request(request, out_fd, cluster=cluster, parts_dir=parts_dir, progress=progress)
    check_progress(progress)
    with progress_for(progress, "fastls", unit="entries") as p:
        tally = list_to(request, out_fd, (lambda n: p.set(done=n)) if p else None)
        p.set(done=tally.entries, failures=len(tally.failures))
    return ListReport(entries=tally.entries, directories=tally.directories, counts=tally.counts,
                      failures=[Failure(*f) for f in tally.failures], seconds=tally.seconds)


def decode_json_path(record: dict) -> bytes:
    """The exact path bytes of a ``--json`` record (inverse of the output format)."""
    if "path_b64" in record:
        import base64

        return base64.b64decode(record["path_b64"])
    return os.fsencode(record["path"])
