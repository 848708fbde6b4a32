"""The cache over local files: reads, validation, write-through, bad input."""

from __future__ import annotations

import io
import os
import random
import threading
from pathlib import Path

import pytest
from cachekit import blob

import manyfiles as mf
from manyfiles.cache import Cache
from manyfiles.cache._format import DESCRIPTOR

BS = 64 << 10          # the smallest block size: many blocks from small files
WHOLE_MAX = 4 * BS     # files up to this are read (and cached) whole; larger ones by block


@pytest.fixture
def cache(tmp_path: Path):
    c = Cache(tmp_path / "cache", min_free=0, block_size=BS, verify_whole_max=WHOLE_MAX)
    yield c
    c.close()


def _write(path: Path, data: bytes) -> bytes:
    path.write_bytes(data)
    return data


def _block_files(cache: Cache) -> list[str]:
    return [f for _, _, files in os.walk(os.path.join(cache.dir, "blocks")) for f in files]


def _whole_name(cache: Cache, path: Path) -> str:
    """The name of the whole file of ``path`` as it is now."""
    from manyfiles.cache._format import object_id
    from manyfiles.cache._origin import FileOrigin

    origin = FileOrigin(path)
    return object_id(origin.source, origin.stat().validator).hex() + ".w"


def test_reads_match_the_file_cold_warm_and_after_restart(tmp_path: Path, cache: Cache):
    path = tmp_path / "data.bin"
    data = _write(path, blob(5 * BS + 1234, "seq"))
    rng = random.Random(7)
    ops = [(rng.randrange(0, len(data) + 10), rng.choice([1, 100, 4096, BS, 3 * BS, len(data)]))
           for _ in range(60)]

    def replay(f) -> None:
        assert f.read(10) == data[:10]
        assert f.tell() == 10
        for pos, n in ops:
            f.seek(pos)
            assert f.read(n) == data[pos:pos + n], (pos, n)
            assert f.tell() == pos + len(data[pos:pos + n])
        f.seek(-5, io.SEEK_END)
        assert f.read() == data[-5:]
        f.seek(BS - 3)
        buf = bytearray(10)
        assert f.readinto(buf) == 10 and bytes(buf) == data[BS - 3:BS + 7]

    with mf.open(path, cache=cache) as f:
        replay(f)
    cache.flush()
    with mf.open(path, cache=cache) as f:       # warm: every block is on disk now
        replay(f)
    assert cache.get_bytes(path) == data
    first = cache.stats()
    assert first.entries == 1 and first.fills == 6 and first.hits > 0

    with Cache(cache.dir, min_free=0, verify_whole_max=WHOLE_MAX) as again:     # a restart: the same dir
        with again.open(path, buffering=0) as f:
            replay(f)
        assert again.get_bytes(str(path)) == data
        after = again.stats()
    assert after.misses == first.misses, "a restarted cache read something from the origin"
    assert after.hits > first.hits


def test_random_reads_fetch_only_the_blocks_touched(tmp_path: Path, cache: Cache):
    path = tmp_path / "big.bin"
    data = _write(path, blob(100 * BS, "big"))
    touched = set()
    with mf.open(path, cache=cache, buffering=0) as f:
        for pos in (37 * BS + 5, 3 * BS + 100, 88 * BS - 2048, 60 * BS + 7, 37 * BS + 9000):
            f.seek(pos)
            assert f.read(4096) == data[pos:pos + 4096]
            touched.update({pos // BS, (pos + 4095) // BS})
    cache.flush()
    s = cache.stats()
    assert s.misses == len(touched) == s.fills
    assert sorted(int(n.split(".")[1]) for n in _block_files(cache)) == sorted(touched)
    assert s.hits == 1          # the second read in block 37


def test_sequential_read_prefetches_and_fills_everything(tmp_path: Path, cache: Cache):
    path = tmp_path / "seq.bin"
    data = _write(path, blob(40 * BS + 1, "pf"))
    with mf.open(path, cache=cache) as f:
        chunks = []
        while chunk := f.read(10_000):
            chunks.append(chunk)
    assert b"".join(chunks) == data
    cache.flush()
    assert _block_files(cache) == [_whole_name(cache, path)], "streamed into one whole file"
    assert cache.get_bytes(path) == data


@pytest.mark.parametrize("change", ["in_place_same_mtime", "replaced_same_mtime", "appended"])
def test_a_changed_file_is_a_miss_with_the_new_bytes(tmp_path: Path, cache: Cache, change: str):
    path = tmp_path / "v.bin"
    old = _write(path, blob(3 * BS, "v1"))
    assert cache.get_bytes(path) == old
    cache.flush()
    st = os.stat(path)
    if change == "in_place_same_mtime":      # cp -p / touch -r: same size, same mtime, new bytes
        with open(path, "r+b") as f:
            f.write(blob(3 * BS, "v2"))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        new = path.read_bytes()
    elif change == "replaced_same_mtime":    # a new inode renamed over it
        tmp = tmp_path / "v.tmp"
        new = _write(tmp, blob(3 * BS, "v2"))
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.rename(tmp, path)
    else:
        with open(path, "ab") as f:
            f.write(b"more")
        new = old + b"more"
    assert cache.get_bytes(path) == new
    cache.flush()
    assert cache.get_bytes(path) == new
    s = cache.stats()
    assert s.entries == 1, "the old version was not dropped"
    assert _block_files(cache) == [], "a small file is packed, not a file of its own"
    assert [row[0] for row in cache._store.index._conn().execute("SELECT objid FROM packed")] == \
        [bytes.fromhex(_whole_name(cache, path)[:-2])], "the new version is the one packed"


def test_write_through_replaces_the_file_and_invalidates(tmp_path: Path):
    path = tmp_path / "w.bin"
    _write(path, b"old" * 1000)
    os.chmod(path, 0o640)
    with Cache(tmp_path / "c", min_free=0, block_size=BS, ttl=3600) as cache:
        assert cache.get_bytes(path) == b"old" * 1000
        cache.flush()
        with mf.open(path, "wb", cache=cache) as f:
            f.write(b"new" * 10)
            f.write(b"!")
            assert path.read_bytes() == b"old" * 1000, "written before close"
        assert path.read_bytes() == b"new" * 10 + b"!"
        assert os.stat(path).st_mode & 0o777 == 0o640
        # with a TTL nothing asks the file again: only the invalidation makes this right
        assert cache.get_bytes(path) == b"new" * 10 + b"!"

        with pytest.raises(RuntimeError), mf.open(path, "wb", cache=cache) as f:
            f.write(b"half")
            raise RuntimeError("writer failed")
        assert path.read_bytes() == b"new" * 10 + b"!"
    assert sorted(os.listdir(tmp_path)) == ["c", "w.bin"], "a temporary file was left"

    with mf.open(tmp_path / "fresh.bin", "wb") as f:     # no cache, a new file
        f.write(b"x")
    assert (tmp_path / "fresh.bin").read_bytes() == b"x"


def test_ttl_trusts_the_last_validation_for_its_duration(tmp_path: Path):
    path = tmp_path / "t.bin"
    data = _write(path, blob(2 * BS, "ttl"))
    with Cache(tmp_path / "c", min_free=0, block_size=BS, ttl=3600) as cache:
        assert cache.get_bytes(path) == data
        cache.flush()
    path.unlink()
    # A new process-like Cache: the validation time comes from the index, no stat is made.
    with Cache(tmp_path / "c", min_free=0, ttl=3600) as cache:
        assert cache.get_bytes(path) == data
    with Cache(tmp_path / "c", min_free=0) as cache, pytest.raises(mf.NotFound):
        cache.get_bytes(path)           # ttl=0: every open asks the origin


def test_odd_names_and_edge_sizes(tmp_path: Path, cache: Cache):
    folder = os.fsencode(tmp_path / "odd")
    os.mkdir(folder)
    names = [b"new\nline", b"caf\xe9-latin1", b"empty", b"one-byte", b"exact-block"]
    sizes = [BS + 1, 10, 0, 1, BS]
    content = {}
    for name, size in zip(names, sizes, strict=True):
        p = os.path.join(folder, name)
        with open(p, "wb") as f:
            f.write(blob(size, repr(name)))
        content[p] = blob(size, repr(name))
    report = cache.warm([folder])
    # the empty file is cached too: an empty whole file
    assert report.ok and report.objects == 5 and report.fetched == 5 and report.cached == 0
    for p, data in content.items():
        assert cache.get_bytes(p) == data
    again = cache.warm([folder])
    assert again.cached == 5 and again.fetched == 0
    with pytest.raises(mf.NotFound, match="no-such-file"):
        cache.get_bytes(tmp_path / "no-such-file")
    with pytest.raises(mf.UsageError, match="not a regular file"):
        cache.get_bytes(tmp_path)
    with pytest.raises(mf.UsageError, match="mode"):
        mf.open(tmp_path / "x", "r")
    with pytest.raises(mf.UsageError, match="only local paths and s3://"):
        mf.open("https://example.com/x", cache=cache)


def test_a_foreign_or_newer_directory_is_refused(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(mf.UsageError, match="not a manyfiles cache and not empty"):
        Cache(home)
    assert (home / "thesis.tex").read_text() == "precious"

    newer = tmp_path / "newer"
    Cache(newer).close()
    (newer / DESCRIPTOR).write_text('{"format": "manyfiles-cache/9", "block_size": 4194304}')
    with pytest.raises(mf.UsageError, match="manyfiles-cache/9 is not supported"):
        Cache(newer)

    other = tmp_path / "other"
    Cache(other, block_size=BS).close()
    with pytest.raises(mf.UsageError, match="block size"):
        Cache(other, block_size=2 * BS)
    with pytest.raises(mf.UsageError, match="block size"):
        Cache(tmp_path / "tiny", block_size=1000)


def test_threads_share_one_cache(tmp_path: Path, cache: Cache):
    files = {}
    for i in range(6):
        p = tmp_path / f"f{i}"
        files[p] = _write(p, blob(BS * (i + 1) + i, f"t{i}"))
    errors: list[BaseException] = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(30):
                p, data = rng.choice(list(files.items()))
                with mf.open(p, cache=cache) as f:
                    pos = rng.randrange(len(data))
                    n = rng.choice([10, BS, 2 * BS])
                    f.seek(pos)
                    assert f.read(n) == data[pos:pos + n]
                assert cache.get_bytes(p) == data
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    cache.flush()
    assert cache.stats().entries == 6


def test_a_forked_worker_uses_the_parents_cache(tmp_path: Path, cache: Cache):
    import multiprocessing

    files = {tmp_path / f"w{i}": _write(tmp_path / f"w{i}", blob(5 * BS + i, f"w{i}")) for i in range(4)}
    first = next(iter(files))
    assert cache.get_bytes(first) == files[first]    # the parent's threads exist now
    cache.flush()                                    # (else the worker may fetch it again: harmless)
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=_child_reads_and_returns, args=(cache, files))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the forked worker failed or hung"
    cache.flush()
    s = cache.stats()
    assert s.entries == 4, "the worker's fills did not reach the cache before it exited"
    blocks = sum(-(-len(d) // BS) for d in files.values())
    assert s.misses == s.fills == blocks, "each block fetched and stored once, by one process or the other"
    assert s.hits >= 5, "the worker did not read the parent's entry from the cache"


def _child_reads_and_returns(cache: Cache, files: dict) -> None:
    for p, data in files.items():
        with mf.open(p, cache=cache) as f:
            assert f.read() == data


def test_opening_an_existing_cache_takes_no_lock_while_another_process_writes(tmp_path: Path) -> None:
    """Every DataLoader worker opens the shared index while the others write their fills: opening a
    cache that exists must not wait for the write lock (it waited up to the busy timeout, then
    failed with 'database is locked', seen with 4 workers)."""
    import sqlite3

    d = tmp_path / "c"
    with Cache(d, min_free=0):
        pass
    writer = sqlite3.connect(d / "index.sqlite", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")             # another process in the middle of a write
    opened, outcome = threading.Event(), []

    def open_it() -> None:
        try:
            with Cache(d, min_free=0) as c:
                outcome.append(c.stats().entries)
        except Exception as exc:
            outcome.append(exc)
        finally:
            opened.set()

    threading.Thread(target=open_it, daemon=True).start()
    try:
        assert opened.wait(30), "Cache() waited for another writer's lock"
    finally:
        writer.execute("ROLLBACK")
        writer.close()
    assert outcome == [0]
