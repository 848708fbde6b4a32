"""Deleting the local files a mirror no longer has (``s3pull --sync --delete``), safely.

Each path is reached from the root one folder at a time, every folder opened with ``O_NOFOLLOW``
relative to the one before (``_core.fsops.open_dir``): a folder swapped for a symlink since the
comparison fails that path (ELOOP), it never leads outside the root.  Only regular files are
unlinked (lstat, no follow: a symlink or folder found in a file's place is left and reported).
A path already gone counts as deleted: a run killed mid-way, run again, ends with the same state.
Folders left empty stay (as ``rclone sync`` without ``--delete-empty-src-dirs``).
"""

from __future__ import annotations

import contextlib
import os
import stat as _stat
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from manyfiles._core import checkpoints, fsops
from manyfiles._core.report import Report
from manyfiles.errors import describe_oserror, shown


@dataclass(kw_only=True)
class DeleteReport(Report):
    """What :func:`delete_local` did: ``deleted`` files (with ``dry_run``: would delete)."""

    deleted: int = 0
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return f"{verb} {self.deleted:,} files in {self.seconds:.2f} s"

    def to_dict(self) -> dict[str, Any]:
        return {"deleted": self.deleted, "dry_run": self.dry_run, "seconds": round(self.seconds, 3),
                "failures": [{"path": f.path, "code": f.code, "reason": f.reason} for f in self.failures]}


def delete_local(root: str | os.PathLike, paths: Iterable[str], *, dry_run: bool = False) -> DeleteReport:
    """Unlink each ``/``-separated relative path under ``root`` (regular files only, no symlink
    followed on the way, nothing outside ``root``); see the module docstring.  ``dry_run``: only
    count what exists and would go."""
    import time

    t0 = time.monotonic()
    report = DeleteReport(dry_run=dry_run)
    root_fd = fsops.open_dir(os.path.abspath(root), follow_symlinks=True)   # the folder the user named
    try:
        for rel in paths:
            try:
                if _delete_one(root_fd, rel, dry_run):
                    report.deleted += 1
            except OSError as exc:
                report.add_failure(rel, describe_oserror(exc), _errname(exc))
    finally:
        os.close(root_fd)
    report.seconds = time.monotonic() - t0
    return report


def _errname(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, "")


def _delete_one(root_fd: int, rel: str, dry_run: bool) -> bool:
    """True when the file was (or would be) deleted; False when it was gone already."""
    *folders, name = rel.split("/")
    if not name or any(p in ("", ".", "..") for p in (*folders, name)):
        raise OSError(22, f"not a relative path: {shown(rel)}")
    fds: list[int] = []
    try:
        fd = root_fd
        for folder in folders:
            try:
                fd = fsops.open_dir(folder, dir_fd=fd)
            except FileNotFoundError:
                return False
            fds.append(fd)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if not _stat.S_ISREG(st.st_mode):
            raise OSError(21 if _stat.S_ISDIR(st.st_mode) else 40,
                          "not a regular file now (a symlink or folder in its place): not deleted")
        if dry_run:
            return True
        checkpoints.reached("sync-delete")
        with contextlib.suppress(FileNotFoundError):
            fsops.unlink(name, dir_fd=fd)
        return True
    finally:
        for f in fds:
            os.close(f)


__all__ = ["DeleteReport", "delete_local"]
