"""manyfiles.mirror.comparison against moto over HTTP (through the test edge, which records every
request): every kind of difference planted in a small tree is found, by each rule, with one LIST and
a HEAD only for the objects whose ETag is no MD5."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from s3util import Bucket, blob, put_multipart

from manyfiles import mirror
from manyfiles.errors import NotFound, UsageError, WrongKind
from manyfiles.s3.store import store_for

MiB = 1 << 20


@pytest.fixture(scope="module")
def seeded(moto_direct, tmp_path_factory):
    """A bucket and a folder with every kind of difference under ``p/`` (made once: the tests copy
    the folder and never change the bucket)."""
    b = Bucket(moto_direct, prefix="mirror")
    root = tmp_path_factory.mktemp("mirror") / "src"
    (root / "sub").mkdir(parents=True)
    same = {"same.txt": b"same bytes", "sub/deep.txt": b"deep", "sub/empty": b""}
    for rel, data in same.items():
        (root / rel).write_bytes(data)
        b.put(f"p/{rel}", data)
    (root / "only-local.txt").write_bytes(b"local")
    b.put("p/only-remote.txt", b"remote")
    (root / "same-size.bin").write_bytes(b"AAAA")           # same size, other bytes (an MD5 ETag)
    b.put("p/same-size.bin", b"BBBB")
    (root / "other-size.txt").write_bytes(b"short")
    b.put("p/other-size.txt", b"longer bytes")
    big = [blob(5 * MiB, "a"), blob(1000, "b")]             # multipart: ETag md5-2, a HEAD decides
    put_multipart(b.admin, b.bucket, "p/multi-same.bin", big)
    (root / "multi-same.bin").write_bytes(b"".join(big))
    put_multipart(b.admin, b.bucket, "p/multi-other.bin", big)
    flipped = bytearray(b"".join(big))
    flipped[7] ^= 1
    (root / "multi-other.bin").write_bytes(bytes(flipped))
    os.symlink("/etc/hostname", root / "link")               # never followed
    (root / os.fsdecode(b"bad\xff")).write_bytes(b"x")       # no key can hold it
    b.put("p/../escape", b"x")                               # no local path can hold it
    b.put("elsewhere/same.txt", b"not under the prefix")
    yield b, root
    b.close()


@pytest.fixture
def world(seeded, tmp_path: Path):
    """The seeded bucket and this test's copy of the folder (mtimes kept, links as links)."""
    b, pristine = seeded
    root = tmp_path / "src"
    shutil.copytree(pristine, root, symlinks=True)
    b.proxy.requests.clear()
    return b, root


def _paths(entries) -> list[str]:
    return [e.path for e in entries]


def test_checksum_finds_every_planted_difference_with_one_list_and_heads_only_for_multipart(world) -> None:
    b, root = world
    store = store_for(b.settings, b.bucket)
    c = mirror.compare(root, store, "p", by="checksum")
    assert _paths(c.missing_remote) == ["only-local.txt"]
    assert _paths(c.missing_local) == ["only-remote.txt"]
    # same-size.bin: its MD5 ETag did not match, the HEAD's CRC32 (boto3 sends one) confirmed it
    assert [(e.path, e.why) for e in c.differing] == [("multi-other.bin", "multipart-md5"),
                                                      ("other-size.txt", "size"), ("same-size.bin", "crc32")]
    assert [(e.path, e.why) for e in c.same] == [("multi-same.bin", "multipart-md5"), ("same.txt", "md5"),
                                                 ("sub/deep.txt", "md5"), ("sub/empty", "md5")]
    assert {e.path: e.why for e in c.skipped} == {"bad\\xff": "name is not UTF-8 (no S3 key can hold it)",
                                                   "link": "symlink (not followed)",
                                                   "../escape": "unsafe key: '..' path segment"}
    assert not c.equal and c.failures == []
    assert len(b.lists()) == 1 and b.gets() == []
    # the MD5 ETags are compared from the listing; the multipart ones need a HEAD (and their part
    # sizes); a mismatching MD5 is confirmed by a HEAD before it counts (an SSE-KMS ETag is no MD5)
    heads = sorted(p.rpartition("/")[2].partition("?")[0] for m, p, _ in b.proxy.requests if m == "HEAD")
    assert set(heads) == {"multi-same.bin", "multi-other.bin", "same-size.bin"}
    assert c.heads == 3 and len(heads) == 5     # + one HEAD ?partNumber=1 per multipart object (part sizes)
    kinds = [k for k, _ in c.differences()]
    assert sorted(kinds) == ["differing"] * 3 + ["missing-local", "missing-remote"]


def test_size_counts_same_size_as_same_and_sends_no_head(world) -> None:
    b, root = world
    c = mirror.compare(root, store_for(b.settings, b.bucket), "p/", by="size")
    assert _paths(c.differing) == ["other-size.txt"]
    assert "same-size.bin" in _paths(c.same) and "multi-other.bin" in _paths(c.same)
    assert b.heads() == [] and c.hashed_bytes == 0


def test_size_mtime_follows_the_direction_of_the_copy(world) -> None:
    b, root = world
    future = time.time() + 3600
    os.utime(root / "same.txt", (future, future))        # the file is newer than its object
    store = store_for(b.settings, b.bucket)
    up = mirror.compare(root, store, "p/", by="size-mtime", source="local")
    assert ("same.txt", "local newer") in [(e.path, e.why) for e in up.differing]
    assert "sub/deep.txt" in _paths(up.same)
    down = mirror.compare(root, store, "p/", by="size-mtime", source="remote")
    assert "same.txt" in _paths(down.same)
    past = time.time() - 3600
    os.utime(root / "sub" / "deep.txt", (past, past))   # the object is newer than the file
    down = mirror.compare(root, store, "p/", by="size-mtime", source="remote")
    assert ("sub/deep.txt", "remote newer") in [(e.path, e.why) for e in down.differing]


def test_include_exclude_select_both_sides(world) -> None:
    b, root = world
    c = mirror.compare(root, store_for(b.settings, b.bucket), "p/", include=["*.txt"], exclude=["sub/*"])
    assert _paths(c.same) == ["same.txt"]
    assert _paths(c.missing_remote) == ["only-local.txt"] and _paths(c.missing_local) == ["only-remote.txt"]
    assert _paths(c.differing) == ["other-size.txt"]


def test_an_equal_tree_is_equal(moto_direct, tmp_path: Path) -> None:
    b = Bucket(moto_direct, prefix="mirror")
    try:
        for i in range(3):
            (tmp_path / f"f{i}").write_bytes(blob(100 + i, str(i)))
            b.put(f"p/f{i}", blob(100 + i, str(i)))
        (tmp_path / ".s3pull").mkdir()                       # s3pull's state is never compared
        (tmp_path / ".s3pull" / "state.jsonl").write_text("{}\n")
        c = mirror.check(tmp_path, f"s3://{b.bucket}/p/", settings=b.settings)
        assert c.equal and len(c.same) == 3 and c.local_files == 3 and c.remote_objects == 3
        assert c.to_dict()["equal"] is True
    finally:
        b.close()


def test_bad_arguments_are_refused_before_any_request(moto_direct, tmp_path: Path) -> None:
    b = Bucket(moto_direct, prefix="mirror")
    try:
        store = store_for(b.settings, b.bucket)
        with pytest.raises(UsageError, match="by must be one of"):
            mirror.compare(tmp_path, store, "p/", by="md5")
        with pytest.raises(NotFound):
            mirror.compare(tmp_path / "nope", store, "p/")
        (tmp_path / "file").write_text("x")
        with pytest.raises(WrongKind):
            mirror.compare(tmp_path / "file", store, "p/")
        with pytest.raises(UsageError, match="wildcards"):
            mirror.check(tmp_path, f"s3://{b.bucket}/p/*.txt", settings=b.settings)
        assert b.proxy.requests == []
    finally:
        b.close()


def _check_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).parent / "manyfiles"), "check", *args],
                          capture_output=True, env={**os.environ, **env}, timeout=120)


def test_check_prints_each_difference_and_exits_1_then_0_once_equal(world) -> None:
    """``manyfiles check SRC s3://...`` as a real process: one stdout line per difference (each kind
    planted), notes for names not compared, exit 1; --json the same as objects; equal: exit 0."""
    b, root = world
    url = f"s3://{b.bucket}/p/"
    r = _check_cli(str(root), url, env=b.env)
    assert r.returncode == 1, r.stderr
    assert r.stdout.decode().splitlines() == ["differing\tmulti-other.bin\tmultipart-md5",
                                              "missing-remote\tonly-local.txt",
                                              "missing-local\tonly-remote.txt",
                                              "differing\tother-size.txt\tsize",
                                              "differing\tsame-size.bin\tcrc32"]
    err = r.stderr.decode().splitlines()
    assert "manyfiles: note: link: not compared: symlink (not followed)" in err
    assert err[-1].startswith("manyfiles: 8 files, 9 objects compared by checksum: 4 same, 3 differing, "
                              "1 missing remote, 1 missing local, 3 skipped in "), err
    assert "Traceback" not in r.stderr.decode()
    r = _check_cli(str(root), url, "--json", "--compare", "size", env=b.env)
    records = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert r.returncode == 1
    kinds = ("differing", "missing-local", "missing-remote")
    assert [(x["event"], x["path"]) for x in records if x["event"] in kinds] == [
        ("missing-remote", "only-local.txt"), ("missing-local", "only-remote.txt"),
        ("differing", "other-size.txt")]
    assert records[-1]["event"] == "summary" and records[-1]["equal"] is False and records[-1]["same"] == 6
    # where both sides agree (the differences excluded on both): exit 0, nothing printed with -q
    agree = [a for x in ("only-*", "other-size.txt", "same-size.bin", "multi-other.bin")
             for a in ("--exclude", x)]
    r = _check_cli(url, str(root), "-q", *agree, env=b.env)        # either order
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b""), r.stderr


def test_a_check_by_checksum_reads_an_unchanged_file_once_and_still_finds_a_same_size_edit(
        moto_direct, tmp_path: Path, monkeypatch) -> None:
    """The checksum memo (``$XDG_STATE_HOME/manyfiles/checksums``): a second check reads no byte of
    the files unchanged since the first hashed them; a same-size edit with its mtime put back is
    read again and found; ``memo=False`` and ``--no-memo`` read everything; s3push --sync uses it."""
    from manyfiles._core.checksum_memo import MARGIN_NS
    from manyfiles.push import push

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    b = Bucket(moto_direct, prefix="memo")
    root = tmp_path / "src"
    root.mkdir()
    try:
        data = {f"f{i}.bin": blob(300 + i, str(i)) for i in range(3)}
        for rel, body in data.items():
            (root / rel).write_bytes(body)
            b.put(f"p/{rel}", body)
        total = sum(map(len, data.values()))
        # a file is memoized only once its last change is older than the margin (racily clean)
        newest = max(max(st.st_mtime_ns, st.st_ctime_ns) for st in map(os.lstat, root.iterdir()))
        while time.time_ns() <= newest + MARGIN_NS:
            time.sleep(0.05)
        url = f"s3://{b.bucket}/p/"
        first = mirror.check(root, url, settings=b.settings)
        assert first.equal and (first.hashed_bytes, first.memo_hits) == (total, 0)
        second = mirror.check(root, url, settings=b.settings)
        assert second.equal and (second.hashed_bytes, second.memo_hits) == (0, 3)
        assert [e.why for e in second.same] == ["md5"] * 3
        edited = root / "f1.bin"
        st = os.lstat(edited)
        edited.write_bytes(blob(301, "other"))                   # same size, other bytes
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))   # and the old mtime back
        third = mirror.check(root, url, settings=b.settings)
        assert _paths(third.differing) == ["f1.bin"] and third.memo_hits == 2
        assert third.hashed_bytes in (301, 602)      # (and again for moto's CRC after a HEAD)
        unmemoized = mirror.check(root, url, settings=b.settings, memo=False)
        assert unmemoized.memo_hits == 0 and unmemoized.hashed_bytes >= total
        r = _check_cli(str(root), url, "--json", "--no-memo",
                       env={**b.env, "XDG_STATE_HOME": str(tmp_path / "state")})
        summary = json.loads(r.stdout.decode().splitlines()[-1])
        assert (r.returncode, summary["hashed_bytes"], summary["memo_hits"]) == \
            (1, unmemoized.hashed_bytes, 0), r.stderr
        # s3push --sync compares through the same memo: a push with an empty one fills it
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state2"))
        report = push(f"{root}/", url, settings=b.settings, sync=True, state_dir=tmp_path / "journal")
        assert (report.uploaded, report.same) == (1, 2)
        after = mirror.check(root, url, settings=b.settings)
        assert after.equal and (after.hashed_bytes, after.memo_hits) == (301, 2)
    finally:
        b.close()
