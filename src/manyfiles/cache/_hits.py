"""The hit path of a fixed list of object versions (a dataset's): one ``pread`` per packed object.

A dataset reads the same N versions every epoch.  :class:`HitTable` knows, for one thread of one
process, where the packs hold each of them: three arrays indexed like the dataset (pack slot,
offset, length), filled in bulk from the index and kept up to date by comparing the packs'
:class:`~manyfiles.cache._packs.Generation` (a memory read) before each batch.  A hit is then one
``pread`` on a pack descriptor the table keeps open: no SQLite, no per-object object but the
bytes returned.  A batch (:meth:`HitTable.get_many`) is one call: the C core's ``pread_records``
reads the batch's records with one ``preadv`` per run of records lying close together in a pack,
straight into the bytes returned, and the hits are counted once for the batch.  What it does not
know (not packed yet, held whole in a file of its own, or in blocks) the caller reads through the
cache's general path.

Why it may trust what it loaded: a pack is only ever appended to and its id is never reused
(_packs.py), so an offset the index once named holds that record for as long as the pack exists;
an object removed alone leaves its record where it was (the same version's bytes), and a pack
removed is seen at the next refresh (its descriptor is closed: the next reads of it miss).  The
table belongs to one thread: refreshing and reading never race.
"""

from __future__ import annotations

import os
import sqlite3
import time
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from manyfiles.cache import _format as fmt
from manyfiles.cache._index import BUSY_TIMEOUT_S
from manyfiles.cache._origin import file_validator
from manyfiles.cache._packs import PACK_MAX_OBJECT

if TYPE_CHECKING:
    from manyfiles.cache._store import BlockStore

ID = 16     # bytes of an object id
#: a batch's records this close together in a pack are read with one ``preadv`` (the bytes between
#: them, their headers, are read too): reading a few KiB more costs less than another system call
#: (docs/benchmarks.md, issue 27's batch read)
MAX_GAP = 4096


def pread_records_python(indexes: Sequence[int], slots: array, fds: array, offsets: array,
                         lengths: array, used: bytearray, max_gap: int) -> tuple[list, int, int]:
    """What the C core's ``pread_records`` does, one ``pread`` per record (when it is not built):
    ``(payloads, hits, bytes)``, a payload None where ``slots``/``fds`` hold none or the read fell
    short or failed; ``used[slot]`` set for every slot read."""
    out: list[bytes | None] = []
    hits = nbytes = 0
    n = len(slots)
    for i in indexes:
        if not 0 <= i < n:
            raise IndexError(f"pread_records: index {i} out of range ({n})")
        data = None
        s = slots[i]
        if s >= 0 and fds[s] >= 0:
            length = lengths[i]
            try:
                data = os.pread(fds[s], length, offsets[i])
            except OSError:
                data = None
            if data is not None and len(data) == length:
                hits += 1
                nbytes += length
                used[s] = 1
            else:
                data = None
        out.append(data)
    return out, hits, nbytes


try:
    from manyfiles._dents import pread_records as pread_records_c
except ImportError:     # pragma: no cover - the C core was not built
    pread_records_c = None
pread_records = pread_records_c or pread_records_python


class HitTable:
    """Where the packs hold each of ``ids`` (object ids, 16 bytes each, concatenated), for one
    thread: :meth:`get` reads one by its position, :meth:`refresh` learns what changed (call it
    before a batch), :meth:`settle` hands the hits to the cache's counters (after a batch)."""

    def __init__(self, store: BlockStore, ids: bytes, *, packed_max: int = PACK_MAX_OBJECT) -> None:
        if len(ids) % ID:
            raise ValueError("object ids are 16 bytes each")
        self._store = store
        self._ids = ids
        n = len(ids) // ID
        self._slot = array("i", [-1]) * n        # the pack (index into _packs/_fds) holding item i, or -1
        self._off = array("q", bytes(8 * n))     # where its payload starts in that pack
        self._len = array("q", bytes(8 * n))
        self._packs: list[int] = []              # slot -> pack id
        self._fds = array("i")                   # slot -> descriptor (-1: gone)
        self._slot_of: dict[int, int] = {}
        self._used = bytearray()                 # slot -> read since the last settle
        self._seen: tuple[int, int] | None = None
        self._seq = 0                            # the index's records up to here are loaded
        self._wanted: sqlite3.Connection | None = None
        self._bs = store.block_size
        #: objects up to this size are held whole in packs, or not held at all (never in blocks)
        self.packed_max = min(PACK_MAX_OBJECT, packed_max)
        #: hits since the last settle (objects, blocks, bytes)
        self.hits = self.blocks = self.hit_bytes = 0
        self.enabled = not store.verify          # (verify=True: the general path checks each record once)

    def __len__(self) -> int:
        return len(self._slot)

    def get(self, i: int) -> bytes | None:
        """Object ``i`` if a pack holds it (one ``pread``), else None: read it another way."""
        s = self._slot[i]
        if s < 0:
            return None
        fd = self._fds[s]
        if fd < 0:
            return None
        n = self._len[i]
        data = os.pread(fd, n, self._off[i])
        if len(data) != n:
            return None
        self.hits += 1
        self.blocks += -(-n // self._bs)
        self.hit_bytes += n
        self._used[s] = 1
        return data

    def get_many(self, indexes: Sequence[int]) -> tuple[list[bytes | None], int]:
        """Objects ``indexes`` (positions, each ``0 <= i < len(self)``) where the packs hold them, in
        order, None where not (read those another way): one call, the records read with one
        ``preadv`` per run of them close together in a pack.  Returns (the list, the bytes of its
        hits); its hits are counted as :meth:`get`'s."""
        out, hits, nbytes = pread_records(indexes, self._slot, self._fds, self._off, self._len,
                                          self._used, MAX_GAP)
        if hits:
            self.hits += hits
            self.hit_bytes += nbytes
            bs = self._bs
            if self.packed_max <= bs:           # (every packed record is one block at most)
                self.blocks += hits
            else:
                self.blocks += sum(-(-len(d) // bs) for d in out if d is not None)
        return out, nbytes

    def get_files(self, indexes: Sequence[int], paths: Sequence[bytes]) -> tuple[list[bytes | None], int]:
        """As :meth:`get_many` for local/NFS files (``paths[k]`` is item ``indexes[k]``'s): a file
        is read only if it is still the version the table names (a ``stat`` each, as :meth:`get_file`)."""
        slot, ids = self._slot, self._ids
        valid = []
        for i, path in zip(indexes, paths, strict=True):
            ok = False
            if slot[i] >= 0:
                try:
                    st = os.stat(path)
                except OSError:
                    pass
                else:
                    ok = fmt.object_id(b"file:" + path, file_validator(st)) == ids[i * ID:(i + 1) * ID]
            valid.append(ok)
        if all(valid):
            return self.get_many(indexes)
        some = [i for i, ok in zip(indexes, valid, strict=True) if ok]
        got, nbytes = self.get_many(some)
        it = iter(got)
        return [next(it) if ok else None for ok in valid], nbytes

    def get_elsewhere(self, i: int, size: int) -> bytes | None:
        """Object ``i`` (``size`` bytes, up to :attr:`packed_max`) if this process holds it whole but
        not where the table looked: queued for the cache disk, appended to its pack and not
        accounted yet, or in a whole file of its own (a cache written before packs).  None: fetch
        it.  (A record another process accounted since the last refresh is seen at the next.)"""
        store = self._store
        objid = self._ids[i * ID:(i + 1) * ID]
        data = store.fills.queued_whole(objid)
        if data is None:
            loc = store.packs.pending.get(objid)
            if loc is not None and loc.length == size:
                data = store.packs.read(loc)
        if data is None:
            fd = store.open_whole(objid, size)
            if fd is not None:
                try:
                    data = os.pread(fd, size, 0)
                finally:
                    os.close(fd)
                if len(data) != size:
                    data = None
        if data is not None:
            self.hits += 1
            self.blocks += -(-size // self._bs)
            self.hit_bytes += size
            store.counters.note_access(objid, 0.0)
        return bytes(data) if data is not None else None

    def get_file(self, i: int, path: bytes) -> bytes | None:
        """As :meth:`get`, for a local/NFS file whose version is its ``stat``: read only if the
        file is still the version the table names (one ``stat``: the cache's validate-on-open)."""
        if self._slot[i] < 0:
            return None
        try:
            st = os.stat(path)
        except OSError:
            return None
        if fmt.object_id(b"file:" + path, file_validator(st)) != self._ids[i * ID:(i + 1) * ID]:
            return None
        return self.get(i)

    def refresh(self) -> None:
        """Learn what changed since the last look, if anything did: records accounted (loaded,
        only those new since), packs removed (their descriptors closed)."""
        if not self.enabled:
            return
        packs = self._store.packs
        gen = packs.generation.read()            # (before the queries: a change meanwhile is seen next time)
        seen = self._seen
        if gen == seen:
            return
        try:
            if seen is not None and gen[1] != seen[1]:
                self._drop_removed({r.id for r in self._store.index.packs()})
            if seen is None or gen[0] != seen[0]:
                self._load()
        except sqlite3.Error:
            return                              # (the general path serves meanwhile; tried again next time)
        self._seen = gen

    def settle(self) -> None:
        """Count the hits since the last call in the cache's counters, and note the packs read (the
        LRU order of packs)."""
        if not self.hits:
            return
        counters = self._store.counters
        counters.count(hits=self.blocks, hit_bytes=self.hit_bytes, object_hits=self.hits)
        now = time.time()
        for s, used in enumerate(self._used):
            if used:
                counters.note_pack_access(self._packs[s], now)
                self._used[s] = 0
        self.hits = self.blocks = self.hit_bytes = 0

    def abandon(self) -> sqlite3.Connection | None:
        """In a forked child, a parent's table: let go of its descriptors and arrays; returns its
        SQLite connection (the parent's: to be kept, never closed in the child)."""
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds, self._packs, self._slot_of = array("i"), [], {}
        self._slot = array("i")
        self._off = self._len = array("q")
        self.enabled = False
        conn, self._wanted = self._wanted, None
        return conn

    def close(self) -> None:
        for fd in self._fds:
            if fd >= 0:
                os.close(fd)
        self._fds = array("i", [-1]) * len(self._fds)
        if self._wanted is not None:
            self._wanted.close()
            self._wanted = None

    # -- loading ---------------------------------------------------------------------------------------

    def _load(self) -> None:
        top = self._store.index.top_record()
        if top <= self._seq:
            return                  # nothing new (a fresh cache: no table of ids built for nothing)
        c = self._wanted_conn()
        c.execute("BEGIN")          # (one snapshot: no record lands between the two queries)
        try:
            rows = c.execute("SELECT w.i, p.seq, p.pack, p.offset, p.length FROM packed p JOIN temp.wanted w "
                             "ON w.objid = p.objid WHERE p.seq > ?", (self._seq,)).fetchall()
            top = c.execute("SELECT COALESCE(MAX(seq), 0) FROM packed").fetchone()[0]
        finally:
            c.execute("COMMIT")
        slot_of, header = self._slot_of, fmt.RECORD_HEADER_SIZE
        for i, _seq, pack, offset, length in rows:
            s = slot_of.get(pack)
            if s is None:
                s = self._open(pack)
            self._slot[i] = s
            self._off[i] = offset + header
            self._len[i] = length
        self._seq = max(self._seq, top)

    def _wanted_conn(self) -> sqlite3.Connection:
        """This table's own connection, with its ids in a temporary table (the join is SQLite's)."""
        if self._wanted is None:
            c = sqlite3.connect(self._store.index.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            c.execute("CREATE TEMP TABLE wanted(objid BLOB PRIMARY KEY, i INTEGER NOT NULL) WITHOUT ROWID")
            # (one statement cutting the ids out of the blob: twice as fast as a row per execute)
            c.execute("INSERT OR IGNORE INTO temp.wanted WITH RECURSIVE k(j) AS (SELECT 0 UNION ALL "
                      "SELECT j + 1 FROM k WHERE j + 1 < ?2) SELECT substr(?1, j * 16 + 1, 16), j FROM k",
                      (self._ids, len(self._ids) // ID))
            self._wanted = c
        return self._wanted

    def _open(self, pack: int) -> int:
        try:
            fd = os.open(self._store.packs.path(pack), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        s = len(self._packs)
        self._packs.append(pack)
        self._fds.append(fd)
        self._used.append(0)
        self._slot_of[pack] = s
        return s

    def _drop_removed(self, live: set[int]) -> None:
        """Close the descriptors of packs that are gone (their items then miss until re-packed)."""
        for s, pack in enumerate(self._packs):
            if pack not in live and self._fds[s] >= 0:
                os.close(self._fds[s])
                self._fds[s] = -1
