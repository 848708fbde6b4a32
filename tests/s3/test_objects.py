"""The object layer (manyfiles.s3.objects): HEAD, ranged GET and streamed whole GET of one object,
through the fault proxy in front of moto (which checks every signature)."""

from __future__ import annotations

import threading

import pytest
from s3util import CREDS, blob, put_composite, put_multipart

from manyfiles.errors import CredentialsError, IntegrityError, NotFound, TransferError, UsageError
from manyfiles.s3 import ClientSettings, RetryPolicy
from manyfiles.s3.objects import Inconsistent, ObjectClient, object_error, parse_object_url

KiB, MiB = 1 << 10, 1 << 20
FAST = RetryPolicy(attempts=3, base=0.002, cap=0.01)


def objects_via(proxy, **kw) -> ObjectClient:
    retries = []
    client = ObjectClient(ClientSettings(endpoint_url=proxy.url, region="us-east-1"), retry=FAST,
                          on_retry=lambda err: retries.append(str(err)), **kw)
    client.retries = retries      # what on_retry was told, for the assertions
    return client


def gets_of(key: str):
    return lambda m, p, h: m == "GET" and p.split("?")[0].endswith("/" + key) and "partNumber" not in p


@pytest.fixture
def seeded(bucket, s3admin, s3plain):
    """A bucket with an MD5-checked, a CRC32-checked and a multipart object."""
    name, _ = bucket
    data = {"o/md5.bin": blob(300 * KiB + 7, "md5"), "o/crc.bin": blob(5000, "crc")}
    s3plain.put_object(Bucket=name, Key="o/md5.bin", Body=data["o/md5.bin"])
    s3admin.put_object(Bucket=name, Key="o/crc.bin", Body=data["o/crc.bin"], ChecksumAlgorithm="CRC32")
    data["o/multi.bin"] = put_multipart(s3plain, name, "o/multi.bin", [blob(5 * MiB, "m1"), blob(3000, "m2")])
    return name, data


def test_head_decides_each_objects_check(seeded, proxy):
    name, data = seeded
    objs = objects_via(proxy)
    md5, crc, multi = (objs.head(name, f"o/{k}.bin") for k in ("md5", "crc", "multi"))
    assert (md5.size, md5.claim.kind) == (len(data["o/md5.bin"]), "md5")
    assert crc.claim.kind == "crc32" and crc.etag
    assert multi.claim.kind == "multipart-md5" and multi.parts == (5 * MiB, 3000)
    assert multi.part_at(0, 5 * MiB - 1) == 1 and multi.part_at(5 * MiB, 5 * MiB + 2999) == 2
    assert multi.part_at(0, 100) == 0
    heads = [p.rpartition("/")[2] for m, p, _ in proxy.requests if m == "HEAD"]
    assert heads == ["md5.bin", "crc.bin", "multi.bin", "multi.bin?partNumber=1"]
    with pytest.raises(TransferError) as info:
        objs.head(name, "o/missing.bin")
    assert isinstance(object_error(f"s3://{name}/o/missing.bin", info.value), NotFound)


def test_get_range_gives_exactly_the_range_asked_and_checks_a_whole_one(seeded, proxy):
    name, data = seeded
    want = data["o/md5.bin"]
    objs = objects_via(proxy)
    head = objs.head(name, "o/md5.bin")
    proxy.faults.append((gets_of("o/md5.bin"), "wrong-range-honest"))     # another offset, said so
    got = objs.get_range(name, "o/md5.bin", 1000, 70_000, if_match=head.etag, head=head)
    assert got.data == want[1000:70_001] and got.claim is None       # a part of one part: unverified
    assert proxy.applied == ["wrong-range-honest"] and len(objs.retries) == 1
    proxy.faults.append((gets_of("o/md5.bin"), "flip"))
    whole = objs.get_range(name, "o/md5.bin", 0, len(want) - 1, if_match=head.etag, head=head)
    assert whole.data == want and whole.claim.kind == "md5"          # the flip was caught, asked again
    assert proxy.applied[-1] == "flip" and len(objs.retries) == 2
    with pytest.raises(ValueError):
        objs.get_range(name, "o/md5.bin", 0, len(want), if_match=head.etag, head=head)


def test_stream_hands_out_the_last_block_only_after_the_check(seeded, proxy):
    name, data = seeded
    objs = objects_via(proxy)
    proxy.random_faults = (1.0, "flip", gets_of("o/md5.bin"))
    seen = []
    with pytest.raises(IntegrityError), objs.stream(name, "o/md5.bin") as s:
        for block in s.blocks(64 * KiB):
            seen.append(block)
    assert 0 < sum(map(len, seen)) < len(data["o/md5.bin"])
    proxy.random_faults = None
    with objs.stream(name, "o/crc.bin") as s:
        assert b"".join(s.blocks(1000)) == data["o/crc.bin"] and s.claim.kind == "crc32"


def test_stream_resumes_a_lost_connection_where_it_stopped(seeded, proxy):
    name, data = seeded
    objs = objects_via(proxy)
    proxy.faults.append((gets_of("o/multi.bin"), "reset"))
    with objs.stream(name, "o/multi.bin") as s:
        assert s.head.claim.kind == "multipart-md5"
        assert b"".join(s.blocks(MiB)) == data["o/multi.bin"]
        assert s.claim.parts == (5 * MiB, 3000)
    ranges = [r for m, p, r in proxy.requests if m == "GET" and r]
    assert proxy.applied == ["reset"] and len(ranges) == 1
    start, end = map(int, ranges[0].split("=")[1].split("-"))
    assert start % MiB == 0 and end == len(data["o/multi.bin"]) - 1 and len(objs.retries) == 1


def test_close_from_another_thread_ends_a_read_stalled_on_the_server(seeded, proxy):
    """A reader blocked on a server that stopped answering (here: the resume after a lost
    connection, which the proxy holds back) returns with a TransferError as soon as another
    thread closes the stream, not after the read timeout (an hour here), and nothing is resumed."""
    name, data = seeded
    objs = ObjectClient(ClientSettings(endpoint_url=proxy.url, region="us-east-1", read_timeout=3600.0),
                        retry=FAST)
    stalled, finished = threading.Event(), threading.Event()

    def resume(m, p, h) -> bool:
        if gets_of("o/md5.bin")(m, p, h) and h.get("Range"):
            stalled.set()           # the proxy holds this answer back from now on
            return True
        return False

    proxy.faults += [(gets_of("o/md5.bin"), "truncate"), (resume, "stall")]
    stream = objs.stream(name, "o/md5.bin")
    buf = bytearray(len(data["o/md5.bin"]))
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(stream.readinto(buf))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            finished.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert stalled.wait(60), "the resume never reached the proxy"
    stream.close()
    assert finished.wait(60), "close() did not end the stalled read"
    reader.join()
    assert isinstance(outcome[0], TransferError) and "closed" in str(outcome[0])
    assert proxy.applied == ["truncate", "stall"]
    assert len([r for m, _, r in proxy.requests if m == "GET"]) == 2     # nothing after the close
    assert stream.pos == 0          # no byte handed out


@pytest.mark.parametrize("lie", ["head-zero", "head-size", "head-parts-count"])
def test_a_multipart_layout_no_head_gives_is_searched_never_skipped(lie, seeded, proxy):
    """HEAD ?partNumber=1 keeps lying: asked again, then the whole object is hashed at the part sizes
    uploaders use; flipped bytes never pass that either."""
    name, data = seeded
    objs = objects_via(proxy)
    proxy.random_faults = (1.0, lie, lambda m, p, h: m == "HEAD" and "partNumber" in p)
    head = objs.head(name, "o/multi.bin")
    assert head.claim.pending and len(objs.retries) == FAST.attempts - 1
    assert objs.read(name, "o/multi.bin") == data["o/multi.bin"]
    with objs.stream(name, "o/multi.bin") as s:
        assert b"".join(s.blocks()) == data["o/multi.bin"]
        assert s.claim.kind == "multipart-md5-searched" and s.claim.parts == (5 * MiB, 3000)
    proxy.faults.append((gets_of("o/multi.bin"), "flip"))
    with pytest.raises(IntegrityError, match="not reproduced"), objs.stream(name, "o/multi.bin") as s:
        b"".join(s.blocks())


@pytest.mark.parametrize("lie", ["head-zero", "head-size"])
def test_a_head_that_contradicts_the_listing_or_itself_is_refused(lie, seeded, proxy):
    name, data = seeded
    objs = objects_via(proxy)
    proxy.random_faults = (1.0, lie, lambda m, p, h: m == "HEAD")
    with pytest.raises(Inconsistent, match="says"):
        objs.head(name, "o/md5.bin", size=len(data["o/md5.bin"]))
    with pytest.raises(Inconsistent):       # no listing: Content-Length 0 vs a non-empty ETag
        objs.head(name, "o/md5.bin") if lie == "head-zero" else objs.head(name, "o/md5.bin", size=1)
    assert objs.read(name, "o/md5.bin", size=len(data["o/md5.bin"])) == data["o/md5.bin"]   # GETs don't lie


def test_keys_are_resolved_for_each_call(seeded, proxy, monkeypatch, tmp_path):
    """Keys changed between two calls are used by the next one; removed keys are not used at all
    (the edge knows both keys until the first is revoked)."""
    name, data = seeded
    proxy.secrets = {CREDS["AWS_ACCESS_KEY_ID"]: CREDS["AWS_SECRET_ACCESS_KEY"], "second": "second-secret"}
    objs = objects_via(proxy)
    assert objs.head(name, "o/crc.bin").size == len(data["o/crc.bin"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "second")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second-secret")
    del proxy.secrets[CREDS["AWS_ACCESS_KEY_ID"]]        # the first key is revoked
    assert objs.read(name, "o/crc.bin") == data["o/crc.bin"]
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    signed = proxy.signed
    with pytest.raises(TransferError) as info:
        objs.head(name, "o/crc.bin")
    assert isinstance(object_error(f"s3://{name}/o/crc.bin", info.value), CredentialsError)
    assert proxy.signed == signed and not proxy.refused


def test_a_part_with_its_own_checksum_is_checked_on_its_own(bucket, s3admin, proxy):
    """A range that is exactly one part of an object uploaded with part checksums is fetched as
    ``GET ?partNumber=N`` and checked against that part's checksum (a flip is caught and asked
    again); where the server answers that with the whole object (moto), a plain ranged GET,
    unverified (claim None), and no more part GETs."""
    name, _ = bucket
    parts = [blob(5 * MiB, "p1"), blob(MiB + 7, "p2")]
    data = put_composite(s3admin, name, "c/multi.bin", parts, "CRC32")
    proxy.head_as_s3 = proxy.parts_as_s3 = True
    objs = objects_via(proxy)
    head = objs.head(name, "c/multi.bin")
    assert head.claim.composite and head.parts == (5 * MiB, MiB + 7)
    proxy.faults.append((lambda m, p, h: m == "GET" and "partNumber=2" in p, "flip"))
    got = objs.get_range(name, "c/multi.bin", 5 * MiB, len(data) - 1, if_match=head.etag, head=head)
    assert got.data == parts[1] and got.claim.method == "crc32" and not got.claim.composite
    assert proxy.applied == ["flip"] and len(objs.retries) == 1
    proxy.random_faults = (1.0, "flip", lambda m, p, h: m == "GET" and "partNumber=1" in p)
    with pytest.raises(IntegrityError, match="part 1"):
        objs.get_range(name, "c/multi.bin", 0, 5 * MiB - 1, if_match=head.etag, head=head)
    proxy.random_faults = None
    proxy.parts_as_s3 = False
    proxy.requests.clear()
    first = objs.get_range(name, "c/multi.bin", 0, 5 * MiB - 1, if_match=head.etag, head=head)
    assert first.data == parts[0] and first.claim is None
    again = objs.get_range(name, "c/multi.bin", 5 * MiB, len(data) - 1, if_match=head.etag, head=head)
    assert again.data == parts[1] and again.claim is None
    assert [p.rpartition("?")[2] for m, p, _ in proxy.requests if "?" in p] == ["partNumber=1"]


def test_parse_object_url():
    assert parse_object_url("s3://b/a/b*.json") == ("b", "a/b*.json")
    for bad in ("s3://b/", "s3://b", "s3:///k", "/local/path", "s3://b/dir/"):
        with pytest.raises(UsageError):
            parse_object_url(bad)
