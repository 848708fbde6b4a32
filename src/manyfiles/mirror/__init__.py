"""Mirrors: a local folder against an S3 prefix (``manyfiles check``, ``s3pull --sync``, ``s3push --sync``).

Public API:

* :func:`compare` -- the files under a folder against the objects under a prefix of a store:
  a :class:`Comparison` (``missing_remote``, ``missing_local``, ``differing``, ``same``,
  ``skipped``), compared by ``"size"``, ``"size-mtime"`` or ``"checksum"``; nothing is written.
* :func:`check` -- the same from an ``s3://bucket/prefix/`` URL (what ``manyfiles check`` runs).
* :func:`delete_local` -- remove files under a folder by relative path, never outside it, never
  through a symlink (``s3pull --sync --delete``).

Example:
    >>> from manyfiles import mirror
    >>> c = mirror.check("/data/run1", "s3://bucket/runs/run1/")     # doctest: +SKIP
    >>> c.equal, [e.path for e in c.differing]                       # doctest: +SKIP
    (False, ['weights.bin'])
"""

from __future__ import annotations

from manyfiles.mirror.compare import (
    BY,
    SOURCES,
    Comparison,
    Entry,
    LocalFile,
    compare,
    folder_prefix,
    local_files,
)
from manyfiles.mirror.delete import DeleteReport, delete_local
from manyfiles.mirror.urls import check

__all__ = ["BY", "SOURCES", "Comparison", "DeleteReport", "Entry", "LocalFile", "check", "compare",
           "delete_local", "folder_prefix", "local_files"]
