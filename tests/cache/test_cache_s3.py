"""The cache over S3 (moto behind the fault proxy): GETs counted, ETags changed, restarts."""

from __future__ import annotations

import hashlib
import json
import random
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from cachekit import blob, held, run_python, whole_name

import manyfiles as mf
from manyfiles.cache import Cache

BS = 64 << 10
WHOLE_MAX = 4 * BS     # objects up to this are checked whole before a byte is served


@pytest.fixture
def cache(tmp_path: Path, s3):
    c = Cache(tmp_path / "cache", min_free=0, block_size=BS, settings=s3.settings, retry=s3.retry)
    yield c
    c.close()


@pytest.fixture
def small_whole(tmp_path: Path, s3):
    """A cache whose objects over 4 blocks are read by block (or streamed)."""
    c = Cache(tmp_path / "cache", min_free=0, block_size=BS, settings=s3.settings, retry=s3.retry,
              verify_whole_max=WHOLE_MAX)
    yield c
    c.close()


def _seed(s3, n_small: int = 12, n_big: int = 2) -> dict[str, bytes]:
    objs = {}
    for i in range(n_small):
        objs[f"train/small-{i:03d}.bin"] = s3.put(f"train/small-{i:03d}.bin", blob(1000 + 997 * i, f"s{i}"))
    for i in range(n_big):
        objs[f"train/big-{i}.bin"] = s3.put(f"train/big-{i}.bin", blob(5 * BS + 17 * (i + 1), f"b{i}"))
    return objs


def test_a_new_process_reads_everything_from_the_cache_without_a_get(tmp_path: Path, s3, cache: Cache):
    objs = _seed(s3)
    for key, data in objs.items():
        assert cache.get_bytes(s3.url(key)) == data
    cache.flush()
    blocks = sum(-(-len(d) // BS) for d in objs.values())
    before = cache.stats()
    assert before.fills == blocks
    gets_before = len(s3.gets())
    assert gets_before == len(objs), "each object fetched by one GET, blocks and all"
    assert all(r[2] is None for r in s3.gets()), "whole-object GETs, no ranges"

    trace = tmp_path / "epoch2.mftrace"
    expected = {k: hashlib.sha256(d).hexdigest() for k, d in objs.items()}
    out = run_python(f"""
        import hashlib, json, random
        import manyfiles as mf
        from manyfiles.cache import Cache
        expected = {json.dumps(expected)}
        with mf.tracing({str(trace)!r}), Cache({cache.dir!r}, min_free=0) as cache:
            ok = {{}}
            for key, digest in expected.items():
                url = "s3://{s3.bucket}/" + key
                with mf.open(url, cache=cache) as f:
                    ok[key] = hashlib.sha256(f.read()).hexdigest() == digest
                    f.seek(random.randrange(f.raw.size))
                    f.read(100)
            s = cache.stats()
        print(json.dumps({{"ok": ok, "hits": s.hits, "misses": s.misses}}))
    """, env=s3.env)
    assert all(out["ok"].values()), out["ok"]
    assert len(s3.gets()) == gets_before, "the new process sent GETs"
    assert out["misses"] == before.misses, "the new process missed"
    assert out["hits"] - before.hits >= blocks

    from manyfiles.trace import load, summarize

    ops = {o.op: o.count for o in summarize(load([str(trace)])).ops}
    assert ops.get("cache.hit", 0) >= len(objs), "one hit per open of a whole file"
    assert "s3.get" not in ops and "s3.get_range" not in ops and "cache.miss" not in ops
    assert ops["s3.head"] == len(objs), "validate on open: one HEAD per open"


def test_get_bytes_of_an_object_never_seen_is_one_request(s3, cache: Cache):
    small = s3.put("one.bin", blob(BS - 1, "one"))
    big = s3.put("two.bin", blob(2 * BS + 1, "two"))
    s3.put("empty.bin", b"")
    assert cache.get_bytes(s3.url("one.bin")) == small
    assert (len(s3.gets()), len(s3.heads())) == (1, 0), "the version comes with the first block"
    assert cache.get_bytes(s3.url("two.bin")) == big          # three blocks, one stream
    assert (len(s3.gets()), len(s3.heads())) == (2, 0)
    assert cache.get_bytes(s3.url("empty.bin")) == b""
    assert (len(s3.gets()), len(s3.heads())) == (3, 0)
    cache.flush()
    gets = len(s3.gets())
    assert cache.get_bytes(s3.url("one.bin")) == small        # known now: validated by a HEAD
    assert len(s3.gets()) == gets and len(s3.heads()) == 1


def test_a_changed_etag_is_a_miss_and_a_change_mid_read_is_refused(s3, small_whole: Cache):
    cache = small_whole
    url = s3.url("v.bin")
    old = s3.put("v.bin", blob(6 * BS, "v1"))
    assert cache.get_bytes(url) == old
    cache.flush()
    new = s3.put("v.bin", blob(6 * BS, "v2"))
    assert cache.get_bytes(url) == new
    cache.flush()
    assert cache.get_bytes(url) == new
    assert cache.stats().entries == 1

    big = s3.put("big.bin", blob(40 * BS, "b2"))
    with cache.open(s3.url("big.bin"), buffering=0) as f:     # v2, streamed: nothing of it kept yet
        assert f.read(100) == big[:100]
        s3.put("big.bin", blob(40 * BS, "b3"))
        f.seek(30 * BS)                                         # past what the stream read ahead
        with pytest.raises(mf.ObjectChanged, match="changed"):
            f.read(100)                                         # a ranged GET pinned to v2: refused


def test_random_reads_fetch_only_the_blocks_touched_then_one_get_checks_the_object(s3, small_whole: Cache):
    cache = small_whole
    data = s3.put("big.bin", blob(64 * BS, "r"))
    touched = set()
    with mf.open(s3.url("big.bin"), cache=cache, buffering=0) as f:
        for pos in random.Random(3).sample(range(6 * BS, len(data) - 4096), 6):   # past the stream's start
            f.seek(pos)
            assert f.read(4096) == data[pos:pos + 4096]
            touched.update({pos // BS, (pos + 4095) // BS})
    cache.flush()
    # the first open of an object never seen gets its version from a whole-object GET (dropped at
    # the first seek); then one ranged GET per block touched; the blocks, which nothing could
    # check, are kept unverified until one whole-object GET in the background checked the object
    # (reads after that GET installed the object's whole file read it from there)
    first, *rest = s3.gets()
    assert first[2] is None
    ranged = [r[2] for r in rest if r[2]]
    assert ranged and len(set(ranged)) == len(ranged)
    assert set(ranged) <= {f"bytes={i * BS}-{(i + 1) * BS - 1}" for i in touched}
    assert len([r for r in rest if not r[2]]) == 1, "one background GET of the whole object"
    assert not s3.heads()
    assert cache.verify().verified == 1
    with mf.open(s3.url("big.bin"), cache=cache, buffering=0) as f:     # known now: a HEAD, no GET
        f.seek(50 * BS)
        assert f.read(10) == data[50 * BS:50 * BS + 10]
    assert len(s3.heads()) == 1 and len(s3.gets()) == 1 + len(rest)


def test_without_a_cache_random_reads_get_just_their_bytes(s3):
    data = s3.put("p.bin", blob(20 * BS + 5, "p"))
    with mf.open(s3.url("p.bin"), settings=s3.settings) as f:
        assert f.read() == data
    with mf.open(s3.url("p.bin"), settings=s3.settings, buffering=0) as f:
        f.seek(7 * BS + 3)
        assert f.read(4096) == data[7 * BS + 3:7 * BS + 3 + 4096]
    assert s3.gets()[-1][2] == f"bytes={7 * BS + 3}-{7 * BS + 3 + 4095}"


def test_a_corrupted_body_is_detected_and_fetched_again(s3, cache: Cache):
    small = s3.put("small.bin", blob(3000, "c"))
    big = s3.put("big.bin", blob(3 * BS, "c"))
    s3.fault("flip", key="small.bin")
    assert cache.get_bytes(s3.url("small.bin")) == small      # failed its check -> fetched again
    s3.fault("flip", key="big.bin")
    report = cache.warm([s3.url("big.bin")])                   # one GET, checked, then installed
    assert report.ok, report.failures
    assert s3.proxy.applied == ["flip", "flip"]
    assert len(s3.gets()) == 4
    cache.flush()
    assert cache.get_bytes(s3.url("big.bin")) == big
    assert len(s3.gets()) == 4


def test_write_through_to_s3(tmp_path: Path, s3):
    url = s3.url("out/model.bin")
    s3.put("out/model.bin", b"v1" * 100)
    with Cache(tmp_path / "c", min_free=0, block_size=BS, settings=s3.settings, ttl=3600) as cache:
        assert cache.get_bytes(url) == b"v1" * 100
        cache.flush()
        with mf.open(url, "wb", cache=cache) as f:
            f.write(blob(BS + 1, "up"))
            assert s3.admin.get_object(Bucket=s3.bucket, Key="out/model.bin")["Body"].read() == b"v1" * 100
        assert s3.admin.get_object(Bucket=s3.bucket, Key="out/model.bin")["Body"].read() == blob(BS + 1, "up")
        # ttl: no HEAD is made, so only the invalidation keeps this from serving v1
        assert cache.get_bytes(url) == blob(BS + 1, "up")
        with pytest.raises(ValueError), mf.open(url, "wb", cache=cache) as f:
            f.write(b"partial")
            raise ValueError("writer failed")
    assert s3.admin.get_object(Bucket=s3.bucket, Key="out/model.bin")["Body"].read() == blob(BS + 1, "up")


def test_warm_a_prefix_then_validate_by_listing(s3, cache: Cache, tmp_path: Path):
    objs = _seed(s3, n_small=30, n_big=1)
    report = cache.warm([s3.url("train/")], jobs=4)
    assert report.ok and report.objects == len(objs) and report.fetched == len(objs)
    assert report.bytes == sum(map(len, objs.values()))
    gets, heads = len(s3.gets()), len(s3.heads())
    again = cache.warm([s3.url("train/*.bin")])
    assert again.cached == len(objs) and again.fetched == 0
    assert (len(s3.gets()), len(s3.heads())) == (gets, heads), "a listing validates, no GET/HEAD"
    # epoch 2 with a TTL: the listing's validation is trusted, no request at all
    with Cache(cache.dir, min_free=0, ttl=600, settings=s3.settings) as ttl_cache:
        for key, data in objs.items():
            assert ttl_cache.get_bytes(s3.url(key)) == data
    assert (len(s3.gets()), len(s3.heads())) == (gets, heads)


def test_missing_objects_and_buckets_are_one_line_errors(s3, cache: Cache):
    with pytest.raises(mf.NotFound, match=r"^s3://.*/nope\.bin: no such object$"):
        cache.get_bytes(s3.url("nope.bin"))
    with pytest.raises(mf.NotFound, match="no such object"):
        mf.open("s3://no-such-bucket-here/x", settings=s3.settings)
    report = cache.warm([s3.url("nothing/"), s3.url("nope.bin"), "s3://no-such-bucket-here/a/"])
    assert not report.ok and report.objects == 3
    reasons = {f.path: f.reason for f in report.failures}
    assert reasons[s3.url("nothing/")] == "no such object or prefix"
    assert "no such bucket" in reasons["s3://no-such-bucket-here/a/"].lower()
    with pytest.raises(mf.PartialFailure, match="3 failed"):
        report.raise_for_failures()
    json.dumps(report.to_dict())


# -- whole-object verification -----------------------------------------------------------------------

MiB = 1 << 20


def _plain_client(s3):
    """An uploader that sends no flexible checksum: the object then has only its ETag to check."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=s3.admin.meta.endpoint_url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(request_checksum_calculation="when_required"))


def _put_kind(s3, kind: str, key: str, blocks: int = 6) -> bytes:
    """An object of several blocks (``blocks`` for md5 and crc32) whose whole-object check is ``kind``."""
    if kind == "md5":                     # single-part upload, ETag = MD5 of the body
        data = blob((blocks - 1) * BS + 321, key)
        _plain_client(s3).put_object(Bucket=s3.bucket, Key=key, Body=data)
        return data
    if kind == "multipart-md5":           # ETag md5-of-md5s-2: part size from HEAD ?partNumber=1
        parts = [blob(5 * MiB, key + "1"), blob(BS + 99, key + "2")]
        client = _plain_client(s3)
        up = client.create_multipart_upload(Bucket=s3.bucket, Key=key)
        done = []
        for i, body in enumerate(parts, 1):
            r = client.upload_part(Bucket=s3.bucket, Key=key, UploadId=up["UploadId"], PartNumber=i,
                                   Body=body)
            done.append({"ETag": r["ETag"], "PartNumber": i})
        client.complete_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=up["UploadId"],
                                         MultipartUpload={"Parts": done})
        return b"".join(parts)
    return s3.put(key, blob((blocks - 1) * BS + 321, key))      # boto3's default: a CRC32 checksum


def _blocks_of(cache: Cache) -> list[str]:
    return held(cache)


@pytest.mark.parametrize("kind", ["md5", "multipart-md5", "crc32"])
def test_a_flipped_byte_in_a_small_object_is_caught_before_a_byte_is_served(s3, cache: Cache, kind: str):
    data = _put_kind(s3, kind, f"w/{kind}.bin")
    url = s3.url(f"w/{kind}.bin")
    at = len(data) // 2 + 7                      # in a middle block: every block alone looks fine
    s3.fault(f"flip@{at}", key=f"{kind}.bin")
    with mf.open(url, cache=cache) as f:         # up to verify_whole_max: checked whole first
        assert f.read() == data
    assert s3.proxy.applied == [f"flip@{at}"]
    assert [r[2] for r in s3.gets()] == [None, None], "the whole object fetched again"
    cache.flush()
    report = cache.verify()
    assert (report.verified, report.unverified, report.corrupt) == (1, 0, 0)
    assert _blocks_of(cache) == [whole_name(next(iter(_objids(s3, cache, f"w/{kind}.bin"))), len(data))]


@pytest.mark.parametrize("kind", ["md5", "multipart-md5", "crc32"])
def test_a_flipped_byte_in_a_streamed_object_ends_the_read_and_is_never_kept(s3, small_whole: Cache,
                                                                            kind: str):
    cache = small_whole
    data = _put_kind(s3, kind, f"w/{kind}.bin")
    url = s3.url(f"w/{kind}.bin")
    at = len(data) // 2 + 7
    s3.fault(f"flip@{at}", key=f"{kind}.bin")
    with mf.open(url, cache=cache) as f:
        got = bytearray()
        with pytest.raises(mf.IntegrityError, match=f"{kind}.bin"):
            while chunk := f.read(BS // 2):
                got += chunk
        assert len(got) < len(data), "the last block is served only after the check passed"
    assert s3.proxy.applied == [f"flip@{at}"]
    assert [r[2] for r in s3.gets()] == [None], "one whole-object GET"
    cache.flush()
    assert _blocks_of(cache) == [], "no byte of the object is kept"
    assert cache.stats().entries == 0
    # read again (no fault this time): right bytes, one GET, and the object is held whole
    assert cache.get_bytes(url) == data
    cache.flush()
    report = cache.verify()
    assert (report.verified, report.unverified, report.corrupt) == (1, 0, 0)
    assert len(_blocks_of(cache)) == 1


def test_closing_a_reader_ends_its_stream_stalled_on_the_server(s3, tmp_path: Path):
    """The pump of a streamed object blocked on a server that stopped answering (the resume after
    a lost connection, held back by the proxy) ends as soon as the reader is closed, not after the
    read timeout (an hour here); nothing of the object is kept, nothing more is asked."""
    settings = replace(s3.settings, read_timeout=3600.0)
    cache = Cache(tmp_path / "cache", min_free=0, block_size=BS, settings=settings, retry=s3.retry,
                  verify_whole_max=WHOLE_MAX)
    s3.put("w/stall.bin", blob(6 * BS + 5, "stall"))     # cut after 3 blocks: within the read-ahead
    stalled = threading.Event()

    def resume(m, p, h) -> bool:
        if m == "GET" and p.split("?")[0].endswith("/stall.bin") and h.get("Range"):
            stalled.set()           # the proxy holds this answer back from now on
            return True
        return False

    s3.proxy.faults += [(lambda m, p, h: m == "GET" and p.split("?")[0].endswith("/stall.bin")
                         and not h.get("Range"), "truncate"), (resume, "stall")]
    try:
        before = {t for t in threading.enumerate() if t.name == "manyfiles-cache-stream"}
        f = mf.open(s3.url("w/stall.bin"), cache=cache)
        pumps = {t for t in threading.enumerate() if t.name == "manyfiles-cache-stream"} - before
        assert len(pumps) == 1
        assert stalled.wait(60), "the resume never reached the proxy"
        f.close()
        pump = pumps.pop()
        pump.join(60)
        assert not pump.is_alive(), "closing the reader did not end the stalled stream"
        assert s3.proxy.applied == ["truncate", "stall"] and len(s3.gets()) == 2
        cache.flush()
        assert _blocks_of(cache) == [] and cache.stats().entries == 0, "nothing of it is kept"
    finally:
        cache.close()


def _objids(s3, cache: Cache, key: str) -> set[bytes]:
    from manyfiles.cache._format import object_id
    from manyfiles.cache._origin import S3Origin

    head = s3.admin.head_object(Bucket=s3.bucket, Key=key)
    source = f"s3+{s3.settings.endpoint_url}/{s3.bucket}/{key}".encode()
    return {object_id(source, S3Origin.validator(head["ETag"], head["ContentLength"]))}


def test_verify_counts_whole_checks_and_warm_checks_every_object(tmp_path: Path, s3, cache: Cache):
    seq = _put_kind(s3, "multipart-md5", "v/seq.bin")
    rnd = _put_kind(s3, "md5", "v/random.bin")
    warmed = _put_kind(s3, "md5", "v/warmed.bin")
    local = tmp_path / "local.bin"
    local.write_bytes(blob(3 * BS, "local"))
    with mf.open(s3.url("v/seq.bin"), cache=cache) as f:            # sequential: one checked stream
        assert f.read() == seq
    with mf.open(s3.url("v/random.bin"), cache=cache, buffering=0) as f:   # random: checked whole first
        for i in reversed(range(-(-len(rnd) // BS))):
            f.seek(i * BS)
            assert f.read(BS) == rnd[i * BS:(i + 1) * BS]
    s3.fault(f"flip@{2 * BS}", key="warmed.bin")
    report = cache.warm([s3.url("v/warmed.bin"), str(local)])
    assert report.ok and report.fetched == 2, report.failures      # the flipped GET was retried
    assert s3.proxy.applied == [f"flip@{2 * BS}"]
    assert cache.get_bytes(s3.url("v/warmed.bin")) == warmed
    v = cache.verify()
    assert (v.entries, v.verified, v.unverified, v.unverifiable) == (4, 3, 0, 1), v
    assert v.ok and "3 verified, 1 unverifiable, 0 unverified" in v.summary()


def test_a_seek_in_the_middle_of_the_stream_drops_it_and_the_reads_stay_right(s3, small_whole: Cache):
    cache = small_whole
    data = blob(20 * BS + 5, "seek")          # longer than the stream reads ahead of the reader
    _plain_client(s3).put_object(Bucket=s3.bucket, Key="s/seek.bin", Body=data)
    with mf.open(s3.url("s/seek.bin"), cache=cache, buffering=0) as f:
        assert f.read(2 * BS + 100) == data[:2 * BS + 100]          # from the one stream
        f.seek(BS // 2)
        assert f.read() == data[BS // 2:]
    cache.flush()                    # the blocks read by range were checked by one more whole GET
    gets = s3.gets()
    assert gets[0][2] is None and len([r for r in gets[1:] if r[2] is None]) == 1, gets
    assert cache.get_bytes(s3.url("s/seek.bin")) == data
    v = cache.verify()
    assert (v.entries, v.verified, v.unverified, v.corrupt) == (1, 1, 0, 0)
