"""The candidate engines (engines/candidates.py): obstore (Rust object_store) and crt (awscrt's S3
client).  Right bytes, every byte checked against the object's claim, wrong bytes never installed, a
changed object refused; and the limit docs/s3pull.md records for obstore: it exposes no checksum
and no encryption header, so its check is the ETag's MD5 and an SSE-KMS object cannot be told from
a corrupt one (crt sees every header and checks what the lean engine checks)."""

from __future__ import annotations

import json

import pytest
from s3util import blob, files_under, put_multipart

from manyfiles.s3 import ClientSettings, RetryPolicy, pull

pytest.importorskip("obstore")
pytest.importorskip("awscrt.s3")
CANDIDATES = ["obstore", "crt"]

FAST = RetryPolicy(attempts=3, base=0.002, cap=0.01)
MiB = 1 << 20


def _records(dest) -> dict:
    lines = (dest / ".s3pull" / "state.jsonl").read_text().splitlines()
    return {r["k"]: r for r in map(json.loads, lines)}


@pytest.mark.parametrize("engine", CANDIDATES)
def test_candidate_installs_every_object_checked(engine, s3admin, s3plain, bucket, settings, tmp_path):
    name, _ = bucket
    data = {f"o/{i}.bin": blob(1000 * i + 1, f"o{i}") for i in range(6)}
    for key, body in data.items():
        s3admin.put_object(Bucket=name, Key=key, Body=body)     # with a CRC32 (botocore's default)
    parts = [blob(5 * MiB, "m1"), blob(MiB // 2, "m2")]
    data["o/multi.bin"] = put_multipart(s3plain, name, "o/multi.bin", parts)
    report = pull(f"s3://{name}/o/", str(tmp_path / "o"), strategy=engine, retry=FAST, concurrency=4,
                  settings=settings)
    assert report.failures == [] and report.done == 7
    assert files_under(tmp_path / "o") == {k.removeprefix("o/"): v for k, v in data.items()}
    # the CRC32 the server holds is out of obstore's reach: the ETags are what it checked
    want = {"md5": 6, "multipart-md5": 1} if engine == "obstore" else {"crc32": 6, "multipart-md5": 1}
    assert report.verified == want
    assert {r["m"] for r in _records(tmp_path / "o").values()} == set(want)


@pytest.mark.parametrize("engine", CANDIDATES)
@pytest.mark.parametrize("fault", ["flip", "truncate", "other-body"])
def test_candidate_never_installs_wrong_bytes(fault, engine, s3plain, bucket, proxy, tmp_path):
    name, _ = bucket
    a, b = blob(40_000, "a"), blob(40_000, "b")
    s3plain.put_object(Bucket=name, Key="f/a.bin", Body=a)
    s3plain.put_object(Bucket=name, Key="f/b.bin", Body=b)
    proxy.decoy_path = f"/{name}/f/b.bin"
    proxy.faults.append((lambda m, p, h: m == "GET" and p.endswith("/f/a.bin"), fault))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/f/", str(tmp_path / "o"), settings=via, strategy=engine, retry=FAST,
                  concurrency=4)
    assert proxy.applied == [fault]
    assert report.failures == [] and report.retries >= 1        # caught, fetched again
    assert files_under(tmp_path / "o") == {"a.bin": a, "b.bin": b}


@pytest.mark.parametrize("engine", CANDIDATES)
def test_candidate_refuses_an_object_changed_since_the_listing(engine, s3plain, bucket, settings, tmp_path):
    name, _ = bucket
    s3plain.put_object(Bucket=name, Key="c/x.bin", Body=blob(5000, "old"))
    from manyfiles.s3 import plan

    planned = plan(f"s3://{name}/c/", str(tmp_path / "o"), settings=settings, strategy=engine, retry=FAST)
    s3plain.put_object(Bucket=name, Key="c/x.bin", Body=blob(5000, "new"))
    report = planned.execute()
    assert [f.code for f in report.failures] == ["changed"]
    assert files_under(tmp_path / "o") == {}


def test_obstore_engine_cannot_tell_an_sse_kms_object_from_a_corrupt_one(s3plain, bucket, proxy, tmp_path):
    """What disqualifies it as a default: without the encryption header, an SSE-KMS object's ETag
    (not an MD5) fails the MD5 check; the crt and lean engines check it by size and say so."""
    name, _ = bucket
    body = blob(3000, "kms")
    s3plain.put_object(Bucket=name, Key="k/x.bin", Body=body)
    proxy.sse_kms = True
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    report = pull(f"s3://{name}/k/", str(tmp_path / "o"), settings=via, strategy="obstore", retry=FAST)
    assert [f.code for f in report.failures] == ["integrity"] and files_under(tmp_path / "o") == {}
    for engine in ("crt", "lean"):
        report = pull(f"s3://{name}/k/", str(tmp_path / engine), settings=via, strategy=engine, retry=FAST)
        assert report.failures == [] and report.verified == {"size-only": 1}
        assert files_under(tmp_path / engine) == {"x.bin": body}
