"""A dataset's hit path: its listing's objects read straight from the cache's packs.

The listing fixes the versions a dataset reads, so their object ids are computed once, when it is
listed (16 bytes each; they travel with the dataset to its workers).  In each thread of each
process that reads, the cache's :meth:`~manyfiles.cache.Cache.hit_table` for those ids says where
the packs hold them: a hit is one ``pread`` (a file dataset's: a ``stat`` first, the cache's
validation of files), with no SQLite and no Python object but the bytes.  The table is refreshed
before each batch (a memory read when nothing changed) and its hits are counted after it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

# Tables inherited from a parent process (fork): never used again, and never closed here either --
# their SQLite connection is the parent's, and closing it in a child can drop the child's own
# locks on the index (POSIX locks are per process and file).
_INHERITED: list[Any] = []


class HitPath:
    """The object ids of a listing (``ids``), and per thread the cache's hit table for them.
    ``files``: the listing is of local/NFS files (each hit is validated by a ``stat``)."""

    def __init__(self, ids: bytes, files: bool) -> None:
        self.ids = ids
        self.files = files
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"ids": self.ids, "files": self.files}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def table(self, cache: Any) -> Any:
        """This thread's table (a new one in a forked child, or for another cache object)."""
        got = getattr(self._local, "table", None)
        if got is None or got[0] != os.getpid() or got[1] is not cache:
            if got is not None and got[0] != os.getpid():
                _INHERITED.append(got[2].abandon())
            table = cache.hit_table(self.ids)
            self._local.table = got = (os.getpid(), cache, table)
        return got[2]

    def elsewhere(self, table: Any) -> Any:
        """``table`` if an object up to ``table.packed_max`` that it does not hold can be held
        only where this process finds it without the index (``table.get_elsewhere``); None when the
        general path must look (a file dataset: its versions are ``stat``'s; ``verify=True``)."""
        return table if table.enabled and not self.files else None

    def reader(self, table: Any) -> Callable[[int, str], bytes | None]:
        """``read(index, url)``: object ``index`` from the packs through ``table``, or None (read it
        through the cache's general path)."""
        if self.files:
            get_file = table.get_file
            return lambda index, url: get_file(index, os.fsencode(url))
        get = table.get
        return lambda index, url: get(index)
