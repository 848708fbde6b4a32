"""Corrupted content never lands under a final name: flipped bytes, lying ranges, other bodies.

Every cell compares the bytes of every final file with the source: an object is either exact
or listed in the failures, and a clean re-run makes every object exact.
"""

from __future__ import annotations

import json

import pytest
from s3util import CONTENT_FAULTS, blob, files_under, put_composite, put_multipart

from manyfiles.errors import IntegrityError
from manyfiles.s3 import ClientSettings, RetryPolicy, get_objects, pull
from manyfiles.s3.integrity import Claim
from manyfiles.s3.routing import STRATEGIES

KiB, MiB = 1 << 10, 1 << 20
FAST = RetryPolicy(attempts=4, base=0.002, cap=0.01)
MATRIX_FAULTS = ("flip", "wrong-range", "reset", "truncate", "503", "ignore-range")


def object_get(method, path, headers) -> bool:
    return method == "GET" and "list-type" not in path and "partNumber" not in path


def cfg(**kw):
    return {"ranged_min": 1 * MiB, "part_size": 1 * MiB, "retry": FAST, "concurrency": 4, "processes": 2,
            **kw}


@pytest.fixture(scope="module")
def corpus(s3admin, s3plain):
    """One bucket for the whole matrix: small objects with and without a CRC32 checksum, a
    single-part object fetched in ranged parts by auto, and a two-part multipart object."""
    import uuid

    name = f"m-{uuid.uuid4().hex[:12]}"
    s3admin.create_bucket(Bucket=name)
    data = {}
    for i in range(3):
        key = f"c/small-{i}.bin"
        body = blob(1000 + 700 * i, key)
        (s3admin if i == 0 else s3plain).put_object(Bucket=name, Key=key, Body=body)
        data[key] = body
    data["c/medium.bin"] = blob(MiB + MiB // 2 + 3, "medium")
    s3plain.put_object(Bucket=name, Key="c/medium.bin", Body=data["c/medium.bin"])
    data["c/multi.bin"] = put_multipart(s3plain, name, "c/multi.bin",
                                        [blob(5 * MiB, "p1"), blob(300 * KiB + 11, "p2")])
    return name, data


# auto's small objects are the loop engine's: its rows are auto's (a forced loop would repeat them)
MATRIX_STRATEGIES = [s for s in STRATEGIES if s != "loop"]


@pytest.mark.parametrize("p", [0.2, 0.4, 1.0])
@pytest.mark.parametrize("fault", MATRIX_FAULTS)
@pytest.mark.parametrize("strategy", MATRIX_STRATEGIES)
def test_fault_matrix_never_installs_wrong_bytes(strategy, fault, p, corpus, proxy, tmp_path):
    name, data = corpus
    proxy.decoy_path = f"/{name}/c/small-1.bin"
    proxy.random_faults = (p, fault, object_get)
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    dest = tmp_path / "o"
    report = pull(f"s3://{name}/c/", str(dest), strategy=strategy, settings=via, **cfg())
    got = files_under(dest)
    want = {k.removeprefix("c/"): v for k, v in data.items()}
    wrong = sorted(k for k, v in got.items() if want.get(k) != v)
    assert wrong == [], f"wrong bytes installed: {wrong}"
    failed = {f.path.removeprefix("c/") for f in report.failures}
    assert failed | set(got) == set(want) and not failed & set(got)
    assert report.done == len(got)
    proxy.random_faults = None
    again = pull(f"s3://{name}/c/", str(dest), strategy=strategy, settings=via, **cfg())
    assert again.failures == []
    assert files_under(dest) == want


@pytest.mark.parametrize("fault", CONTENT_FAULTS)
def test_corrupt_ranged_part_of_a_single_part_object_is_refetched(fault, corpus, proxy, tmp_path):
    name, data = corpus
    proxy.decoy_path = f"/{name}/c/small-1.bin"
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/c/medium.bin")
                         and (h.get("Range") or "").startswith(f"bytes={MiB}-"), fault))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/c/medium.bin", str(tmp_path / "o"), settings=via, **cfg())
    assert proxy.applied == [fault]
    assert report.failures == [] and report.retries >= 1
    assert (tmp_path / "o" / "medium.bin").read_bytes() == data["c/medium.bin"]
    assert report.verified == {"md5": 1}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_flipped_byte_in_a_multipart_object_is_caught_by_every_engine(strategy, corpus, proxy, tmp_path):
    name, data = corpus
    proxy.faults.append((lambda m, p, h: m == "GET" and "c/multi.bin" in p, "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/c/multi.bin", str(tmp_path / "o"), strategy=strategy, settings=via,
                  **cfg())
    assert proxy.applied == ["flip"]
    assert report.failures == [] and report.retries >= 1
    assert (tmp_path / "o" / "multi.bin").read_bytes() == data["c/multi.bin"]
    assert report.verified == {"multipart-md5": 1}


def test_other_objects_body_of_the_same_size_is_refused(s3plain, bucket, proxy, tmp_path):
    name, _ = bucket
    a = blob(4000, "a")
    s3plain.put_object(Bucket=name, Key="o/a.bin", Body=a)
    s3plain.put_object(Bucket=name, Key="o/b.bin", Body=blob(4000, "b"))
    proxy.decoy_path = f"/{name}/o/b.bin"
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/o/a.bin"), "other-body"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/o/a.bin", str(tmp_path / "o"), settings=via, **cfg())
    assert proxy.applied == ["other-body"] and report.failures == []
    assert (tmp_path / "o" / "a.bin").read_bytes() == a


@pytest.mark.parametrize("sse", [True, "sse-c"], ids=["sse-kms", "sse-c"])
@pytest.mark.parametrize("strategy", ["auto", "lean", "sync", "http"])
def test_sse_kms_objects_are_checksum_or_size_verified(strategy, sse, s3admin, s3plain, bucket, proxy,
                                                       tmp_path):
    name, _ = bucket
    with_crc = blob(3000, "k1")
    plain = blob(5000, "k2")
    big = blob(2 * MiB + 5, "k3")
    s3admin.put_object(Bucket=name, Key="k/crc.bin", Body=with_crc)       # botocore adds a CRC32
    s3plain.put_object(Bucket=name, Key="k/plain.bin", Body=plain)
    s3plain.put_object(Bucket=name, Key="k/big.bin", Body=big)
    proxy.sse_kms = sse
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/k/", str(tmp_path / "o"), strategy=strategy, settings=via, **cfg())
    assert report.failures == [] and report.retries == 0
    assert files_under(tmp_path / "o") == {"crc.bin": with_crc, "plain.bin": plain, "big.bin": big}
    assert report.verified == {"crc32": 1, "size-only": 2}


def test_memory_sink_verifies_too(corpus, proxy):
    name, data = corpus
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/c/small-2.bin"), "flip"))
    proxy.faults.append((lambda m, p, h: m == "GET" and "c/multi.bin" in p, "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    got = get_objects(f"s3://{name}/c/", settings=via, **cfg())
    assert sorted(proxy.applied) == ["flip", "flip"]
    assert got == data


@pytest.mark.parametrize("alg", ["CRC32", "CRC32C", "CRC64NVME"])
def test_crc_checked_ranged_objects_combine_per_range_crcs(alg, s3admin, bucket, proxy, tmp_path):
    """A CRC-checked object fetched in ranges: each range's CRC is taken by the thread that
    writes it and the pieces are combined; a flipped byte in one range is still caught."""
    name, _ = bucket
    data = blob(3 * MiB + 17, alg)
    s3admin.put_object(Bucket=name, Key=f"x/{alg}.bin", Body=data, ChecksumAlgorithm=alg)
    proxy.faults.append((lambda m, p, h: m == "GET" and (h.get("Range") or "").startswith(f"bytes={MiB}-"),
                         "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/x/", str(tmp_path / "o"), settings=via, **cfg())
    assert proxy.applied == ["flip"] and report.failures == [] and report.retries >= 1
    assert report.verified == {alg.lower(): 1}
    assert (tmp_path / "o" / f"{alg}.bin").read_bytes() == data


def test_digest_combines_crc_pieces_written_in_any_order():
    import base64
    import random
    import zlib

    from manyfiles.s3.integrity import Claim, Digest

    data = blob(1_000_003, "pieces")
    want = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    ranges = [(o, min(o + 65536, len(data))) for o in range(0, len(data), 65536)]
    random.Random(7).shuffle(ranges)
    d = Digest(Claim("crc32", want), len(data), lambda off, n: data[off:off + n])
    for i, (a, b) in enumerate(ranges):
        if i == 3:
            d.written(a, b - a)            # a resumed part: read back
            continue
        feed = d.claim_feed(a)
        feed.update(data[a:b])
        d.written(a, b - a, feed)
    assert d.check() == "crc32"
    missing = Digest(Claim("crc32", want), len(data), lambda off, n: data[off:off + n])
    for a, b in ranges[1:]:
        feed = missing.claim_feed(a)
        feed.update(data[a:b])
        missing.written(a, b - a, feed)
    with pytest.raises(IntegrityError, match="never hashed"):
        missing.check()


def _ranges_straddling(requests, path: str, bounds: list[int]) -> list[str]:
    """The Range headers of GETs of ``path`` that cross one of the part boundaries ``bounds``."""
    bad = []
    for method, p, rng in requests:
        if method == "GET" and p.split("?")[0].endswith(path) and rng:
            a, b = (int(x) for x in rng.split("=")[1].split("-"))
            if any(a < c <= b for c in bounds):
                bad.append(rng)
    return bad


def test_multipart_ranges_follow_the_parts_that_head_partnumber_gives(s3plain, bucket, proxy, tmp_path):
    """A multipart ETag is checked exactly when the object is fetched in ranges: the part sizes
    come from HEAD ?partNumber=1 (one HEAD per part when the sizes differ), no range crosses a
    part boundary, each part is MD5'd and the digests combine into the ``-N`` ETag.  A byte
    flipped in the second part is caught and the object fetched again."""
    name, _ = bucket
    uniform = [blob(5 * MiB + 1, "u1"), blob(5 * MiB + 1, "u2"), blob(1000, "u3")]
    mixed = [blob(6 * MiB, "m1"), blob(5 * MiB + 7, "m2"), blob(999, "m3")]
    data = {"uniform.bin": put_multipart(s3plain, name, "mp/uniform.bin", uniform),
            "mixed.bin": put_multipart(s3plain, name, "mp/mixed.bin", mixed)}
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/mp/mixed.bin")
                         and (h.get("Range") or "").startswith(f"bytes={6 * MiB}-"), "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/mp/", str(tmp_path / "o"), settings=via, **cfg(part_size=2 * MiB))
    assert proxy.applied == ["flip"] and report.failures == [] and report.retries >= 1
    assert report.verified == {"multipart-md5": 2} and report.engines["ranged"].objects == 2
    assert files_under(tmp_path / "o") == data
    heads = sorted(p.rpartition("/")[2] for m, p, _ in proxy.requests if m == "HEAD")
    assert heads == ["mixed.bin", *(f"mixed.bin?partNumber={i}" for i in (1, 2, 3)),
                     "uniform.bin", "uniform.bin?partNumber=1"]
    for path, parts in (("mp/uniform.bin", uniform), ("mp/mixed.bin", mixed)):
        bounds = [sum(map(len, parts[:i])) for i in range(1, len(parts))]
        assert _ranges_straddling(proxy.requests, path, bounds) == [], path
    record = {r["k"]: r for r in map(json.loads, (tmp_path / "o" / ".s3pull" / "state.jsonl").open())}
    assert Claim.from_record(record["mp/mixed.bin"]).parts == tuple(map(len, mixed))
    assert record["mp/mixed.bin"]["m"] == "multipart-md5"


@pytest.mark.parametrize("strategy", ["auto", "auto, S3's HEAD", "lean", "sync"])
def test_composite_checksums_of_multipart_objects_are_checked_per_part(strategy, s3admin, bucket, proxy,
                                                                       tmp_path):
    """A COMPOSITE checksum (checksum of the part checksums, ``-N``): per-part CRCs, combined
    from the ranges inside each part when fetched in ranges."""
    name, _ = bucket
    proxy.head_as_s3 = strategy.endswith("HEAD")
    strategy = strategy.partition(",")[0]
    data = put_composite(s3admin, name, "cx/multi.bin", [blob(5 * MiB, "c1"), blob(MiB + 5, "c2")], "CRC32")
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/cx/multi.bin"), "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/cx/", str(tmp_path / "o"), strategy=strategy, settings=via, **cfg())
    assert proxy.applied == ["flip"] and report.failures == [] and report.retries >= 1
    # whole GETs see "<crc>-2"; moto's HEAD (ranged: auto) names neither "-N" nor the checksum
    # type, so full-object vs composite is open there and the multipart ETag decides
    assert report.verified == ({"multipart-md5": 1} if strategy == "auto" and not proxy.head_as_s3
                               else {"crc32": 1})
    assert strategy != "auto" or report.engines["ranged"].objects == 1
    assert (tmp_path / "o" / "multi.bin").read_bytes() == data


@pytest.mark.parametrize("alg", ["SHA256", "SHA1"])
def test_sha_checksums_are_checked_whole_and_in_ranges(alg, s3admin, bucket, proxy, tmp_path):
    """SHA checksums do not combine: a ranged object is hashed in order (ranges that finish out
    of order are read back); a flipped byte in any range or in a whole GET is caught."""
    name, _ = bucket
    small, big = blob(5000, "s" + alg), blob(3 * MiB + 17, alg)
    s3admin.put_object(Bucket=name, Key="sha/small.bin", Body=small, ChecksumAlgorithm=alg)
    s3admin.put_object(Bucket=name, Key="sha/big.bin", Body=big, ChecksumAlgorithm=alg)
    in_third_range = f"bytes={2 * MiB}-"
    proxy.faults.append((lambda m, p, h: m == "GET" and (h.get("Range") or "").startswith(in_third_range),
                         "flip"))
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/sha/small.bin"), "flip"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/sha/", str(tmp_path / "o"), settings=via, **cfg())
    assert proxy.applied == ["flip", "flip"] and report.failures == [] and report.retries >= 2
    assert report.verified == {alg.lower(): 2}
    assert files_under(tmp_path / "o") == {"small.bin": small, "big.bin": big}
