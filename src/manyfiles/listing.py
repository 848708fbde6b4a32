"""Fast directory listing (fastls): getdents64 with a large buffer.

Backends, by name (like benhoyt/scandir's scandir_c / scandir_python):

* ``"dents"``    our C extension ``manyfiles._dents`` (the default where it built)
* ``"scandir"``  ``os.scandir`` (automatic fallback; glibc reads ~32 KiB per getdents call)
* ``"getdents"`` the PyPI ``getdents`` package, a cross-check only (defects in docs/fastls.md)

Nothing here holds all names in memory except :func:`listdir` (which returns them):
:func:`iter_entries` streams one getdents64 batch at a time and :func:`walk` keeps a
bounded number of directory listings in flight.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from manyfiles import _native, iotrace
from manyfiles._extras import require, require_installed

_dents = _native.dents  # None without a compiler at install time, or off Linux (_native.reason says why)

DEFAULT_BUFSIZE = 1 << 20
MIN_BUFSIZE = 280
BACKENDS: tuple[str, ...] = ("dents", "scandir", "getdents")
GETDENTS_FEATURE = "the getdents backend"
TYPE_LETTERS = "fdlbcps?"
_DT_OF_LETTER = {"p": 1, "c": 2, "d": 4, "b": 6, "f": 8, "l": 10, "s": 12, "?": 0}
_LETTER_OF_DT = {v: k for k, v in _DT_OF_LETTER.items()}
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Entry(NamedTuple):
    """One directory entry: ``type`` is one of ``f d l b c p s ?`` (``?``: the filesystem did not say)."""

    name: str | bytes
    type: str
    inode: int


class DirListing(NamedTuple):
    """One directory visited by :func:`walk`.

    ``stats`` holds one ``os.stat_result`` (lstat) per entry when ``walk(stat=True)``,
    ``None`` for an entry that vanished meanwhile.  ``error`` is set when the directory
    could not be listed (then ``entries`` is empty).
    """

    path: str | bytes
    depth: int
    entries: list[Entry]
    error: OSError | None
    stats: list[os.stat_result | None] | None = None


class Filter(NamedTuple):
    """What to keep: glob patterns on names (fnmatch, case-sensitive) and type letters."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    types: str = ""

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude or self.types)

    def c_args(self) -> dict:
        """Arguments for the C core: patterns as bytes, types as a bit mask."""
        return {
            "include": tuple(os.fsencode(p) for p in self.include) or None,
            "exclude": tuple(os.fsencode(p) for p in self.exclude) or None,
            "types": sum(1 << _DT_OF_LETTER[t] for t in set(self.types)),
        }

    def matches(self, name: str | bytes, type_letter: str) -> bool:
        """The same decision in Python, for the fallback backends."""
        text = os.fsdecode(name)
        if any(fnmatch.fnmatchcase(text, p) for p in self.exclude):
            return False
        if self.include and not any(fnmatch.fnmatchcase(text, p) for p in self.include):
            return False
        return not self.types or type_letter in self.types


NO_FILTER = Filter()

if _dents is not None:
    _dents._set_entry_type(Entry)
    # Test hook: behave as on sshfs/NFSv3, where every d_type is DT_UNKNOWN.
    if os.environ.get("MANYFILES_TEST_DT_UNKNOWN") == "1":
        _dents._set_force_unknown(True)


def default_backend() -> str:
    """The backend used when none is asked: ``dents`` where the C core built, else ``scandir``."""
    return "dents" if _dents is not None else "scandir"


def _resolve_backend(backend: str | None) -> str:
    name = backend or default_backend()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    if name == "dents":
        _native.require("the dents backend")
    elif name == "getdents":
        require_installed("getdents", "getdents", GETDENTS_FEATURE)
    return name


def _open_dir(path: str | bytes, dir_fd: int | None = None) -> int:
    return os.open(path, _OPEN_DIR, dir_fd=dir_fd)


def _check_bufsize(bufsize: int) -> int:
    if bufsize < MIN_BUFSIZE:
        raise ValueError(f"bufsize must be at least {MIN_BUFSIZE} bytes (a 255-byte name needs 280)")
    return bufsize


def _trace_batches(path: str | bytes, batches: list | None) -> None:
    tr = iotrace.TRACER
    if tr is not None and batches:
        for start, dur, nbytes, nentries in batches:
            tr.record("getdents", path, nentries, nbytes, start, dur, 0)


def _batches_list() -> list | None:
    return [] if iotrace.TRACER is not None else None


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
    _check_bufsize(bufsize)
    return _on_dir(
        path, _dents.listdir, bufsize, isinstance(path, bytes), resolve=bool(filter.types), **filter.c_args()
    )


def iter_entries(
    path: str | bytes = ".",
    *,
    bufsize: int = DEFAULT_BUFSIZE,
    resolve_unknown: bool = True,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
) -> Iterator[Entry]:
    """Yield an :class:`Entry` per entry, one getdents64 batch at a time.

    Entries whose type the filesystem reports as DT_UNKNOWN (sshfs, NFSv3, XFS
    ftype=0) are kept; with ``resolve_unknown`` their type comes from ``fstatat``.
    """
    name = _resolve_backend(backend)
    _check_bufsize(bufsize)
    if name == "scandir":
        return _scandir_entries(path, filter)
    if name == "getdents":
        return _getdents_entries(path, bufsize, resolve_unknown, filter)
    return _dents_entries(path, bufsize, resolve_unknown, filter)


def _dents_entries(path: str | bytes, bufsize: int, resolve: bool, filter: Filter) -> Iterator[Entry]:
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


def _scandir_entries(path: str | bytes, filter: Filter) -> Iterator[Entry]:
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


def _getdents_entries(path: str | bytes, bufsize: int, resolve: bool, filter: Filter) -> Iterator[Entry]:
    # The PyPI package: filter_function=None, because its default filter drops every
    # DT_UNKNOWN entry (all of them on sshfs); it then also returns "." and "..".
    getdents = require("getdents", "getdents", GETDENTS_FEATURE)

    text_path = os.fsdecode(path)
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
    path: str | bytes = ".",
    *,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
) -> int:
    """Number of entries in ``path`` (without . and ..); the C core creates no object per entry."""
    if _resolve_backend(backend) != "dents":
        return sum(
            1
            for _ in iter_entries(
                path, bufsize=bufsize, resolve_unknown=bool(filter.types), backend=backend, filter=filter
            )
        )
    _check_bufsize(bufsize)
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
    _check_bufsize(bufsize)
    return _on_dir(path, _dents.write_names, out_fd, sep, prefix, bufsize, **filter.c_args())


# ---- trees ------------------------------------------------------------------------


class _Task(NamedTuple):
    path: str | bytes
    depth: int


def walk(
    root: str | bytes,
    *,
    threads: int = 8,
    max_depth: int | None = None,
    follow_symlinks: bool = False,
    stat: bool = False,
    bufsize: int = DEFAULT_BUFSIZE,
    backend: str | None = None,
    filter: Filter = NO_FILTER,
) -> Iterator[DirListing]:
    """Yield one :class:`DirListing` per directory under ``root`` (root included, depth 0), unordered.

    Directories are listed in parallel by ``threads`` threads, one directory per task;
    the C core releases the GIL during getdents64, so the syscalls overlap (on a cold
    cache or a network filesystem that is where the time goes).  At most ``4 * threads``
    listings are in flight, so memory stays bounded whatever the consumer's pace.

    Unreadable directories come with ``error`` set and the walk goes on.  Symlinks are not
    followed unless ``follow_symlinks``; then cycles are detected by (st_dev, st_ino) and
    reported as an ``ELOOP`` error on the directory that closes the cycle.  ``filter``
    applies to the entries reported, never to the recursion.  ``stat=True`` adds an
    lstat per entry (done in the worker threads).
    """
    _resolve_backend(backend)
    _check_bufsize(bufsize)
    walker = _Walker(threads, max_depth, follow_symlinks, stat, bufsize, backend, filter)
    return walker.run(root)


class _Walker:
    def __init__(
        self,
        threads: int,
        max_depth: int | None,
        follow: bool,
        stat: bool,
        bufsize: int,
        backend: str | None,
        filter: Filter,
    ) -> None:
        self.threads = max(1, threads)
        self.max_depth = max_depth
        self.follow = follow
        self.stat = stat
        self.bufsize = bufsize
        self.backend = backend
        self.filter = filter
        self.seen: set[tuple[int, int]] = set()
        self.seen_lock = threading.Lock()

    def run(self, root: str | bytes) -> Iterator[DirListing]:
        todo: queue.SimpleQueue = queue.SimpleQueue()
        done: queue.SimpleQueue = queue.SimpleQueue()
        pending: list[_Task] = [_Task(root, 0)]
        workers = [
            threading.Thread(target=self._work, args=(todo, done), daemon=True) for _ in range(self.threads)
        ]
        for w in workers:
            w.start()
        in_flight = 0
        limit = 4 * self.threads
        try:
            while pending or in_flight:
                while pending and in_flight < limit:
                    todo.put(pending.pop())
                    in_flight += 1
                listing, subdirs = done.get()
                in_flight -= 1
                pending.extend(subdirs)
                yield listing
        finally:
            for _ in workers:
                todo.put(None)

    def _work(self, todo: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
        while (task := todo.get()) is not None:
            try:
                done.put(self._list_one(task))
            except BaseException as exc:  # never leave the consumer waiting forever
                done.put(
                    (DirListing(task.path, task.depth, [], OSError(errno.EIO, repr(exc), task.path)), [])
                )

    def _list_one(self, task: _Task) -> tuple[DirListing, list[_Task]]:
        path, depth = task
        try:
            if self.follow and not self._first_visit(path):
                raise OSError(errno.ELOOP, "File system loop detected", path)
            entries = _all_entries(path, self.bufsize, self.backend)
        except OSError as exc:
            if exc.filename is None:
                exc.filename = path
            return DirListing(path, depth, [], exc), []
        descend = self.max_depth is None or depth < self.max_depth
        subdirs = [
            _Task(os.path.join(path, e.name), depth + 1) for e in entries if descend and self._is_dir(path, e)
        ]
        if self.filter:
            entries = [e for e in entries if self.filter.matches(e.name, e.type)]
        stats = _lstat_all(path, entries) if self.stat else None
        return DirListing(path, depth, entries, None, stats), subdirs

    def _is_dir(self, parent: str | bytes, e: Entry) -> bool:
        if e.type == "d":
            return True
        if e.type != "l" or not self.follow:
            return False
        try:
            return os.path.isdir(os.path.join(parent, e.name))
        except OSError:
            return False

    def _first_visit(self, path: str | bytes) -> bool:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        with self.seen_lock:
            if key in self.seen:
                return False
            self.seen.add(key)
        return True


def _all_entries(path: str | bytes, bufsize: int, backend: str | None) -> list[Entry]:
    """Every entry of one directory, types resolved (the walk needs them to recurse)."""
    if _resolve_backend(backend) != "dents":
        return list(iter_entries(path, bufsize=bufsize, backend=backend, resolve_unknown=True))
    return _on_dir(path, _dents.entries, bufsize, isinstance(path, bytes), resolve=True)


def _lstat_all(path: str | bytes, entries: Sequence[Entry]) -> list[os.stat_result | None]:
    fd = _open_dir(path)
    tr = iotrace.TRACER
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
        for e in d.entries:
            yield os.path.join(d.path, e.name)
