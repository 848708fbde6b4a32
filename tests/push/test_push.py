"""s3push against moto through the fault proxy: the keys, the bytes (every object read back and
compared), the checks (a flipped body refused, a lying answer caught), files that change while
read, a failing CompleteMultipartUpload then a rerun that resumes, and the journal."""

from __future__ import annotations

import json
import os

import pytest
from s3util import blob

from manyfiles._core import checkpoints
from manyfiles.errors import UsageError
from manyfiles.mirror import TooManyDeletions
from manyfiles.push import abort_stale, push
from manyfiles.s3 import RetryPolicy

MiB = 1 << 20
# many fast retries: the random faults below hit one request in five
PATIENT = RetryPolicy(attempts=12, base=0.001, cap=0.005)
SMALL = dict(part_size=5 * MiB, multipart_threshold=5 * MiB)


def make_tree(root, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def bucket_contents(dest, prefix: str = "") -> dict[str, bytes]:
    """Every object under ``prefix`` read back whole (through moto directly)."""
    out = {}
    for page in dest.admin.get_paginator("list_objects_v2").paginate(Bucket=dest.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = dest.admin.get_object(Bucket=dest.bucket, Key=obj["Key"])["Body"].read()
    return out


def uploads_in_progress(dest) -> list[str]:
    return [u["Key"] for u in dest.admin.list_multipart_uploads(Bucket=dest.bucket).get("Uploads", [])]


def run(dest, state, sources, prefix="p/", **kw):
    kw = {"settings": dest.settings, "retry": PATIENT, "state_dir": state, "jobs": 8, **SMALL, **kw}
    return push([os.fspath(s) for s in sources], dest.url(prefix), **kw)


def test_a_tree_lands_under_the_prefix_byte_for_byte(tmp_path, dest, state):
    files = {f"a/f{i}.bin": blob(i * 37, f"s{i}") for i in range(12)}
    files["b/c/big.bin"] = blob(12 * MiB + 3, "big")       # 3 parts of 5 MiB
    files["empty"] = b""
    make_tree(tmp_path / "src", files)
    report = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert report.ok and report.uploaded == len(files) and (report.puts, report.multipart) == (13, 1)
    assert report.parts == 3 and report.checksum == "crc64nvme"
    assert bucket_contents(dest) == {f"p/{k}": v for k, v in files.items()}
    # without the trailing slash the folder's name is kept; a file goes under its name
    (tmp_path / "one.txt").write_bytes(b"one")
    assert run(dest, state, [tmp_path / "src" / "a", tmp_path / "one.txt"], prefix="q").ok
    assert bucket_contents(dest, "q/") == {**{f"q/a/f{i}.bin": files[f"a/f{i}.bin"] for i in range(12)},
                                           "q/one.txt": b"one"}
    assert uploads_in_progress(dest) == [] and not os.listdir(state)     # a complete run leaves no journal


def test_small_files_go_from_one_thread_and_larger_ones_from_the_pool(tmp_path, dest, state):
    """Files up to 64 KiB (one send with the request's head) are PUT by one thread over keep-alive
    connections, not by the pool's threads (tens of GIL hand-offs per small PUT there); a file of
    100 KiB still goes from the pool.  Every byte lands."""
    files = {f"s{i:02d}.bin": blob(1000 + 50 * i, f"s{i}") for i in range(40)}
    make_tree(tmp_path / "src", files)
    assert started_threads(lambda: run(dest, state, [f"{tmp_path / 'src'}/"])) == ["s3push-loop"]
    files["mid.bin"] = blob(100 << 10, "mid")
    make_tree(tmp_path / "src", files)
    assert "s3push_0" in started_threads(lambda: run(dest, state, [f"{tmp_path / 'src'}/"], prefix="q/"))
    assert bucket_contents(dest, "q/") == {f"q/{k}": v for k, v in files.items()}


def started_threads(fn) -> list[str]:
    """The names of the s3push threads started while ``fn()`` ran (which must succeed)."""
    import sys
    import threading

    names: list[str] = []

    def first_call(frame, event, arg):      # (a new thread's profile hook: its name, once)
        names.append(threading.current_thread().name)
        sys.setprofile(None)

    threading.setprofile(first_call)
    try:
        assert fn().ok
    finally:
        threading.setprofile(None)
    return sorted(n for n in names if n.startswith("s3push"))


def test_filters_and_the_dry_run_send_nothing_extra(tmp_path, dest, state):
    make_tree(tmp_path / "src", {"x.json": b"{}", "y.tmp": b"t", "d/z.json": b"[]", "big.bin": blob(6 * MiB)})
    plan = run(dest, state, [f"{tmp_path / 'src'}/"], dry_run=True, exclude=["*.tmp"])
    assert sorted((p["key"], p["how"]) for p in plan.planned) == [
        ("p/big.bin", "multipart"), ("p/d/z.json", "put"), ("p/x.json", "put")]
    assert dest.proxy.requests == [] and bucket_contents(dest) == {}
    report = run(dest, state, [f"{tmp_path / 'src'}/"], include=["*.json"])
    assert report.ok and sorted(bucket_contents(dest)) == ["p/d/z.json", "p/x.json"]


@pytest.mark.parametrize("checksum", ["crc64nvme", "md5"])
def test_faults_leave_no_wrong_byte_and_no_partial_object(tmp_path, dest, state, checksum):
    """Resets, cut answers and SlowDown on one request in five, bodies flipped on the wire, lying
    ETags and checksums in answers: every object right, none partial, no upload left over."""
    files = {f"s{i}.bin": blob(1000 + i, f"f{i}") for i in range(30)}
    files.update({f"big{i}.bin": blob(11 * MiB + i, f"b{i}") for i in range(2)})
    make_tree(tmp_path / "src", files)
    proxy = dest.proxy

    def writes(m, path, headers):
        return m in ("PUT", "POST")

    def part(m, path, headers):
        return m == "PUT" and "partNumber=" in path

    def single(m, path, headers):
        return m == "PUT" and "partNumber=" not in path

    proxy.random_faults = (0.2, ("503", "reset", "truncate"), writes)
    proxy.request_faults += [(single, "flip-request"), (single, "flip-request"), (part, "flip-request"),
                             (single, "lie-etag"),
                             (part, "lie-checksum" if checksum != "md5" else "lie-etag")]
    report = run(dest, state, [f"{tmp_path / 'src'}/"], checksum=checksum)
    assert report.ok, report.failures
    assert not proxy.request_faults        # every planted fault was met
    assert [r for r in proxy.refused if r[2] == "BadDigest"] != []       # the flipped bodies were refused
    assert bucket_contents(dest) == {f"p/{k}": v for k, v in files.items()}
    assert uploads_in_progress(dest) == []


def test_a_file_changing_while_read_is_read_again_then_reported(tmp_path, dest, state):
    make_tree(tmp_path / "src", {"steady": b"s" * 100, "moving": b"m" * 100, "once": b"o" * 100,
                                 "bigmoving": blob(6 * MiB)})
    src = tmp_path / "src"
    touched = []

    def hook(path: bytes) -> None:
        name = os.path.basename(path)
        if name in (b"moving", b"bigmoving") or (name == b"once" and b"once" not in touched):
            touched.append(name)
            with open(path, "ab") as f:
                f.write(b"+")

    checkpoints.add("push-read", hook)
    try:
        report = run(dest, state, [f"{src}/"], reread=3)
    finally:
        checkpoints.remove("push-read")
    assert sorted((os.path.basename(f.path), f.code) for f in report.failures) == [
        ("bigmoving", "changed"), ("moving", "changed")]
    got = bucket_contents(dest)
    # read again: the new bytes
    assert got == {"p/steady": b"s" * 100, "p/once": (src / "once").read_bytes()}
    assert got["p/once"] == b"o" * 100 + b"+" and uploads_in_progress(dest) == []


def test_a_failing_complete_leaves_nothing_visible_and_the_rerun_resumes_its_parts(tmp_path, dest, state):
    data = blob(16 * MiB + 5, "c")        # 4 parts
    make_tree(tmp_path / "src", {"big.bin": data})

    def complete(m, path, headers):
        return m == "POST" and "uploadId=" in path

    dest.proxy.faults.append((complete, "500-always"))
    first = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert [f.path for f in first.failures] == [os.fspath(tmp_path / "src" / "big.bin")]
    assert bucket_contents(dest) == {} and uploads_in_progress(dest) == ["p/big.bin"]
    dest.proxy.faults.clear()
    dest.proxy.requests.clear()
    second = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert second.ok and (second.resumed_parts, second.parts) == (4, 0)
    assert not [r for r in dest.proxy.requests if r[0] == "PUT"]          # no part sent again
    assert bucket_contents(dest) == {"p/big.bin": data} and uploads_in_progress(dest) == []


def test_a_rerun_keeps_only_parts_whose_etag_is_the_one_recorded_and_aborts_unneeded_uploads(
        tmp_path, dest, state):
    data = blob(11 * MiB, "k")
    make_tree(tmp_path / "src", {"big.bin": data, "gone.bin": blob(6 * MiB, "g")})

    def complete(m, path, headers):
        return m == "POST" and "uploadId=" in path

    dest.proxy.faults.append((complete, "500-always"))
    assert not run(dest, state, [f"{tmp_path / 'src'}/"]).ok
    assert sorted(uploads_in_progress(dest)) == ["p/big.bin", "p/gone.bin"]
    # another writer replaced part 2 of big.bin's upload: its ETag is not the one the journal recorded
    (journal,) = [state / n for n in os.listdir(state)]
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    uid = next(r["uid"] for r in records if r["t"] == "start" and r["key"] == "p/big.bin")
    dest.admin.upload_part(Bucket=dest.bucket, Key="p/big.bin", UploadId=uid, PartNumber=2,
                           Body=b"x" * (5 * MiB))
    (tmp_path / "src" / "gone.bin").unlink()
    dest.proxy.faults.clear()
    report = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert report.ok and (report.resumed_parts, report.parts, report.aborted) == (2, 1, 1)
    assert bucket_contents(dest) == {"p/big.bin": data} and uploads_in_progress(dest) == []


def test_an_abort_that_fails_stays_in_the_journal_and_the_next_run_aborts_it(tmp_path, dest, state):
    make_tree(tmp_path / "src", {"gone.bin": blob(6 * MiB, "g"), "small": b"s" * 10})

    def complete(m, path, headers):
        return m == "POST" and "uploadId=" in path

    def abort(m, path, headers):
        return m == "DELETE" and "uploadId=" in path

    dest.proxy.faults.append((complete, "500-always"))
    assert not run(dest, state, [f"{tmp_path / 'src'}/"]).ok
    assert uploads_in_progress(dest) == ["p/gone.bin"]
    (tmp_path / "src" / "gone.bin").unlink()          # its upload is no longer needed
    dest.proxy.faults[:] = [(abort, "500-always")]    # ... and aborting it fails
    report = run(dest, state, [f"{tmp_path / 'src'}/"], retry=RetryPolicy(attempts=2, base=0.001, cap=0.005))
    assert report.aborted == 0 and uploads_in_progress(dest) == ["p/gone.bin"]
    dest.proxy.faults.clear()
    report = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert report.aborted == 1 and uploads_in_progress(dest) == [], "the upload was forgotten, not aborted"
    assert bucket_contents(dest) == {"p/small": b"s" * 10}


def test_abort_stale_aborts_only_uploads_older_than_the_age(dest):
    for key in ("old/a", "old/b", "other/c"):
        dest.admin.create_multipart_upload(Bucket=dest.bucket, Key=key)
    # moto dates every upload 2010-11-10: 7000 days is older than that, one hour is not
    kept = abort_stale(dest.url("old/"), 7000 * 86400, settings=dest.settings)
    assert (kept.listed, kept.aborted) == (2, [])
    dry = abort_stale(dest.url("old/"), 3600, settings=dest.settings, dry_run=True)
    assert len(dry.aborted) == 2 and len(uploads_in_progress(dest)) == 3
    done = abort_stale(dest.url("old/"), 3600, settings=dest.settings)
    assert sorted(a["key"] for a in done.aborted) == ["old/a", "old/b"]
    assert uploads_in_progress(dest) == ["other/c"]


def test_hostile_names_are_refused_one_each_and_symlinks_are_not_followed(tmp_path, dest, state):
    src = tmp_path / "src"
    make_tree(src, {"ok.txt": b"fine"})
    outside = tmp_path / "outside"
    make_tree(outside, {"secret.txt": b"secret"})
    os.symlink(outside / "secret.txt", src / "link.txt")
    os.symlink(outside, src / "linkdir")
    with open(os.path.join(os.fsencode(src), b"bad\xff.bin"), "wb") as f:
        f.write(b"x")
    (src / "new\nline.txt").write_bytes(b"y")
    os.mkfifo(src / "fifo")
    report = run(dest, state, [f"{src}/"])
    assert sorted(f.code for f in report.failures) == ["bad-name", "bad-name", "not-a-file"]
    assert report.skipped == 2 and bucket_contents(dest) == {"p/ok.txt": b"fine"}
    followed = run(dest, state, [f"{src}/"], prefix="f/", follow_symlinks=True, exclude=["fifo", "*.bin"])
    assert bucket_contents(dest, "f/") == {"f/ok.txt": b"fine", "f/link.txt": b"secret",
                                           "f/linkdir/secret.txt": b"secret"}
    assert [f.code for f in followed.failures] == ["bad-name"]


def test_a_sync_sends_only_what_differs_and_a_second_sends_nothing(tmp_path, dest, state):
    src = tmp_path / "src"
    files = {f"d/f{i}": blob(200 + i, f"y{i}") for i in range(8)}
    files["big"] = blob(6 * MiB, "sync")
    make_tree(src, files)
    assert run(dest, state, [f"{src}/"], sync=True).uploaded == 9
    dest.proxy.requests.clear()
    again = run(dest, state, [f"{src}/"], sync=True)
    assert again.ok and (again.uploaded, again.same) == (0, 9)
    assert not [r for r in dest.proxy.requests if r[0] in ("PUT", "POST")]
    # same size, other bytes; a new file; an object no file has
    (src / "d" / "f3").write_bytes(blob(203, "other"))
    (src / "new").write_bytes(b"new")
    dest.put("p/extra", b"x")
    plan = run(dest, state, [f"{src}/"], sync=True, delete=True, dry_run=True)
    assert sorted((p["key"], p["how"]) for p in plan.planned) == [
        ("p/d/f3", "put"), ("p/extra", "delete"), ("p/new", "put")]
    with pytest.raises(TooManyDeletions, match="max-delete"):
        run(dest, state, [f"{src}/"], sync=True, delete=True, max_delete=0)
    assert "p/new" not in bucket_contents(dest)         # refused before any change
    report = run(dest, state, [f"{src}/"], sync=True, delete=True)
    assert report.ok and (report.uploaded, report.deleted, report.same) == (2, 1, 8)
    assert bucket_contents(dest) == {f"p/{k}": v.read_bytes() for k, v in
                                     ((str(p.relative_to(src)), p) for p in src.rglob("*") if p.is_file())}


def test_files_from_takes_names_relative_to_the_folder_or_absolute_under_it(tmp_path, dest, state):
    src = tmp_path / "src"
    make_tree(src, {"a.bin": b"a", "b/c.bin": b"c", "b/d.tmp": b"d", "e.bin": b"e"})
    report = run(dest, state, [f"{src}/"], files_from=["a.bin", os.fspath(src / "b" / "c.bin"), "b/d.tmp",
                                                        "b/../a.bin"], exclude=["*.tmp"])
    assert report.ok and report.uploaded == 2, report.failures
    assert bucket_contents(dest) == {"p/a.bin": b"a", "p/b/c.bin": b"c"}
    listing = tmp_path / "names"
    listing.write_bytes(b"e.bin\n")
    assert run(dest, state, [f"{src}/"], files_from=listing).uploaded == 1
    with pytest.raises(UsageError):
        run(dest, state, [f"{src}/", f"{src}/"], files_from=["a.bin"])


def test_a_sync_walks_the_folder_once(tmp_path, dest, state, monkeypatch):
    import manyfiles.listing
    import manyfiles.mirror.comparison
    import manyfiles.push._list

    src = tmp_path / "src"
    make_tree(src, {"a": b"a", "d/b": b"b"})
    dest.put("p/a", b"a")
    roots: list[bytes] = []

    def counted(path, **kw):        # the real walker, counting the walks of the tree's root
        roots.append(os.fsencode(path))
        return manyfiles.listing.walk(path, **kw)

    monkeypatch.setattr(manyfiles.push._list, "walk", counted)
    monkeypatch.setattr(manyfiles.mirror.comparison, "walk", counted)
    report = run(dest, state, [f"{src}/"], sync=True)
    assert report.ok and (report.uploaded, report.same) == (1, 1)
    assert bucket_contents(dest) == {"p/a": b"a", "p/d/b": b"b"}
    assert roots == [os.fsencode(src)]


def test_an_answer_that_keeps_lying_is_met_like_a_failing_request(tmp_path, dest, state):
    """A PUT's answer that names other bytes: a HEAD asks what was stored.  Where the HEAD says our
    bytes, the file is done (no resend); where it too names others (four times in a row: more than
    the re-reads of a changing file, 3), the object is removed and the file sent again, within the
    retry policy's tries; it ends right."""
    make_tree(tmp_path / "src", {"a.bin": b"a" * 100, "b.bin": b"b" * 100})

    def put(name):
        return lambda m, path, headers: m == "PUT" and path.partition("?")[0].endswith(f"/p/{name}")

    def head_a(m, path, headers):
        return m == "HEAD" and path.partition("?")[0].endswith("/p/a.bin")

    dest.proxy.request_faults += [(put("a.bin"), "lie-etag")] * 4 + [(put("b.bin"), "lie-etag")]
    dest.proxy.faults += [(head_a, "head-etag")] * 4
    report = run(dest, state, [f"{tmp_path / 'src'}/"], checksum="md5")
    assert report.ok, report.failures
    assert not dest.proxy.request_faults and not dest.proxy.faults and report.retried == 4
    assert [r[0] for r in dest.proxy.requests if r[1].endswith("/p/b.bin")] == ["PUT", "HEAD"]
    assert bucket_contents(dest) == {"p/a.bin": b"a" * 100, "p/b.bin": b"b" * 100}


def test_lying_answers_to_every_part_and_put_end_right_in_one_run(tmp_path, dest, state):
    """Every UploadPart's answer names another ETag (the server stored our bytes: it checked them
    against our checksum), and a PUT's answer another checksum: the refused Complete is sent again
    with the ETags ListParts gives the parts it lists with our checksums; the PUT's object is
    confirmed by a HEAD.  One run, nothing sent twice, no upload left open."""
    big, small = blob(11 * MiB, "v"), b"s" * 100
    make_tree(tmp_path / "src", {"big.bin": big, "s.bin": small})

    def part(m, path, headers):
        return m == "PUT" and "partNumber=" in path

    def single(m, path, headers):
        return m == "PUT" and "partNumber=" not in path

    dest.proxy.list_part_checksums = True       # as S3 lists them (moto does not)
    dest.proxy.request_faults += [(part, "lie-etag")] * 3 + [(single, "lie-checksum")]
    report = run(dest, state, [f"{tmp_path / 'src'}/"])
    assert report.ok, report.failures
    assert not dest.proxy.request_faults and report.retried == 0
    assert sum(1 for r in dest.proxy.requests if r[0] == "PUT") == 4        # 3 parts, 1 PUT: none again
    assert bucket_contents(dest) == {"p/big.bin": big, "p/s.bin": small} and uploads_in_progress(dest) == []

def test_a_create_answered_by_a_closed_connection_leaves_no_upload_open(tmp_path, dest, state):
    """The server made the upload, then the kept-alive connection closed before a byte of its
    answer: the create is tried again as a failed request (not resent unseen, as for an idle
    connection the server closed), so the upload the first one made is aborted, not left open."""
    big = blob(6 * MiB, "g")
    make_tree(tmp_path / "src", {"a.bin": b"a" * 100, "big.bin": big})

    def create(m, path, headers):
        return m == "POST" and path.endswith("?uploads=")

    dest.proxy.faults.append((create, "drop-after"))
    # one thread, a.bin first: the create goes on the connection a.bin's PUT kept alive
    report = run(dest, state, [f"{tmp_path / 'src'}/"], jobs=1, files_from=["a.bin", "big.bin"])
    assert report.ok and dest.proxy.applied == ["drop-after"]
    assert [r[0] for r in dest.proxy.requests if "uploads=" in r[1]] == ["POST", "POST", "GET"]
    assert report.aborted == 1 and uploads_in_progress(dest) == []
    assert bucket_contents(dest) == {"p/a.bin": b"a" * 100, "p/big.bin": big}



def test_a_create_that_fails_at_last_leaves_no_upload_open(tmp_path, dest, state):
    """Every try of a CreateMultipartUpload made an upload whose answer never came: the file fails,
    and the end of the run aborts the uploads those tries made."""
    make_tree(tmp_path / "src", {"big.bin": blob(6 * MiB, "g")})

    def create(m, path, headers):
        return m == "POST" and path.endswith("?uploads=")

    dest.proxy.faults += [(create, "drop-after")] * 2
    report = run(dest, state, [f"{tmp_path / 'src'}/"], retry=RetryPolicy(attempts=2, base=0.001, cap=0.005))
    assert not report.ok and dest.proxy.applied == ["drop-after"] * 2
    assert report.aborted == 2 and uploads_in_progress(dest) == [] and bucket_contents(dest) == {}
