"""Lists of names read from a file or stdin: what every ``--files-from FILE|-`` reads.

One name a line, or NUL-terminated (``find -print0``, ``fastls -0``), for names that hold
newlines.  The separator is detected, not asked for: a name can never contain NUL, so a NUL
in the first :data:`SNIFF` bytes means the list is NUL-separated (a path is at most 4096
bytes, an S3 key 1024, so a NUL list shows one within the sniffed bytes).  ``-`` is stdin,
as for rclone ``--files-from -`` and tar ``-T -``.

Example:
    >>> import io
    >>> list(read_names(io.BytesIO(b"a\\nb c\\n\\nd\\r\\n")))
    [b'a', b'b c', b'd']
    >>> list(read_names(io.BytesIO(b"x\\ny\\0z\\0")))
    [b'x\\ny', b'z']
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

from manyfiles.errors import from_oserror

__all__ = ["SNIFF", "STDIN", "read_names"]

STDIN = "-"
SNIFF = 64 * 1024      # bytes read before deciding between NUL and newline separation
_CHUNK = 1 << 20


def read_names(source: str | os.PathLike | BinaryIO, *, sep: bytes | None = None) -> Iterator[bytes]:
    """Yield the names listed in ``source``: a path, ``"-"`` (stdin) or a binary file object.

    ``sep``: ``b"\\n"`` or ``b"\\0"``; None detects it (see the module docstring).  With
    newlines, a trailing ``\\r`` is dropped (lists written on Windows).  Empty names are
    skipped.  Names are bytes, exact (decode with ``os.fsdecode`` for paths, UTF-8 for S3
    keys).  The file is opened by this call, not on the first ``next``: one that cannot be
    opened raises :class:`~manyfiles.errors.NotFound` / ``AccessDenied`` naming it right away.
    """
    if sep not in (None, b"\n", b"\0"):
        raise ValueError(f"sep must be b'\\n', b'\\0' or None, not {sep!r}")
    if not isinstance(source, (str, os.PathLike)):
        return _split(source, sep, close=False)
    if os.fspath(source) == STDIN:
        return _split(sys.stdin.buffer, sep, close=False)
    path = os.fspath(source)
    try:
        f = open(path, "rb")  # noqa: SIM115 -- closed by _split
    except OSError as exc:
        raise from_oserror(exc, path) from exc
    return _split(f, sep, close=True)


def _split(f: BinaryIO, sep: bytes | None, *, close: bool) -> Iterator[bytes]:
    try:
        yield from _names(f, sep)
    finally:
        if close:
            f.close()


def _names(f: BinaryIO, sep: bytes | None) -> Iterator[bytes]:
    pending = b""
    if sep is None:                  # sniff: read until a NUL, SNIFF bytes or the end
        while len(pending) < SNIFF and b"\0" not in pending:
            chunk = f.read(SNIFF - len(pending))
            if not chunk:
                break
            pending += chunk
        sep = b"\0" if b"\0" in pending else b"\n"
    while True:
        *names, pending = pending.split(sep)
        for name in names:
            if sep == b"\n" and name.endswith(b"\r"):
                name = name[:-1]
            if name:
                yield name
        chunk = f.read(_CHUNK)
        if not chunk:
            break
        pending += chunk
    if sep == b"\n" and pending.endswith(b"\r"):
        pending = pending[:-1]
    if pending:
        yield pending
