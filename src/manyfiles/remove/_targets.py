"""What a removal is about: the checked arguments (targets) and the rules that pick entries."""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from manyfiles._report import Failure
from manyfiles.errors import UsageError

PathArg = str | bytes | os.PathLike


@dataclass(frozen=True)
class Rules:
    """Which entries go.

    ``include``: glob patterns; when given, only matching entries are removed (a matching
    directory with all its content).  ``exclude``: patterns of entries to keep (a kept
    directory is not entered).  A pattern with ``/`` matches the path relative to the
    argument, otherwise the name.  ``keep_root``: the argument directories stay.
    ``cross_mounts``: descend into filesystems mounted inside the tree.
    """

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    keep_root: bool = False
    cross_mounts: bool = False
    include_match: Callable[[str], Any] | None = field(default=None, init=False, repr=False, compare=False)
    exclude_match: Callable[[str], Any] | None = field(default=None, init=False, repr=False, compare=False)
    include_rel: bool = field(default=False, init=False, repr=False, compare=False)
    exclude_rel: bool = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for which in ("include", "exclude"):
            match, rel = _matcher(getattr(self, which))
            object.__setattr__(self, f"{which}_match", match)
            object.__setattr__(self, f"{which}_rel", rel)


def _matcher(patterns: Sequence[str] | None) -> tuple[Callable[[str], Any] | None, bool]:
    """Compile glob patterns into one regex; second value: does any pattern need the relative path."""
    if not patterns:
        return None, False
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns), re.DOTALL)
    return regex.match, any("/" in p for p in patterns)


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
        p = path.rstrip("/") or "/"
        if os.path.basename(p) in (".", ".."):
            raise UsageError(f"{path}: refusing to remove '.' or '..'")
        if os.path.realpath(p) == "/" and not os.path.islink(p):
            raise UsageError(f"{path}: refusing to remove the root directory")
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
