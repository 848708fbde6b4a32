"""s3pull selects keys with the one glob rule set of fastls and fastrm (tests/globcases.py).

The parity table's names are uploaded as keys (those that are UTF-8: S3 keys cannot hold other
bytes) at ``g/NAME`` and ``g/sub/NAME``; every pattern then goes through s3pull's own selection
path, a dry run against the server: ``--include``/``--exclude`` (a pattern without ``/`` tests the
name, one with ``/`` the relative path) and the wildcard in the source URL (the whole key).
"""

from __future__ import annotations

import fnmatch
import os
import uuid

import pytest

from globcases import NAMES, PATTERNS, expected
from manyfiles.s3 import plan
from manyfiles.s3.keys import parse_url

# UTF-8 names only (S3 keys are UTF-8); moto's server cannot store a key with a newline (its
# router answers 404), real S3 can
KEY_NAMES = [n for n in NAMES if n.decode("utf-8", "replace").encode() == n and b"\n" not in n]


@pytest.fixture(scope="module")
def table_bucket(s3plain) -> str:
    name = f"g-{uuid.uuid4().hex[:12]}"
    s3plain.create_bucket(Bucket=name)
    for n in KEY_NAMES:
        for under in ("g/", "g/sub/"):
            s3plain.put_object(Bucket=name, Key=under + n.decode(), Body=n)
    return name


def planned(source: str, settings, tmp_path, **kw) -> list[str]:
    p = plan(source, tmp_path / "never-created", settings=settings, **kw)
    assert p.failures == [] and not (tmp_path / "never-created").exists()
    return sorted(j.rel for j in p.objects)


def test_every_key_name_of_the_table_is_listed(table_bucket, settings, tmp_path):
    everything = planned(f"s3://{table_bucket}/g/", settings, tmp_path)
    assert len(everything) == 2 * len(KEY_NAMES) and len(KEY_NAMES) >= 30


@pytest.mark.parametrize("option", ["include", "exclude"])
def test_include_and_exclude_select_like_fastls_and_fastrm(option, table_bucket, settings, tmp_path):
    everything = {n.decode() for n in KEY_NAMES} | {f"sub/{n.decode()}" for n in KEY_NAMES}
    for pattern in PATTERNS:
        text = os.fsdecode(pattern)
        top = {n.decode() for n in expected(pattern, KEY_NAMES)}
        deep = {f"sub/{n.decode()}" for n in expected(pattern, KEY_NAMES, under=b"sub")}
        want = top | deep if option == "include" else everything - top - deep
        got = planned(f"s3://{table_bucket}/g/", settings, tmp_path, **{option: [text]})
        assert got == sorted(want), (pattern, option)


def test_wildcards_in_the_source_url_follow_the_same_rules(table_bucket, settings, tmp_path):
    keys = [f"g/{n.decode()}" for n in KEY_NAMES] + [f"g/sub/{n.decode()}" for n in KEY_NAMES]
    for pattern in PATTERNS:
        text = "g/" + os.fsdecode(pattern)
        if any(0xDC80 <= ord(c) <= 0xDCFF for c in text):
            continue   # not UTF-8: refused (test_a_source_that_is_not_utf8_is_one_line)
        url = parse_url(f"s3://{table_bucket}/{text}")
        if url.pattern is None:   # no wildcard: a prefix, as in every S3 tool
            want = [k for k in keys if k.startswith(text)]
        else:
            want = [k for k in keys if fnmatch.fnmatchcase(k, text)]
        got = planned(f"s3://{table_bucket}/{text}", settings, tmp_path)
        assert got == sorted(k.removeprefix(url.base) for k in want), pattern


def test_a_source_that_is_not_utf8_is_one_line(table_bucket, run_cli, cli_env, tmp_path):
    """Bytes from the command line that no S3 key can hold: a usage error, not a traceback."""
    for tail in (b"g/\xff", b"g/*\xff"):
        source = b"s3://" + table_bucket.encode() + b"/" + tail
        r = run_cli("s3pull", source, str(tmp_path / "o"), env=cli_env)
        assert r.returncode == 2 and r.stderr.count(b"\n") == 1, r.stderr
        assert b"not UTF-8" in r.stderr and not (tmp_path / "o").exists()
