"""Crash safety and concurrency: kill -9 during warm, two processes filling at once, bad blocks."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from cachekit import blob

from manyfiles.cache import Cache
from manyfiles.cache._format import HEADER_SIZE, RECORD_HEADER_SIZE, block_relpath, object_id

BS = 256 << 10


def _seed_mixed(s3) -> dict[str, bytes]:
    """Small objects, multi-block single-part objects (MD5 ETag: one GET) and a multipart one
    (no MD5 ETag: ranged GETs per block)."""
    objs = {}
    for i in range(30):
        objs[f"d/s{i:02d}"] = s3.put(f"d/s{i:02d}", blob(3000 + 1500 * i, f"s{i}"))
    for i in range(4):
        objs[f"d/m{i}"] = s3.put(f"d/m{i}", blob(3 * BS + 11 * i, f"m{i}"))
    big = blob((5 << 20) + 3 * BS + 5, "mp")
    up = s3.admin.create_multipart_upload(Bucket=s3.bucket, Key="d/multipart")
    parts = []
    for n, (a, b) in enumerate([(0, 5 << 20), (5 << 20, len(big))], start=1):
        r = s3.admin.upload_part(Bucket=s3.bucket, Key="d/multipart", UploadId=up["UploadId"], PartNumber=n,
                                 Body=big[a:b])
        parts.append({"ETag": r["ETag"], "PartNumber": n})
    s3.admin.complete_multipart_upload(Bucket=s3.bucket, Key="d/multipart", UploadId=up["UploadId"],
                                       MultipartUpload={"Parts": parts})
    objs["d/multipart"] = big
    return objs


def _check_all(cache_dir: str, s3, objs: dict[str, bytes]) -> None:
    """Read every object through the cache (8 threads) and check it; then nothing on disk is torn."""
    from concurrent.futures import ThreadPoolExecutor

    with Cache(cache_dir, min_free=0, settings=s3.settings) as cache:
        with ThreadPoolExecutor(8) as pool:
            got = dict(zip(objs, pool.map(lambda k: cache.get_bytes(s3.url(k)), objs), strict=True))
        for key, data in objs.items():
            assert got[key] == data, key
        report = cache.verify()
    assert report.corrupt == 0 and report.orphans == 0, report


def test_kill_9_during_warm_never_leaves_a_wrong_byte(tmp_path: Path, s3):
    objs = _seed_mixed(s3)
    cache_dir = str(tmp_path / "cache")
    Cache(cache_dir, min_free=0, block_size=BS).close()
    exe = os.path.join(os.path.dirname(sys.executable), "manyfiles")
    rng = random.Random(1234)
    kills = 0
    for round_ in range(22):
        s3.proxy.delay = 0.02
        gets = len(s3.gets())
        proc = subprocess.Popen([exe, "cache", "warm", "--dir", cache_dir, "-j", "2", s3.url("d/")],
                                env={**os.environ, **s3.env}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        # Kill at a random point of the fill: after a random number of GETs, plus a little.
        target = rng.randint(1, 15)
        deadline = time.monotonic() + 60
        while len(s3.gets()) - gets < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.03))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        s3.proxy.delay = 0.0
        # Every read after the kill is right, and nothing torn is on disk.
        _check_all(cache_dir, s3, objs)
        # Keep a random third so that the next warm has both work and entries to skip.
        with Cache(cache_dir, min_free=0, settings=s3.settings) as cache:
            gone = rng.sample(sorted(objs), k=2 * len(objs) // 3)
            cache.evict([s3.url(k) for k in gone])
            if round_ % 5 == 4:
                cache.clear()
    assert kills >= 20, f"only {kills} runs were killed before they finished"


def test_two_processes_filling_the_same_entries(tmp_path: Path, s3):
    objs = _seed_mixed(s3)
    cache_dir = str(tmp_path / "cache")
    Cache(cache_dir, min_free=0, block_size=BS).close()
    code = f"""
        import json, random, sys
        from manyfiles.cache import Cache
        keys = {sorted(objs)!r}
        random.Random(int(sys.argv[1])).shuffle(keys)
        with Cache({cache_dir!r}, min_free=0) as cache:
            for k in keys:                       # lazy fills, sequential and random reads
                with cache.open("s3://{s3.bucket}/" + k) as f:
                    f.read()
            cache.warm(["s3://{s3.bucket}/" + k for k in keys], jobs=3)
        print(json.dumps({{}}))
    """
    env = {**os.environ, **s3.env}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(seed)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for seed in (1, 2)]
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err.decode()
    _check_all(cache_dir, s3, objs)
    with Cache(cache_dir, min_free=0) as cache:
        s = cache.stats()
        files = sum(os.path.getsize(os.path.join(d, f))
                    for d, _, files in os.walk(os.path.join(cache_dir, "blocks")) for f in files)
        packs = cache._store.index.packs()
        records = sum(r.records for r in packs)
        live = sum(r.live for r in packs)
    on_disk = files + sum(os.path.getsize(p) for p in Path(cache_dir, "packs").glob("*.pack"))
    assert s.entries == len(objs) and records == 34, "the objects up to 1 MiB are packed, the other is a file"
    assert s.bytes == on_disk, "the counter is what the files take"
    assert files + live == sum(len(d) for d in objs.values()) + RECORD_HEADER_SIZE * records, \
        "each object held whole, once (a record two processes appended at once is dead bytes)"


def _large_file_in_blocks(tmp_path: Path, blocks: list[int]) -> tuple[Path, bytes, Cache]:
    """A local file larger than ``verify_whole_max``, of which random reads cached ``blocks``
    (block files with headers: what an object held in part looks like on disk)."""
    path = tmp_path / "big.bin"
    data = blob(8 * BS + 5, "big")
    path.write_bytes(data)
    cache = Cache(tmp_path / "c", min_free=0, block_size=BS, verify_whole_max=2 * BS)
    with cache.open(path, buffering=0) as f:
        for i in blocks:
            f.seek(i * BS + 1)
            assert f.read(10) == data[i * BS + 1:i * BS + 11]
    cache.flush()
    return path, data, cache


def _block_file(cache: Cache, path: Path, index: int) -> str:
    from manyfiles.cache._origin import FileOrigin

    origin = FileOrigin(path)
    return os.path.join(cache.dir, block_relpath(object_id(origin.source, origin.stat().validator), index))


def test_a_flipped_byte_in_a_block_is_caught_by_verify_and_fetched_again(tmp_path: Path):
    path, data, cache = _large_file_in_blocks(tmp_path, [1, 2])
    cache.close()
    block = _block_file(cache, path, 1)
    with open(block, "r+b") as f:               # one bit rot in the payload of block 1
        f.seek(HEADER_SIZE + 1000)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 1000)
        f.write(bytes([byte[0] ^ 0x01]))
    with Cache(tmp_path / "c", min_free=0, verify=True, verify_whole_max=2 * BS) as cache:
        before = cache.stats()
        with cache.open(path, buffering=0) as f, pytest.warns(RuntimeWarning, match="corrupt cache file"):
            f.seek(BS)
            assert f.read(2 * BS) == data[BS:3 * BS]
        s = cache.stats()
        assert (s.corrupt, s.misses - before.misses, s.hits - before.hits) == (1, 1, 1), \
            "only the bad block was read again"
    # verify() finds the same damage without reading through the cache
    with open(block, "r+b") as f:
        f.seek(HEADER_SIZE + 7)
        f.write(b"\xff\xfe")
    with Cache(tmp_path / "c", min_free=0, verify_whole_max=2 * BS) as cache:
        report = cache.verify()
        assert (report.corrupt, report.wrong, report.blocks) == (1, 1, 1) and not os.path.exists(block)
        assert not report.ok and report.failures[0].reason == "1 cached blocks failed their CRC-32: dropped"
        assert cache.verify().ok


def test_a_truncated_or_foreign_block_is_a_miss_even_without_verify(tmp_path: Path):
    path, data, cache = _large_file_in_blocks(tmp_path, [0, 1, 2])
    cache.close()
    b0, b1, b2 = (_block_file(cache, path, i) for i in range(3))
    os.truncate(b2, HEADER_SIZE + 100)             # a short block
    with open(b1, "rb") as f:
        header_of_block_1 = f.read(HEADER_SIZE)
    with open(b0, "r+b") as f:                     # block 0's file now claims to be another block
        f.write(header_of_block_1)
    with Cache(tmp_path / "c", min_free=0, verify_whole_max=2 * BS) as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with cache.open(path, buffering=0) as f:
            assert f.read(3 * BS) == data[:3 * BS]
        assert cache.stats().corrupt == 2


def test_leftovers_of_killed_processes_are_cleaned(tmp_path: Path):
    path, data, cache = _large_file_in_blocks(tmp_path, [0, 1])
    cache_dir = tmp_path / "c"
    block = _block_file(cache, path, 1)
    cache.close()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = cache_dir / "tmp" / f"{dead}-1-0"
    stale.write_bytes(b"half a block")
    orphans = [cache_dir / "blocks" / "00" / "11" / ("0011" + "ab" * 14 + suffix) for suffix in (".0", ".w")]
    orphans[0].parent.mkdir(parents=True)
    for orphan in orphans:
        orphan.write_bytes(b"x" * 100)
        os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    with Cache(cache_dir, min_free=0, verify_whole_max=2 * BS) as cache:
        assert not stale.exists(), "a dead process's temp file survived a restart"
        # forget block 1 in the index only: as if the kill came between rename and accounting
        v = cache.version(cache.origin(path))
        cache._store.index.drop_blocks(v.objid, [1])
        report = cache.verify()
        assert report.orphans == 2 and report.adopted == 1 and report.corrupt == 0
        assert not any(o.exists() for o in orphans) and os.path.exists(block)
        assert cache.stats().bytes == 2 * (BS + HEADER_SIZE)
        assert cache.get_bytes(path) == data


def test_restart_keeps_every_complete_entry(tmp_path: Path):
    folder = tmp_path / "src"
    folder.mkdir()
    files = {folder / f"f{i}": blob(BS * (i % 3) + 100 * i, f"r{i}") for i in range(20)}
    for p, d in files.items():
        p.write_bytes(d)
    cache_dir = str(tmp_path / "c")
    proc = subprocess.run([sys.executable, "-c", f"""
import os, signal
from manyfiles.cache import Cache
cache = Cache({cache_dir!r}, min_free=0, block_size={BS})
assert cache.warm([{str(folder)!r}]).ok
cache.flush()
os.kill(os.getpid(), signal.SIGKILL)   # no close(), no atexit: the index must already hold it all
"""], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Cache(cache_dir, min_free=0) as cache:
        before = cache.stats()
        for p, d in files.items():
            assert cache.get_bytes(p) == d
        after = cache.stats()
    assert before.entries == len(files), "every file, the empty ones too, is held whole"
    assert after.misses == before.misses
