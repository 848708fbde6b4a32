"""The one place fastrm reaches below the public listing API (until tree-core's walker lands).

fastrm works on directory fds it opened itself (O_NOFOLLOW, relative to the parent's fd),
and the public :mod:`manyfiles.listing` API takes paths.  Two calls of the C core fill the
gap: list an open fd, and unlink every non-directory of an open fd with the GIL released.
They are private to listing; this module is their only user outside it, so when the
public fd-level API (or the walker's post-order hooks) exists, only this file changes.
See NOTES.md (2026-11-23, py-core).
"""

from __future__ import annotations

import os

from manyfiles import listing

Entry = listing.Entry
DEFAULT_BUFSIZE = listing.DEFAULT_BUFSIZE

_core = listing._dents  # private by design: see the module docstring
#: The C core is built and has both calls fastrm uses (checked once, not by catching TypeError).
HAVE_CORE = _core is not None and hasattr(_core, "entries_batch") and hasattr(_core, "unlink_files")
_HAVE_PROC_FD = os.path.isdir("/proc/self/fd")


def entries(fd: int, path: str, *, resolve: bool, bufsize: int) -> list[Entry]:
    """Every entry of the open directory ``fd`` (``path`` names it in traces and errors)."""
    if not HAVE_CORE:
        # /proc/self/fd/N names exactly the directory we opened, so a rename or symlink
        # swap of ``path`` cannot redirect the listing
        where = f"/proc/self/fd/{fd}" if _HAVE_PROC_FD else path
        return list(listing.iter_entries(where, resolve_unknown=resolve))
    out: list[Entry] = []
    while True:
        batches = listing._batches_list()
        batch = _core.entries_batch(fd, bufsize, False, resolve=resolve, path=path, batches=batches)
        listing._trace_batches(path, batches)
        if batch is None:
            return out
        out.extend(batch)


UnlinkBatch = tuple[int, bool, list[str], list[tuple[str, int]]]


def unlink_files(fd: int, bufsize: int, limit: int, path: str) -> UnlinkBatch:
    """Unlink up to ``limit`` non-directories of the open directory ``fd`` in C, GIL released.

    Returns ``(removed, at_end, subdirectory names, [(name, errno)] failures)``; no Python
    object is made per removed file.  Only when :data:`HAVE_CORE`.
    """
    return _core.unlink_files(fd, bufsize, limit, path)
