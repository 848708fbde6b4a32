"""No wrong byte served or kept: every read pattern of the cache through a proxy that flips bytes,
lies about ranges and lies in its HEADs (issue 16).

Objects of each kind (an MD5 ETag, a CRC32 checksum, a multipart ETag, multipart with per-part
checksums), small (up to ``verify_whole_max``: checked whole before any byte is served) and
large.  Every test asserts on the bytes *served* (each read against the truth) and on the bytes
*kept* (every file in the cache directory against the object it names, then a new process
reading everything with the faults off).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import struct
import threading
from pathlib import Path

import pytest
from cachekit import blob, cli, run_python

import manyfiles as mf
from manyfiles.cache import Cache
from manyfiles.cache._format import HEADER_SIZE, RECORD_HEADER_SIZE, object_id, unpack_header
from manyfiles.cache._origin import S3Origin
from manyfiles.cache._packs import PACK_MAX_OBJECT
from manyfiles.s3 import RetryPolicy

BS = 64 << 10
WHOLE_MAX = 4 * BS
MiB = 1 << 20
# many attempts: at P = 0.5 a read must get through, the faults are what is tested
PATIENT = RetryPolicy(attempts=10, base=0.001, cap=0.01)
CONTENT_LIES = ("flip", "wrong-range")


def _plain_client(s3):
    """An uploader that sends no flexible checksum: the object then has only its ETag to check."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=s3.admin.meta.endpoint_url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(request_checksum_calculation="when_required"))


def _multipart(s3, key: str, parts: list[bytes], checksum: str | None = None) -> bytes:
    client = s3.admin if checksum else _plain_client(s3)
    extra = {"ChecksumAlgorithm": checksum} if checksum else {}
    up = client.create_multipart_upload(Bucket=s3.bucket, Key=key, **extra)
    done = []
    for i, body in enumerate(parts, 1):
        r = client.upload_part(Bucket=s3.bucket, Key=key, UploadId=up["UploadId"], PartNumber=i, Body=body,
                               **extra)
        part = {"ETag": r["ETag"], "PartNumber": i}
        if checksum:
            part[f"Checksum{checksum}"] = r[f"Checksum{checksum}"]
        done.append(part)
    client.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up["UploadId"],
                                     MultipartUpload={"Parts": done})
    return b"".join(parts)


def _seed(s3, which: str = "all") -> dict[str, bytes]:
    """key -> bytes: small and large objects of every kind of check."""
    objs = {}
    if which in ("all", "small"):
        objs["small-md5.bin"] = blob(200_000, "sm")
        _plain_client(s3).put_object(Bucket=s3.bucket, Key="small-md5.bin", Body=objs["small-md5.bin"])
        objs["small-crc.bin"] = s3.put("small-crc.bin", blob(WHOLE_MAX, "sc"))
    if which in ("all", "large"):
        objs["large-md5.bin"] = blob(12 * BS + 333, "lm")
        _plain_client(s3).put_object(Bucket=s3.bucket, Key="large-md5.bin", Body=objs["large-md5.bin"])
        objs["large-crc.bin"] = s3.put("large-crc.bin", blob(9 * BS + 1, "lc"))
    if which in ("all", "multipart"):
        objs["large-mp.bin"] = _multipart(s3, "large-mp.bin", [blob(5 * MiB, "mp1"), blob(BS + 99, "mp2")])
    return objs


def _cache(tmp_path: Path, s3, **kw) -> Cache:
    return Cache(tmp_path / "cache", min_free=0, block_size=BS, verify_whole_max=WHOLE_MAX,
                 settings=s3.settings, retry=PATIENT, **kw)


def _lie(s3, p: float = 0.5, kinds: tuple[str, ...] = CONTENT_LIES) -> None:
    """From now on, each object GET gets one of ``kinds`` with probability ``p``."""
    s3.proxy.random_faults = (p, kinds, lambda m, path, h: m == "GET" and "list-type" not in path)


def _truth_by_objid(s3, objs: dict[str, bytes]) -> dict[bytes, bytes]:
    """objid -> bytes of the version now on the server, as the cache names it."""
    out = {}
    for key, data in objs.items():
        etag = s3.admin.head_object(Bucket=s3.bucket, Key=key)["ETag"]
        source = f"s3+{s3.settings.endpoint_url}/{s3.bucket}/{key}".encode()
        out[object_id(source, S3Origin.validator(etag, len(data)))] = data
    return out


def _kept_wrong(cache_dir: Path, truth: dict[bytes, bytes]) -> list[str]:
    """Files in the cache whose bytes are not those of the object version they name, and records
    the index names in packs whose bytes are not those of their object."""
    import sqlite3

    wrong = []
    with contextlib.closing(sqlite3.connect(cache_dir / "index.sqlite")) as db:
        records = db.execute("SELECT objid, pack, offset, length FROM packed").fetchall()
    for objid, pack, offset, length in records:
        with open(cache_dir / "packs" / f"{pack:016x}.pack", "rb") as f:
            f.seek(offset + RECORD_HEADER_SIZE)
            if f.read(length) != truth.get(objid):
                wrong.append(f"{objid.hex()}: record in pack {pack:016x} differs")
    for folder, _, files in os.walk(cache_dir / "blocks"):
        for name in files:
            hexid, _, n = name.partition(".")
            data = truth.get(bytes.fromhex(hexid))
            raw = Path(folder, name).read_bytes()
            if data is None:
                wrong.append(f"{name}: a file of no version on the server")
            elif n == "w":
                if raw != data:
                    wrong.append(f"{name}: whole file differs")
            else:
                h = unpack_header(raw)
                if h is None or raw[HEADER_SIZE:] != data[h.offset:h.offset + h.length]:
                    wrong.append(f"{name}: block {n} differs (checked={h.checked if h else None})")
    return wrong


def _reread_in_a_new_process(cache_dir: Path, s3, objs: dict[str, bytes], **options) -> dict:
    """A new process reads every object through the cache (faults off): which were exact."""
    digests = {k: __import__("hashlib").sha256(v).hexdigest() for k, v in objs.items()}
    return run_python(f"""
        import hashlib, json
        from manyfiles.cache import Cache
        from manyfiles.s3 import ClientSettings, RetryPolicy
        settings = ClientSettings(endpoint_url={s3.settings.endpoint_url!r}, region="us-east-1")
        with Cache({str(cache_dir)!r}, min_free=0, settings=settings, verify_whole_max={WHOLE_MAX},
                   retry=RetryPolicy(attempts=2, base=0.001), **{options!r}) as cache:
            ok = {{k: hashlib.sha256(cache.get_bytes("s3://{s3.bucket}/" + k)).hexdigest() == d
                  for k, d in {json.dumps(digests)}.items()}}
            hits = cache.stats().hits
        print(json.dumps({{"ok": ok, "hits": hits}}))
    """)


class Served:
    """Counts what reads handed out: wrong bytes per object, errors (refusals are fine)."""

    def __init__(self, objs: dict[str, bytes]) -> None:
        self.objs = objs
        self.wrong: dict[str, int] = {}
        self.reads = self.errors = 0
        self.lock = threading.Lock()

    def check(self, key: str, pos: int, got: bytes) -> None:
        want = self.objs[key][pos:pos + len(got)]
        bad = sum(a != b for a, b in zip(got, want, strict=True)) if got != want else 0
        with self.lock:
            self.reads += 1
            if bad:
                self.wrong[key] = self.wrong.get(key, 0) + bad

    def refused(self) -> None:
        with self.lock:
            self.errors += 1

    def wrong_small(self) -> dict[str, int]:
        return {k: n for k, n in self.wrong.items() if len(self.objs[k]) <= WHOLE_MAX}


def _read(pattern: str, cache: Cache, s3, key: str, served: Served, rng: random.Random) -> None:
    data = served.objs[key]
    try:
        if pattern == "get_bytes":
            served.check(key, 0, cache.get_bytes(s3.url(key)))
            return
        with mf.open(s3.url(key), cache=cache) as f:
            if pattern == "whole":
                served.check(key, 0, f.read())
            elif pattern == "sequential":
                pos = 0
                while chunk := f.read(10_000):
                    served.check(key, pos, chunk)
                    pos += len(chunk)
            else:                                  # random seek + read, across block boundaries
                for _ in range(12):
                    pos = rng.randrange(len(data))
                    f.seek(pos)
                    served.check(key, pos, f.read(rng.choice([1, 4096, BS + 7])))
    except mf.ManyfilesError:
        served.refused()


PATTERNS = ("sequential", "random", "whole", "get_bytes", "concurrent", "warm")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_flipped_bytes_and_lying_ranges_no_wrong_byte_served_small_none_kept_any(tmp_path: Path, s3,
                                                                                  pattern: str):
    objs = _seed(s3)
    truth = _truth_by_objid(s3, objs)
    served = Served(objs)
    _lie(s3)
    with _cache(tmp_path, s3) as cache:
        rng = random.Random(pattern)
        if pattern == "warm":
            for _ in range(2):
                report = cache.warm([s3.url(k) for k in objs], jobs=3)
                assert report.objects == len(objs) and report.cached == 0
                served.reads += report.fetched
                cache.evict([s3.url(k) for k in objs])
            cache.warm([s3.url(k) for k in objs], jobs=3)
            for key in objs:
                _read("random", cache, s3, key, served, rng)
        elif pattern == "concurrent":           # four readers at once, every object, mixed patterns
            def reader(i: int) -> None:
                r = random.Random(i)
                for key in objs:
                    _read(("random", "sequential", "whole", "get_bytes")[i], cache, s3, key, served, r)
            threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for rep in range(3):                # cold twice, then whatever the second pass left
                for key in objs:
                    _read(pattern, cache, s3, key, served, rng)
                if rep == 0:
                    cache.flush()
                    cache.evict([s3.url(k) for k in objs])
        cache.flush()                           # background completions end here
    applied = len(s3.proxy.applied)
    s3.proxy.random_faults = None
    assert applied >= 4, "the proxy told (almost) no lie: the test tested nothing"
    assert served.reads > 0
    assert served.wrong_small() == {}, "wrong bytes served from an object checked whole"
    assert _kept_wrong(tmp_path / "cache", truth) == []
    out = _reread_in_a_new_process(tmp_path / "cache", s3, objs)
    assert all(out["ok"].values()), out


def test_strict_never_serves_an_unverified_byte_of_any_size(tmp_path: Path, s3):
    objs = _seed(s3)
    truth = _truth_by_objid(s3, objs)
    served = Served(objs)
    _lie(s3)
    with _cache(tmp_path, s3, strict=True) as cache:
        rng = random.Random(1)
        for pattern in ("random", "sequential", "get_bytes"):
            for key in objs:
                _read(pattern, cache, s3, key, served, rng)
    s3.proxy.random_faults = None
    assert served.reads > 0 and served.wrong == {}
    assert _kept_wrong(tmp_path / "cache", truth) == []


def test_ranges_of_parts_with_their_own_checksums_are_checked_per_part(tmp_path: Path, s3):
    s3.proxy.parts_as_s3 = True        # S3's GET ?partNumber=N (moto answers with the whole object)
    s3.proxy.head_as_s3 = True         # and S3's HEAD, naming a composite checksum "-N" as S3 does
    parts = [blob(5 * MiB, "p1"), blob(5 * MiB, "p2"), blob(3 * BS + 5, "p3")]
    objs = {"composite.bin": _multipart(s3, "composite.bin", parts, checksum="CRC32")}
    truth = _truth_by_objid(s3, objs)
    served = Served(objs)
    _lie(s3)
    with _cache(tmp_path, s3) as cache:
        rng = random.Random(5)
        for _ in range(3):
            _read("random", cache, s3, "composite.bin", served, rng)
        cache.flush()
        part_gets = [r for r in s3.gets() if "partNumber=" in r[1]]
    s3.proxy.random_faults = None
    assert part_gets, "no part was fetched on its own"
    assert served.reads > 0 and served.wrong == {}, "a part checksum lets no wrong byte through"
    assert _kept_wrong(tmp_path / "cache", truth) == []
    blocks = [f for _, _, fs in os.walk(tmp_path / "cache" / "blocks") for f in fs]
    assert blocks and all(not f.endswith(".w") for f in blocks), "checked per part: nothing to complete"
    r = cli("cache", "verify", "--dir", str(tmp_path / "cache"), "--json", env=s3.env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["unverified"] == 0


def test_a_part_get_answered_with_the_whole_object_falls_back_to_a_check_in_the_background(tmp_path: Path,
                                                                                            s3):
    parts = [blob(5 * MiB, "q1"), blob(BS + 5, "q2")]
    objs = {"composite.bin": _multipart(s3, "composite.bin", parts, checksum="CRC32")}
    truth = _truth_by_objid(s3, objs)
    with _cache(tmp_path, s3) as cache:
        with mf.open(s3.url("composite.bin"), cache=cache, buffering=0) as f:
            f.seek(5 * MiB + 10)                    # moto answers GET ?partNumber=2 with everything
            assert f.read(100) == objs["composite.bin"][5 * MiB + 10:5 * MiB + 110]
        cache.flush()                               # the background check made it whole
        assert cache.verify().verified == 1
    assert _kept_wrong(tmp_path / "cache", truth) == []
    wholes = [f for _, _, fs in os.walk(tmp_path / "cache" / "blocks") for f in fs]
    assert wholes == [next(iter(truth)).hex() + ".w"]


@pytest.mark.parametrize("lie", ["head-zero", "head-etag", "head-size"])
def test_a_head_that_contradicts_the_cached_entry_is_a_miss_never_empty(tmp_path: Path, s3, lie: str):
    objs = _seed(s3, "small") | _seed(s3, "large")
    with _cache(tmp_path, s3) as cache:
        for key, data in objs.items():
            assert cache.get_bytes(s3.url(key)) == data
        cache.flush()
        for key, data in objs.items():
            for _ in range(PATIENT.attempts + 2):     # a gateway that keeps lying, to retries too
                s3.fault(lie, method="HEAD", key=key)
            gets = len(s3.gets())
            with mf.open(s3.url(key), cache=cache) as f:
                assert f.read() == data, key
            assert len(s3.gets()) > gets, "the contradicted entry was trusted without a GET"
            assert cache.get_bytes(s3.url(key)) == data
            s3.proxy.faults.clear()
        assert s3.proxy.applied.count(lie) >= 2 * len(objs)
        cache.flush()
        assert cache.stats().entries == len(objs)
        assert cache.verify().ok


def test_a_multipart_layout_a_head_lies_about_is_found_by_the_whole_check(tmp_path: Path, s3):
    objs = _seed(s3, "multipart")
    truth = _truth_by_objid(s3, objs)
    for _ in range(30):          # every HEAD ?partNumber=1 lies about the part's size, retries too
        s3.proxy.faults.append((lambda m, p, h: m == "HEAD" and "partNumber=1" in p, "head-size"))
    with _cache(tmp_path, s3) as cache:
        assert cache.get_bytes(s3.url("large-mp.bin")) == objs["large-mp.bin"]
        cache.flush()
        s3.proxy.faults.clear()
        assert cache.verify().verified == 1
    assert _kept_wrong(tmp_path / "cache", truth) == []


def _unverified_wrong_block_left_by_a_killed_reader(tmp_path: Path, s3, key: str) -> None:
    """A reader of ``key`` that read one block by range (the proxy lying about that range) and
    was killed before the background check of the object could end."""
    s3.fault("pass", ranged=False, key=key)          # the cold open's stream (dropped at the seek)
    s3.fault("stall", ranged=False, key=key)         # the background check's GET never answers
    s3.fault("wrong-range", ranged=True, key=key)
    out = run_python(f"""
        import json, os, signal
        from manyfiles.cache import Cache
        from manyfiles.s3 import ClientSettings, RetryPolicy
        settings = ClientSettings(endpoint_url={s3.settings.endpoint_url!r}, region="us-east-1")
        cache = Cache({str(tmp_path / "cache")!r}, min_free=0, block_size={BS}, verify_whole_max={WHOLE_MAX},
                      settings=settings, retry=RetryPolicy(attempts=1))
        raw = cache.reader("s3://{s3.bucket}/{key}")
        raw.seek({3 * BS})
        got = raw.read(10)
        cache._store.fills.flush()                   # the unverified block is on disk
        print(json.dumps({{"got": got.hex()}}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """, expect_killed=True)
    assert out["got"]
    assert s3.proxy.applied[:2] == ["pass", "wrong-range"]
    s3.proxy.faults.clear()                          # (the stall, if the check never got that far)


def test_verify_finds_unverified_data_exits_1_and_warm_never_counts_it_cached(tmp_path: Path, s3):
    objs = _seed(s3, "large")
    truth = _truth_by_objid(s3, objs)
    key = "large-md5.bin"
    with _cache(tmp_path, s3) as cache, cache.open(s3.url("large-crc.bin")) as f:   # held whole
        assert f.read() == objs["large-crc.bin"]
    _unverified_wrong_block_left_by_a_killed_reader(tmp_path, s3, key)
    assert _kept_wrong(tmp_path / "cache", truth), "the setup left no wrong block"
    d = str(tmp_path / "cache")
    r = cli("cache", "verify", "--dir", d, env=s3.env)
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [
        f"manyfiles: s3://{s3.bucket}/{key}: holds 1 unverified blocks "
        "(`cache verify --complete` checks them)"]
    r = cli("cache", "warm", "--dir", d, "--json", s3.url(key), s3.url("large-crc.bin"), env=s3.env)
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["fetched"], json.loads(r.stdout)["cached"]) == (1, 1)
    assert _kept_wrong(tmp_path / "cache", truth) == []
    r = cli("cache", "verify", "--dir", d, "--json", env=s3.env)
    assert r.returncode == 0 and json.loads(r.stdout)["verified"] == 2


def test_verify_complete_finds_the_wrong_block_replaces_it_and_exits_1(tmp_path: Path, s3):
    objs = _seed(s3, "large")
    truth = _truth_by_objid(s3, objs)
    key = "large-md5.bin"
    _unverified_wrong_block_left_by_a_killed_reader(tmp_path, s3, key)
    d = str(tmp_path / "cache")
    r = cli("cache", "verify", "--dir", d, "--complete", "--json", env=s3.env)
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert (report["completed"], report["wrong"], report["verified"]) == (1, 1, 1), report
    assert r.stderr.decode().splitlines() == [
        f"manyfiles: s3://{s3.bucket}/{key}: 1 cached blocks were wrong data: replaced by the checked object"]
    assert _kept_wrong(tmp_path / "cache", truth) == []
    r = cli("cache", "verify", "--dir", d, env=s3.env)
    assert r.returncode == 0, r.stderr
    with _cache(tmp_path, s3) as cache:
        assert cache.get_bytes(s3.url(key)) == objs[key]
        assert cache.stats().misses == 0


def _flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as f:                     # bit rot at rest, same length
        f.seek(at)
        (byte,) = struct.unpack("B", f.read(1))
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


def _held_at(cache_dir: Path, objid: bytes) -> tuple[Path, int]:
    """(file, offset of the object's first byte in it) of an object held whole: its record in a
    pack, else its whole file."""
    import sqlite3

    with contextlib.closing(sqlite3.connect(cache_dir / "index.sqlite")) as db:
        row = db.execute("SELECT pack, offset FROM packed WHERE objid=?", (objid,)).fetchone()
    if row is not None:
        return cache_dir / "packs" / f"{row[0]:016x}.pack", row[1] + RECORD_HEADER_SIZE
    return next(Path(cache_dir / "blocks").rglob(objid.hex() + ".w")), 0


@pytest.mark.parametrize("store", ["packed", "whole file"])
def test_a_whole_object_changed_on_disk_is_found_by_verify(tmp_path: Path, s3, store: str):
    objs = _seed(s3, "small")
    key = "small-md5.bin"
    if store == "whole file":           # over PACK_MAX_OBJECT: a file of its own (streamed in)
        key = "big-md5.bin"
        objs[key] = blob(PACK_MAX_OBJECT + 3 * BS, "big")
        _plain_client(s3).put_object(Bucket=s3.bucket, Key=key, Body=objs[key])
    truth = _truth_by_objid(s3, objs)
    with _cache(tmp_path, s3) as cache:
        for k in objs:
            cache.get_bytes(s3.url(k))
        cache.flush()
    objid = next(iter(_truth_by_objid(s3, {key: objs[key]})))
    _flip_byte(*_at(_held_at(tmp_path / "cache", objid), 1000))
    with _cache(tmp_path, s3, verify=True) as cache:   # verify=True: re-checked before its first use
        with pytest.warns(RuntimeWarning, match="corrupt cache (file|record)"):
            assert cache.get_bytes(s3.url(key)) == objs[key]
        cache.flush()
    _flip_byte(*_at(_held_at(tmp_path / "cache", objid), 7))
    r = cli("cache", "verify", "--dir", str(tmp_path / "cache"), "--json", env=s3.env)
    assert r.returncode == 1
    assert (json.loads(r.stdout)["wrong"], json.loads(r.stdout)["verified"]) == (1, len(objs) - 1)
    assert _kept_wrong(tmp_path / "cache", truth) == []


def _at(where: tuple[Path, int], at: int) -> tuple[Path, int]:
    return where[0], where[1] + at
