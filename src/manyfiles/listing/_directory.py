"""Fast directory listing (fastls), one directory: getdents64 with a large buffer.

The types every listing function shares (:class:`Entry`, :class:`DirListing`, :class:`Filter`),
the backends (``"dents"``, the C core ``manyfiles._dents``; ``"scandir"``; ``"getdents"``), and the
progress helpers are here; trees (and :func:`~manyfiles.listing.count`, which counts either) are in
:mod:`manyfiles.listing._tree`.

Nothing here holds all names in memory except :func:`listdir` (which returns them):
:func:`iter_entries` streams one getdents64 batch at a time.
"""

from __future__ import annotations

import errno
import os
import sys
from collections import namedtuple
from collections.abc import Callable, Iterator

from manyfiles._core import glob as _glob

TYPE_CHECKING = False  # typing is not imported at run time: ~7 ms of fastls' start-up
if TYPE_CHECKING:
    from typing import Any

    from manyfiles._core.progress import Progress, ProgressArg

# The C core is imported here directly, not through manyfiles._core.native (which says why it is
# missing): _native imports pathlib and _extras importlib.metadata, ~40 ms of fastls' start-up,
# so both are imported only on the paths that need them.
try:
    from manyfiles import _dents
except ImportError:  # no compiler at install time, or not Linux (_native.reason says why)
    _dents = None

DEFAULT_BUFSIZE = 1 << 20
MIN_BUFSIZE = 280
MAX_BUFSIZE = 64 << 20
BACKENDS: tuple[str, ...] = ("dents", "scandir", "getdents")
GETDENTS_FEATURE = "the getdents backend"
TYPE_LETTERS = "fdlbcps?"
_DT_OF_LETTER = {"p": 1, "c": 2, "d": 4, "b": 6, "f": 8, "l": 10, "s": 12, "?": 0}
_LETTER_OF_DT = {v: k for k, v in _DT_OF_LETTER.items()}
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Entry(namedtuple("Entry", "name type inode")):
    """One directory entry: ``name`` (str, or bytes for a bytes path), ``type`` one of
    ``f d l b c p s ?`` (``?``: the filesystem did not say), ``inode`` (int)."""

    __slots__ = ()


class DirListing(namedtuple("DirListing", "path depth entries error stats", defaults=(None,))):
    """One directory visited by :func:`walk`: ``path``, ``depth`` (root 0), ``entries``
    (list of :class:`Entry`), ``error`` (OSError or None) and ``stats``.

    ``stats`` holds one ``os.stat_result`` (lstat) per entry when ``walk(stat=True)``,
    ``None`` for an entry that vanished meanwhile.  ``error`` is set when the directory
    could not be listed (then ``entries`` is empty).
    """

    __slots__ = ()


class DirDone(namedtuple("DirDone", "path depth")):
    """``walk(postorder=True)``: ``path`` and everything below it have been yielded."""

    __slots__ = ()


class Filter(namedtuple("Filter", "include exclude types", defaults=((), (), ""))):
    """What to keep: ``include`` / ``exclude`` glob patterns (:mod:`manyfiles._core.glob`, Python's
    fnmatch rules; tuples of str) and ``types`` (type letters, e.g. ``"fl"``).

    A pattern containing ``/`` is matched against the path relative to the walk's root,
    any other against the name.
    """

    __slots__ = ()

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude or self.types)

    def c_args(self) -> dict:
        """Arguments for the C core: compiled patterns, types as a bit mask."""
        return {
            "include": _glob.compile(self.include) if self.include else None,
            "exclude": _glob.compile(self.exclude) if self.exclude else None,
            "types": type_mask(self.types),
        }

    def matches(self, name: str | bytes, type_letter: str, rel: str | bytes | None = None) -> bool:
        """The same decision in Python, for the fallback backends."""
        if self.exclude and _glob.compile(self.exclude).match(name, rel):
            return False
        if self.include and not _glob.compile(self.include).match(name, rel):
            return False
        return not self.types or type_letter in self.types


NO_FILTER = Filter()


def type_mask(letters: str) -> int:
    """The C core's type filter: bit ``1 << d_type`` for each type letter."""
    return sum(1 << _DT_OF_LETTER[t] for t in set(letters))


if _dents is not None:
    _dents.set_types(Entry, DirListing)


def default_backend() -> str:
    """The backend used when none is asked: ``dents`` where the C core built, else ``scandir``."""
    return "dents" if _dents is not None else "scandir"


def _resolve_backend(backend: str | None) -> str:
    name = backend or default_backend()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "dents" and _dents is None:
        from manyfiles._core import native as _native

        _native.require("the dents backend")
    elif name == "getdents":
        from manyfiles._core.extras import require_installed

        require_installed("getdents", "getdents", GETDENTS_FEATURE)
    return name


def _open_dir(path: str | bytes | int) -> int:
    if isinstance(path, int):  # an open directory: a new open file description, its offset stays the caller's
        return os.open(".", _OPEN_DIR, dir_fd=path)
    return os.open(path, _OPEN_DIR)


def _check_bufsize(bufsize: int) -> int:
    if bufsize < MIN_BUFSIZE:
        raise ValueError(f"bufsize must be at least {MIN_BUFSIZE} bytes (a 255-byte name needs 280)")
    # getdents64's count is 32-bit: the kernel truncates 4 GiB to 0 (EINVAL); no filesystem
    # fills more than a few MiB per call anyway (the C core clamps the same way)
    return min(bufsize, MAX_BUFSIZE)


def _tracer() -> Any:
    """The active I/O tracer, or None.  manyfiles.trace.iotrace is not imported for this (fastls
    starts ~3 ms sooner): tracing can only be on if something imported it already."""
    module = sys.modules.get("manyfiles.trace.iotrace")
    return None if module is None else module.TRACER


def _native_trace() -> Any:
    """What the C walker hands its I/O log to (each record attributed to the worker thread that
    made the call), or None when tracing is off."""
    tr = _tracer()
    return None if tr is None else sys.modules["manyfiles.trace.iotrace"].native_sink(tr)


def _trace_batches(path: str | bytes, batches: list | None) -> None:
    tr = _tracer()
    if tr is not None and batches:
        for start, dur, nbytes, nentries in batches:
            tr.record("getdents", path, nentries, nbytes, start, dur, 0)


def _batches_list() -> list | None:
    return [] if _tracer() is not None else None


def _on_dir(path: str | bytes, c_function: Any, *args: Any, **kwargs: Any) -> Any:
    """Open ``path``, run one whole-directory C call on it, report its batches to the I/O log."""
    fd = _open_dir(path)
    try:
        batches = _batches_list()
        result = c_function(fd, *args, path=path, batches=batches, **kwargs)
    finally:
        os.close(fd)
    _trace_batches(path, batches)
    return result


# ---- progress (manyfiles._core.progress, imported only when someone listens: fastls' start-up) -----


def _check_progress(progress: object) -> None:
    """UsageError for a bad ``progress=`` (before any work), without importing _progress for good ones."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        from manyfiles._core.progress import check_progress

        check_progress(progress)


class _Silent:
    """The Progress of nobody listening: falsy, every update a no-op."""

    def __bool__(self) -> bool:
        return False

    def add(self, done: int = 0, **counters: int) -> None:
        pass

    def set(self, **counters: int | None) -> None:
        pass

    def start_part(self, **counters: int | None) -> None:
        pass

    def part_done(self, n: int) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_SILENT = _Silent()


def _progress_for(progress: ProgressArg, task: str) -> Any:
    """A context manager yielding a :class:`~manyfiles._core.progress.Progress` (or a silent stand-in)."""
    if not progress:
        return _SILENT
    from manyfiles._core.progress import progress_for

    return progress_for(progress, task, unit="entries")


def _walker_hook(shown: Progress | _Silent | None,
                 on_entries: Callable[[int], object] | None) -> Callable[[int], object] | None:
    """What the C walker calls with its running count (~10 times a second, calling thread):
    the Progress's own :meth:`~manyfiles._core.progress.Progress.part_done`, the caller's raw
    ``on_entries``, both, or nothing at all (no hook: the walker never calls into Python)."""
    if on_entries is None:
        return shown.part_done if shown else None
    if not shown:
        return on_entries

    def both(n: int) -> None:
        shown.part_done(n)
        on_entries(n)

    return both


# ---- one directory ----------------------------------------------------------------


def listdir(
    path: str | bytes = ".",
    *,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
) -> list:
    """Names in ``path`` (unsorted), like ``os.listdir``: str names for a str path (undecodable
    bytes as surrogate escapes), bytes names for a bytes path."""
    if _resolve_backend(backend) != "dents":
        return [
            e.name
            for e in iter_entries(
                path, bufsize=bufsize, resolve_unknown=bool(filter.types), backend=backend, filter=filter
            )
        ]
    bufsize = _check_bufsize(bufsize)
    return _on_dir(
        path, _dents.listdir, bufsize, isinstance(path, bytes), resolve=bool(filter.types), **filter.c_args()
    )


def iter_entries(
    path: str | bytes | int = ".",
    *,
    bufsize: int = DEFAULT_BUFSIZE,
    resolve_unknown: bool = True,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
) -> Iterator[Entry]:
    """Yield an :class:`Entry` per entry, one getdents64 batch at a time.

    Entries whose type the filesystem reports as DT_UNKNOWN (sshfs, NFSv3, XFS
    ftype=0) are kept; with ``resolve_unknown`` their type comes from ``fstatat``.

    ``path`` may also be an open directory file descriptor (as ``os.scandir`` accepts):
    the directory is listed from its start through a new open file description, so the
    fd, its offset and its ownership stay the caller's; names are ``str``.  Tools that
    walk a tree through fds they opened themselves (``O_NOFOLLOW``, relative to the
    parent) list exactly the directory they opened, whatever its path has become.
    """
    name = _resolve_backend(backend)
    bufsize = _check_bufsize(bufsize)
    if name == "scandir":
        return _scandir_entries(path, filter)
    if name == "getdents":
        return _getdents_entries(path, bufsize, resolve_unknown, filter)
    return _dents_entries(path, bufsize, resolve_unknown, filter)


def _dents_entries(path: str | bytes | int, bufsize: int, resolve: bool, filter: Filter) -> Iterator[Entry]:
    fd = _open_dir(path)
    try:
        as_bytes = isinstance(path, bytes)
        c_filter = filter.c_args()
        while True:
            batches = _batches_list()
            batch = _dents.entries_batch(
                fd, bufsize, as_bytes, resolve=resolve, path=path, batches=batches, **c_filter
            )
            _trace_batches(path, batches)
            if batch is None:
                return
            yield from batch
    finally:
        os.close(fd)


def _scandir_entries(path: str | bytes | int, filter: Filter = NO_FILTER) -> Iterator[Entry]:
    with os.scandir(path) as it:
        for e in it:
            entry = Entry(e.name, _scandir_type(e), e.inode())
            if not filter or filter.matches(entry.name, entry.type):
                yield entry


def _scandir_type(e: os.DirEntry) -> str:
    try:
        if e.is_symlink():
            return "l"
        if e.is_dir(follow_symlinks=False):
            return "d"
        if e.is_file(follow_symlinks=False):
            return "f"
        return _mode_letter(e.stat(follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return "?"


def _mode_letter(mode: int) -> str:
    import stat

    for letter, test in (
        ("f", stat.S_ISREG),
        ("d", stat.S_ISDIR),
        ("l", stat.S_ISLNK),
        ("b", stat.S_ISBLK),
        ("c", stat.S_ISCHR),
        ("p", stat.S_ISFIFO),
        ("s", stat.S_ISSOCK),
    ):
        if test(mode):
            return letter
    return "?"


def _getdents_entries(path: str | bytes | int, bufsize: int, resolve: bool,
                      filter: Filter) -> Iterator[Entry]:
    # The PyPI package: filter_function=None, because its default filter drops every
    # DT_UNKNOWN entry (all of them on sshfs); it then also returns "." and "..".
    from manyfiles._core.extras import require

    getdents = require("getdents", "getdents", GETDENTS_FEATURE)

    text_path = f"<fd {path}>" if isinstance(path, int) else os.fsdecode(path)
    if isinstance(path, int):
        fd = os.open(".", getdents.O_GETDENTS, dir_fd=path)
    else:
        fd = os.open(path, getdents.O_GETDENTS)
    try:
        raw = getdents.getdents_raw(fd, bufsize)
        while True:
            try:
                inode, dtype, name = next(raw)
            except StopIteration:
                return
            except OSError as exc:
                if exc.errno is None:  # the package raises OSError without errno
                    raise OSError(
                        errno.EIO, "getdents64 failed (the getdents package does not say why)", text_path
                    ) from exc
                raise
            if name in (".", ".."):
                continue
            letter = _LETTER_OF_DT.get(dtype, "?")
            if letter == "?" and resolve:
                letter = _lstat_letter(fd, name)
            if isinstance(path, bytes):
                name = os.fsencode(name)
            if not filter or filter.matches(name, letter):
                yield Entry(name, letter, inode)
    finally:
        os.close(fd)


def _lstat_letter(dir_fd: int, name: str | bytes) -> str:
    try:
        return _mode_letter(os.lstat(name, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return "?"


def write_names(
    path: str | bytes,
    out_fd: int,
    *,
    sep: bytes = b"\n",
    prefix: bytes = b"",
    bufsize: int = DEFAULT_BUFSIZE,
    filter: Filter = NO_FILTER,
) -> int:
    """Write ``prefix + name + sep`` for every entry straight to ``out_fd``; returns the count.

    The fastest way to print a huge directory: names never become Python objects.
    Needs the C core (``ImportError`` otherwise).
    """
    _resolve_backend("dents")
    bufsize = _check_bufsize(bufsize)
    return _on_dir(path, _dents.write_names, out_fd, sep, prefix, bufsize, **filter.c_args())
