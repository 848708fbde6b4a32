"""The ``fastls`` job itself: list one or more directories to a file descriptor.

:func:`list_to` is what the click-free ``fastls`` script runs (``manyfiles.listing._fastls_main``)
and what :func:`manyfiles.fastls.run` wraps into a report.  It imports nothing heavy
(no dataclasses, no typing): ``fastls -r`` on a warm 150k-entry tree takes ~0.1 s, so a few
milliseconds of imports show.  The plan is chosen once per request:

* flat listing, names only, no sort: the C core writes names straight to ``out_fd``
  (no Python object per entry), the fastest possible path;
* a count, or names / JSON lines (without ``--long`` and ``--sort``) of a tree: the C walker
  counts, or formats and writes them, with native threads and no Python object per entry;
* everything else streams :class:`~manyfiles.listing.DirListing` records from
  :func:`~manyfiles.listing.walk` and formats them here.

Failed paths are collected in the tally (``fastls: PATH: reason``); the job goes on.
"""

from __future__ import annotations

import errno
import os
import time
from collections import namedtuple
from collections.abc import Iterator

from manyfiles import listing
from manyfiles.listing import DEFAULT_BUFSIZE, DEFAULT_THREADS, NO_FILTER, DirListing
from manyfiles.listing._tree import count_into, tree_args, write_into

TYPE_CHECKING = False  # typing is not imported at run time (start-up)
if TYPE_CHECKING:
    from manyfiles._core.progress import Progress

FORMATS = ("names", "json", "long")


_REQUEST_DEFAULTS = {
    "paths": (".",), "recursive": False, "max_depth": None, "follow_symlinks": False, "count_only": False,
    "sort": False, "format": "names", "stat": False, "sep": b"\n", "filter": NO_FILTER,
    "bufsize": DEFAULT_BUFSIZE, "threads": DEFAULT_THREADS, "backend": None,
}


class ListRequest(namedtuple("ListRequest", list(_REQUEST_DEFAULTS), defaults=_REQUEST_DEFAULTS.values())):
    """What to list and how to print it (the CLI's options, parsed); every field has the default
    above: ``paths``, ``recursive``, ``max_depth``, ``follow_symlinks``, ``count_only``, ``sort``,
    ``format`` (names, json or long), ``stat``, ``sep``, ``filter``, ``bufsize``, ``threads``,
    ``backend``.  (A namedtuple: typing is not imported on fastls' start-up path.)"""

    __slots__ = ()


class Failed(namedtuple("Failed", "path reason code")):
    """A path or directory that could not be listed (the fields of manyfiles._core.report.Failure)."""

    __slots__ = ()

    @classmethod
    def of(cls, path: str | bytes, exc: OSError) -> Failed:
        return cls(os.fsdecode(path), exc.strerror or str(exc), errno.errorcode.get(exc.errno or 0, ""))


class Tally:
    """What a run did: entries printed, directories listed, per-path counts, the failures.

    (A plain class: :class:`manyfiles.fastls.ListReport` is the library's report, built from it.)
    """

    __slots__ = ("counts", "directories", "entries", "failures", "seconds")

    def __init__(self) -> None:
        self.entries = 0
        self.directories = 0
        self.counts: dict[str, int] = {}
        self.failures: list[Failed] = []
        self.seconds = 0.0


def list_to(request: ListRequest, out_fd: int, progress: Progress | None = None) -> Tally:
    """List ``request.paths`` to ``out_fd`` (counts only, with ``count_only``).

    ``progress``: the open :class:`~manyfiles._core.progress.Progress` of the caller
    (:func:`manyfiles.fastls.run`), ``done`` = entries so far across the paths; each path is one
    of its parts, and the C walker is handed its ``part_done``.  None or a silent one: nothing
    is computed for it and the walker gets no hook.
    """
    shown = progress if progress else None
    tally = Tally()
    t0 = time.perf_counter()
    writer = _Output(out_fd)
    for path in request.paths:
        if shown is not None:  # the next path counts on from everything so far
            shown.start_part(done=tally.entries, failures=len(tally.failures))
        try:
            _run_one(request, path, writer, tally, shown)
        except BrokenPipeError:
            raise  # the reader went away: stop everything, not just this path
        except OSError as exc:
            tally.failures.append(Failed.of(path, exc))
    writer.flush()
    tally.seconds = time.perf_counter() - t0
    return tally


def _in_c(request: ListRequest) -> bool:
    return (request.backend or listing.default_backend()) == "dents"


def _uses_fast_path(request: ListRequest) -> bool:
    return not request.recursive and not request.sort and request.format == "names" and _in_c(request)


def _uses_c_walker(request: ListRequest) -> bool:
    """Counts of trees, and names or JSON lines (no lstat, no sort) of trees or JSON of one directory."""
    if not _in_c(request) or request.stat or request.sort:
        return False
    if request.count_only:
        return request.recursive
    return request.format == "json" or (request.format == "names" and request.recursive)


def _run_one(request: ListRequest, path: str, writer: _Output, report: Tally,
             shown: Progress | None) -> None:
    # one path of several: print full paths so the output stays unambiguous
    prefix = os.fsencode(os.path.join(path, "")) if len(request.paths) > 1 or request.recursive else b""
    if request.count_only and not request.recursive:
        n = listing.count(path, bufsize=request.bufsize, backend=request.backend, filter=request.filter)
        _add_count(report, path, n)
        return
    if _uses_c_walker(request):
        _run_c_walker(request, path, writer, report, shown)
        return
    if _uses_fast_path(request) and shown is None:
        writer.flush()
        n = listing.write_names(
            path, writer.fd, sep=request.sep, prefix=prefix, bufsize=request.bufsize, filter=request.filter
        )
        _add_count(report, path, n)
        report.directories += 1
        return
    # Walk with a bytes path: names stay bytes end to end, no per-name encoding.
    listings = _listings(request, os.fsencode(path))
    records = _sorted(listings) if request.sort else listings
    n = 0
    for d in records:
        if d.error is not None:
            report.failures.append(Failed.of(d.path, d.error))
            continue
        report.directories += 1
        n += len(d.entries)
        if not request.count_only:
            writer.write(_format(request, d, prefix if d.depth == 0 and not request.recursive else None))
        if shown is not None:
            shown.part_done(n)
    _add_count(report, path, n)


def _run_c_walker(request: ListRequest, path: str, writer: _Output, report: Tally,
                  shown: Progress | None) -> None:
    args = tree_args(threads=request.threads if request.recursive else 1,
                     max_depth=request.max_depth if request.recursive else 0,
                     follow_symlinks=request.follow_symlinks, bufsize=request.bufsize, filter=request.filter)
    # bytes root: the paths in failures stay exactly what the walker saw
    root = os.fsencode(path)
    if request.count_only:
        tally = count_into(shown, root, args)
    else:
        writer.flush()
        tally = write_into(shown, root, writer.fd, args, json=request.format == "json", sep=request.sep)
    for failed, exc in tally.failures:
        report.failures.append(Failed.of(failed, exc))
    report.directories += tally.directories
    _add_count(report, path, tally.entries)


def _add_count(report: Tally, path: str, n: int) -> None:
    report.counts[path] = report.counts.get(path, 0) + n
    report.entries += n


def _listings(request: ListRequest, path: bytes) -> Iterator[DirListing]:
    max_depth = request.max_depth if request.recursive else 0
    walk = listing.walk(
        path,
        threads=request.threads if request.recursive else 1,
        max_depth=max_depth,
        follow_symlinks=request.follow_symlinks,
        stat=request.stat or request.format == "long",
        bufsize=request.bufsize,
        backend=request.backend,
        filter=request.filter,
    )
    if not request.recursive:
        # the root's own failure is the path's failure
        for d in walk:
            if d.error is not None and d.depth == 0:
                raise d.error
            yield d
        return
    yield from walk


def _sorted(listings: Iterator[DirListing]) -> Iterator[DirListing]:
    """Sort by full path (bytes order, like `LC_ALL=C ls`); this holds every name in memory."""
    everything = list(listings)
    for d in everything:
        order = sorted(range(len(d.entries)), key=lambda i, d=d: d.entries[i].name)
        d.entries[:] = [d.entries[i] for i in order]
        if d.stats is not None:
            d.stats[:] = [d.stats[i] for i in order]
    everything.sort(key=lambda d: d.path)
    if any(d.depth > 0 for d in everything):
        # interleave so that a tree prints in path order, not directory by directory
        yield from _merge_paths(everything)
    else:
        yield from everything


def _merge_paths(listings: list[DirListing]) -> Iterator[DirListing]:
    rows = []
    for d in listings:
        for i, e in enumerate(d.entries):
            rows.append((os.path.join(d.path, e.name), d, i))
    rows.sort(key=lambda r: r[0])
    for _, d, i in rows:
        stats = [d.stats[i]] if d.stats is not None else None
        yield DirListing(d.path, d.depth, [d.entries[i]], None, stats)


def _format(request: ListRequest, d: DirListing, prefix: bytes | None) -> bytes:
    full = os.path.join(d.path, b"")
    base = full if prefix is None else prefix
    if request.format == "json":
        return b"".join(_json_line(d, i, full) for i in range(len(d.entries)))
    if request.format == "long":
        return b"".join(_long_line(d, i, base, request.sep) for i in range(len(d.entries)))
    sep = request.sep
    if not d.entries:
        return b""
    # one C-level join per directory instead of a concatenation per name
    return base + (sep + base).join([e.name for e in d.entries]) + sep


def _json_line(d: DirListing, i: int, base: bytes) -> bytes:
    import base64
    import json

    e = d.entries[i]
    raw = base + e.name
    record: dict = {"path": os.fsdecode(raw), "name": os.fsdecode(e.name), "type": e.type, "inode": e.inode}
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        # JSON cannot carry raw bytes: the exact name travels base64-encoded too
        record["path_b64"] = base64.b64encode(raw).decode("ascii")
    st = d.stats[i] if d.stats is not None else None
    if st is not None:
        record["size"] = st.st_size
        record["mtime"] = st.st_mtime
    return json.dumps(record, ensure_ascii=True).encode() + b"\n"


def _long_line(d: DirListing, i: int, base: bytes, sep: bytes) -> bytes:
    e = d.entries[i]
    st = d.stats[i] if d.stats is not None else None
    size = str(st.st_size) if st is not None else "?"
    mtime = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)) if st is not None else "?"
    return f"{e.type} {size:>12} {mtime} ".encode() + base + e.name + sep


class _Output:
    """Buffered writes to a raw fd (sys.stdout's text layer would re-encode names)."""

    def __init__(self, fd: int, limit: int = 1 << 18) -> None:
        self.fd = fd
        self.limit = limit
        self.chunks: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.chunks.append(data)
        self.size += len(data)
        if self.size >= self.limit:
            self.flush()

    def flush(self) -> None:
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.size = 0
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


def count_lines(report: Tally, several: bool, as_json: bool = False) -> list[str]:
    """What ``--count`` prints: the number, or ``N<TAB>PATH`` per path and a total; with
    ``--json`` one line ``{"event": "summary", "entries": N, "counts": {PATH: N}, "failures": F}``."""
    if as_json:
        import json

        return [json.dumps({"event": "summary", "entries": report.entries, "counts": report.counts,
                            "failures": len(report.failures)}, ensure_ascii=False)]
    if several:
        return [f"{n}\t{path}" for path, n in report.counts.items()] + [f"{report.entries}\ttotal"]
    return [str(report.entries)] if report.counts else []


def failure_lines(report: Tally, prog: str = "fastls") -> list[str]:
    """``fastls: PATH: reason`` for the paths and directories that could not be listed, a long run of
    one kind shortened (:class:`manyfiles.errors.FailureLines`)."""
    if not report.failures:
        return []
    from manyfiles.errors import FailureLines

    return FailureLines(prog).lines(report.failures)


def exit_code(report: Tally, paths: tuple[str, ...]) -> int:
    """0, 1 if something could not be listed, 2 if a PATH itself is not a directory (the table in
    docs/cli.md; :func:`manyfiles.errors.exit_code_of`)."""
    if not report.failures:
        return 0
    from manyfiles.errors import exit_code_of

    return exit_code_of(report.failures, paths)


def progress_fits(count_only: bool, stderr_tty: bool, stdout_tty: bool) -> bool:
    """fastls' auto-progress rule (with no --json / -q): stderr is a terminal, and stdout is not or
    only gets a count at the end.  Names printed on the same terminal would tear the bar:
    ``fastls -r /data > list.txt`` and ``fastls -r -c /data`` show it, ``fastls /data`` does not."""
    return stderr_tty and (count_only or not stdout_tty)
