"""What a removal is about: the checked arguments (targets) and the rules that pick entries."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from manyfiles._core import glob as _glob
from manyfiles._core.glob import Matcher
from manyfiles._core.report import Failure
from manyfiles.errors import UsageError, WrongKind

PathArg = str | bytes | os.PathLike


@dataclass(frozen=True)
class Rules:
    """Which entries go.

    ``include``: glob patterns; when given, only matching entries are removed (a matching
    directory with all its content).  ``exclude``: patterns of entries to keep (a kept
    directory is not entered).  A pattern with ``/`` matches the path relative to the
    argument, any other the name (manyfiles' one glob rule set, :mod:`manyfiles._core.glob`:
    Python's fnmatch rules).  ``keep_root``: the argument directories stay.
    ``cross_mounts``: descend into filesystems mounted inside the tree.
    """

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    keep_root: bool = False
    cross_mounts: bool = False

    def matchers(self) -> tuple[Matcher | None, Matcher | None]:
        """The compiled ``include`` and ``exclude`` globs (None where no pattern is given)."""
        return (_glob.compile(self.include) if self.include else None,
                _glob.compile(self.exclude) if self.exclude else None)


def patterns(value: str | Sequence[str] | None, what: str) -> tuple[str, ...] | None:
    """Glob patterns as a tuple (a single string is one pattern); UsageError for anything else."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(p, str) for p in items):
        raise UsageError(f"{what} must be a glob pattern or a list of them, not {value!r}")
    return tuple(items) or None


@dataclass(frozen=True)
class Target:
    """One argument, checked: its identity when it was looked at, and whether it is a mount root."""

    path: str
    is_dir: bool
    dev: int
    ino: int
    mount_root: bool = False


def as_paths(path: PathArg | Sequence[PathArg]) -> list[str]:
    if isinstance(path, (str, bytes, os.PathLike)):
        return [os.fsdecode(os.fspath(path))]
    return [os.fsdecode(os.fspath(p)) for p in path]


def check_paths(paths: Sequence[str], force_root: bool) -> list[tuple[str, bool]]:
    """Refuse dangerous arguments before anything is removed; (path, is_mount_root) pairs."""
    checked = []
    for path in paths:
        if not path:    # names nothing (not '/', not '.'): missing, as for rm ''
            checked.append((path, False))
            continue
        p = path.rstrip("/") or "/"
        if os.path.basename(p) in (".", ".."):
            raise UsageError(f"{path}: refusing to remove '.' or '..'")
        if os.path.realpath(p) == "/" and not os.path.islink(p):
            raise UsageError(f"{path}: refusing to remove the root directory")
        if path.endswith("/") and os.path.lexists(p) and not os.path.isdir(path):
            # 'file/' names a directory (as for rm): a usage error, nothing is removed
            raise WrongKind(f"{path}: {os.strerror(errno.ENOTDIR)}")
        mount_root = os.path.isdir(p) and not os.path.islink(p) and os.path.ismount(p)
        if mount_root and not force_root:
            raise UsageError(f"{path}: is a mount root; refusing without --force-root "
                             "(which empties it and keeps the mount point)")
        checked.append((p, mount_root))
    return checked


def resolve(checked: Sequence[tuple[str, bool]], missing_ok: bool,
            failures: list[Failure]) -> list[Target]:
    """lstat every checked argument (never following a link); missing ones become failures."""
    targets = []
    for p, mount_root in checked:
        try:
            st = os.lstat(p)
        except OSError as exc:
            if not (missing_ok and exc.errno == errno.ENOENT):
                failures.append(Failure.from_oserror(p, exc))
            continue
        targets.append(Target(p, stat.S_ISDIR(st.st_mode), st.st_dev, st.st_ino, mount_root))
    return targets
