"""Fast directory listing (fastls): getdents64 with a large buffer, and a parallel tree walk.

Backends, by name (like benhoyt/scandir's scandir_c / scandir_python):

* ``"dents"``    our C extension ``manyfiles._dents`` (the default where it built)
* ``"scandir"``  ``os.scandir`` (automatic fallback; glibc reads ~32 KiB per getdents call)
* ``"getdents"`` the PyPI ``getdents`` package, a cross-check only (defects in docs/fastls.md)

One directory: :func:`listdir`, :func:`iter_entries`, :func:`count`, :func:`write_names`.
A tree: :func:`walk` (one :class:`DirListing` per directory), :func:`count_tree` and
:func:`write_tree`.  With the C core a tree is walked by native threads without the GIL
(``manyfiles/_walk.c``); count_tree and write_tree create no Python object per entry, and
walk hands Python one batch per directory.  Without it, a single-threaded ``os.scandir``
walk gives the same results.

Nothing here holds all names in memory except :func:`listdir` (which returns them):
:func:`iter_entries` streams one getdents64 batch at a time and :func:`walk` keeps a
bounded number of directory listings in flight.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence

from manyfiles import _glob

TYPE_CHECKING = False  # typing is not imported at run time: ~7 ms of fastls' start-up
if TYPE_CHECKING:
    from typing import Any

    from manyfiles._progress import Progress, ProgressArg

# The C core is imported here directly, not through manyfiles._native (which says why it is
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
    """What to keep: ``include`` / ``exclude`` glob patterns (:mod:`manyfiles._glob`, Python's
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
    _dents._set_types(Entry, DirListing)


def default_backend() -> str:
    """The backend used when none is asked: ``dents`` where the C core built, else ``scandir``."""
    return "dents" if _dents is not None else "scandir"


def _resolve_backend(backend: str | None) -> str:
    name = backend or default_backend()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "dents" and _dents is None:
        from manyfiles import _native

        _native.require("the dents backend")
    elif name == "getdents":
        from manyfiles._extras import require_installed

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
    """The active I/O tracer, or None.  manyfiles.iotrace is not imported for this (fastls
    starts ~3 ms sooner): tracing can only be on if something imported it already."""
    module = sys.modules.get("manyfiles.iotrace")
    return None if module is None else module.TRACER


def _native_trace() -> Any:
    """What the C walker hands its I/O log to (each record attributed to the worker thread that
    made the call), or None when tracing is off."""
    tr = _tracer()
    return None if tr is None else sys.modules["manyfiles.iotrace"].native_sink(tr)


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


# ---- progress (manyfiles._progress, imported only when someone listens: fastls' start-up) -----


def _check_progress(progress: object) -> None:
    """UsageError for a bad ``progress=`` (before any work), without importing _progress for good ones."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        from manyfiles._progress import check_progress

        check_progress(progress)


class _Silent:
    """The Progress of nobody listening: falsy, every update a no-op."""

    def __bool__(self) -> bool:
        return False

    def add(self, done: int = 0, **counters: int) -> None:
        pass

    def set(self, **counters: int | None) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_SILENT = _Silent()


def _progress_for(progress: ProgressArg, task: str) -> Any:
    """A context manager yielding a :class:`~manyfiles._progress.Progress` (or a silent stand-in)."""
    if not progress:
        return _SILENT
    from manyfiles._progress import progress_for

    return progress_for(progress, task, unit="entries")


def _entries_hook(shown: Progress | _Silent,
                  on_entries: Callable[[int], object] | None) -> Callable[[int], object] | None:
    """What the C walker calls with the entries so far (~10 times a second, calling thread)."""
    if not shown:
        return on_entries
    if on_entries is None:
        return lambda n: shown.set(done=n)

    def both(n: int) -> None:
        shown.set(done=n)
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
    from manyfiles._extras import require

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


def count(
    path: str | bytes | os.PathLike = ".",
    *,
    recursive: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
    progress: ProgressArg = False,
    **tree_options: Any,
) -> int:
    """Number of entries in ``path`` (without . and ..); the C core creates no object per entry.

    ``recursive=True`` counts the whole tree below ``path`` (see :func:`count_tree` for the
    options and a count per type); a directory that cannot be listed raises
    :class:`~manyfiles.errors.PartialFailure` carrying the :class:`TreeCount`.  ``progress``
    as for :func:`count_tree` (one directory is counted in one C call: its display shows
    the final count only).
    """
    _check_progress(progress)
    path = os.fspath(path)
    if recursive:
        tally = count_tree(path, bufsize=bufsize, backend=backend, filter=filter, progress=progress,
                           **tree_options)
        tally.raise_for_failures()
        return tally.entries
    if tree_options:
        raise TypeError(f"count() got tree options without recursive=True: {', '.join(tree_options)}")
    with _progress_for(progress, "count") as shown:
        n = _count_dir(path, bufsize, backend, filter)
        shown.set(done=n)
    return n


def _count_dir(path: str | bytes, bufsize: int, backend: str | None, filter: Filter) -> int:
    if _resolve_backend(backend) != "dents":
        return sum(
            1
            for _ in iter_entries(
                path, bufsize=bufsize, resolve_unknown=bool(filter.types), backend=backend, filter=filter
            )
        )
    bufsize = _check_bufsize(bufsize)
    return _on_dir(path, _dents.count, bufsize, **filter.c_args())


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


# ---- trees ------------------------------------------------------------------------

#: Walker threads by default: directory reads in flight.  A cold disk or a network filesystem
#: wants many (1M-file tree, cold: 8 threads 1.65 s, 16 ~1.0-1.3 s, 32 ~0.9 s on a quiet run);
#: on a warm tree the count stays CPU-bound and the extra threads cost ~0-10 % CPU.
DEFAULT_THREADS = 16


class TreeCount:
    """What :func:`count_tree` / :func:`write_tree` found.

    ``by_type`` counts entries per type letter (``f d l b c p s ?``); ``directories`` is the
    number of directories listed (the root included); ``failures`` the directories that
    could not be listed, as ``(path, OSError)``.
    """

    __slots__ = ("by_type", "directories", "entries", "failures")

    def __init__(self, entries: int = 0, by_type: dict[str, int] | None = None, directories: int = 0,
                 failures: list[tuple[str | bytes, OSError]] | None = None) -> None:
        self.entries = entries
        self.by_type = {} if by_type is None else by_type
        self.directories = directories
        self.failures = [] if failures is None else failures

    def __repr__(self) -> str:
        return (f"TreeCount(entries={self.entries}, by_type={self.by_type}, directories={self.directories}, "
                f"failures={len(self.failures)})")

    def raise_for_failures(self) -> None:
        """Raise :class:`~manyfiles.errors.PartialFailure` if some directory could not be listed."""
        if self.failures:
            from manyfiles.errors import PartialFailure

            path, exc = self.failures[0]
            more = f" (and {len(self.failures) - 1} more)" if len(self.failures) > 1 else ""
            raise PartialFailure(f"{os.fsdecode(path)}: {exc.strerror or exc}{more}", self.failures, self)


class _TreeArgs(namedtuple("_TreeArgs", "threads max_depth min_depth follow_symlinks one_filesystem bufsize "
                                         "filter prune descend")):
    """The options every tree function shares, checked once (see :func:`walk`)."""

    __slots__ = ()

    def c_kwargs(self) -> dict[str, Any]:
        c_filter = self.filter.c_args()
        return {
            "threads": max(1, self.threads),
            "max_depth": -1 if self.max_depth is None else self.max_depth,
            "min_depth": self.min_depth,
            "follow": self.follow_symlinks,
            "xdev": self.one_filesystem,
            "bufsize": self.bufsize,
            "types": c_filter["types"],
            "include": c_filter["include"],
            "exclude": c_filter["exclude"],
            "prune": _glob.compile(self.prune) if self.prune else None,
            "descend": tuple(_glob.compile(p) if p else None for p in self.descend) or None,
            "trace": _native_trace(),
        }


def _tree_args(
    threads: int = DEFAULT_THREADS,
    max_depth: int | None = None,
    min_depth: int = 0,
    follow_symlinks: bool = False,
    one_filesystem: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    filter: Filter = NO_FILTER,
    prune: Sequence[str] = (),
    descend: Sequence[Sequence[str] | None] = (),
) -> _TreeArgs:
    if max_depth is not None and max_depth < 0:
        raise ValueError("max_depth must be >= 0 (or None)")
    if len(descend) > 8:
        raise ValueError("descend: at most 8 levels")
    return _TreeArgs(
        threads, max_depth, min_depth, follow_symlinks, one_filesystem, _check_bufsize(bufsize), filter,
        tuple(prune), tuple(tuple(p) if p else None for p in descend),
    )


def walk(
    root: str | bytes | os.PathLike,
    *,
    threads: int = DEFAULT_THREADS,
    max_depth: int | None = None,
    follow_symlinks: bool = False,
    one_filesystem: bool = False,
    stat: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
    prune: Sequence[str] = (),
    min_depth: int = 0,
    descend: Sequence[Sequence[str] | None] = (),
    postorder: bool = False,
    progress: ProgressArg = False,
) -> Iterator[DirListing]:
    """Yield one :class:`DirListing` per directory under ``root`` (root included, depth 0), unordered.

    With the C core, ``threads`` native threads list directories in parallel without the
    GIL and Python receives one batch per directory; directories come in no fixed order
    (within one, entries come in getdents order).  At most ``4 * threads + 4`` listings are
    in flight, so memory stays bounded whatever the consumer's pace.  Without the C core
    (or with ``backend="scandir"``/``"getdents"``) a single-threaded walk gives the same
    listings.  Paths are ``str``, or ``bytes`` for a ``bytes`` root (a ``Path`` counts as str).

    Unreadable directories come with ``error`` set (``errno``, ``filename``) and the walk goes
    on.  Symlinks are not followed unless ``follow_symlinks``; then cycles are detected by
    (st_dev, st_ino) and reported as an ``ELOOP`` error on the directory that closes the
    cycle.  Mounted filesystems are crossed (like ``find``) unless ``one_filesystem``; then a
    mount point is reported with an ``EXDEV`` error and not entered.

    ``filter`` selects the entries reported, never what is descended into; ``prune`` names
    directories that are not entered (their entry is still reported), ``descend[d]`` the only
    directories entered at depth ``d + 1``; ``min_depth`` reports entries only from
    directories that deep or deeper.  ``stat=True`` adds an lstat per entry.  With
    ``postorder=True`` a :class:`DirDone` also follows each directory once it and everything
    below it have been yielded (children before parents), for bottom-up work.

    ``progress``: True for the shared live display, or a callable taking a
    :class:`~manyfiles._progress.Snapshot` (``done`` = entries yielded so far, ``failures`` =
    directories that could not be listed); it is updated as each listing is yielded and
    finished when the walk ends or the iterator is closed.  Every argument is checked when
    ``walk`` is called, before anything is read.
    """
    _check_progress(progress)
    root = os.fspath(root)
    args = _tree_args(threads, max_depth, min_depth, follow_symlinks, one_filesystem, bufsize, filter,
                      prune, descend)
    if _resolve_backend(backend) == "dents":
        listings = _walk_c(root, args, stat, postorder)
    else:
        listings = _walk_python(root, args, stat, postorder, backend)
    return _walk_shown(listings, progress) if progress else listings


def _walk_shown(listings: Iterator[Any], progress: ProgressArg, task: str = "walk") -> Iterator[Any]:
    """``listings`` passed through, counted on the way (entries, and unreadable directories)."""
    with _progress_for(progress, task) as shown:
        try:
            for d in listings:
                if type(d) is DirListing:
                    shown.add(len(d.entries), failures=d.error is not None)
                yield d
        finally:
            listings.close()


def _walk_c(root: str | bytes, args: _TreeArgs, stat: bool, postorder: bool) -> Iterator[Any]:
    walker = _dents.Walk(os.fsencode(root), as_bytes=isinstance(root, bytes), postorder=postorder,
                         **args.c_kwargs())
    try:
        for item in walker:
            if type(item) is tuple:  # ("post", path, depth)
                yield DirDone(item[1], item[2])
            elif stat and item.error is None:
                yield item._replace(stats=_lstat_all(item.path, item.entries))
            else:
                yield item
    finally:
        walker.close()


_Post = namedtuple("_Post", "path depth")  # walk(postorder=True) in Python: a marker on the stack


def _walk_python(
    root: str | bytes, args: _TreeArgs, stat: bool, postorder: bool, backend: str | None
) -> Iterator[Any]:
    """The same walk, single-threaded, on os.scandir (or the getdents package)."""
    flt = args.filter
    prune = _glob.compile(args.prune) if args.prune else None
    descend = [_glob.compile(p) if p else None for p in args.descend]
    seen: set[tuple[int, int]] = set()
    root_dev = None
    stack: list[Any] = [(root, 0, "")]
    while stack:
        item = stack.pop()
        if isinstance(item, _Post):
            yield DirDone(item.path, item.depth)
            continue
        path, depth, rel = item
        try:
            if args.follow_symlinks or args.one_filesystem:
                st = os.stat(path)
                if depth == 0:
                    root_dev = st.st_dev
                if args.one_filesystem and st.st_dev != root_dev:
                    raise OSError(errno.EXDEV, "is a mount point; not crossed", path)
                if args.follow_symlinks:
                    if (st.st_dev, st.st_ino) in seen:
                        raise OSError(errno.ELOOP, "File system loop detected", path)
                    seen.add((st.st_dev, st.st_ino))
            entries = _all_entries(path, args.bufsize, backend)
        except OSError as exc:
            if exc.filename is None:
                exc.filename = path
            yield DirListing(path, depth, [], exc)
            continue
        if postorder and depth >= args.min_depth:
            stack.append(_Post(path, depth))  # popped after everything below
        if args.max_depth is None or depth < args.max_depth:
            subdirs = []
            level_glob = descend[depth] if depth < len(descend) else None
            for e in entries:
                if not _enters(path, e, args.follow_symlinks):
                    continue
                sub_rel = _join_rel(rel, e.name)
                if level_glob is not None and not level_glob.match(e.name):
                    continue
                if prune is not None and prune.match(e.name, sub_rel):
                    continue
                subdirs.append((os.path.join(path, e.name), depth + 1, sub_rel))
            stack.extend(reversed(subdirs))
        if depth < args.min_depth:
            continue
        if flt:
            entries = [e for e in entries if flt.matches(e.name, e.type, _join_rel(rel, e.name))]
        stats = _lstat_all(path, entries) if stat else None
        yield DirListing(path, depth, entries, None, stats)


def _join_rel(rel: str | bytes, name: str | bytes) -> Any:
    return name if not rel else os.path.join(rel, name)


def _enters(parent: str | bytes, e: Entry, follow: bool) -> bool:
    if e.type == "d":
        return True
    if e.type != "l" or not follow:
        return False
    try:
        return os.path.isdir(os.path.join(parent, e.name))
    except OSError:
        return False


def _all_entries(path: str | bytes, bufsize: int, backend: str | None) -> list[Entry]:
    """Every entry of one directory, types resolved (the walk needs them to recurse)."""
    if _resolve_backend(backend) != "dents":
        return list(iter_entries(path, bufsize=bufsize, backend=backend, resolve_unknown=True))
    return _on_dir(path, _dents.entries, bufsize, isinstance(path, bytes), resolve=True)


def _lstat_all(path: str | bytes, entries: Sequence[Entry]) -> list[os.stat_result | None]:
    fd = _open_dir(path)
    tr = _tracer()
    out: list[os.stat_result | None] = []
    try:
        for e in entries:
            t0 = time.monotonic_ns() if tr is not None else 0
            try:
                out.append(os.lstat(e.name, dir_fd=fd))
                result = 0
            except FileNotFoundError:
                out.append(None)
                result = errno.ENOENT
            if tr is not None:
                tr.record("stat", e.name, 0, 0, t0, time.monotonic_ns() - t0, result)
    finally:
        os.close(fd)
    return out


def iter_paths(listings: Iterable[DirListing]) -> Iterator[str | bytes]:
    """Full paths of every entry in a walk, for callers that want a flat stream."""
    for d in listings:
        if isinstance(d, DirListing):
            for e in d.entries:
                yield os.path.join(d.path, e.name)


def count_tree(
    root: str | bytes | os.PathLike,
    *,
    threads: int = DEFAULT_THREADS,
    max_depth: int | None = None,
    follow_symlinks: bool = False,
    one_filesystem: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
    prune: Sequence[str] = (),
    min_depth: int = 0,
    descend: Sequence[Sequence[str] | None] = (),
    progress: ProgressArg = False,
    on_entries: Callable[[int], object] | None = None,
) -> TreeCount:
    """Count the entries below ``root`` (per type too); the options are :func:`walk`'s.

    With the C core no Python object is created per entry or per directory.  ``progress``:
    True for the shared live display, or a callable taking a
    :class:`~manyfiles._progress.Snapshot` (``done`` = entries so far; the last one has the
    final count).  ``on_entries`` is the raw hook under it: called with the entries counted
    so far about ten times a second, from the calling thread (an exception it raises stops the
    walk and propagates).  A root that cannot be listed raises ``OSError``; other unreadable
    directories are in ``failures``.
    """
    _check_progress(progress)
    root = os.fspath(root)
    args = _tree_args(threads, max_depth, min_depth, follow_symlinks, one_filesystem, bufsize, filter,
                      prune, descend)
    name = _resolve_backend(backend)
    with _progress_for(progress, "count") as shown:
        hook = _entries_hook(shown, on_entries)
        if name == "dents":
            tally = _tree_count(root, _dents.walk_count(os.fsencode(root), progress=hook, **args.c_kwargs()))
        else:
            tally = _count_python(root, args, backend, hook)
        shown.set(done=tally.entries, failures=len(tally.failures))
    return tally


def _count_python(root: str | bytes, args: _TreeArgs, backend: str | None,
                  hook: Callable[[int], object] | None) -> TreeCount:
    tally = TreeCount()
    for d in _walk_python(root, args, False, False, backend):
        if d.error is not None:
            if d.depth == 0:
                raise d.error
            tally.failures.append((d.path, d.error))
            continue
        tally.directories += 1
        tally.entries += len(d.entries)
        for e in d.entries:
            tally.by_type[e.type] = tally.by_type.get(e.type, 0) + 1
        if hook is not None:
            hook(tally.entries)
    return tally


def write_tree(
    root: str | bytes | os.PathLike,
    out_fd: int,
    *,
    json: bool = False,
    sep: bytes = b"\n",
    threads: int = DEFAULT_THREADS,
    max_depth: int | None = None,
    follow_symlinks: bool = False,
    one_filesystem: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    filter: Filter = NO_FILTER,
    progress: ProgressArg = False,
    on_entries: Callable[[int], object] | None = None,
) -> TreeCount:
    """Write the path of every entry below ``root`` to ``out_fd`` (``path + sep``), or with
    ``json=True`` one JSON object per line, exactly as ``fastls --json`` prints it
    (``path``, ``name``, ``type``, ``inode``, and ``path_b64`` for a path that is not UTF-8).

    The C walker formats into per-thread buffers and writes whole lines, so lines from
    different threads never interleave; their order is not fixed.  Needs the C core
    (``ImportError`` otherwise).  Returns the :class:`TreeCount` (``by_type`` is empty).
    ``progress`` and ``on_entries`` as for :func:`count_tree`.
    """
    _check_progress(progress)
    _resolve_backend("dents")
    root = os.fspath(root)
    args = _tree_args(threads, max_depth, 0, follow_symlinks, one_filesystem, bufsize, filter)
    with _progress_for(progress, "write") as shown:
        hook = _entries_hook(shown, on_entries)
        raw = _dents.walk_write(os.fsencode(root), out_fd, json, sep, progress=hook, **args.c_kwargs())
        tally = _tree_count(root, raw)
        shown.set(done=tally.entries, failures=len(tally.failures))
    return tally


def _tree_count(root: str | bytes, raw: tuple) -> TreeCount:
    per_type, entries, dirs, failures = raw
    as_bytes = isinstance(root, bytes)
    tally = TreeCount(entries, {}, dirs)
    for dt, n in enumerate(per_type):
        if n:
            letter = _LETTER_OF_DT.get(dt, "?")
            tally.by_type[letter] = tally.by_type.get(letter, 0) + n
    for path, err, _depth, _detail in failures:
        shown = path if as_bytes else os.fsdecode(path)
        tally.failures.append((shown, _walk_error(err, shown)))
    return tally


def _walk_error(err: int, path: str | bytes) -> OSError:
    reason = {errno.ELOOP: "File system loop detected", errno.EXDEV: "is a mount point; not crossed"}
    return OSError(err, reason.get(err) or os.strerror(err), path)
