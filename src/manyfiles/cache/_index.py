"""The cache's metadata: one SQLite database in WAL mode, shared by every thread and process.

One row per cached object version (``objid``): its source, validator, size, a bitmap of
the blocks on disk, their bytes, whether it is held as one whole file, and the last
validation and access times (LRU).  The files are the truth for *content* (a file only
ever holds bytes of its objid); the index is the truth for *accounting* (what to evict,
how much is used) and holds, per whole file, the check its bytes passed (``verified``:
the method, and the claim ``cache verify`` re-hashes the file against).

Schema 2 added ``entries.whole`` and ``verified.claim``; a schema-1 index is migrated in
place when first opened (its block entries stay readable; their blocks carry no
``FLAG_CHECKED`` and are treated as unverified).  Schema 3 added the packs (_packs.py):
``entries.pack`` (the pack holding a small object whole, NULL otherwise), ``packed`` (where each
packed object's record is: pack, offset, length, CRC-32; ``seq`` only grows, so a reader loads
what is new since its last look) and ``packs`` (each pack's size, live bytes, last access: the
unit of eviction).  A schema-2 index gets the new column and tables when first opened; its whole
files and blocks stay as they are.

Every connection belongs to one thread of one process (``threading.local`` + pid check,
so a forked child opens its own).  Writes are short ``BEGIN IMMEDIATE`` transactions that
wait up to ``busy_timeout`` for another writer.  Hot paths never write: accesses and
counters are batched by the caller and flushed about once a second.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from manyfiles.cache._format import HEADER_SIZE, PACK_HEADER_SIZE, RECORD_HEADER_SIZE

SCHEMA_VERSION = 3
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
    whole INTEGER NOT NULL DEFAULT 0,
    pack INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entries_source ON entries(source);
CREATE INDEX IF NOT EXISTS entries_lru ON entries(last_access);
CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS verified(objid BLOB PRIMARY KEY, method TEXT NOT NULL, at REAL NOT NULL,
    claim TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS packed(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    objid BLOB NOT NULL UNIQUE,
    pack INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    crc INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS packed_pack ON packed(pack);
CREATE TABLE IF NOT EXISTS packs(
    id INTEGER PRIMARY KEY,
    size INTEGER NOT NULL,
    live INTEGER NOT NULL,
    records INTEGER NOT NULL,
    created REAL NOT NULL,
    last_access REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS packs_lru ON packs(last_access);
CREATE TABLE IF NOT EXISTS removed_packs(id INTEGER PRIMARY KEY, at REAL NOT NULL);
"""
_MIGRATE_1_TO_2 = ("ALTER TABLE entries ADD COLUMN whole INTEGER NOT NULL DEFAULT 0",
                   "ALTER TABLE verified ADD COLUMN claim TEXT")
_MIGRATE_2_TO_3 = ("ALTER TABLE entries ADD COLUMN pack INTEGER",)

_ENTRY_COLUMNS = "objid, source, validator, size, present, disk_bytes, whole, pack"
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


class Packed(NamedTuple):
    """A small object version just appended to a pack as one record, to be accounted: where
    (``pack``, ``offset`` of the record, payload ``length`` and ``crc``), the check its bytes passed
    and its claim (as :class:`Whole`).  ``cleared``: the cache's clear count when the appender took
    the pack (a clear since makes its records lost; a pack removed otherwise leaves a tombstone)."""

    version: Version
    pack: int
    offset: int
    length: int
    crc: int
    method: str
    claim: str
    nblocks: int
    cleared: int

    @property
    def end(self) -> int:
        """The pack's bytes up to the end of this record."""
        return self.offset + RECORD_HEADER_SIZE + self.length


@dataclass
class Recorded:
    """What :meth:`Index.record_fills` leaves to do on disk, and what it counted."""

    stale_blocks: list[tuple[bytes, int]] = field(default_factory=list)   # blocks to unlink (an older
                                                                          # version, or held whole)
    stale_wholes: list[bytes] = field(default_factory=list)       # whole files of an older version
    superseded: list[Victim] = field(default_factory=list)        # older versions removed from the index
    replaced: list[tuple[bytes, int]] = field(default_factory=list)   # blocks a whole file replaced
    lost_packs: set[int] = field(default_factory=set)             # packs removed under their appender
    lost: int = 0                                                 # files removed before they were accounted
    packs_seen: set[int] = field(default_factory=set)             # packs that have their row now
    packed: int = 0                                               # records now named by the index
    new: int = 0                                                  # blocks not accounted before
    new_bytes: int = 0


class Victim(NamedTuple):
    """An entry removed from the index whose files are to be unlinked; or a whole pack (``pack``,
    whose ``entries`` objects went with it: its file is to be unlinked).  A packed object removed
    alone (``pack`` set, ``whole`` true) leaves its record in the pack: dead bytes, freed with it."""

    objid: bytes
    present: bytes
    disk_bytes: int
    whole: bool = False
    pack: int | None = None
    entries: int = 1

    @property
    def is_pack(self) -> bool:
        return self.pack is not None and not self.objid

    @property
    def frees(self) -> int:
        """Bytes its removal frees on disk (a record left in its pack frees nothing yet)."""
        return 0 if self.pack is not None and self.objid else self.disk_bytes


class Entry(NamedTuple):
    """One row of the index, as ``cache verify`` walks them."""

    objid: bytes
    source: bytes
    validator: bytes
    size: int
    present: bytes
    disk_bytes: int
    whole: bool
    pack: int | None = None


class PackRow(NamedTuple):
    """One pack as the index accounts it."""

    id: int
    size: int
    live: int
    records: int
    last_access: float


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
        #: told of what a write removed, inside its transaction, before the commit (the store unlinks
        #: the files there: a fill of the same version accounted later, by another process, then
        #: finds its file gone and is not accounted, instead of naming a file an eviction removed)
        self.on_removed: Callable[[list[Victim]], None] | None = None
        #: asked, inside the transaction, whether a file to account is still on disk
        self.on_disk: Callable[[Fill | Whole], bool] | None = None
        # Processes that create a cache at once (the DataLoader workers of a new cache) collide on
        # the journal-mode switch, which fails at once ("database is locked") instead of waiting
        # like a transaction does: those collisions are waited out too.
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._set_up(self._conn())
                return
            except sqlite3.OperationalError as exc:
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise
                time.sleep(0.005 + random.random() * 0.02)

    def _set_up(self, conn: sqlite3.Connection) -> None:
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
            elif row[0] in ("1", "2"):
                for stmt in (*(_MIGRATE_1_TO_2 if row[0] == "1" else ()), *_MIGRATE_2_TO_3):
                    c.execute(stmt)
                c.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION),))
            elif row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"index schema {row[0]}, this version reads {SCHEMA_VERSION}")
            c.execute("INSERT OR IGNORE INTO meta VALUES('cleared', '0')")
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

    def verified_at(self, objid: bytes) -> float | None:
        """When ``objid``'s whole-object check was recorded (a packed record: when it was accounted)."""
        row = self._conn().execute("SELECT at FROM verified WHERE objid=?", (objid,)).fetchone()
        return None if row is None else row[0]

    def verifications(self) -> dict[bytes, tuple[str, str | None]]:
        """objid -> (method, claim) of every entry whose whole object was checked (``cache verify``)."""
        rows = self._conn().execute(
            "SELECT v.objid, v.method, v.claim FROM verified v JOIN entries e ON e.objid = v.objid"
        ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def entry(self, objid: bytes) -> Entry | None:
        row = self._conn().execute(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE objid=?", (objid,)).fetchone()
        return None if row is None else _entry(row)

    def counters(self) -> dict[str, int]:
        return dict(self._conn().execute("SELECT name, value FROM counters").fetchall())

    def entries(self) -> Iterator[Entry]:
        """Every entry, in pages."""
        last = b""
        while True:
            rows = self._conn().execute(
                f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE objid > ? ORDER BY objid LIMIT 1000",
                (last,)).fetchall()
            if not rows:
                return
            yield from (_entry(r) for r in rows)
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

    # -- packs (readers) -----------------------------------------------------------------------------

    def packed(self, objid: bytes) -> tuple[int, int, int, int] | None:
        """(pack, record offset, length, crc) of ``objid``'s record, None if it is not packed."""
        return self._conn().execute("SELECT pack, offset, length, crc FROM packed WHERE objid=?",
                                    (objid,)).fetchone()

    def packs(self) -> list[PackRow]:
        """Every pack the index accounts."""
        return [PackRow(*r) for r in self._conn().execute(
            "SELECT id, size, live, records, last_access FROM packs").fetchall()]

    def pack_records(self, pack: int) -> list[tuple[bytes, int, int, int]]:
        """(objid, offset, length, crc) of the records the index names in ``pack``, by offset."""
        return self._conn().execute("SELECT objid, offset, length, crc FROM packed WHERE pack=? "
                                    "ORDER BY offset", (pack,)).fetchall()

    def top_record(self) -> int:
        """The sequence number of the newest record the index names (0: none)."""
        return self._conn().execute("SELECT COALESCE(MAX(seq), 0) FROM packed").fetchone()[0]

    def cleared(self) -> int:
        """How many times the cache was cleared (a pack taken before a clear is not the cache's any more)."""
        row = self._conn().execute("SELECT value FROM meta WHERE key='cleared'").fetchone()
        return int(row[0]) if row is not None else 0

    # -- writers -----------------------------------------------------------------------------------

    def record_fills(self, fills: Iterable[Fill | Whole | Packed], now: float) -> Recorded:
        """Account files renamed into place (blocks, :class:`Fill`, and whole files, :class:`Whole`) and
        records appended to packs (:class:`Packed`).

        A fill of a version older (by validation time) than one the index already has for the
        same source is stale: its file is to be removed (a record: left dead in its pack), not
        recorded.  A newer version supersedes the older ones, which are removed from the index
        here.  A whole file or record replaces the blocks of its version (to be unlinked); a block
        of a version already held whole is stale, and so is a second whole copy (two processes
        packed or wrote the same version).  Returns what to unlink and how many fills were new.
        """
        out = Recorded()
        added_bytes = added_entries = 0
        with self.write() as c:
            fills = list(fills)
            records = [f for f in fills if isinstance(f, Packed)]
            if records:
                # Records in bulk (a few statements a batch: the accounting must keep up with the
                # appends of small objects); those whose object or source the index has already
                # go one by one below, as files do.
                added_bytes += _grow_packs(c, records, now, out)
                records = [f for f in records if f.pack not in out.lost_packs]
                simple, rest = _new_objects(c, records)
                added_bytes += _insert_records(c, simple, now, out)
                added_entries += len(simple)
                fills = [*(f for f in fills if not isinstance(f, Packed)), *rest]
            for f in fills:
                v = f.version
                packed = isinstance(f, Packed)
                is_whole = packed or isinstance(f, Whole)
                if not packed and self.on_disk is not None and not self.on_disk(f):
                    out.lost += 1
                    continue
                row = c.execute("SELECT present, disk_bytes, whole, pack FROM entries WHERE objid=?",
                                (v.objid,)).fetchone()
                if row is None:
                    others = c.execute("SELECT objid, present, disk_bytes, validated_at, whole, pack "
                                       "FROM entries WHERE source=? AND objid != ?",
                                       (v.source, v.objid)).fetchall()
                    if any(o[3] > v.validated_at for o in others):
                        if packed:
                            pass                    # its record stays dead in the pack
                        elif is_whole:
                            out.stale_wholes.append(v.objid)
                        else:
                            out.stale_blocks.append((v.objid, f.index))
                        continue
                    for objid, present, disk_bytes, _, whole, pack in others:
                        emptied = _delete(c, objid)
                        victim = Victim(objid, present, disk_bytes, bool(whole), pack)
                        out.superseded.extend((victim, emptied) if emptied else (victim,))
                        added_bytes -= victim.frees + (emptied.frees if emptied else 0)
                        added_entries -= 1
                    present, disk_bytes, whole, held_in = bytearray((f.nblocks + 7) // 8), 0, False, None
                    c.execute("INSERT INTO entries VALUES(?, ?, ?, ?, ?, 0, ?, ?, 0, NULL)",
                              (v.objid, v.source, v.validator, v.size, bytes(present), v.validated_at, now))
                    added_entries += 1
                else:
                    present, disk_bytes, whole, held_in = bytearray(row[0]), row[1], bool(row[2]), row[3]
                if is_whole:
                    if whole:       # held whole already (two processes filled it at once): one copy stays
                        if not packed and held_in is not None:
                            out.stale_wholes.append(v.objid)   # a file of an object packed already
                        continue    # (a second record stays dead; a second file replaced the first)
                    out.replaced.extend((v.objid, i) for i in bits_set(present))
                    full = _all_bits(f.nblocks)
                    out.new += f.nblocks - sum(1 for _ in bits_set(present))
                    if packed:
                        on_disk = RECORD_HEADER_SIZE + f.length
                        c.execute("INSERT INTO packed(objid, pack, offset, length, crc) "
                                  "VALUES(?, ?, ?, ?, ?)", (v.objid, f.pack, f.offset, f.length, f.crc))
                        c.execute("UPDATE packs SET live = live + ?, records = records + 1 WHERE id=?",
                                  (on_disk, f.pack))
                        out.packed += 1
                        added_bytes -= disk_bytes       # the blocks it replaces; the pack grew above
                    else:
                        on_disk = v.size
                        added_bytes += v.size - disk_bytes
                    out.new_bytes += on_disk - disk_bytes
                    c.execute("UPDATE entries SET present=?, disk_bytes=?, whole=1, pack=?, "
                              "last_access=MAX(last_access, ?) WHERE objid=?",
                              (full, on_disk, f.pack if packed else None, now, v.objid))
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
            self._removed(out.superseded)
        return out

    def _removed(self, victims: list[Victim]) -> None:
        if victims and self.on_removed is not None and not getattr(self._local, "rehearsing", False):
            self.on_removed(victims)

    def touch(self, accesses: dict[bytes, tuple[float, float]], counters: dict[str, int],
              pack_accesses: dict[int, float] | None = None) -> None:
        """Record batched accesses (objid -> (last access, validated at); pack -> last access of one
        of its records, by a reader that knew where it was) and counter increments."""
        with self.write() as c:
            c.executemany("UPDATE entries SET last_access=MAX(last_access, ?), "
                          "validated_at=MAX(validated_at, ?) WHERE objid=?",
                          [(a, v, o) for o, (a, v) in accesses.items()])
            if accesses:
                c.executemany("UPDATE packs SET last_access=MAX(last_access, ?) "
                              "WHERE id=(SELECT pack FROM entries WHERE objid=?)",
                              [(a, o) for o, (a, _) in accesses.items()])
            if pack_accesses:
                c.executemany("UPDATE packs SET last_access=MAX(last_access, ?) WHERE id=?",
                              [(a, p) for p, a in pack_accesses.items()])
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
        """Remove least recently used entries totalling at least ``need_bytes`` (or all older ones):
        objects held in their own files one by one, packed ones a pack at a time (the pack's last
        access is its records' latest)."""
        victims: list[Victim] = []
        freed = 0
        cutoff = float("inf") if older_than is None else older_than
        with self.write() as c:
            while need_bytes is None or freed < need_bytes:
                files = c.execute("SELECT last_access, objid, present, disk_bytes, whole FROM entries "
                                  "WHERE pack IS NULL AND last_access < ? ORDER BY last_access LIMIT ?",
                                  (cutoff, batch)).fetchall()
                packs = c.execute("SELECT last_access, id, size FROM packs WHERE last_access < ? "
                                  "ORDER BY last_access LIMIT ?", (cutoff, batch)).fetchall()
                if not files and not packs:
                    break
                for row in sorted([*files, *packs], key=lambda r: r[0]):
                    if len(row) == 3:
                        victim = _delete_pack(c, row[1], row[2])
                    else:
                        _delete(c, row[1])
                        victim = Victim(row[1], row[2], row[3], bool(row[4]))
                    victims.append(victim)
                    freed += victim.frees
                    if need_bytes is not None and freed >= need_bytes:
                        break
            self._count_removed(c, victims, evicted=True)
            self._removed(victims)
        return victims

    def remove_sources(self, sources: Iterable[bytes]) -> list[Victim]:
        """Remove every version of these sources (write-through invalidation, ``evict SRC``)."""
        victims: list[Victim] = []
        with self.write() as c:
            for source in sources:
                rows = c.execute("SELECT objid, present, disk_bytes, whole, pack FROM entries WHERE source=?",
                                 (source,)).fetchall()
                for r in rows:
                    victims.append(Victim(r[0], r[1], r[2], bool(r[3]), r[4]))
                    emptied = _delete(c, r[0])
                    if emptied:
                        victims.append(emptied)
            self._count_removed(c, victims, evicted=False)
            self._removed(victims)
        return victims

    def remove_objects(self, objids: Iterable[bytes]) -> list[Victim]:
        """Remove these object versions (a failed whole-object check, a whole file found bad)."""
        victims: list[Victim] = []
        with self.write() as c:
            for objid in objids:
                row = c.execute("SELECT present, disk_bytes, whole, pack FROM entries WHERE objid=?",
                                (objid,)).fetchone()
                c.execute("DELETE FROM verified WHERE objid=?", (objid,))
                if row is not None:
                    victims.append(Victim(objid, row[0], row[1], bool(row[2]), row[3]))
                    emptied = _delete(c, objid)
                    if emptied:
                        victims.append(emptied)
            self._count_removed(c, victims, evicted=False)
            self._removed(victims)
        return victims

    def reconcile_packs(self, packs: Iterable[int], file_size: Callable[[int], int | None]) -> list[Victim]:
        """``cache verify``'s judgement of ``packs`` against their files, made under the write lock
        (no pack is accounted, grown or removed meanwhile, so a pack created or evicted by another
        process while verify listed the folder is not mistaken for a lost one): each pack still
        accounted whose file is gone or is not that pack (``file_size`` None) is removed with every
        object it holds; the others take their file's size (appends whose accounting a kill cut short
        are in it).  Returns the removed packs' Victims."""
        victims: list[Victim] = []
        with self.write() as c:
            for pack in packs:
                row = c.execute("SELECT size FROM packs WHERE id=?", (pack,)).fetchone()
                if row is None:
                    continue
                size = file_size(pack)
                if size is None:
                    victims.append(_delete_pack(c, pack, row[0]))
                elif size != row[0]:
                    c.execute("UPDATE packs SET size=? WHERE id=?", (size, pack))
            self._count_removed(c, victims, evicted=False)
            self._removed(victims)
        return victims

    def _count_removed(self, c: sqlite3.Connection, victims: list[Victim], *, evicted: bool) -> None:
        freed = sum(v.frees for v in victims)
        gone = sum(v.entries for v in victims)
        counters = {"bytes": -freed, "entries": -gone}
        if evicted:
            counters.update(evictions=gone, evicted_bytes=freed)
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
        """Recompute the counters (entries, bytes) and each pack's live bytes from the rows (verify);
        returns (entries, bytes)."""
        with self.write() as c:
            c.execute("UPDATE packs SET live=(SELECT COALESCE(SUM(length), 0) + ? * COUNT(*) FROM packed "
                      "WHERE packed.pack = packs.id), records=(SELECT COUNT(*) FROM packed "
                      "WHERE packed.pack = packs.id)", (RECORD_HEADER_SIZE,))
            n = c.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
            files = c.execute("SELECT COALESCE(SUM(disk_bytes), 0) FROM entries "
                              "WHERE pack IS NULL").fetchone()[0]
            packs = c.execute("SELECT COALESCE(SUM(size), 0) FROM packs").fetchone()[0]
            c.execute("UPDATE counters SET value=? WHERE name='entries'", (n,))
            c.execute("UPDATE counters SET value=? WHERE name='bytes'", (files + packs,))
            c.execute("DELETE FROM verified WHERE objid NOT IN (SELECT objid FROM entries)")
            c.execute("DELETE FROM packed WHERE objid NOT IN (SELECT objid FROM entries)")
        return n, files + packs

    def clear(self) -> None:
        with self.write() as c:
            c.execute("DELETE FROM entries")
            c.execute("DELETE FROM verified")
            c.execute("DELETE FROM packed")
            c.execute("DELETE FROM packs")
            c.execute("DELETE FROM removed_packs")      # (the clear count covers every pack taken before)
            c.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key='cleared'")
            c.execute("UPDATE counters SET value=0")


def _entry(row: tuple) -> Entry:
    return Entry(*row[:6], bool(row[6]), row[7])


def _cleared(c: sqlite3.Connection) -> int:
    row = c.execute("SELECT value FROM meta WHERE key='cleared'").fetchone()
    return int(row[0]) if row is not None else 0


def _grow_packs(c: sqlite3.Connection, records: list[Packed], now: float, out: Recorded) -> int:
    """Make room for ``records`` in their packs' rows (a pack's row is created with its first
    records); returns the bytes the packs grew by.  A pack removed under its appender (evicted,
    dropped by verify: its tombstone says so; or cleared since the appender took it) is lost, with
    every record of it (``out.lost_packs``): its file is gone."""
    cleared = _cleared(c)
    by_pack: dict[int, list[Packed]] = {}
    for f in records:
        by_pack.setdefault(f.pack, []).append(f)
    grown = 0
    for pack, fs in by_pack.items():
        row = c.execute("SELECT size FROM packs WHERE id=?", (pack,)).fetchone()
        if row is None:
            if (any(f.cleared != cleared for f in fs)
                    or c.execute("SELECT 1 FROM removed_packs WHERE id=?", (pack,)).fetchone()):
                out.lost_packs.add(pack)
                continue
            c.execute("INSERT INTO packs VALUES(?, ?, 0, 0, ?, ?)", (pack, PACK_HEADER_SIZE, now, now))
            size = 0        # (its header is counted with its first records)
        else:
            size = row[0]
        out.packs_seen.add(pack)
        end = max(f.end for f in fs)
        if end > size:
            c.execute("UPDATE packs SET size=?, last_access=MAX(last_access, ?) WHERE id=?", (end, now, pack))
            grown += end - size
    return grown


def _new_objects(c: sqlite3.Connection, records: list[Packed]) -> tuple[list[Packed], list[Packed]]:
    """(records of objects the index has no version of, the others): the first go in bulk."""
    known: set[bytes] = set()
    for i in range(0, len(records), 400):
        chunk = records[i:i + 400]
        marks = ",".join("?" * len(chunk))
        known.update(r[0] for r in c.execute(f"SELECT objid FROM entries WHERE objid IN ({marks})",
                                             [f.version.objid for f in chunk]))
        known.update(r[0] for r in c.execute(f"SELECT source FROM entries WHERE source IN ({marks})",
                                             [f.version.source for f in chunk]))
    simple, rest = [], []
    for f in records:
        v = f.version
        if v.objid in known or v.source in known:
            rest.append(f)
        else:
            simple.append(f)
            known.update((v.objid, v.source))    # (a second record of it in this batch: one by one)
    return simple, rest


def _insert_records(c: sqlite3.Connection, records: list[Packed], now: float, out: Recorded) -> int:
    """Account the records of objects new to the index; returns the change of the bytes counter
    (none: their packs' growth counted it)."""
    if not records:
        return 0
    rows = []
    for f in records:
        v = f.version
        rows.append((v.objid, v.source, v.validator, v.size, _all_bits(f.nblocks),
                     RECORD_HEADER_SIZE + f.length, v.validated_at, now, f.pack))
    c.executemany("INSERT INTO entries VALUES(?, ?, ?, ?, ?, ?, ?, ?, 1, ?)", rows)
    c.executemany("INSERT INTO packed(objid, pack, offset, length, crc) VALUES(?, ?, ?, ?, ?)",
                  [(f.version.objid, f.pack, f.offset, f.length, f.crc) for f in records])
    c.executemany("INSERT OR REPLACE INTO verified VALUES(?, ?, ?, ?)",
                  [(f.version.objid, f.method, now, f.claim) for f in records])
    live: dict[int, list[int]] = {}
    for f in records:
        n = live.setdefault(f.pack, [0, 0])
        n[0] += RECORD_HEADER_SIZE + f.length
        n[1] += 1
        out.new += f.nblocks
        out.new_bytes += RECORD_HEADER_SIZE + f.length
    c.executemany("UPDATE packs SET live = live + ?, records = records + ? WHERE id=?",
                  [(b, n, p) for p, (b, n) in live.items()])
    out.packed += len(records)
    return 0


def _delete(c: sqlite3.Connection, objid: bytes) -> Victim | None:
    """Forget one object version; if it was the last live record of its pack, the pack too (the
    Victim returned: its file is to be unlinked)."""
    row = c.execute("SELECT pack, length FROM packed WHERE objid=?", (objid,)).fetchone()
    c.execute("DELETE FROM entries WHERE objid=?", (objid,))
    c.execute("DELETE FROM verified WHERE objid=?", (objid,))
    if row is None:
        return None
    c.execute("DELETE FROM packed WHERE objid=?", (objid,))
    c.execute("UPDATE packs SET live = live - ?, records = records - 1 WHERE id=?",
              (RECORD_HEADER_SIZE + row[1], row[0]))
    left = c.execute("SELECT records, size FROM packs WHERE id=?", (row[0],)).fetchone()
    if left is None or left[0] > 0:
        return None
    return _delete_pack(c, row[0], left[1])


def _delete_pack(c: sqlite3.Connection, pack: int, size: int) -> Victim:
    """Forget a pack and every object it holds; the Victim whose file is to be unlinked."""
    c.execute("DELETE FROM verified WHERE objid IN (SELECT objid FROM entries WHERE pack=?)", (pack,))
    n = c.execute("DELETE FROM entries WHERE pack=?", (pack,)).rowcount
    c.execute("DELETE FROM packed WHERE pack=?", (pack,))
    c.execute("DELETE FROM packs WHERE id=?", (pack,))
    # (its appender may still account records it appended before: they must not bring it back)
    c.execute("INSERT OR REPLACE INTO removed_packs VALUES(?, ?)", (pack, time.time()))
    return Victim(b"", b"", size, True, pack, n)


def block_disk_bytes(size: int, index: int, block_size: int) -> int:
    """Bytes block ``index`` of an object of ``size`` bytes takes on disk (header + payload)."""
    return HEADER_SIZE + min(block_size, size - index * block_size)
