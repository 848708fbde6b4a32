"""The cache's metadata: one SQLite database in WAL mode, shared by every thread and process.

One row per cached object version (``objid``): its source, validator, size, a bitmap of
the blocks on disk, their bytes, and the last validation and access times (LRU).  The
block files are the truth for *content* (a block file only ever holds the right bytes for
its objid); the index is the truth for *accounting*: what to evict, how much is used.

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
from typing import NamedTuple

from manyfiles.cache._format import HEADER_SIZE

SCHEMA_VERSION = 1
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
    last_access REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_source ON entries(source);
CREATE INDEX IF NOT EXISTS entries_lru ON entries(last_access);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS verified(objid BLOB PRIMARY KEY, method TEXT NOT NULL, at REAL NOT NULL)
    WITHOUT ROWID;
"""

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


class Victim(NamedTuple):
    """An entry removed from the index whose block files are to be unlinked."""

    objid: bytes
    present: bytes
    disk_bytes: int


def bits_set(bitmap: bytes) -> Iterator[int]:
    for byte_index, byte in enumerate(bitmap):
        if byte:
            for bit in range(8):
                if byte >> bit & 1:
                    yield byte_index * 8 + bit


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
        # WAL is persistent (stored in the file): readers never block the writer, nor it them.
        conn.execute("PRAGMA journal_mode=WAL")
        with self.write() as c:
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            row = c.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                c.execute("INSERT INTO meta VALUES('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"index schema {row[0]}, this version reads {SCHEMA_VERSION}")
            c.executemany("INSERT OR IGNORE INTO counters VALUES(?, 0)",
                          [(n,) for n in (*COUNTERS, "entries", "bytes")])

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

    def verification(self, objid: bytes) -> str | None:
        """How the whole object of ``objid`` was checked ("md5", "crc32"...), None if never."""
        row = self._conn().execute("SELECT method FROM verified WHERE objid=?", (objid,)).fetchone()
        return None if row is None else row[0]

    def verifications(self) -> dict[bytes, str]:
        """objid -> method of every entry whose whole object was checked (``cache verify``)."""
        return dict(self._conn().execute(
            "SELECT v.objid, v.method FROM verified v JOIN entries e ON e.objid = v.objid").fetchall())

    def counters(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT name, value FROM counters").fetchall())

    def entries(self) -> Iterator[tuple[bytes, bytes, bytes, int, bytes, int]]:
        """(objid, source, validator, size, present, disk_bytes) of every entry, in pages."""
        last = b""
        while True:
            rows = self._conn().execute(
                "SELECT objid, source, validator, size, present, disk_bytes FROM entries WHERE objid > ? "
                "ORDER BY objid LIMIT 1000", (last,)).fetchall()
            if not rows:
                return
            yield from rows
            last = rows[-1][0]

    def sizes(self, objids: list[bytes]) -> dict[bytes, int]:
        """objid -> object size, for those of ``objids`` that have an entry."""
        c = self._conn()
        out: dict[bytes, int] = {}
        for i in range(0, len(objids), 500):
            chunk = objids[i:i + 500]
            marks = ",".join("?" * len(chunk))
            rows = c.execute(f"SELECT objid, size FROM entries WHERE objid IN ({marks})", chunk).fetchall()
            out.update(rows)
        return out

    # -- writers -----------------------------------------------------------------------------------

    def record_fills(self, fills: list[Fill],
                     now: float) -> tuple[list[tuple[bytes, int]], list[Victim], int]:
        """Account blocks renamed into place.  Returns (stale blocks, superseded versions) to unlink,
        and how many of the fills were blocks not accounted before (two readers may fill one block).

        A fill of a version older (by validation time) than one the index already has for the
        same source is stale: its block is to be removed, not recorded.  A newer version
        supersedes the older ones, which are removed from the index here.
        """
        stale: list[tuple[bytes, int]] = []
        superseded: list[Victim] = []
        added_bytes = added_entries = new = 0
        with self.write() as c:
            for f in fills:
                v = f.version
                row = c.execute("SELECT present, disk_bytes FROM entries WHERE objid=?",
                                (v.objid,)).fetchone()
                if row is None:
                    others = c.execute("SELECT objid, present, disk_bytes, validated_at FROM entries "
                                       "WHERE source=? AND objid != ?", (v.source, v.objid)).fetchall()
                    if any(o[3] > v.validated_at for o in others):
                        stale.append((v.objid, f.index))
                        continue
                    for objid, present, disk_bytes, _ in others:
                        _delete(c, objid)
                        superseded.append(Victim(objid, present, disk_bytes))
                        added_bytes -= disk_bytes
                        added_entries -= 1
                    present = bytearray((f.nblocks + 7) // 8)
                    disk_bytes = 0
                    c.execute("INSERT INTO entries VALUES(?, ?, ?, ?, ?, 0, ?, ?)",
                              (v.objid, v.source, v.validator, v.size, bytes(present), v.validated_at, now))
                    added_entries += 1
                else:
                    present, disk_bytes = bytearray(row[0]), row[1]
                if _set_bit(present, f.index):
                    new += 1
                    disk_bytes += f.disk_bytes
                    added_bytes += f.disk_bytes
                    c.execute("UPDATE entries SET present=?, disk_bytes=?, last_access=MAX(last_access, ?) "
                              "WHERE objid=?", (bytes(present), disk_bytes, now, v.objid))
            self._add(c, {"bytes": added_bytes, "entries": added_entries})
        return stale, superseded, new

    def mark_verified(self, marks: dict[bytes, str], unmarks: Iterable[bytes], now: float) -> None:
        """Record whole-object checks (objid -> method), then forget those of ``unmarks`` (versions
        that got a block from elsewhere than a checked stream)."""
        with self.write() as c:
            c.executemany("INSERT OR REPLACE INTO verified VALUES(?, ?, ?)",
                          [(o, m, now) for o, m in marks.items()])
            c.executemany("DELETE FROM verified WHERE objid=?", [(o,) for o in unmarks])

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
                    rows = c.execute("SELECT objid, present, disk_bytes FROM entries ORDER BY last_access "
                                     "LIMIT ?", (batch,)).fetchall()
                else:
                    rows = c.execute("SELECT objid, present, disk_bytes FROM entries WHERE last_access < ? "
                                     "ORDER BY last_access LIMIT ?", (older_than, batch)).fetchall()
                if not rows:
                    break
                for objid, present, disk_bytes in rows:
                    _delete(c, objid)
                    victims.append(Victim(objid, present, disk_bytes))
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
                rows = c.execute("SELECT objid, present, disk_bytes FROM entries WHERE source=?",
                                 (source,)).fetchall()
                for r in rows:
                    _delete(c, r[0])
                victims.extend(Victim(*r) for r in rows)
            self._count_removed(c, victims, evicted=False)
        return victims

    def remove_objects(self, objids: Iterable[bytes]) -> list[Victim]:
        """Remove these object versions (a failed whole-object check)."""
        victims: list[Victim] = []
        with self.write() as c:
            for objid in objids:
                row = c.execute("SELECT present, disk_bytes FROM entries WHERE objid=?", (objid,)).fetchone()
                c.execute("DELETE FROM verified WHERE objid=?", (objid,))
                if row is not None:
                    _delete(c, objid)
                    victims.append(Victim(objid, row[0], row[1]))
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
