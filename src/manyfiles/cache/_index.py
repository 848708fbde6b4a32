"""The cache's metadata: one SQLite database in WAL mode, shared by every thread and process.

One row per cached object version (``objid``): its source, validator, size, a bitmap of
the blocks on disk, their bytes, whether it is held as one whole file, and the last
validation and access times (LRU).  The files are the truth for *content* (a file only
ever holds bytes of its objid); the index is the truth for *accounting* (what to evict,
how much is used) and holds, per whole file, the check its bytes passed (``verified``:
the method, and the claim ``cache verify`` re-hashes the file against).

Schema 2 added ``entries.whole`` and ``verified.claim``; a schema-1 index is migrated in
place when first opened (its block entries stay readable; their blocks carry no
``FLAG_CHECKED`` and are treated as unverified).

Every connection belongs to one thread of one process (``threading.local`` + pid check,
so a forked child opens its own).  Writes are short ``BEGIN IMMEDIATE`` transactions that
wait up to ``busy_timeout`` for another writer.  Hot paths never write: accesses and
counters are batched by the caller and flushed about once a second.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from manyfiles.cache._format import HEADER_SIZE

SCHEMA_VERSION = 2
BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries(
    objid BLOB PRIMARY KEY,
    source BLOB NOT NULL,
    validator BLOB NOT NULL,
    size INTEGER NOT NULL,
    present BLOB NOT NULL,
    disk_bytes INTEGER NOT NULL,
    validated_at REAL NOT NULL,
    last_access REAL NOT NULL,
    whole INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_source ON entries(source);
CREATE INDEX IF NOT EXISTS entries_lru ON entries(last_access);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS verified(objid BLOB PRIMARY KEY, method TEXT NOT NULL, at REAL NOT NULL,
    claim TEXT) WITHOUT ROWID;
"""
_MIGRATE_1_TO_2 = ("ALTER TABLE entries ADD COLUMN whole INTEGER NOT NULL DEFAULT 0",
                   "ALTER TABLE verified ADD COLUMN claim TEXT")

COUNTERS = ("hits", "misses", "hit_bytes", "miss_bytes", "fills", "fill_bytes", "fills_dropped",
            "evictions", "evicted_bytes", "corrupt", "object_hits", "object_misses")


class Version(NamedTuple):
    """One version of a source: what a reader needs to find its blocks."""

    objid: bytes
    source: bytes
    validator: bytes
    size: int
    validated_at: float


class Fill(NamedTuple):
    """A block that was just renamed into place, to be accounted."""

    version: Version
    index: int
    disk_bytes: int
    nblocks: int


class Whole(NamedTuple):
    """An object version just renamed into place as one whole file, to be accounted: the check
    its bytes passed (``method``) and the claim ``cache verify`` re-hashes it against (JSON)."""

    version: Version
    method: str
    claim: str
    nblocks: int


@dataclass
class Recorded:
    """What :meth:`Index.record_fills` leaves to do on disk, and what it counted."""

    stale_blocks: list[tuple[bytes, int]] = field(default_factory=list)   # blocks to unlink (an older
                                                                          # version, or held whole)
    stale_wholes: list[bytes] = field(default_factory=list)       # whole files of an older version
    superseded: list[Victim] = field(default_factory=list)        # older versions removed from the index
    replaced: list[tuple[bytes, int]] = field(default_factory=list)   # blocks a whole file replaced
    new: int = 0                                                  # blocks not accounted before
    new_bytes: int = 0


class Victim(NamedTuple):
    """An entry removed from the index whose files are to be unlinked."""

    objid: bytes
    present: bytes
    disk_bytes: int
    whole: bool = False


class Entry(NamedTuple):
    """One row of the index, as ``cache verify`` walks them."""

    objid: bytes
    source: bytes
    validator: bytes
    size: int
    present: bytes
    disk_bytes: int
    whole: bool


def bits_set(bitmap: bytes) -> Iterator[int]:
    for byte_index, byte in enumerate(bitmap):
        if byte:
            for bit in range(8):
                if byte >> bit & 1:
                    yield byte_index * 8 + bit


def _all_bits(n: int) -> bytes:
    out = bytearray(b"\xff" * (n // 8))
    if n % 8:
        out.append((1 << (n % 8)) - 1)
    return bytes(out)


def _set_bit(bitmap: bytearray, i: int) -> bool:
    """Set bit ``i``; True if it was clear."""
    mask = 1 << (i & 7)
    if bitmap[i >> 3] & mask:
        return False
    bitmap[i >> 3] |= mask
    return True


class Index:
    def __init__(self, path: str, block_size: int) -> None:
        self.path = path
        self.block_size = block_size
        self._local = threading.local()
        conn = self._conn()
        if self._current(conn):
            return
        # WAL is persistent (stored in the file): readers never block the writer, nor it them.
        conn.execute("PRAGMA journal_mode=WAL")
        with self.write() as c:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            row = c.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                c.execute("INSERT INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] == "1":
                for stmt in _MIGRATE_1_TO_2:
                    c.execute(stmt)
                c.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"index schema {row[0]}, this version reads {SCHEMA_VERSION}")
            c.executemany("INSERT OR IGNORE INTO counters VALUES(?, 0)",
                          [(n,) for n in (*COUNTERS, "entries", "bytes")])

    @staticmethod
    def _current(conn: sqlite3.Connection) -> bool:
        """Is the index already in WAL mode, at this schema, with every counter?  Then opening it
        takes no lock: every worker process of a DataLoader opens the index while the others write,
        and the journal-mode switch and the schema transaction were where they collided."""
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                return False
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            names = (*COUNTERS, "entries", "bytes")
            have = conn.execute(f"SELECT count(*) FROM counters WHERE name IN ({','.join('?' * len(names))})",
                                names).fetchone()[0]
        except sqlite3.OperationalError:        # no tables yet (a new cache)
            return False
        return row is not None and row[0] == str(SCHEMA_VERSION) and have == len(names)

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA synchronous=NORMAL")
            local.conn, local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        """Close this thread's connection (others close when their thread's local goes away)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.conn = None

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A short write transaction (takes the database's write lock at once)."""
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("ROLLBACK" if getattr(self._local, "rehearsing", False) else "COMMIT")

    @contextlib.contextmanager
    def rehearsal(self) -> Iterator[None]:
        """Within it, this thread's writers run but keep nothing (``evict -n``: the same victims
        as a real eviction, computed by the same code, then rolled back)."""
        self._local.rehearsing = True
        try:
            yield
        finally:
            self._local.rehearsing = False

    # -- readers -----------------------------------------------------------------------------------

    def latest(self, source: bytes) -> Version | None:
        """The most recently validated version of ``source`` in the cache."""
        row = self._conn().execute(
            "SELECT objid, validator, size, validated_at FROM entries WHERE source=? "
            "ORDER BY validated_at DESC LIMIT 1", (source,)).fetchone()
        return None if row is None else Version(row[0], source, row[1], row[2], row[3])

    def present(self, objid: bytes) -> bytes | None:
        row = self._conn().execute("SELECT present FROM entries WHERE objid=?", (objid,)).fetchone()
        return None if row is None else row[0]

    def verification(self, objid: bytes) -> tuple[str, str | None] | None:
        """(method, claim record as JSON) of the whole-object check ``objid`` passed, None if never."""
        row = self._conn().execute("SELECT method, claim FROM verified WHERE objid=?", (objid,)).fetchone()
        return None if row is None else (row[0], row[1])

    def verifications(self) -> dict[bytes, tuple[str, str | None]]:
        """objid -> (method, claim) of every entry whose whole object was checked (``cache verify``)."""
        rows = self._conn().execute(
            "SELECT v.objid, v.method, v.claim FROM verified v JOIN entries e ON e.objid = v.objid"
        ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def entry(self, objid: bytes) -> Entry | None:
        row = self._conn().execute(
            "SELECT objid, source, validator, size, present, disk_bytes, whole FROM entries WHERE objid=?",
            (objid,)).fetchone()
        return None if row is None else Entry(*row[:6], bool(row[6]))

    def counters(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT name, value FROM counters").fetchall())

    def entries(self) -> Iterator[Entry]:
        """Every entry, in pages."""
        last = b""
        while True:
            rows = self._conn().execute(
                "SELECT objid, source, validator, size, present, disk_bytes, whole FROM entries "
                "WHERE objid > ? ORDER BY objid LIMIT 1000", (last,)).fetchall()
            if not rows:
                return
            yield from (Entry(*r[:6], bool(r[6])) for r in rows)
            last = rows[-1][0]

    def shapes(self, objids: list[bytes]) -> dict[bytes, tuple[int, bool]]:
        """objid -> (object size, held whole), for those of ``objids`` that have an entry."""
        c = self._conn()
        out: dict[bytes, tuple[int, bool]] = {}
        for i in range(0, len(objids), 500):
            chunk = objids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            rows = c.execute(f"SELECT objid, size, whole FROM entries WHERE objid IN ({marks})",
                             chunk).fetchall()
            out.update((r[0], (r[1], bool(r[2]))) for r in rows)
        return out

    # -- writers -----------------------------------------------------------------------------------

    def record_fills(self, fills: Iterable[Fill | Whole], now: float) -> Recorded:
        """Account files renamed into place: blocks (:class:`Fill`) and whole files (:class:`Whole`).

        A fill of a version older (by validation time) than one the index already has for the
        same source is stale: its file is to be removed, not recorded.  A newer version
        supersedes the older ones, which are removed from the index here.  A whole file
        replaces the blocks of its version (to be unlinked); a block of a version already held
        whole is stale.  Returns what to unlink and how many fills were new (two readers may
        fill one block).
        """
        out = Recorded()
        added_bytes = added_entries = 0
        with self.write() as c:
            for f in fills:
                v = f.version
                is_whole = isinstance(f, Whole)
                row = c.execute("SELECT present, disk_bytes, whole FROM entries WHERE objid=?",
                                (v.objid,)).fetchone()
                if row is None:
                    others = c.execute("SELECT objid, present, disk_bytes, validated_at, whole FROM entries "
                                       "WHERE source=? AND objid != ?", (v.source, v.objid)).fetchall()
                    if any(o[3] > v.validated_at for o in others):
                        if is_whole:
                            out.stale_wholes.append(v.objid)
                        else:
                            out.stale_blocks.append((v.objid, f.index))
                        continue
                    for objid, present, disk_bytes, _, whole in others:
                        _delete(c, objid)
                        out.superseded.append(Victim(objid, present, disk_bytes, bool(whole)))
                        added_bytes -= disk_bytes
                        added_entries -= 1
                    present, disk_bytes, whole = bytearray((f.nblocks + 7) // 8), 0, False
                    c.execute("INSERT INTO entries VALUES(?, ?, ?, ?, ?, 0, ?, ?, 0)",
                              (v.objid, v.source, v.validator, v.size, bytes(present), v.validated_at, now))
                    added_entries += 1
                else:
                    present, disk_bytes, whole = bytearray(row[0]), row[1], bool(row[2])
                if is_whole:
                    out.replaced.extend((v.objid, i) for i in bits_set(present) if not whole)
                    full = _all_bits(f.nblocks)
                    out.new += 0 if whole else f.nblocks - sum(1 for _ in bits_set(present))
                    out.new_bytes += v.size - disk_bytes
                    added_bytes += v.size - disk_bytes
                    c.execute("UPDATE entries SET present=?, disk_bytes=?, whole=1, "
                              "last_access=MAX(last_access, ?) WHERE objid=?", (full, v.size, now, v.objid))
                    c.execute("INSERT OR REPLACE INTO verified VALUES(?, ?, ?, ?)",
                              (v.objid, f.method, now, f.claim))
                elif whole:
                    out.stale_blocks.append((v.objid, f.index))
                elif _set_bit(present, f.index):
                    out.new += 1
                    out.new_bytes += f.disk_bytes
                    disk_bytes += f.disk_bytes
                    added_bytes += f.disk_bytes
                    c.execute("UPDATE entries SET present=?, disk_bytes=?, last_access=MAX(last_access, ?) "
                              "WHERE objid=?", (bytes(present), disk_bytes, now, v.objid))
            self._add(c, {"bytes": added_bytes, "entries": added_entries})
        return out

    def touch(self, accesses: dict[bytes, tuple[float, float]], counters: dict[str, int]) -> None:
        """Record batched accesses (objid -> (last access, validated at)) and counter increments."""
        with self.write() as c:
            c.executemany("UPDATE entries SET last_access=MAX(last_access, ?), "
                          "validated_at=MAX(validated_at, ?) WHERE objid=?",
                          [(a, v, o) for o, (a, v) in accesses.items()])
            self._add(c, counters)

    def add_counters(self, counters: dict[str, int]) -> None:
        with self.write() as c:
            self._add(c, counters)

    @staticmethod
    def _add(c: sqlite3.Connection, counters: dict[str, int]) -> None:
        c.executemany("UPDATE counters SET value = value + ? WHERE name=?",
                      [(n, k) for k, n in counters.items() if n])

    def pop_lru(self, need_bytes: int | None, *, older_than: float | None = None,
                batch: int = 256) -> list[Victim]:
        """Remove least recently used entries totalling at least ``need_bytes`` (or all older ones)."""
        victims: list[Victim] = []
        freed = 0
        with self.write() as c:
            while need_bytes is None or freed < need_bytes:
                if older_than is None:
                    rows = c.execute("SELECT objid, present, disk_bytes, whole FROM entries "
                                     "ORDER BY last_access LIMIT ?", (batch,)).fetchall()
                else:
                    rows = c.execute("SELECT objid, present, disk_bytes, whole FROM entries "
                                     "WHERE last_access < ? ORDER BY last_access LIMIT ?",
                                     (older_than, batch)).fetchall()
                if not rows:
                    break
                for objid, present, disk_bytes, whole in rows:
                    _delete(c, objid)
                    victims.append(Victim(objid, present, disk_bytes, bool(whole)))
                    freed += disk_bytes
                    if need_bytes is not None and freed >= need_bytes:
                        break
            self._count_removed(c, victims, evicted=True)
        return victims

    def remove_sources(self, sources: Iterable[bytes]) -> list[Victim]:
        """Remove every version of these sources (write-through invalidation, ``evict SRC``)."""
        victims: list[Victim] = []
        with self.write() as c:
            for source in sources:
                rows = c.execute("SELECT objid, present, disk_bytes, whole FROM entries WHERE source=?",
                                 (source,)).fetchall()
                for r in rows:
                    _delete(c, r[0])
                victims.extend(Victim(r[0], r[1], r[2], bool(r[3])) for r in rows)
            self._count_removed(c, victims, evicted=False)
        return victims

    def remove_objects(self, objids: Iterable[bytes]) -> list[Victim]:
        """Remove these object versions (a failed whole-object check, a whole file found bad)."""
        victims: list[Victim] = []
        with self.write() as c:
            for objid in objids:
                row = c.execute("SELECT present, disk_bytes, whole FROM entries WHERE objid=?",
                                (objid,)).fetchone()
                c.execute("DELETE FROM verified WHERE objid=?", (objid,))
                if row is not None:
                    _delete(c, objid)
                    victims.append(Victim(objid, row[0], row[1], bool(row[2])))
            self._count_removed(c, victims, evicted=False)
        return victims

    def _count_removed(self, c: sqlite3.Connection, victims: list[Victim], *, evicted: bool) -> None:
        freed = sum(v.disk_bytes for v in victims)
        counters = {"bytes": -freed, "entries": -len(victims)}
        if evicted:
            counters.update(evictions=len(victims), evicted_bytes=freed)
        self._add(c, counters)

    def drop_blocks(self, objid: bytes, indexes: Iterable[int]) -> None:
        """Clear blocks found missing or corrupt (by verify or a reader)."""
        with self.write() as c:
            row = c.execute("SELECT present, disk_bytes, size FROM entries WHERE objid=?",
                            (objid,)).fetchone()
            if row is None:
                return
            present, disk_bytes, size = bytearray(row[0]), row[1], row[2]
            freed = 0
            for i in indexes:
                mask = 1 << (i & 7)
                if i >> 3 < len(present) and present[i >> 3] & mask:
                    present[i >> 3] &= ~mask & 0xFF
                    freed += block_disk_bytes(size, i, self.block_size)
            freed = min(freed, disk_bytes)
            c.execute("UPDATE entries SET present=?, disk_bytes=? WHERE objid=?",
                      (bytes(present), disk_bytes - freed, objid))
            self._add(c, {"bytes": -freed})

    def recount(self) -> tuple[int, int]:
        """Recompute the entries/bytes counters from the rows (verify); returns them."""
        with self.write() as c:
            n, total = c.execute("SELECT COUNT(*), COALESCE(SUM(disk_bytes), 0) FROM entries").fetchone()
            c.execute("UPDATE counters SET value=? WHERE name='entries'", (n,))
            c.execute("UPDATE counters SET value=? WHERE name='bytes'", (total,))
            c.execute("DELETE FROM verified WHERE objid NOT IN (SELECT objid FROM entries)")
        return n, total

    def clear(self) -> None:
        with self.write() as c:
            c.execute("DELETE FROM entries")
            c.execute("DELETE FROM verified")
            c.execute("UPDATE counters SET value=0")


def _delete(c: sqlite3.Connection, objid: bytes) -> None:
    c.execute("DELETE FROM entries WHERE objid=?", (objid,))
    c.execute("DELETE FROM verified WHERE objid=?", (objid,))


def block_disk_bytes(size: int, index: int, block_size: int) -> int:
    """Bytes block ``index`` of an object of ``size`` bytes takes on disk (header + payload)."""
    return HEADER_SIZE + min(block_size, size - index * block_size)
