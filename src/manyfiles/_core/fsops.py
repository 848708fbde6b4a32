"""Filesystem mutations shared by shard, remove and s3pull, each one traced.

Only the primitives live here (one syscall each, plus the error mapping the
callers share, and the back-off for a step a concurrent remover can undo);
planning lives with the callers.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from manyfiles.trace import iotrace

PathLike = str | bytes


def traced(op: str, path: PathLike, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` and record it in the I/O log as ``op`` on ``path``."""
    tr = iotrace.TRACER
    if tr is None:
        return fn(*args, **kwargs)
    t0 = time.monotonic_ns()
    try:
        result = fn(*args, **kwargs)
    except OSError as exc:
        tr.record(op, path, 0, 0, t0, time.monotonic_ns() - t0, exc.errno or -1)
        raise
    tr.record(op, path, 0, 0, t0, time.monotonic_ns() - t0, 0)
    return result


def rename(
    src: PathLike, dst: PathLike, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None
) -> None:
    traced("rename", src, os.rename, src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


def unlink(path: PathLike, *, dir_fd: int | None = None) -> None:
    traced("unlink", path, os.unlink, path, dir_fd=dir_fd)


def rmdir(path: PathLike, *, dir_fd: int | None = None) -> None:
    traced("rmdir", path, os.rmdir, path, dir_fd=dir_fd)


def mkdir(path: PathLike, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
    traced("mkdir", path, os.mkdir, path, mode, dir_fd=dir_fd)


def fsync(fd: int, path: PathLike = "") -> None:
    traced("fsync", path, os.fsync, fd)


def fsync_dir(path: PathLike) -> None:
    """fsync a directory so that renames/creates inside it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd, path)
    finally:
        os.close(fd)


# A writer racing with a prune (``ShardedDir.remove`` removing emptied buckets) can see a
# directory vanish between two steps.  It repeats the step after a short random back-off
# (full jitter: the two sides stop meeting in lock step) until RACE_TIMEOUT seconds have
# passed; a prune needs an emptied directory to win, so only a remover that never stops
# can outlast that.
RACE_TIMEOUT = 60.0
_BACKOFF_FIRST = 50e-6
_BACKOFF_MAX = 0.02


def attempts(timeout: float = RACE_TIMEOUT) -> Iterator[int]:
    """Attempt numbers for a step that a concurrent remover can undo, with back-off between them.

    The first retry is immediate; later ones sleep a random time up to a doubling cap.  The
    iteration ends once ``timeout`` seconds have passed since the first attempt.
    """
    deadline = time.monotonic() + timeout
    for n in itertools.count():
        yield n
        if time.monotonic() >= deadline:
            return
        if n:
            time.sleep(random.uniform(0, min(_BACKOFF_MAX, _BACKOFF_FIRST * 2 ** min(n, 20))))


def makedirs(path: PathLike, *, timeout: float = RACE_TIMEOUT) -> None:
    """``os.makedirs(exist_ok=True)`` with each created level traced, robust to concurrent prunes.

    A level that a concurrent prune (``ShardedDir.remove``) removes between our mkdirs is
    made again, with back-off, for up to ``timeout`` seconds (see :func:`attempts`).
    """
    _makedirs(path, time.monotonic() + timeout)


def _makedirs(path: PathLike, deadline: float) -> None:
    for _ in attempts(max(0.0, deadline - time.monotonic())):
        try:
            mkdir(path)
            return
        except FileExistsError:
            return
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not parent or parent == path:
                raise
            # make the parent, then try again: at once the first time, after a back-off when a
            # prune removed the parent we had just made
            _makedirs(parent, deadline)
    raise FileNotFoundError(errno.ENOENT, "directory keeps disappearing (concurrent removal)", path)


def rmdir_if_empty(path: PathLike, *, dir_fd: int | None = None) -> bool:
    """Remove an empty directory; False (not an error) if it is not empty or already gone."""
    try:
        rmdir(path, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            return False
        raise
    return True


def prune_empty_parents(path: PathLike, stop_at: PathLike) -> int:
    """Remove ``path``'s now-empty ancestor directories up to (not including) ``stop_at``.

    Returns how many were removed.  A racing writer that re-populates a level makes
    rmdir fail with ENOTEMPTY, which simply stops the pruning.
    """
    stop = os.path.abspath(stop_at)
    current = os.path.dirname(os.path.abspath(path))
    removed = 0
    while current != stop and current.startswith(stop) and rmdir_if_empty(current):
        removed += 1
        current = os.path.dirname(current)
    return removed


# -- no-clobber rename and filesystem sync (shard) --------------------------------------------------

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc: Any = None
# st_dev of every filesystem that rejected RENAME_NOREPLACE (NFS, sshfs and other FUSE servers):
# per filesystem, so one NFS mount does not cost an ext4 tree its atomic no-clobber rename.
_rejects_noreplace: set[int] = set()


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        for fn in ("renameat2", "syncfs"):
            if hasattr(_libc, fn):
                getattr(_libc, fn).restype = ctypes.c_int
    return _libc


def _check(result: int, path: PathLike) -> None:
    """Raise the OSError of a failed libc call (``result`` -1, errno set)."""
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)


def _renameat2(src: bytes, dst: bytes, src_dir_fd: int, dst_dir_fd: int) -> None:
    _check(_libc.renameat2(src_dir_fd, src, dst_dir_fd, dst, _RENAME_NOREPLACE), src)


def _dev_of_parent(dst: PathLike, dst_dir_fd: int | None) -> int:
    parent = os.path.dirname(dst)
    if parent:
        return os.stat(parent, dir_fd=dst_dir_fd).st_dev
    return os.fstat(dst_dir_fd).st_dev if dst_dir_fd is not None else os.stat(".").st_dev


def rename_noreplace(src: bytes, dst: bytes, *, src_dir_fd: int | None = None,
                     dst_dir_fd: int | None = None, dev: int | None = None) -> None:
    """Rename ``src`` to ``dst`` but never replace an existing ``dst`` (FileExistsError instead).

    Uses renameat2(RENAME_NOREPLACE), atomic on ext4/xfs/btrfs/tmpfs.  Filesystems that
    reject the flag (NFS, many FUSE servers) get lstat + rename, which can only clobber a
    file created by someone else in the microseconds between the two calls.  Which
    filesystems reject it is remembered per ``st_dev``; callers that know the device of
    ``dst``'s directory pass it as ``dev`` (else it is looked up once a rejection is known).
    """
    if _rejects_noreplace and dev is None:
        dev = _dev_of_parent(dst, dst_dir_fd)
    lib = _libc if _libc is not None else _load_libc()
    if dev not in _rejects_noreplace and hasattr(lib, "renameat2"):
        sfd = _AT_FDCWD if src_dir_fd is None else src_dir_fd
        dfd = _AT_FDCWD if dst_dir_fd is None else dst_dir_fd
        try:
            traced("rename", src, _renameat2, src, dst, sfd, dfd)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                raise
        _rejects_noreplace.add(dev if dev is not None else _dev_of_parent(dst, dst_dir_fd))
    try:
        traced("stat", dst, os.lstat, dst, dir_fd=dst_dir_fd)
    except FileNotFoundError:
        rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def syncfs(fd: int, path: PathLike = "") -> None:
    """Flush the whole filesystem holding ``fd`` (one call instead of an fsync per directory).

    Raises the OSError syncfs(2) reports: EIO (or ENOSPC) means data written earlier may
    not be on disk, so the caller must not drop its journal.
    """
    lib = _load_libc()
    if not hasattr(lib, "syncfs"):
        traced("fsync", path, os.sync)
        return
    traced("fsync", path, lambda: _check(lib.syncfs(fd), path))


# --- removal primitives (fastrm, and shard's prune/revert) -------------------------

_OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def open_dir(name: PathLike, *, dir_fd: int | None = None, follow_symlinks: bool = False) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) for mutations inside it.

    The one directory opener of the mutating tools (fastrm, shard).  By default a symlink
    (even one to a directory) fails with ELOOP or ENOTDIR, so a walk that descends through
    these fds can never leave the tree it started in.  ``follow_symlinks`` is for the
    directory the user named (``shard apply /data/link``), never for what is found inside.
    """
    flags = _OPEN_DIR_FLAGS if follow_symlinks else _OPEN_DIR_FLAGS | os.O_NOFOLLOW
    return traced("open", name, os.open, name, flags, dir_fd=dir_fd)


def unlink_nondir(name: PathLike, *, dir_fd: int | None = None) -> bool:
    """Unlink ``name`` if it is not a directory; return False if it is one.

    No stat on the fast path: Linux answers unlink(2) on a directory with EISDIR;
    POSIX also allows EPERM, which on Linux means "immutable" or "sticky directory",
    so only then do we look (fstatat, no follow) to tell the two apart.
    """
    try:
        unlink(name, dir_fd=dir_fd)
    except IsADirectoryError:
        return False
    except PermissionError as exc:
        if exc.errno == errno.EPERM and is_dir_nofollow(name, dir_fd=dir_fd):
            return False
        raise
    return True


def is_dir_nofollow(name: PathLike, *, dir_fd: int | None = None) -> bool:
    """True if ``name`` is a directory (a symlink to one is not); False if missing."""
    import stat

    try:
        st = traced("stat", name, os.stat, name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode)
