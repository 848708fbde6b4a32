"""The manyfiles filesystem against s3fs: the same calls on one bucket of the real S3 test server give
the same answers, except the differences docs/ml.md lists ("Differences from s3fs"), which this suite
asserts exactly: each listed difference is real, and no other call differs.

Every call starts with no listing kept by either filesystem (s3fs answers some calls from the listings
it kept, so the order of calls would otherwise matter): a fresh instance of ours, s3fs's one instance
after ``invalidate_cache()`` (a new s3fs instance costs a botocore client: most of this suite's time)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

fsspec = pytest.importorskip("fsspec")
s3fs = pytest.importorskip("s3fs")

MiB = 1 << 20

# The differences of docs/ml.md, "Differences from s3fs" (at most 8): id -> the calls that show it.
# FIELDS is applied to every answer (the S3 fields of an info dict that s3fs has and we do not).
FIELDS = ("StorageClass", "ChecksumAlgorithm", "ContentType", "VersionId")
DIFFERENCES = {
    "fields": "info dicts of objects lack StorageClass, ChecksumAlgorithm, ContentType, VersionId",
    "read-only": "writing raises PermissionError",
    "local": "absolute paths are local files",
}
DIFFERING_CALLS = {"write pipe_file": "read-only", "write rm": "read-only", "absolute path": "local"}


def _objects() -> dict[str, bytes]:
    objs = {
        "a b.txt": b"with a space\n",
        "\u00fc/\u00f1and\u00fa.txt": "unicode \u00e9\n".encode(),
        "p+q.bin": os.urandom(300),
        "pct%41.bin": os.urandom(200),
        "empty.bin": b"",
        "big.bin": os.urandom(12 * MiB),
        "d/x1.txt": b"one\ntwo\nthree\n",
        "d/xa.txt": b"a" * 100,
        "d/xb.txt": b"b" * 100,
        "d/e/f/g.txt": b"deep",
        "d/marker/": b"",
        "d/marker/in.txt": b"in a marked folder",
        "top.csv": b"a,b\n1,2\n",
    }
    return objs


@pytest.fixture(scope="module")
def pair(moto_direct, tmp_path_factory):
    from s3util import Bucket, put_multipart

    s3 = Bucket(moto_direct, prefix="par")
    objs = _objects()
    for key, data in objs.items():
        s3.put(key, data)
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), os.urandom(1234)]
    put_multipart(s3.admin, s3.bucket, "mp.bin", parts)
    objs["mp.bin"] = b"".join(parts)
    cache = str(tmp_path_factory.mktemp("paritycache"))

    def ours():
        return fsspec.filesystem("manyfiles", cache=cache, endpoint_url=s3.endpoint, region="us-east-1",
                                 skip_instance_cache=True)

    shared = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3.endpoint, "region_name": "us-east-1"},
                               skip_instance_cache=True, use_listings_cache=True)

    def theirs():
        shared.invalidate_cache()
        return shared

    yield s3, objs, ours, theirs
    s3.close()


def _norm(value):
    """An answer in a comparable form: dicts without FIELDS, datetimes as UTC, errors as their
    builtin family (FileNotFoundError, ValueError...)."""
    if isinstance(value, BaseException):
        family = next(c for c in type(value).__mro__ if c.__module__ == "builtins")
        return ("error", family.__name__)
    if isinstance(value, dict):
        return {k: _norm(v) for k, v in value.items() if k not in FIELDS}
    if isinstance(value, (list, tuple)):
        return type(value)(_norm(v) for v in value)
    if isinstance(value, datetime.datetime):
        return value.astimezone(datetime.timezone.utc)
    if isinstance(value, str) and value.startswith('"') and value.endswith('"'):
        return value            # ETags are quoted by both
    return value


def _calls(b: str) -> dict[str, object]:
    missing = "nobucket-parity-zz"

    def file_api(fs):
        with fs.open(f"{b}/d/x1.txt") as f:
            out = [f.path, f.fs is fs, f.size, f.readline(), f.tell(), f.read(3), f.seek(0, 2), f.read()]
            for args in ((-1,), (0, 5)):
                try:
                    f.seek(*args)
                except Exception as exc:
                    out.append(_norm(exc))
            out.append({k: v for k, v in f.info().items() if k in ("name", "size", "type", "ETag")})
        return out

    def big_reads(fs):
        with fs.open(f"{b}/mp.bin") as f:
            f.seek(5 * MiB - 3)
            a = f.read(7)
            f.seek(-10, 2)
            return [a, f.read(), f.tell()]

    return {
        "ls bucket": lambda fs: fs.ls(b),
        "ls bucket names": lambda fs: fs.ls(b, detail=False),
        "ls folder": lambda fs: fs.ls(f"{b}/d"),
        "ls folder/": lambda fs: fs.ls(f"s3://{b}/d/", detail=False),
        "ls marker folder": lambda fs: fs.ls(f"{b}/d/marker", detail=False),
        "ls file": lambda fs: fs.ls(f"{b}/d/x1.txt"),
        "ls unicode": lambda fs: fs.ls(f"{b}/\u00fc", detail=False),
        "ls missing": lambda fs: fs.ls(f"{b}/nope"),
        "ls missing bucket": lambda fs: fs.ls(missing),
        "info file": lambda fs: fs.info(f"{b}/d/x1.txt"),
        "info space": lambda fs: fs.info(f"s3://{b}/a b.txt"),
        "info plus": lambda fs: fs.info(f"{b}/p+q.bin"),
        "info percent": lambda fs: fs.info(f"{b}/pct%41.bin"),
        "info empty": lambda fs: fs.info(f"{b}/empty.bin"),
        "info multipart": lambda fs: fs.info(f"{b}/mp.bin"),
        "info folder": lambda fs: fs.info(f"{b}/d/e"),
        "info bucket": lambda fs: fs.info(b),
        "info missing": lambda fs: fs.info(f"{b}/nope.bin"),
        "info missing bucket": lambda fs: fs.info(f"{missing}/k"),
        "exists file": lambda fs: fs.exists(f"{b}/d/xa.txt"),
        "exists folder": lambda fs: fs.exists(f"{b}/d/e/f"),
        "exists bucket": lambda fs: fs.exists(b),
        "exists missing": lambda fs: fs.exists(f"{b}/d/zz"),
        "exists missing bucket": lambda fs: fs.exists(missing),
        "exists key of missing bucket": lambda fs: fs.exists(f"{missing}/k"),
        "isdir": lambda fs: [fs.isdir(f"{b}/{p}") for p in ("d", "d/e/f", "d/x1.txt", "nope", "d/marker")],
        "isfile": lambda fs: [fs.isfile(f"{b}/{p}") for p in ("d", "d/x1.txt", "empty.bin", "nope")],
        "find": lambda fs: fs.find(b),
        "find withdirs": lambda fs: fs.find(b, withdirs=True),
        "find detail": lambda fs: fs.find(f"{b}/d", detail=True),
        "find maxdepth 1": lambda fs: fs.find(f"{b}/d", maxdepth=1),
        "find maxdepth 2 withdirs": lambda fs: fs.find(f"{b}/d", maxdepth=2, withdirs=True),
        "find file": lambda fs: fs.find(f"{b}/top.csv"),
        "find missing": lambda fs: fs.find(f"{b}/nope"),
        "glob *": lambda fs: fs.glob(f"{b}/*"),
        "glob **": lambda fs: fs.glob(f"{b}/**"),
        "glob ?": lambda fs: fs.glob(f"{b}/d/x?.txt"),
        "glob [ab]": lambda fs: fs.glob(f"s3://{b}/d/x[ab].txt"),
        "glob **/*.txt": lambda fs: fs.glob(f"{b}/**/*.txt"),
        "glob folders": lambda fs: fs.glob(f"{b}/d/*/"),
        "glob detail": lambda fs: fs.glob(f"{b}/d/x*", detail=True),
        "walk": lambda fs: list(fs.walk(b)),
        "walk maxdepth": lambda fs: list(fs.walk(f"{b}/d", maxdepth=1)),
        "du": lambda fs: fs.du(b),
        "du each": lambda fs: fs.du(f"{b}/d", total=False),
        "expand_path recursive": lambda fs: fs.expand_path(f"{b}/d", recursive=True),
        "cat_file": lambda fs: fs.cat_file(f"{b}/d/x1.txt"),
        "cat_file range": lambda fs: fs.cat_file(f"{b}/d/x1.txt", start=2, end=7),
        "cat_file negative": lambda fs: fs.cat_file(f"{b}/d/x1.txt", start=-5),
        "cat_file negative end": lambda fs: fs.cat_file(f"{b}/d/x1.txt", start=1, end=-1),
        "cat_file negative past start": lambda fs: fs.cat_file(f"{b}/d/x1.txt", start=-1000),
        "cat_file past end": lambda fs: fs.cat_file(f"{b}/d/x1.txt", start=3, end=1000),
        "cat_file empty": lambda fs: fs.cat_file(f"{b}/empty.bin"),
        "cat_file unicode": lambda fs: fs.cat_file(f"{b}/\u00fc/\u00f1and\u00fa.txt"),
        "cat_file big range": lambda fs: fs.cat_file(f"{b}/big.bin", start=4 * MiB - 5, end=8 * MiB + 5),
        "cat_file missing": lambda fs: fs.cat_file(f"{b}/nope.bin"),
        "cat_file missing bucket": lambda fs: fs.cat_file(f"{missing}/k"),
        "cat": lambda fs: fs.cat([f"{b}/d/xa.txt", f"{b}/d/xb.txt"]),
        "cat_ranges": lambda fs: fs.cat_ranges([f"{b}/d/x1.txt", f"{b}/p+q.bin", f"{b}/big.bin"],
                                               [0, -50, 5 * MiB], [4, None, 5 * MiB + 9]),
        "cat_ranges negative past start": lambda fs: fs.cat_ranges([f"{b}/d/xa.txt"], [-1000], [None]),
        "file api": file_api,
        "multipart reads": big_reads,
        "modified": lambda fs: fs.modified(f"{b}/d/x1.txt"),
        "modified folder": lambda fs: fs.modified(f"{b}/d"),
        "size": lambda fs: [fs.size(f"{b}/big.bin"), fs.sizes([f"{b}/empty.bin", f"{b}/mp.bin"])],
        "checksum-free head": lambda fs: fs.head(f"{b}/top.csv", 4),
        "tail": lambda fs: fs.tail(f"{b}/top.csv", 4),
        "read_text": lambda fs: fs.read_text(f"{b}/a b.txt"),
        "ls root": lambda fs: b in fs.ls(""),
        "absolute path": lambda fs: fs.exists(f"/{b}/top.csv"),
        # last: s3fs writes
        "write pipe_file": lambda fs: fs.pipe_file(f"{b}/w/new.bin", b"new"),
        "write rm": lambda fs: fs.rm(f"{b}/w/new.bin"),
    }


def _run(call, make):
    try:
        return _norm(call(make()))
    except Exception as exc:
        return _norm(exc)


def test_every_call_answers_as_s3fs_but_the_documented_differences(pair):
    s3, _objs, ours, theirs = pair
    differ = {}
    for name, call in _calls(s3.bucket).items():
        a, b = _run(call, ours), _run(call, theirs)
        if a != b:
            differ[name] = (a, b)
    assert set(DIFFERING_CALLS.values()) | {"fields"} == set(DIFFERENCES)
    assert set(differ) == set(DIFFERING_CALLS), "\n".join(f"{n}:\n  ours   {a!r}\n  s3fs   {b!r}"
                                                         for n, (a, b) in differ.items())
    assert len(DIFFERENCES) <= 8


def test_the_documented_field_difference_is_real_and_the_list_is_in_the_docs(pair):
    s3, _objs, ours, theirs = pair
    info = theirs().info(f"{s3.bucket}/d/x1.txt")
    assert set(FIELDS) & set(info), "s3fs no longer gives these fields: drop the difference"
    assert not set(FIELDS) & set(ours().info(f"{s3.bucket}/d/x1.txt"))
    docs = Path(__file__).resolve().parents[2].joinpath("docs", "ml.md").read_text()
    section = docs.split("## Differences from s3fs", 1)[1].split("\n## ", 1)[0]
    items = [line for line in section.splitlines() if line.startswith("* **")]
    assert len(items) == len(DIFFERENCES), items
    for text in DIFFERENCES.values():
        assert any(text in line for line in items), text


def test_every_object_reads_the_same_through_both(pair):
    s3, objs, ours, theirs = pair
    mine, other = ours(), theirs()
    for key, data in objs.items():
        if key.endswith("/"):
            continue
        assert mine.cat_file(f"{s3.bucket}/{key}") == other.cat_file(f"{s3.bucket}/{key}") == data, key


def test_after_a_find_both_answer_from_the_listings_they_kept(pair):
    """s3fs keeps the folders a ``find`` listed and answers ``info``/``ls``/``isdir`` of them from there;
    so does ours: the same answers, and neither sends a request for them."""
    s3, _objs, ours, theirs = pair
    b = s3.bucket
    questions = [lambda fs: fs.info(f"{b}/d/e"), lambda fs: fs.ls(f"{b}/d", detail=False),
                 lambda fs: fs.isdir(f"{b}/d/e/f"), lambda fs: fs.info(f"{b}/d/nope"),
                 lambda fs: fs.info(f"{b}/d/x1.txt"), lambda fs: fs.info(f"{b}/d/marker"),
                 lambda fs: fs.ls(f"{b}/d/marker", detail=False), lambda fs: fs.exists(f"{b}/d/e/f/g.txt")]
    answers, asked = {}, {}
    for name, make in (("ours", ours), ("s3fs", theirs)):
        fs = make()
        fs.find(f"{b}/d")
        before = len(s3.proxy.requests)
        answers[name] = [_run(q, lambda fs=fs: fs) for q in questions]
        asked[name] = s3.proxy.requests[before:]
    assert answers["ours"] == answers["s3fs"]
    assert asked == {"ours": [], "s3fs": []}
