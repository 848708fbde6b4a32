"""Filesystem mutations shared by shard, remove and s3pull, each one traced.

Only the primitives live here (one syscall each, plus the error mapping the
callers share); planning and retries live with the callers.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from manyfiles import iotrace

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


def makedirs(path: PathLike, *, attempts: int = 8) -> None:
    """``os.makedirs(exist_ok=True)`` with each created level traced.

    A level that a concurrent prune (``ShardedDir.remove``, fastrm) removes between our
    mkdirs is made again, up to ``attempts`` times.
    """
    for _ in range(attempts):
        try:
            mkdir(path)
            return
        except FileExistsError:
            return
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not parent or parent == path:
                raise
            makedirs(parent, attempts=attempts)
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


# -- added by shard (issue 3): no-clobber rename and filesystem sync --------------------------------

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100
_libc: Any = None
_noreplace_ok = True  # cleared on the first filesystem that rejects RENAME_NOREPLACE (NFS, some FUSE)


def _load_libc() -> Any:
    global _libc
    if _libc is None:
        import ctypes

        _libc = ctypes.CDLL(None, use_errno=True)
        for fn in ("renameat2", "syncfs"):
            if hasattr(_libc, fn):
                getattr(_libc, fn).restype = ctypes.c_int
    return _libc


def _renameat2(src: bytes, dst: bytes, src_dir_fd: int, dst_dir_fd: int) -> None:
    import ctypes

    if _libc.renameat2(src_dir_fd, src, dst_dir_fd, dst, _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), src)


def rename_noreplace(src: bytes, dst: bytes, *, src_dir_fd: int | None = None,
                     dst_dir_fd: int | None = None) -> None:
    """Rename ``src`` to ``dst`` but never replace an existing ``dst`` (FileExistsError instead).

    Uses renameat2(RENAME_NOREPLACE), atomic on ext4/xfs/btrfs/tmpfs.  Filesystems that
    reject the flag (NFS, many FUSE servers) get lstat + rename, which can only clobber a
    file created by someone else in the microseconds between the two calls.
    """
    global _noreplace_ok
    sfd = _AT_FDCWD if src_dir_fd is None else src_dir_fd
    dfd = _AT_FDCWD if dst_dir_fd is None else dst_dir_fd
    if _noreplace_ok:
        lib = _libc if _libc is not None else _load_libc()
        if hasattr(lib, "renameat2"):
            try:
                traced("rename", src, _renameat2, src, dst, sfd, dfd)
                return
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
        _noreplace_ok = False
    try:
        os.lstat(dst, dir_fd=dst_dir_fd)
    except FileNotFoundError:
        rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)
        return
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)


def syncfs(fd: int, path: PathLike = "") -> None:
    """Flush the whole filesystem holding ``fd`` (one call instead of an fsync per directory)."""
    lib = _load_libc()
    if not hasattr(lib, "syncfs"):
        traced("fsync", path, os.sync)
        return
    traced("fsync", path, lambda: lib.syncfs(fd))


# --- removal primitives (fastrm, and shard's prune/revert) -------------------------

_OPEN_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(name: PathLike, *, dir_fd: int | None = None) -> int:
    """Open directory ``name`` (relative to ``dir_fd``) without following a symlink.

    A symlink (even one to a directory) fails with ELOOP or ENOTDIR, so a walk that
    descends through these fds can never leave the tree it started in.
    """
    return traced("open", name, os.open, name, _OPEN_DIR_FLAGS, dir_fd=dir_fd)


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
