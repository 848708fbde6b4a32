"""Fast directory listing (fastls), trees: the parallel walk, count and write of a whole tree.

With the C core a tree is walked by native threads without the GIL (``listing/_walk.c``);
:func:`count_tree` and :func:`write_tree` create no Python object per entry, and :func:`walk`
hands Python one batch per directory.  Without it, a single-threaded ``os.scandir`` walk gives
the same results.  One directory, the shared types and the backends: :mod:`._directory`.
"""

from __future__ import annotations

import errno
import os
import time
from collections import namedtuple
from collections.abc import Callable, Iterable, Iterator, Sequence

from manyfiles._core import glob as _glob
from manyfiles.listing._directory import (
    _LETTER_OF_DT,
    DEFAULT_BUFSIZE,
    NO_FILTER,
    DirDone,
    DirListing,
    Entry,
    Filter,
    _check_bufsize,
    _check_progress,
    _dents,
    _native_trace,
    _on_dir,
    _open_dir,
    _progress_for,
    _resolve_backend,
    _tracer,
    _walker_hook,
    iter_entries,
)

TYPE_CHECKING = False  # typing is not imported at run time: ~7 ms of fastls' start-up
if TYPE_CHECKING:
    from typing import Any

    from manyfiles._core.progress import Progress, ProgressArg
    from manyfiles.listing._directory import _Silent


# ---- count: one directory, or a tree (recursive=True) ------------------------------


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


def tree_args(
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
    """The tree options of :func:`walk`, checked (ValueError) before anything is read."""
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
    :class:`~manyfiles._core.progress.Snapshot` (``done`` = entries yielded so far, ``failures`` =
    directories that could not be listed); it is updated as each listing is yielded and
    finished when the walk ends or the iterator is closed.  Every argument is checked when
    ``walk`` is called, before anything is read.
    """
    _check_progress(progress)
    root = os.fspath(root)
    args = tree_args(threads, max_depth, min_depth, follow_symlinks, one_filesystem, bufsize, filter,
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
    :class:`~manyfiles._core.progress.Snapshot` (``done`` = entries so far; the last one has the
    final count).  ``on_entries``: a raw hook called with the entries counted so far about ten
    times a second, from the calling thread (an exception it raises stops the walk and
    propagates).  A root that cannot be listed raises ``OSError``; other unreadable
    directories are in ``failures``.
    """
    _check_progress(progress)
    args = tree_args(threads, max_depth, min_depth, follow_symlinks, one_filesystem, bufsize, filter,
                     prune, descend)
    _resolve_backend(backend)
    with _progress_for(progress, "count") as shown:
        return count_into(shown, root, args, backend, on_entries)


def count_into(shown: Progress | _Silent | None, root: str | bytes | os.PathLike, args: _TreeArgs,
               backend: str | None = None, on_entries: Callable[[int], object] | None = None) -> TreeCount:
    """:func:`count_tree` reporting into an open Progress (``shown``; None: nobody listens), as the
    current part of its operation (:meth:`~manyfiles._core.progress.Progress.start_part`: fastls
    over several paths); ``args`` from :func:`tree_args`."""
    root = os.fspath(root)
    hook = _walker_hook(shown, on_entries)
    if _resolve_backend(backend) == "dents":
        tally = _tree_count(root, _dents.walk_count(os.fsencode(root), progress=hook, **args.c_kwargs()))
    else:
        tally = _count_python(root, args, backend, hook)
    _part_finished(shown, tally)
    return tally


def _part_finished(shown: Progress | _Silent | None, tally: TreeCount) -> None:
    if shown:
        shown.part_done(tally.entries)
        shown.add(failures=len(tally.failures))


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
    args = tree_args(threads, max_depth, 0, follow_symlinks, one_filesystem, bufsize, filter)
    with _progress_for(progress, "write") as shown:
        return write_into(shown, root, out_fd, args, json=json, sep=sep, on_entries=on_entries)


def write_into(shown: Progress | _Silent | None, root: str | bytes | os.PathLike, out_fd: int,
               args: _TreeArgs, *, json: bool = False, sep: bytes = b"\n",
               on_entries: Callable[[int], object] | None = None) -> TreeCount:
    """:func:`write_tree` reporting into an open Progress, as :func:`count_into` does."""
    root = os.fspath(root)
    raw = _dents.walk_write(os.fsencode(root), out_fd, json, sep, progress=_walker_hook(shown, on_entries),
                            **args.c_kwargs())
    tally = _tree_count(root, raw)
    _part_finished(shown, tally)
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
