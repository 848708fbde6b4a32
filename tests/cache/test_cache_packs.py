"""Small objects packed (issue 27): records in a few pack files, crash-safe appends, eviction by
pack, ``cache verify`` of packs, and an old cache (format 1) upgraded in place."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cachekit import blob, cli

from manyfiles.cache import Cache
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Index, Version
from manyfiles.cache._origin import FileOrigin
from manyfiles.cache._packs import Packs
from manyfiles.errors import UsageError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import faults

KiB = 1 << 10


def _small_files(folder: Path, n: int, seed: str = "", lo: int = 1, hi: int = 8 * KiB) -> dict[str, bytes]:
    rng = random.Random(f"sizes:{seed}")
    out = {}
    for i in range(n):
        p = folder / f"{i // 100:02d}" / f"f{i:05d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        out[str(p)] = blob(rng.randint(lo, hi), f"{seed}{i}")
        p.write_bytes(out[str(p)])
    return out


def _all_files(root: str | Path) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]


def _kept_wrong(cache_dir: str, truth: dict[str, bytes]) -> list[str]:
    """Records the index names whose bytes are not those of the file version they name."""
    by_objid = {}
    for path, data in truth.items():
        origin = FileOrigin(path)
        by_objid[fmt.object_id(origin.source, origin.stat().validator)] = data
    with sqlite3.connect(os.path.join(cache_dir, fmt.INDEX)) as db:
        rows = db.execute("SELECT objid, pack, offset, length FROM packed").fetchall()
    wrong = []
    for objid, pack, offset, length in rows:
        with open(os.path.join(cache_dir, fmt.pack_relpath(pack)), "rb") as f:
            f.seek(offset)
            raw = f.read(fmt.RECORD_HEADER_SIZE + length)
        payload = raw[fmt.RECORD_HEADER_SIZE:]
        if not fmt.record_sound(raw, objid, offset, length) or payload != by_objid.get(objid):
            wrong.append(f"{objid.hex()} in pack {pack:016x} at {offset}")
    return wrong


def test_thousands_of_small_objects_are_a_few_files_and_read_back_exactly(tmp_path: Path):
    files = _small_files(tmp_path / "src", 3000)
    cache_dir = tmp_path / "cache"
    with Cache(cache_dir, min_free=0) as cache:
        report = cache.warm([str(tmp_path / "src")], jobs=4)
        assert (report.ok, report.fetched) == (True, 3000)
    on_disk = _all_files(cache_dir)
    assert len(on_disk) <= 10, f"{len(on_disk)} files for 3,000 objects: {sorted(on_disk)[:5]}..."
    with Cache(cache_dir, min_free=0) as cache:          # a restart: every object read from its record
        assert all(cache.get_bytes(p) == data for p, data in files.items())
        s = cache.stats()
        assert (s.entries, s.object_hits, s.object_misses) == (3000, 3000, 0)
        assert s.bytes == sum(os.path.getsize(p) for p in on_disk if p.endswith(".pack"))
        assert cache.verify().ok
    assert _kept_wrong(str(cache_dir), files) == []


def test_kill_9_during_packed_fills_never_serves_nor_keeps_a_wrong_byte(tmp_path: Path):
    """20 ``cache warm`` runs killed with -9 while they append to packs: half-written records (a
    torn append), records written but not accounted; and 6 more killed at random moments.  After
    each, every object reads back exactly, no record the index names is wrong, and ``cache verify``
    exits 0."""
    files = _small_files(tmp_path / "src", 400, hi=24 * KiB)
    cache_dir = str(tmp_path / "cache")
    Cache(cache_dir, min_free=0).close()
    rng = random.Random(27)
    exe = os.path.join(os.path.dirname(sys.executable), "manyfiles")
    kills = 0
    plan = ["pack-append", "pack-written", "pack-append", "timed"] * 6 + ["pack-append", "pack-written"]
    for round_, how in enumerate(plan):
        warm = ["cache", "warm", "--dir", cache_dir, "-j", "4", "-q", str(tmp_path / "src")]
        if how == "timed":
            proc = subprocess.Popen([exe, *warm], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            time.sleep(rng.uniform(0.1, 0.4))       # (a kill at a random moment of the run)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        else:
            argv = faults.command("manyfiles", *warm, kill_at=f"{how}:{rng.randint(1, 100)}")
            proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == -signal.SIGKILL:
            kills += how != "timed"
        else:
            assert proc.returncode == 0 and how == "timed", err.decode()
        assert _kept_wrong(cache_dir, files) == [], f"round {round_} ({how})"
        with Cache(cache_dir, min_free=0) as cache:
            picked = rng.sample(sorted(files), 40)
            assert all(cache.get_bytes(p) == files[p] for p in picked), f"round {round_} ({how})"
            cache.evict([p for p in files if rng.random() < 0.7])     # work for the next run
        if round_ % 5 == 4:
            r = cli("cache", "verify", "--dir", cache_dir, "--json")
            assert r.returncode == 0, r.stderr.decode()
            assert json.loads(r.stdout)["corrupt"] == 0
    assert kills == 20
    with Cache(cache_dir, min_free=0) as cache:
        assert all(cache.get_bytes(p) == data for p, data in files.items())
        assert cache.verify().ok
        s = cache.stats()
        # (a pack whose appender was killed before its first record was accounted is an orphan:
        # not counted, removed by verify once a minute old and free)
        accounted = cache._store.index.packs()
        assert s.bytes == sum(os.path.getsize(Path(cache_dir, fmt.pack_relpath(r.id))) for r in accounted)
        assert s.entries == 400


def test_eviction_frees_space_a_pack_at_a_time_and_keeps_the_hot_one(tmp_path: Path):
    files = _small_files(tmp_path / "src", 240, lo=30 * KiB, hi=34 * KiB)
    hot = next(iter(files))
    max_size = 2 << 20          # packs of max_size / 32 = 64 KiB: one or two records each
    with Cache(tmp_path / "c", max_size=max_size, min_free=0, low_water=0.75) as cache:
        for p, data in files.items():
            assert cache.get_bytes(p) == data
            assert cache.get_bytes(hot) == files[hot]
            cache.flush()
            s = cache.stats()
            packs = [f for f in _all_files(Path(cache.dir, fmt.PACKS)) if f.endswith(".pack")]
            assert s.bytes <= max_size and s.bytes == sum(os.path.getsize(f) for f in packs)
        assert s.evictions > 100 and s.fills_dropped == 0
        assert s.bytes >= 0.5 * max_size, "hysteresis: down to the low mark, not far below"
        hits = s.object_hits
        assert cache.get_bytes(hot) == files[hot]
        assert cache.stats().object_hits == hits + 1, "the hot object's pack was evicted"
        assert cache.verify().ok


def test_removing_every_record_of_a_pack_removes_the_pack(tmp_path: Path):
    files = _small_files(tmp_path / "src", 50)
    with Cache(tmp_path / "c", min_free=0) as cache:
        cache.warm([str(tmp_path / "src")])
        assert len(_all_files(Path(cache.dir, fmt.PACKS))) == 2       # one pack and the generation file
        r = cache.evict(list(files)[:49])
        assert (r.entries, r.bytes) == (49, 0), "records removed alone: their pack stays"
        r = cache.evict(list(files)[49:])
        assert r.entries == 1 and r.bytes > 0 and cache.stats().bytes == 0
        assert _all_files(Path(cache.dir, fmt.PACKS)) == [os.path.join(cache.dir, fmt.PACKS, "generation")]


def test_verify_drops_a_damaged_record_and_forgets_a_pack_gone(tmp_path: Path):
    files = _small_files(tmp_path / "src", 30)
    cache_dir = str(tmp_path / "c")
    with Cache(cache_dir, min_free=0) as cache:
        cache.warm([str(tmp_path / "src")])
    with sqlite3.connect(os.path.join(cache_dir, fmt.INDEX)) as db:
        pack, offset, length = db.execute("SELECT pack, offset, length FROM packed LIMIT 1").fetchone()
    with open(os.path.join(cache_dir, fmt.pack_relpath(pack)), "r+b") as f:       # bit rot at rest
        f.seek(offset + fmt.RECORD_HEADER_SIZE + length // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 1]))
    r = cli("cache", "verify", "--dir", cache_dir, "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["wrong"] == 1
    assert cli("cache", "verify", "--dir", cache_dir).returncode == 0, "repaired"
    with Cache(cache_dir, min_free=0) as cache:
        assert all(cache.get_bytes(p) == data for p, data in files.items())
        cache.flush()
        packs = cache._store.packs.files()
        assert len(packs) == 1
        os.unlink(next(iter(packs.values())))          # the pack file lost
        report = cache.verify()
        assert report.missing == 30 and cache.stats().entries == 0 and cache.stats().bytes == 0
        assert all(cache.get_bytes(p) == data for p, data in files.items())
    assert _kept_wrong(cache_dir, files) == []


def test_verify_keeps_a_pack_another_process_accounted_after_verify_listed_the_folder(tmp_path: Path):
    # Another process (a second Cache on the same folder, a pack of its own) creates a pack and accounts
    # its records right after verify listed the packs folder: the pack is in the index but not in the
    # listing, and it is a healthy pack, not a lost one.
    first = _small_files(tmp_path / "a", 20, "a")
    second = _small_files(tmp_path / "b", 20, "b")
    cache_dir = str(tmp_path / "c")
    with Cache(cache_dir, min_free=0) as verifier, Cache(cache_dir, min_free=0) as other:
        verifier.warm([str(tmp_path / "a")])
        verifier.flush()
        packs = verifier._store.packs
        real_listing = packs.files

        def listing_then_another_fill() -> dict[int, str]:
            listed = real_listing()
            other.warm([str(tmp_path / "b")])
            other.flush()
            return listed

        packs.files = listing_then_another_fill
        report = verifier.verify()
        assert (report.missing, report.wrong) == (0, 0)
        assert verifier.stats().entries == 40, "the other process's pack was taken for a lost one"
        assert all(other.get_bytes(p) == data for p, data in {**first, **second}.items())
    assert _kept_wrong(cache_dir, {**first, **second}) == []


def test_verify_judges_a_reread_record_before_an_eviction_can_remove_its_check(tmp_path: Path):
    # Verify's first read of a record met its pack's descriptor emptied (a removal elsewhere was in
    # flight: the payload read as nothing), so it reads the record again.  An eviction in another
    # process that removes the object between that reread and its judgement must not make verify take a
    # good record for a corrupt one: the judgement is made under the index's write lock, where such an
    # eviction cannot commit (it is tried with no wait: "database is locked").
    files = _small_files(tmp_path / "src", 10)
    cache_dir = str(tmp_path / "c")
    with Cache(cache_dir, min_free=0) as cache:
        cache.warm([str(tmp_path / "src")])
        cache.flush()
        store = cache._store
        real_sound = store.packed_sound
        evictions: list = []

        def sound_with_an_eviction_in_flight(objid: bytes, data: bytes) -> bool:
            if evictions[:1] not in ([], [objid]) or len(evictions) > 2:
                return real_sound(objid, data)                    # (the other records: as they are)
            if not evictions:
                evictions.append(objid)                           # the first read: an emptied descriptor
                return real_sound(objid, b"")
            elsewhere = sqlite3.connect(os.path.join(cache_dir, fmt.INDEX), timeout=0, isolation_level=None)
            try:
                elsewhere.execute("BEGIN IMMEDIATE")
                elsewhere.execute("DELETE FROM verified WHERE objid=?", (objid,))
                elsewhere.execute("DELETE FROM packed WHERE objid=?", (objid,))
                elsewhere.execute("DELETE FROM entries WHERE objid=?", (objid,))
                elsewhere.execute("COMMIT")
                evictions.append("evicted before the judgement")
            except sqlite3.OperationalError as exc:
                evictions.append(str(exc))
            finally:
                elsewhere.close()
            return real_sound(objid, data)

        store.packed_sound = sound_with_an_eviction_in_flight
        report = cache.verify()
        del store.packed_sound
        assert evictions[1:] == ["database is locked"], evictions
        assert (report.wrong, report.corrupt, report.failures) == (0, 0, []), report.failures
        assert report.blocks == 10 and cache.stats().entries == 10
    assert cli("cache", "verify", "--dir", cache_dir).returncode == 0
    with Cache(cache_dir, min_free=0) as cache:
        assert all(cache.get_bytes(p) == data for p, data in files.items())


def _old_cache(cache_dir: Path, files: dict[str, bytes]) -> None:
    """A cache as format 1 (index schema 2) left it: each object a whole file of its own."""
    cache_dir.mkdir()
    (cache_dir / "tmp").mkdir()
    (cache_dir / fmt.DESCRIPTOR).write_text(json.dumps({"format": "manyfiles-cache/1", "block_size": 4 << 20,
                                                        "layout": "2:2"}) + "\n")
    db = sqlite3.connect(cache_dir / fmt.INDEX, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript("""
        CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE entries(objid BLOB PRIMARY KEY, source BLOB NOT NULL, validator BLOB NOT NULL,
            size INTEGER NOT NULL, present BLOB NOT NULL, disk_bytes INTEGER NOT NULL,
            validated_at REAL NOT NULL, last_access REAL NOT NULL, whole INTEGER NOT NULL DEFAULT 0)
            WITHOUT ROWID;
        CREATE INDEX entries_source ON entries(source);
        CREATE INDEX entries_lru ON entries(last_access);
        CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL);
        CREATE TABLE verified(objid BLOB PRIMARY KEY, method TEXT NOT NULL, at REAL NOT NULL, claim TEXT)
            WITHOUT ROWID;
        INSERT INTO meta VALUES('schema', '2');
    """)
    names = ("hits", "misses", "hit_bytes", "miss_bytes", "fills", "fill_bytes", "fills_dropped", "evictions",
             "evicted_bytes", "corrupt", "object_hits", "object_misses", "entries", "bytes")
    db.executemany("INSERT INTO counters VALUES(?, 0)", [(n,) for n in names])
    import zlib

    from manyfiles.cache._origin import crc_claim

    for path, data in files.items():
        origin = FileOrigin(path)
        head = origin.stat()
        objid = fmt.object_id(origin.source, head.validator)
        whole = cache_dir / fmt.whole_relpath(objid)
        whole.parent.mkdir(parents=True, exist_ok=True)
        whole.write_bytes(data)
        now = time.time()
        db.execute("INSERT INTO entries VALUES(?, ?, ?, ?, ?, ?, ?, ?, 1)",
                   (objid, origin.source, head.validator, len(data), b"\x01", len(data), now, now))
        db.execute("INSERT INTO verified VALUES(?, 'size-only', ?, ?)",
                   (objid, now, json.dumps(crc_claim(zlib.crc32(data)), sort_keys=True)))
    db.execute("UPDATE counters SET value=? WHERE name='entries'", (len(files),))
    db.execute("UPDATE counters SET value=? WHERE name='bytes'", (sum(map(len, files.values())),))
    db.close()


def test_a_cache_of_the_old_format_is_upgraded_in_place_and_read(tmp_path: Path):
    old = _small_files(tmp_path / "old", 20)
    new = _small_files(tmp_path / "new", 20, seed="n")
    cache_dir = tmp_path / "cache"
    _old_cache(cache_dir, old)
    with Cache(cache_dir, min_free=0) as cache:
        assert all(cache.get_bytes(p) == data for p, data in old.items())
        assert cache.stats().object_misses == 0, "the old whole files were read, not the origin"
        assert all(cache.get_bytes(p) == data for p, data in new.items())
        cache.flush()
        assert len(cache._store.index.packs()) == 1, "new small objects are packed"
        report = cache.verify()
        assert report.ok and (report.entries, report.unverifiable) == (40, 40)
    desc = json.loads((cache_dir / fmt.DESCRIPTOR).read_text())
    assert desc["format"] == fmt.FORMAT == "manyfiles-cache/2"
    with sqlite3.connect(cache_dir / fmt.INDEX) as db:
        assert db.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("3",)


def test_a_cache_of_a_newer_format_is_refused_not_misread(tmp_path: Path):
    cache_dir = tmp_path / "cache"
    Cache(cache_dir, min_free=0).close()
    desc = json.loads((cache_dir / fmt.DESCRIPTOR).read_text())
    (cache_dir / fmt.DESCRIPTOR).write_text(json.dumps({**desc, "format": "manyfiles-cache/3"}))
    with pytest.raises(UsageError, match="cache format manyfiles-cache/3 is not supported"):
        Cache(cache_dir, min_free=0)
    r = cli("cache", "stats", "--dir", str(cache_dir))
    assert r.returncode == 2 and b"Traceback" not in r.stderr


def _one_pack_store(root: Path) -> tuple[Index, Packs]:
    root.mkdir()
    index = Index(str(root / fmt.INDEX), 1 << 20)
    return index, Packs(str(root), index)


def _version(name: str, data: bytes) -> Version:
    return Version(name.encode().ljust(16, b"."), name.encode(), b"v1", len(data), time.time())


def test_records_accounted_after_their_pack_was_removed_do_not_bring_it_back(tmp_path: Path):
    # The appender's second record was appended before it heard that its first one gave the pack
    # its row; the pack is then evicted (its file unlinked) before the second is accounted.
    index, packs = _one_pack_store(tmp_path / "c")
    first = packs.append(_version("a", b"x" * 100), b"x" * 100, "sha256", "{}", 1)
    second = packs.append(_version("b", b"y" * 100), b"y" * 100, "sha256", "{}", 1)
    assert index.record_fills([first], time.time()).packs_seen == {first.pack}
    index.reconcile_packs([first.pack], lambda pack: None)          # (its file found gone)
    packs.unlink(first.pack)
    out = index.record_fills([second], time.time())
    assert out.lost_packs == {first.pack}
    assert index.packs() == [] and index.packed(second.version.objid) is None, "a row for a file gone"


def test_a_pack_not_accounted_yet_stays_readable_when_another_pack_is_removed(tmp_path: Path):
    index, packs = _one_pack_store(tmp_path / "c")
    data = b"z" * 300
    packed = packs.append(_version("a", data), data, "sha256", "{}", 1)
    loc = packs.locate(packed.version.objid)
    assert packs.read(loc) == data
    packs.removed(1)                              # another process removed a pack of its own
    assert packs.read(loc) == data, "its own pending record taken for gone"
    index.record_fills([packed], time.time())
    assert packs.read(packs.locate(packed.version.objid)) == data
