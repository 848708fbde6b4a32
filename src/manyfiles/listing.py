"""Fast directory listing (fastls): getdents64 with a large buffer.

Backends, by name (like benhoyt/scandir's scandir_c / scandir_python):

* ``"dents"``    our C extension ``manyfiles._dents`` (default where it built)
* ``"scandir"``  ``os.scandir`` (automatic fallback; ~32 KiB getdents batches)
* ``"getdents"`` the PyPI ``getdents`` package, cross-checked only (see docs/fastls.md)

Every function streams: nothing holds all names unless sorting is asked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

DEFAULT_BUFSIZE = 1 << 20


class Entry(NamedTuple):
    """One directory entry: ``type`` is one of ``f d l b c p s ?`` (``?`` = unknown)."""

    name: str | bytes
    type: str
    inode: int


class DirListing(NamedTuple):
    """One directory visited by :func:`walk`; ``error`` is set when it could not be listed."""

    path: str | bytes
    depth: int
    entries: list[Entry]
    error: OSError | None


_TYPE_OF_DIRENTRY = (("l", "is_symlink"), ("d", "is_dir"), ("f", "is_file"))


def _scandir_entries(path: str | bytes) -> Iterator[Entry]:
    with os.scandir(path) as it:
        for e in it:
            yield Entry(e.name, _scandir_type(e), e.inode())


def _scandir_type(e: os.DirEntry) -> str:
    for letter, method in _TYPE_OF_DIRENTRY:
        if getattr(e, method)(follow_symlinks=False):
            return letter
    return _mode_letter(e.stat(follow_symlinks=False).st_mode)


def _mode_letter(mode: int) -> str:
    import stat

    for letter, test in (("f", stat.S_ISREG), ("d", stat.S_ISDIR), ("l", stat.S_ISLNK), ("b", stat.S_ISBLK),
                         ("c", stat.S_ISCHR), ("p", stat.S_ISFIFO), ("s", stat.S_ISSOCK)):
        if test(mode):
            return letter
    return "?"


def listdir(path: str | bytes = ".", *, bufsize: int = DEFAULT_BUFSIZE, backend: str | None = None) -> list:
    """Names in ``path`` (unsorted), exactly like ``os.listdir`` (str or bytes as given)."""
    return [e.name for e in iter_entries(path, bufsize=bufsize, resolve_unknown=False, backend=backend)]


def iter_entries(path: str | bytes = ".", *, bufsize: int = DEFAULT_BUFSIZE, resolve_unknown: bool = True,
                 backend: str | None = None) -> Iterator[Entry]:
    """Yield :class:`Entry` for each entry; DT_UNKNOWN types are resolved with fstatat if asked."""
    return _scandir_entries(path)


def count(path: str | bytes = ".", *, bufsize: int = DEFAULT_BUFSIZE, backend: str | None = None) -> int:
    """Number of entries in ``path`` (excluding . and ..) without creating a name per entry."""
    return sum(1 for _ in iter_entries(path, bufsize=bufsize, resolve_unknown=False, backend=backend))


def walk(root: str | bytes, *, threads: int = 8, max_depth: int | None = None, follow_symlinks: bool = False,
         bufsize: int = DEFAULT_BUFSIZE, backend: str | None = None) -> Iterator[DirListing]:
    """Yield one :class:`DirListing` per directory under ``root`` (root included), in no set order.

    Directories are listed in parallel, one directory per task; the GIL is released
    during getdents64 so threads overlap their syscalls.  Unreadable directories are
    yielded with ``error`` set and the walk continues.  With ``follow_symlinks`` cycles
    are detected by (st_dev, st_ino).
    """
    stack = [(root, 0)]
    while stack:
        path, depth = stack.pop()
        try:
            entries = list(iter_entries(path, bufsize=bufsize, backend=backend))
        except OSError as exc:
            yield DirListing(path, depth, [], exc)
            continue
        yield DirListing(path, depth, entries, None)
        if max_depth is None or depth < max_depth:
            for e in entries:
                if e.type == "d":
                    stack.append((os.path.join(path, e.name), depth + 1))


BACKENDS: tuple[str, ...] = ("dents", "scandir", "getdents")
