"""s3.verify / `s3pull verify DEST`: every installed file re-hashed against the check it passed."""

from __future__ import annotations

import json
import os

import pytest
from s3util import FAST_RETRY, blob, files_under, put_multipart

from manyfiles.errors import NotFound
from manyfiles.s3 import pull, verify
from manyfiles.s3.keys import STATE_DIR

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture
def pulled(bucket, s3plain, settings, tmp_path):
    """A destination holding small (CRC32 and MD5-only), ranged and multipart objects."""
    name, put = bucket
    data = {"v/crc.bin": put("v/crc.bin", blob(3000, "crc"))}
    for key, n in (("v/a/md5.bin", 5000), ("v/ranged.bin", 300 * KiB)):
        s3plain.put_object(Bucket=name, Key=key, Body=blob(n, key))
        data[key] = blob(n, key)
    data["v/multi.bin"] = put_multipart(s3plain, name, "v/multi.bin", [blob(5 * MiB, "m1"), blob(999, "m2")])
    dest = tmp_path / "o"
    report = pull(f"s3://{name}/v/", str(dest), settings=settings, ranged_min=128 * KiB, part_size=64 * KiB,
                  retry=FAST_RETRY)
    assert report.ok and report.verified == {"crc32": 1, "md5": 2, "multipart-md5": 1}
    return name, dest, {k.removeprefix("v/"): v for k, v in data.items()}


def flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def state_snapshot(dest):
    return {n: (dest / STATE_DIR / n).read_bytes() for n in os.listdir(dest / STATE_DIR) if n != "tmp"}


def test_a_clean_destination_verifies(pulled):
    _, dest, data = pulled
    seen = []
    report = verify(dest, progress=seen.append)
    assert report.ok and report.checked == 4
    assert report.verified == {"crc32": 1, "md5": 2, "multipart-md5": 1}
    assert report.bytes == sum(map(len, data.values()))
    assert (seen[-1].done, seen[-1].total, seen[-1].finished) == (4, 4, True)


def test_flipped_missing_changed_and_symlinked_files_are_failures(pulled, tmp_path):
    _, dest, data = pulled
    before = state_snapshot(dest)
    flip_byte(dest / "multi.bin", 5 * MiB + 10)           # in the second part
    flip_byte(dest / "a" / "md5.bin", 0)
    os.remove(dest / "ranged.bin")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(data["crc.bin"])                # the right bytes, but not in DEST any more
    os.remove(dest / "crc.bin")
    os.symlink(outside, dest / "crc.bin")
    report = verify(dest)
    assert not report.ok
    assert {f.path: f.code for f in report.failures} == {
        "v/multi.bin": "integrity", "v/a/md5.bin": "integrity", "v/ranged.bin": "missing",
        "v/crc.bin": "changed"}
    assert state_snapshot(dest) == before                # verify writes nothing



def test_records_without_a_check_get_the_one_their_etag_allows(pulled):
    """State records written before checks were recorded (no "m"): the ETag's check is used."""
    _, dest, _ = pulled
    state = dest / STATE_DIR / "state.jsonl"
    records = [json.loads(line) for line in state.read_text().splitlines() if line.strip()]
    assert records and all("m" in r for r in records)
    state.write_text("".join(json.dumps({k: r[k] for k in ("k", "s", "e", "r", "i", "t") if k in r}) + "\n"
                             for r in records))
    # multipart: no part layout recorded, so its part sizes are searched (never a size-only "ok")
    assert verify(dest).verified == {"md5": 3, "multipart-md5-searched": 1}
    flip_byte(dest / "a" / "md5.bin", 0)
    assert [(f.path, f.code) for f in verify(dest).failures] == [("v/a/md5.bin", "integrity")]

def test_size_only_records_an_older_s3pull_wrote_are_never_ok(pulled, settings):
    """Records that say size-only without a reason (an older s3pull could not learn a multipart
    layout, installed what came and reported "ok"): verify searches a multipart ETag's part sizes in
    the file and fails anything it cannot check as ``weak-check``; a re-run fetches those again."""
    name, dest, data = pulled
    state = dest / STATE_DIR / "state.jsonl"
    records = [json.loads(line) for line in state.read_text().splitlines() if line.strip()]
    weak = [{"k": r["k"], "s": r["s"], "e": r["e"], "r": r["r"], "i": r["i"], "t": r["t"], "m": "size-only"}
            for r in records]
    state.write_text("".join(json.dumps(r) + "\n" for r in weak))
    report = verify(dest)
    assert report.verified == {"multipart-md5-searched": 1}
    assert {f.path: f.code for f in report.failures} == {k: "weak-check" for k in ("v/crc.bin", "v/a/md5.bin",
                                                                                   "v/ranged.bin")}
    flip_byte(dest / "multi.bin", 5 * MiB + 3)     # what the old bug installed: caught
    assert {f.path: f.code for f in verify(dest).failures}["v/multi.bin"] == "weak-check"
    again = pull(f"s3://{name}/v/", str(dest), settings=settings, ranged_min=128 * KiB, part_size=64 * KiB,
                 retry=FAST_RETRY)
    assert again.done == 4 and again.skipped == 0 and files_under(dest) == data
    assert verify(dest).verified == {"crc32": 1, "md5": 2, "multipart-md5": 1}


def test_truncated_file_and_size_only_records(bucket, settings, tmp_path):
    name, put = bucket
    put("s/x.bin", blob(4000, "x"))
    put("s/y.bin", blob(4000, "y"))
    dest = tmp_path / "o"
    assert pull(f"s3://{name}/s/", str(dest), settings=settings, verify=False).verified == {"size-only": 2}
    with open(dest / "x.bin", "r+b") as f:
        f.truncate(100)
    flip_byte(dest / "y.bin", 7)            # a size-only record cannot see this: said in the counts
    report = verify(dest)
    assert [(f.path, f.code) for f in report.failures] == [("s/x.bin", "changed")]
    assert report.verified == {"size-only": 1}


def test_cli_verify_exit_codes_and_repair(pulled, run_cli, cli_env):
    name, dest, data = pulled
    r = run_cli("s3pull", "verify", str(dest), env=cli_env)
    assert r.returncode == 0, r.stderr
    assert b"4 files checked" in r.stderr and b"4 ok, 0 failed" in r.stderr
    flip_byte(dest / "ranged.bin", 200 * KiB)
    for argv in (("s3pull", "verify", str(dest)), ("manyfiles", "pull", "verify", str(dest))):
        r = run_cli(*argv, env=cli_env)
        err = r.stderr.decode()
        assert r.returncode == 1, err
        assert err.splitlines()[0].startswith("s3pull verify: v/ranged.bin: integrity: md5 of the bytes")
    r = run_cli("s3pull", "verify", str(dest), "--json", env=cli_env)
    lines = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert lines[0] == {"event": "failed", "key": "v/ranged.bin", "code": "integrity",
                        "reason": lines[0]["reason"]}
    assert lines[-1]["event"] == "summary" and lines[-1]["failed"] == 1 and lines[-1]["checked"] == 4
    # a pull with --verify-existing finds the same file and fetches it again
    r = run_cli("s3pull", f"s3://{name}/v/", str(dest), "--verify-existing", env=cli_env)
    assert r.returncode == 0 and b"1 downloaded" in r.stderr and b"3 skipped" in r.stderr, r.stderr
    assert files_under(dest) == data
    assert run_cli("s3pull", "verify", str(dest), env=cli_env).returncode == 0


def test_nothing_to_verify_is_one_line(run_cli, tmp_path):
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotFound):
        verify(tmp_path / "plain")
    for d in ("plain", "missing"):
        r = run_cli("s3pull", "verify", str(tmp_path / d))
        err = r.stderr.decode()
        assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("s3pull: ") and str(tmp_path / d) in err
    r = run_cli("s3pull", "verify", "--help")
    assert r.returncode == 0 and b"Re-hash every file" in r.stdout
