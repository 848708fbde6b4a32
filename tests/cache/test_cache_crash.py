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
from manyfiles.cache._format import HEADER_SIZE, block_relpath, object_id

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

    with Cache(cache_dir, settings=s3.settings) as cache:
        with ThreadPoolExecutor(8) as pool:
            got = dict(zip(objs, pool.map(lambda k: cache.get_bytes(s3.url(k)), objs), strict=True))
        for key, data in objs.items():
            assert got[key] == data, key
        report = cache.verify()
    assert report.corrupt == 0 and report.orphans == 0, report


def test_kill_9_during_warm_never_leaves_a_wrong_byte(tmp_path: Path, s3):
    objs = _seed_mixed(s3)
    cache_dir = str(tmp_path / "cache")
    Cache(cache_dir, block_size=BS).close()
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
        with Cache(cache_dir, settings=s3.settings) as cache:
            gone = rng.sample(sorted(objs), k=2 * len(objs) // 3)
            cache.evict([s3.url(k) for k in gone])
            if round_ % 5 == 4:
                cache.clear()
    assert kills >= 20, f"only {kills} runs were killed before they finished"


def test_two_processes_filling_the_same_entries(tmp_path: Path, s3):
    objs = _seed_mixed(s3)
    cache_dir = str(tmp_path / "cache")
    Cache(cache_dir, block_size=BS).close()
    code = f"""
        import json, random, sys
        from manyfiles.cache import Cache
        keys = {sorted(objs)!r}
        random.Random(int(sys.argv[1])).shuffle(keys)
        with Cache({cache_dir!r}) as cache:
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
    with Cache(cache_dir) as cache:
        s = cache.stats()
        on_disk = sum(os.path.getsize(os.path.join(d, f))
                      for d, _, files in os.walk(os.path.join(cache_dir, "blocks")) for f in files)
    assert s.entries == len(objs)
    assert s.bytes == on_disk == sum(len(d) + HEADER_SIZE * -(-len(d) // BS) for d in objs.values())


def _block_file(cache: Cache, s3, key: str, index: int) -> str:
    from manyfiles.cache._origin import S3Origin

    origin = S3Origin(s3.bucket, key, s3.settings)
    validator, _ = origin.stat()
    return os.path.join(cache.dir, block_relpath(object_id(origin.source, validator), index))


def test_a_flipped_byte_is_caught_by_verify_and_fetched_again(tmp_path: Path, s3):
    data = s3.put("f.bin", blob(3 * BS, "flip"))
    url = s3.url("f.bin")
    with Cache(tmp_path / "c", block_size=BS, settings=s3.settings) as cache:
        cache.warm([url])
        path = _block_file(cache, s3, "f.bin", 1)
    with open(path, "r+b") as f:                # one bit rot in the payload of block 1
        f.seek(HEADER_SIZE + 1000)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 1000)
        f.write(bytes([byte[0] ^ 0x01]))
    gets = len(s3.gets())
    with Cache(tmp_path / "c", verify=True, settings=s3.settings) as cache:
        with pytest.warns(RuntimeWarning, match="corrupt cache block"):
            assert cache.get_bytes(url) == data
        assert cache.stats().corrupt == 1
        assert len(s3.gets()) == gets + 1, "only the bad block is fetched again"
        cache.flush()
        assert cache.get_bytes(url) == data
    assert len(s3.gets()) == gets + 1

    # verify() finds the same damage without reading through the cache
    with open(path, "r+b") as f:
        f.seek(HEADER_SIZE + 7)
        f.write(b"\xff\xfe")
    with Cache(tmp_path / "c", settings=s3.settings) as cache:
        report = cache.verify()
        assert report.corrupt == 1 and report.blocks == 2 and not os.path.exists(path)
        assert cache.get_bytes(url) == data
        cache.flush()
        assert cache.verify().corrupt == 0


def test_a_truncated_or_foreign_block_is_a_miss_even_without_verify(tmp_path: Path, s3):
    data = s3.put("t.bin", blob(3 * BS, "trunc"))
    url = s3.url("t.bin")
    with Cache(tmp_path / "c", block_size=BS, settings=s3.settings) as cache:
        cache.warm([url])
        b0, b2 = _block_file(cache, s3, "t.bin", 0), _block_file(cache, s3, "t.bin", 2)
    os.truncate(b2, HEADER_SIZE + 100)             # a short block
    with open(b2.replace(".2", ".1"), "rb") as f:
        header_of_block_1 = f.read(HEADER_SIZE)
    with open(b0, "r+b") as f:                     # block 0's file now claims to be another block
        f.write(header_of_block_1)
    with Cache(tmp_path / "c", settings=s3.settings) as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cache.get_bytes(url) == data
        assert cache.stats().corrupt == 2


def test_leftovers_of_killed_processes_are_cleaned(tmp_path: Path, s3):
    data = s3.put("o.bin", blob(2 * BS, "orphan"))
    cache_dir = tmp_path / "c"
    with Cache(cache_dir, block_size=BS, settings=s3.settings) as cache:
        cache.warm([s3.url("o.bin")])
        block = _block_file(cache, s3, "o.bin", 1)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = cache_dir / "tmp" / f"{dead}-1-0"
    stale.write_bytes(b"half a block")
    orphan = cache_dir / "blocks" / "00" / "11" / ("0011" + "ab" * 14 + ".0")
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x" * 100)
    os.utime(orphan, (time.time() - 3600, time.time() - 3600))
    with Cache(cache_dir, settings=s3.settings) as cache:
        assert not stale.exists(), "a dead process's temp file survived a restart"
        # forget block 1 in the index only: as if the kill came between rename and accounting
        v = cache.version(cache.origin(s3.url("o.bin")))
        cache._store.index.drop_blocks(v.objid, [1])
        report = cache.verify()
        assert report.orphans == 1 and report.adopted == 1 and report.corrupt == 0
        assert not orphan.exists() and os.path.exists(block)
        assert cache.stats().bytes == 2 * (BS + HEADER_SIZE)
        assert cache.get_bytes(s3.url("o.bin")) == data


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
cache = Cache({cache_dir!r}, block_size={BS})
assert cache.warm([{str(folder)!r}]).ok
cache.flush()
os.kill(os.getpid(), signal.SIGKILL)   # no close(), no atexit: the index must already hold it all
"""], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    with Cache(cache_dir) as cache:
        before = cache.stats()
        for p, d in files.items():
            assert cache.get_bytes(p) == d
        after = cache.stats()
    assert before.entries == sum(1 for d in files.values() if d)
    assert after.misses == before.misses
