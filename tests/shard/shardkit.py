"""Helpers for the shard tests: real files, content hashes, and a tree/flat checker."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# names that exercise the edge cases: bucket-like names, a newline, non-UTF-8 bytes, 255 bytes
EDGE_NAMES = [b"ab", b"00", b"ff", b"e3", b"with\nnewline", b"caf\xe9-latin1", b"x" * 255, b"-dash",
              b" space"]


def make_dataset(root: Path, n: int, *, edge: bool = True, symlinks: bool = True) -> Path:
    """``n`` small files with distinct content (+ edge-case names and symlinks) in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = [b"f%07d" % i for i in range(n)] + (EDGE_NAMES if edge else [])
        for name in names:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dfd)
            os.write(fd, b"content of " + name)
            os.close(fd)
        if symlinks:
            os.symlink(b"f0000001", b"link-relative", dir_fd=dfd)
            os.symlink(b"/nonexistent/target", b"link-dangling", dir_fd=dfd)
            os.symlink(b".", b"link-to-dir", dir_fd=dfd)  # must move as a link, never be followed
    finally:
        os.close(dfd)
    return root


def snapshot(root: Path) -> dict[bytes, str]:
    """name -> content hash (or link target) of every non-directory under ``root``; names must be unique."""
    out: dict[bytes, str] = {}
    for dirpath, dirs, files in os.walk(os.fsencode(root)):
        links_to_dirs = [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]
        for name in files + links_to_dirs:
            if name.startswith(b".manyfiles-shard"):
                continue
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                value = "link:" + os.fsdecode(os.readlink(path))
            else:
                with open(path, "rb") as f:
                    value = hashlib.sha1(f.read()).hexdigest()
            assert name not in out, f"duplicate name {name!r}"
            out[name] = value
    return out


def top_level(root: Path) -> set[bytes]:
    return set(os.listdir(os.fsencode(root)))


def assert_sharded_clean(root: Path, expected: dict[bytes, str]) -> None:
    """Every file in its bucket, same names and contents, nothing of ours left but the descriptor."""
    from manyfiles.shard import ShardedDir, verify

    assert snapshot(root) == expected
    rep = verify(root)
    assert rep.ok, (rep.flat[:5], rep.misplaced[:5], rep.duplicates[:5], rep.temp_files[:5], rep.in_progress)
    assert rep.files == len(expected)
    ours = {n for n in top_level(root) if n.startswith(b".manyfiles")}
    assert ours == {b".manyfiles-shard.json"}, ours
    assert ShardedDir(root).layout == rep.layout
    assert all(len(n) == 2 and os.path.isdir(os.path.join(os.fsencode(root), n))
               for n in top_level(root) - ours)


def assert_flat_clean(root: Path, expected: dict[bytes, str]) -> None:
    """Back to flat: exactly the original names at the top, no directories, nothing of ours."""
    assert top_level(root) == set(expected)
    assert snapshot(root) == expected


