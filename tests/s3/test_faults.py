"""Faults injected by a real HTTP proxy in front of moto: the result is correct bytes or a clear failure."""

from __future__ import annotations

import os

import pytest
from s3util import FAST_RETRY, blob

from manyfiles.s3 import ClientSettings, pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.report import Tally

KiB = 1024
PART = 64 * KiB


def get_of(key: str, range_start: int | None = None):
    def pred(method, path, headers):
        if method != "GET" or not path.split("?")[0].endswith("/" + key):
            return False
        if range_start is None:
            return True
        return (headers.get("Range") or "").startswith(f"bytes={range_start}-")
    return pred


def cfg(**kw):
    return {"ranged_min": 128 * KiB, "part_size": PART, "retry": FAST_RETRY,
            "concurrency": 4, **kw}


@pytest.fixture
def via_proxy(proxy) -> ClientSettings:
    return ClientSettings(endpoint_url=proxy.url, region="us-east-1")


@pytest.mark.parametrize("strategy", ["async", "http", "lean", "loop", "threads"])
@pytest.mark.parametrize("fault", ["503", "reset", "truncate", "corrupt"])
def test_transient_faults_are_retried_to_correct_bytes(fault, strategy, bucket, proxy, via_proxy, tmp_path):
    name, put = bucket
    data = put("f/obj.bin", blob(40 * KiB, "f"))
    other = put("f/other.bin", blob(1000, "o"))
    proxy.faults.append((get_of("f/obj.bin"), fault))
    report = pull(f"s3://{name}/f/", str(tmp_path / "o"), strategy=strategy, settings=via_proxy, **cfg())
    assert proxy.applied == [fault]
    assert report.failures == []
    assert report.retries == 1
    assert (tmp_path / "o" / "obj.bin").read_bytes() == data
    assert (tmp_path / "o" / "other.bin").read_bytes() == other


@pytest.mark.parametrize("fault", ["503", "reset", "truncate", "200"])
def test_faults_on_ranged_parts(fault, bucket, proxy, via_proxy, tmp_path):
    name, put = bucket
    data = put("r/big.bin", blob(4 * PART + 7, "r"))
    proxy.faults.append((get_of("r/big.bin", range_start=2 * PART), fault))
    report = pull(f"s3://{name}/r/", str(tmp_path / "o"), settings=via_proxy, **cfg())
    assert proxy.applied == [fault]
    assert report.failures == [] and report.engines == {"ranged": Tally(1, len(data))}
    assert report.retries == 1
    assert (tmp_path / "o" / "big.bin").read_bytes() == data


def test_persistent_server_errors_fail_that_object_only(bucket, proxy, via_proxy, tmp_path):
    name, put = bucket
    put("p/bad.bin", blob(2000, "bad"))
    good = put("p/good.bin", blob(2000, "good"))
    proxy.faults.append((get_of("p/bad.bin"), "500-always"))
    dest = tmp_path / "o"
    report = pull(f"s3://{name}/p/", str(dest), settings=via_proxy, **cfg())
    assert report.done == 1 and [f.path for f in report.failures] == ["p/bad.bin"]
    assert "InternalError" in report.failures[0].reason
    assert report.retries == FAST_RETRY.attempts - 1
    assert proxy.applied.count("500-always") == FAST_RETRY.attempts
    assert (dest / "good.bin").read_bytes() == good
    assert not (dest / "bad.bin").exists()
    assert os.listdir(dest / STATE_DIR / "tmp") == []
    assert (dest / STATE_DIR / "failures.tsv").read_text().startswith("p/bad.bin\t")


def test_auth_errors_are_not_retried(bucket, proxy, via_proxy, tmp_path):
    name, put = bucket
    put("a/x.bin", b"x" * 100)

    def forbid(method, path, headers):
        return get_of("a/x.bin")(method, path, headers)

    proxy.faults.append((forbid, "403-always"))
    report = pull(f"s3://{name}/a/", str(tmp_path / "o"), settings=via_proxy, **cfg())
    assert report.done == 0 and report.retries == 0
    assert "AccessDenied" in report.failures[0].reason
    assert proxy.applied == ["403-always"]


def test_large_object_resumes_by_part(bucket, proxy, via_proxy, tmp_path):
    name, put = bucket
    data = put("big/blob.bin", blob(6 * PART, "resume"))
    proxy.faults.append((get_of("big/blob.bin", range_start=4 * PART), "500-always"))
    dest = tmp_path / "o"
    first = pull(f"s3://{name}/big/", str(dest), settings=via_proxy, **cfg())
    assert [f.path for f in first.failures] == ["big/blob.bin"]
    assert not (dest / "blob.bin").exists()
    parts_files = [f for f in os.listdir(dest / STATE_DIR / "tmp") if f.endswith(".parts")]
    assert len(parts_files) == 1
    proxy.faults.clear()
    proxy.requests.clear()
    second = pull(f"s3://{name}/big/", str(dest), settings=via_proxy, **cfg())
    assert second.failures == [] and second.resumed_parts == 5
    ranged = [r for m, p, r in proxy.requests if m == "GET" and r]
    assert ranged == [f"bytes={4 * PART}-{5 * PART - 1}"]
    assert (dest / "blob.bin").read_bytes() == data
    assert os.listdir(dest / STATE_DIR / "tmp") == []
