"""Lying HEADs never turn a check into a size-only one (issue 16).

A proxy answers every HEAD the way a broken gateway might (``Content-Length: 0``, a wrong size, a
wrong ``x-amz-mp-parts-count``, which also makes ``HEAD ?partNumber=1`` useless for the part
layout) while flipping bytes of or lying about the ranges of half the GETs.  For every engine:
no wrong byte is installed, a multipart object whose part sizes no uploader uses (so its ETag
cannot be checked without a HEAD) fails with one line and leaves nothing under its final name,
the exit code is 1, and a rerun without faults installs every object exactly, each with a full
check that ``s3pull verify`` confirms.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest
from s3util import CREDS, HEAD_FAULTS, blob, files_under, put_multipart

from manyfiles.s3 import ClientSettings, RetryPolicy, pull, verify
from manyfiles.s3.routing import STRATEGIES

KiB, MiB = 1 << 10, 1 << 20
FAST = RetryPolicy(attempts=4, base=0.002, cap=0.01)
FULL_CHECKS = {"md5", "crc32", "multipart-md5", "multipart-md5-searched"}
UNMATCHED = "multi-odd.bin"     # parts of 5 MiB + 1: no uploader's part size reproduces its ETag


def cfg(**kw):
    return {"ranged_min": 1 * MiB, "part_size": 1 * MiB, "retry": FAST, "concurrency": 4, "processes": 2,
            **kw}


def is_head(method, path, headers) -> bool:
    return method == "HEAD"


def is_object_get(method, path, headers) -> bool:
    return method == "GET" and "list-type" not in path


@pytest.fixture(scope="module")
def corpus(s3admin, s3plain):
    """Single-part (MD5 and CRC32), multipart at 5 MiB parts (found by the layout search) and at
    5 MiB + 1 (not found), small ones fetched whole, larger ones in ranges by auto/ranged."""
    name = f"h-{uuid.uuid4().hex[:12]}"
    s3admin.create_bucket(Bucket=name)
    data = {"small.bin": blob(3000, "small"), "crc.bin": blob(4000, "crc"),
            "big.bin": blob(2 * MiB + 5, "big")}
    s3plain.put_object(Bucket=name, Key="h/small.bin", Body=data["small.bin"])
    s3admin.put_object(Bucket=name, Key="h/crc.bin", Body=data["crc.bin"], ChecksumAlgorithm="CRC32")
    s3plain.put_object(Bucket=name, Key="h/big.bin", Body=data["big.bin"])
    data["multi.bin"] = put_multipart(s3plain, name, "h/multi.bin", [blob(5 * MiB, "m1"), blob(1000, "m2")])
    data[UNMATCHED] = put_multipart(s3plain, name, f"h/{UNMATCHED}",
                                    [blob(5 * MiB + 1, "o1"), blob(5 * MiB + 1, "o2"), blob(999, "o3")])
    return name, data


@pytest.mark.parametrize("lie", HEAD_FAULTS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_lying_heads_and_bad_bytes_never_install_a_wrong_byte(strategy, lie, corpus, proxy, tmp_path):
    name, data = corpus
    proxy.random_faults = [(1.0, lie, is_head), (0.5, ("flip", "wrong-range"), is_object_get)]
    for key, kind in (("small.bin", "flip"), ("big.bin", "wrong-range"), ("multi.bin", "flip")):
        proxy.faults.append((lambda m, p, h, key=key: is_object_get(m, p, h) and f"/h/{key}" in p, kind))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    dest = tmp_path / "o"
    report = pull(f"s3://{name}/h/", str(dest), strategy=strategy, settings=via, **cfg())
    assert lie in proxy.applied and proxy.faults == []      # every object's first GET was bad
    got = files_under(dest)
    wrong = sorted(k for k, v in got.items() if data.get(k) != v)
    assert wrong == [], f"wrong bytes installed: {wrong}"
    failed = {f.path.removeprefix("h/") for f in report.failures}
    assert UNMATCHED in failed                                # its ETag cannot be checked: refused
    assert failed | set(got) == set(data) and not failed & set(got)
    assert all("\n" not in f.reason for f in report.failures)
    assert set(report.verified) <= FULL_CHECKS and sum(report.verified.values()) == report.done == len(got)
    proxy.random_faults = None
    again = pull(f"s3://{name}/h/", str(dest), strategy=strategy, settings=via, **cfg())
    assert again.failures == [] and files_under(dest) == data
    checked = verify(dest)
    assert checked.ok and set(checked.verified) <= FULL_CHECKS and sum(checked.verified.values()) == len(data)


@pytest.mark.parametrize("strategy", ["auto", "lean", "http", "sync"])
def test_an_unusable_layout_is_asked_again_then_searched(strategy, corpus, proxy, tmp_path):
    """HEAD ?partNumber=1 useless every time: asked again (counted as retries), then the object is
    fetched whole and its ETag found at 5 MiB parts (``multipart-md5-searched``, recorded with the
    part sizes found); the 5 MiB + 1 object is refused, nothing of it left under its name."""
    name, data = corpus
    proxy.random_faults = (1.0, "head-parts-count", lambda m, p, h: m == "HEAD" and "partNumber" in p)
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    dest = tmp_path / "o"
    report = pull(f"s3://{name}/h/multi", str(dest), strategy=strategy, settings=via, **cfg())
    assert report.verified == {"multipart-md5-searched": 1} and report.retries >= FAST.attempts - 1
    assert [(f.path, f.code) for f in report.failures] == [(f"h/{UNMATCHED}", "integrity")]
    assert "not reproduced at any known part size" in report.failures[0].reason
    assert files_under(dest) == {"multi.bin": data["multi.bin"]}
    assert not (dest / UNMATCHED).exists()
    assert [n for n in os.listdir(dest / ".s3pull" / "tmp") if not n.endswith((".part", ".parts"))] == []
    records = [json.loads(line) for line in (dest / ".s3pull" / "state.jsonl").read_text().splitlines()]
    (rec,) = [r for r in records if r["k"] == "h/multi.bin"]
    assert rec["m"] == "multipart-md5" and rec["f"] == 1 and rec["p"][:2] == [5 * MiB, 2]


def test_the_cli_fails_each_unverifiable_object_with_one_line(corpus, proxy, run_cli, tmp_path):
    name, data = corpus
    proxy.random_faults = [(1.0, "head-zero", is_head), (0.5, "flip", is_object_get)]
    env = {**CREDS, "AWS_ENDPOINT_URL": proxy.url, "MANYFILES_RETRY_BASE": "0.01"}
    dest = tmp_path / "o"
    r = run_cli("s3pull", f"s3://{name}/h/", str(dest), "--retries", "3", env=env)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert sum(f"h/{UNMATCHED}" in line for line in err.splitlines()) == 1, err
    assert "Traceback" not in err
    got = files_under(dest)
    assert all(data[k] == v for k, v in got.items()) and UNMATCHED not in got
    proxy.random_faults = None
    again = run_cli("s3pull", f"s3://{name}/h/", str(dest), env=env)
    assert again.returncode == 0, again.stderr.decode()
    assert files_under(dest) == data
    ok = run_cli("s3pull", "verify", str(dest), env=env)
    assert ok.returncode == 0 and b"weak-check" not in ok.stdout + ok.stderr
