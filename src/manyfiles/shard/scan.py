"""Scanning a folder's root: what is flat, what is a bucket, and which worker gets what."""

from __future__ import annotations

import os

from manyfiles import listing
from manyfiles._core.progress import Progress
from manyfiles.errors import from_oserror
from manyfiles.shard.layout import RESERVED_PREFIX, Layout
from manyfiles.shard.sharded_dir import open_dir

RootArg = str | bytes | os.PathLike
_MEMORY_FS = ("tmpfs", "ramfs")


def abs_root(root: RootArg) -> bytes:
    return os.fsencode(os.path.abspath(os.fspath(root)))


def open_root(rootb: bytes) -> int:
    """The root as the user named it (a symlink to it is followed); a one-line error otherwise:
    NotFound, AccessDenied (exit 1) or WrongKind (not a directory: a usage error, exit 2)."""
    try:
        return open_dir(rootb)
    except OSError as exc:
        raise from_oserror(exc, rootb) from exc


#: scan_root reports its progress every this many entries (a check per entry, a rendering per batch)
PROGRESS_EVERY = 8192


def scan_root(rootb: bytes, layout: Layout,
              progress: Progress | None = None) -> tuple[list[bytes], list[bytes], list[tuple[bytes, str]]]:
    """(flat non-directory names, bucket-named subdirectories, skipped entries) of the root."""
    flat, buckets, skipped = [], [], []
    i = 0
    for i, e in enumerate(listing.iter_entries(rootb), 1):
        if progress and not i % PROGRESS_EVERY:
            progress.set(done=i)
        name = e.name
        if name.startswith(RESERVED_PREFIX):
            if not name.startswith(b".manyfiles-shard"):
                skipped.append((name, "reserved name"))
        elif e.type == "d":
            if layout.is_bucket(name, 0):
                buckets.append(name)
            else:
                skipped.append((name, "subdirectory left in place"))
        else:
            flat.append(name)
    if progress:
        progress.set(done=i)
    return flat, buckets, skipped


def group_by_top(layout: Layout, names: list[bytes]) -> dict[bytes, dict[bytes, list[bytes]]]:
    """top bucket -> leaf path -> names: the unit of work is one top bucket."""
    tops: dict[bytes, dict[bytes, list[bytes]]] = {}
    for name in names:
        parts = layout.buckets(name)
        tops.setdefault(parts[0], {}).setdefault(b"/".join(parts), []).append(name)
    return tops


def default_workers(path: bytes) -> int:
    """1 on memory filesystems, 4 elsewhere.

    On tmpfs a rename never waits for I/O, and every move also locks the one flat directory,
    so extra threads only add lock and GIL hand-offs.  On disks and network filesystems the
    workers overlap the waits (journal commits, round trips); see docs/benchmarks.md.
    """
    real = os.path.realpath(path)
    best, fstype = b"", b""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split()
                mnt = fields[4].replace(b"\\040", b" ")
                sep = fields.index(b"-")
                inside = real == mnt or real.startswith(mnt.rstrip(b"/") + b"/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, fields[sep + 1]
    except (OSError, ValueError, IndexError):
        return 4
    return 1 if fstype.decode(errors="replace") in _MEMORY_FS else 4
