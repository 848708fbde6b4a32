"""What the cache keeps for reading offline, beside its blocks: the last listing of each prefix, and
the versions seen to supersede the cached ones.

One SQLite file of its own, ``DIR/listings.sqlite`` (WAL), apart from the index (_index.py): the
block store never reads it, and dropping it loses only the offline answers.

* ``listings``: a listing (the objects' keys, sizes, ETags, mtimes, as one compressed JSON) under
  its key (endpoint, bucket, prefix, delimiter), replaced by every successful listing of it;
* ``seen``: a source whose validation found a version other than the one cached (the object
  changed, the new version not cached yet): offline, the older cached version is not served.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import zlib
from typing import NamedTuple

NAME = "listings.sqlite"
NAMES = frozenset({NAME, NAME + "-wal", NAME + "-shm", NAME + "-journal"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS listings(key TEXT PRIMARY KEY, at REAL NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS seen(source BLOB PRIMARY KEY, validator BLOB NOT NULL, at REAL NOT NULL)
    WITHOUT ROWID;
"""


class KeptObject(NamedTuple):
    """One object (or, ``size`` None, one common prefix) of a kept listing."""

    key: str
    size: int | None
    etag: str | None
    mtime: float | None


class KeptListing(NamedTuple):
    """A listing: its objects (in the listing's order), when it was made, and, when it is the kept
    one served offline, why (else None)."""

    objects: list[KeptObject]
    listed_at: float
    offline: str | None = None


class Kept:
    """The kept listings and superseding versions of one cache directory."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, NAME)
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def keep(self, key: str, objects: list[KeptObject], at: float) -> None:
        """Keep ``objects`` as the listing ``key`` made at ``at`` (an older one is not kept over a newer)."""
        data = zlib.compress(json.dumps([list(o) for o in objects], separators=(",", ":")).encode(), 1)
        c = self._conn()
        c.execute("INSERT INTO listings VALUES(?, ?, ?) ON CONFLICT(key) DO UPDATE SET at=excluded.at, "
                  "data=excluded.data WHERE excluded.at >= listings.at", (key, at, data))

    def listing(self, key: str) -> tuple[list[KeptObject], float] | None:
        """The kept listing ``key`` and when it was made, or None."""
        row = self._conn().execute("SELECT at, data FROM listings WHERE key=?", (key,)).fetchone()
        if row is None:
            return None
        return [KeptObject(*o) for o in json.loads(zlib.decompress(row[1]))], row[0]

    def supersede(self, source: bytes, validator: bytes, at: float | None = None) -> None:
        """``source`` was validated at ``validator`` (not the version the cache holds)."""
        self._conn().execute("INSERT OR REPLACE INTO seen VALUES(?, ?, ?)",
                             (source, validator, time.time() if at is None else at))

    def superseded(self, source: bytes) -> tuple[bytes, float] | None:
        """The version last seen of ``source`` when it was not the cached one: (validator, when)."""
        row = self._conn().execute("SELECT validator, at FROM seen WHERE source=?", (source,)).fetchone()
        return None if row is None else (row[0], row[1])

    def clear(self) -> None:
        if not os.path.exists(self.path):
            return
        c = self._conn()
        c.execute("DELETE FROM listings")
        c.execute("DELETE FROM seen")
