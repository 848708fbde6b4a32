"""Nothing outside DEST, ever: planted symlinks in DEST/.s3pull, foreign owners; a full, failing,
read-only or unwritable disk is one line and a re-run completes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from s3util import FAST_RETRY, blob, files_under

import faults
from manyfiles.s3 import pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.routing import STRATEGIES
from privileges import not_root_cmd

MiB = 1 << 20


def snapshot(root: Path) -> dict[str, bytes]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def _old_part_name(key: str, etag: str, size: int) -> str:
    # the predictable name s3pull used before: sha1(key, etag, size) + ".part"
    return hashlib.sha1(f"{key}\0{etag}\0{size}".encode()).hexdigest() + ".part"


PLANTS = ["state-dir", "tmp", "part", "state", "failures"]


@pytest.mark.parametrize("plant", PLANTS)
def test_symlink_plants_are_refused_and_nothing_outside_changes(plant, run_cli, bucket, cli_env, tmp_path):
    name, put = bucket
    big = put("s/big", blob(3 * MiB, "big"))
    put("s/small", b"small")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "important.tmp").write_bytes(b"keep me")
    (outside / "target").write_bytes(b"user data")
    dest = tmp_path / "dest"
    state = dest / STATE_DIR
    if plant == "state-dir":
        dest.mkdir()
        os.symlink(outside, state)
    else:
        (state / "tmp").mkdir(parents=True)
        if plant == "tmp":
            os.rmdir(state / "tmp")
            os.symlink(outside, state / "tmp")
        elif plant == "part":
            etag = hashlib.md5(big).hexdigest()
            os.symlink(outside / "target", state / "tmp" / _old_part_name("s/big", etag, len(big)))
        elif plant == "state":
            os.symlink(outside / "target", state / "state.jsonl")
        elif plant == "failures":
            os.symlink(outside / "target", state / "failures.tsv")
    before = snapshot(outside)
    r = run_cli("s3pull", f"s3://{name}/s/", str(dest), "--strategy", "ranged", "--part-size", "1MiB",
                env=cli_env)
    err = r.stderr.decode()
    assert snapshot(outside) == before
    assert r.returncode == 1, err
    assert len(err.strip().splitlines()) == 1 and "symlink" in err and "Traceback" not in err
    assert err.startswith("s3pull: ") and STATE_DIR in err
    assert files_under(dest) == {}


def test_start_up_cleanup_deletes_only_names_s3pull_makes(bucket, settings, tmp_path):
    name, put = bucket
    put("c/x", b"x")
    tmp = tmp_path / "dest" / STATE_DIR / "tmp"
    tmp.mkdir(parents=True)
    (tmp / "notes.txt").write_bytes(b"not ours")
    (tmp / "0123abcd.tmp").write_bytes(b"a temp file of a killed run")
    report = pull(f"s3://{name}/c/", str(tmp_path / "dest"), settings=settings, retry=FAST_RETRY)
    assert report.ok and sorted(os.listdir(tmp)) == ["notes.txt"]
    assert (tmp / "notes.txt").read_bytes() == b"not ours"


def test_state_dir_owned_by_someone_else_is_refused(run_cli, bucket, cli_env, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a folder to another user")
    name, put = bucket
    put("o/x", b"x")
    dest = tmp_path / "dest"
    (dest / STATE_DIR).mkdir(parents=True)
    os.chown(dest / STATE_DIR, 65534, 65534)
    r = run_cli("s3pull", f"s3://{name}/o/", str(dest), env=cli_env)
    err = r.stderr.decode()
    assert r.returncode == 1 and "not owned by" in err and len(err.strip().splitlines()) == 1
    assert files_under(dest) == {}


def test_failed_listing_creates_nothing(run_cli, cli_env, tmp_path):
    dest = tmp_path / "dest"
    r = run_cli("s3pull", "s3://no-such-bucket-here/", str(dest), env=cli_env)
    assert r.returncode == 1 and not dest.exists()


@pytest.mark.parametrize("strategy", ["auto", "processes"])
def test_an_empty_prefix_creates_nothing(strategy, run_cli, bucket, cli_env, tmp_path):
    # a typo in the prefix lists nothing: one line, exit 1, and no DEST (nor DEST/.s3pull) left behind
    name, put = bucket
    put("data/a", b"x")
    dest = tmp_path / "dest"
    r = run_cli("s3pull", "--strategy", strategy, f"s3://{name}/dta/", str(dest), env=cli_env)
    assert r.returncode == 1 and b"no object matched" in r.stderr and not dest.exists()
    dest.mkdir()
    r = run_cli("s3pull", "--strategy", strategy, f"s3://{name}/dta/", str(dest), env=cli_env)
    assert r.returncode == 1 and os.listdir(dest) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 6 MiB tmpfs (root only; CI runs as root): the destination fills up mid-run."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("strategy", ["threads", "lean", "auto", "http"])
def test_full_disk_is_one_line_no_wrong_file_and_rerun_completes(strategy, small_disk, run_cli, bucket,
                                                                  cli_env, tmp_path):
    name, put = bucket
    data = {f"{i}.bin": put(f"f/{i}.bin", blob(2 * MiB + i, f"f{i}")) for i in range(5)}
    dest = small_disk / "dest"
    r = run_cli("s3pull", f"s3://{name}/f/", str(dest), "--strategy", strategy, "--part-size", "1MiB",
                "-j", "2", env=cli_env)
    err = r.stderr.decode()
    assert r.returncode == 1, err
    assert "Traceback" not in err and "No space left on device" in err
    # one line for one full disk (issue 17: the object's failure line, then the same ENOSPC again)
    assert len(err.splitlines()) == 1 and err.startswith(f"s3pull: {dest}/"), err
    got = files_under(dest)
    assert all(data[k] == v for k, v in got.items()) and len(got) < 5
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_disk)], check=True)
    r = run_cli("s3pull", f"s3://{name}/f/", str(dest), "--strategy", strategy, "--part-size", "1MiB",
                env=cli_env)
    assert r.returncode == 0, r.stderr.decode()
    assert files_under(dest) == data


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_short_writes_are_continued_never_a_hole(strategy, bucket, settings, tmp_path):
    """Every pwrite writes at most half its buffer (os.pwrite replaced, tests/faults.py): the rest is
    written, never skipped, and the bytes hashed are the bytes on disk."""
    name, put = bucket
    data = {f"{i}.bin": put(f"w/{i}.bin", blob(70_000 + i, f"w{i}")) for i in range(3)}
    data["big.bin"] = put("w/big.bin", blob(3 * MiB + 5, "wbig"))
    with faults.write_fault("short"):
        report = pull(f"s3://{name}/w/", str(tmp_path / "o"), strategy=strategy, settings=settings,
                      ranged_min=MiB, part_size=MiB, retry=FAST_RETRY, processes=2, concurrency=4)
    assert report.failures == [] and files_under(tmp_path / "o") == data


@pytest.mark.parametrize("strategy", ["auto", "lean", "ranged", "threads", "http"])
def test_an_io_error_on_the_destination_is_one_line_and_rerun_completes(strategy, run_cli, bucket, cli_env,
                                                                          tmp_path):
    """EIO from the disk (os.pwrite replaced in the launched s3pull, tests/faults.py: no
    device-mapper here) on the 3rd data write."""
    name, put = bucket
    data = {f"{i}.bin": put(f"e/{i}.bin", blob(2 * MiB + i, f"e{i}")) for i in range(4)}
    dest = tmp_path / "dest"
    r = run_cli("s3pull", f"s3://{name}/e/", str(dest), "--strategy", strategy, "--part-size", "1MiB",
                "-j", "2", env=cli_env, faults=["--write-fault", "EIO:3"])
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err, err
    assert err.startswith("s3pull: ") and "Input/output error" in err.splitlines()[0], err
    got = files_under(dest)
    assert all(data[k] == v for k, v in got.items()) and len(got) < 4
    r = run_cli("s3pull", f"s3://{name}/e/", str(dest), "--strategy", strategy, env=cli_env)
    assert r.returncode == 0, r.stderr.decode()
    assert files_under(dest) == data


def test_unwritable_state_file_and_read_only_disk_are_one_line(small_disk, bucket, cli_env):
    """EACCES on state.jsonl (permission bits enforced: root without CAP_DAC_OVERRIDE) and EROFS
    on the whole destination: one line, exit 1, nothing new installed, and the same command
    completes once the disk is writable again."""
    name, put = bucket
    data = {f"{i}.bin": put(f"s/{i}.bin", blob(5000 + i, f"s{i}")) for i in range(3)}
    dest = small_disk / "dest"
    cmd = [*not_root_cmd(), str(Path(sys.executable).parent / "s3pull"), f"s3://{name}/s/", str(dest)]

    def s3pull() -> subprocess.CompletedProcess:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **cli_env})

    r = s3pull()
    assert r.returncode == 0 and files_under(dest) == data, r.stderr
    data["new.bin"] = put("s/new.bin", blob(6000, "new"))
    state = dest / STATE_DIR / "state.jsonl"
    state.chmod(0o400)
    r = s3pull()
    assert r.returncode == 1 and r.stderr == f"s3pull: {state}: Permission denied\n", r.stderr
    assert "new.bin" not in files_under(dest)
    state.chmod(0o600)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        r = s3pull()
        assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "Read-only file system" in r.stderr and "new.bin" not in files_under(dest)
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    r = s3pull()
    assert r.returncode == 0 and files_under(dest) == data, r.stderr
