"""Mirrors: a local folder against an S3 prefix (``manyfiles check``, ``s3pull --sync``, ``s3push --sync``).

Public API:

* :func:`compare` -- the files under a folder against the objects under a prefix of a store:
  a :class:`Comparison` (``missing_remote``, ``missing_local``, ``differing``, ``same``,
  ``skipped``), compared by ``"size"``, ``"size-mtime"`` or ``"checksum"``; nothing is written.
* :func:`check` -- the same from an ``s3://bucket/prefix/`` URL (what ``manyfiles check`` runs).
* :func:`pull_sync` -- ``s3pull --sync [--delete]``: fetch what is missing or differs, keep the
  rest, remove local files no object has (refused beyond ``max_delete``).
* :func:`delete_local` -- remove files under a folder by relative path, never outside it, never
  through a symlink (``s3pull --sync --delete``).

Example:
    >>> from manyfiles import mirror
    >>> c = mirror.check("/data/run1", "s3://bucket/runs/run1/")     # doctest: +SKIP
    >>> c.equal, [e.path for e in c.differing]                       # doctest: +SKIP
    (False, ['weights.bin'])
"""

from __future__ import annotations

from manyfiles._core.lazy import lazy_exports
from manyfiles.mirror.options import BY, MAX_DELETE, SOURCES

# loaded on first use: ``s3pull`` reads the option values above without the comparison's imports
_EXPORTS = {
    **{name: ".comparison" for name in ("Comparison", "Entry", "LocalFile", "compare", "folder_prefix",
                                     "local_files")},
    **{name: ".delete" for name in ("DeleteReport", "delete_local")},
    **{name: ".sync" for name in ("TooManyDeletions", "pull_sync")},
    "check": ".urls",
}

__all__ = ["BY", "MAX_DELETE", "SOURCES", "Comparison", "DeleteReport", "Entry", "LocalFile",
           "TooManyDeletions", "check", "compare", "delete_local", "folder_prefix", "local_files",
           "pull_sync"]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
