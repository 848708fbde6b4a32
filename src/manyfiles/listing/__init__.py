"""Fast directory listing (fastls): getdents64 with a large buffer, and a parallel tree walk.

Backends, by name (like benhoyt/scandir's scandir_c / scandir_python):

* ``"dents"``    our C extension ``manyfiles._dents`` (the default where it built)
* ``"scandir"``  ``os.scandir`` (automatic fallback; glibc reads ~32 KiB per getdents call)
* ``"getdents"`` the PyPI ``getdents`` package, a cross-check only (defects in docs/fastls.md)

One directory: :func:`listdir`, :func:`iter_entries`, :func:`count`, :func:`write_names`.
A tree: :func:`walk` (one :class:`DirListing` per directory), :func:`count_tree` and
:func:`write_tree`.  With the C core a tree is walked by native threads without the GIL
(``listing/_walk.c``); count_tree and write_tree create no Python object per entry, and
walk hands Python one batch per directory.  Without it, a single-threaded ``os.scandir``
walk gives the same results.

Nothing here holds all names in memory except :func:`listdir` (which returns them):
:func:`iter_entries` streams one getdents64 batch at a time and :func:`walk` keeps a
bounded number of directory listings in flight.

Modules: ``_directory`` (one directory, the shared types, the backends), ``_tree`` (trees),
``fastls`` (the fastls job and its report; public as :mod:`manyfiles.fastls`), ``_fastls_core``
(that job without the report, for the script's start-up), ``_fastls_main`` (the ``fastls``
script), ``table`` (listings as tables; public as :mod:`manyfiles.table`), ``_cluster`` (trees
on a Dask cluster).  The C sources of ``manyfiles._dents`` are here too (``_dents.c``,
``_walk.c`` and its remove-tree mode ``_remove_tree.c``, ``_glob.c``; ``s3/_crc.c`` is compiled into
the same extension).
"""

from __future__ import annotations

from manyfiles.listing._directory import (
    BACKENDS,
    DEFAULT_BUFSIZE,
    GETDENTS_FEATURE,
    MAX_BUFSIZE,
    MIN_BUFSIZE,
    NO_FILTER,
    TYPE_LETTERS,
    DirDone,
    DirListing,
    Entry,
    Filter,
    default_backend,
    iter_entries,
    listdir,
    type_mask,
    write_names,
)
from manyfiles.listing._tree import (
    DEFAULT_THREADS,
    TreeCount,
    count,
    count_tree,
    iter_paths,
    walk,
    write_tree,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_BUFSIZE",
    "DEFAULT_THREADS",
    "GETDENTS_FEATURE",
    "MAX_BUFSIZE",
    "MIN_BUFSIZE",
    "NO_FILTER",
    "TYPE_LETTERS",
    "DirDone",
    "DirListing",
    "Entry",
    "Filter",
    "TreeCount",
    "count",
    "count_tree",
    "default_backend",
    "iter_entries",
    "iter_paths",
    "listdir",
    "type_mask",
    "walk",
    "write_names",
    "write_tree",
]
