"""Nothing outside DEST, ever: planted symlinks in DEST/.s3pull, foreign owners, a full disk."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from s3util import blob, files_under

from manyfiles.s3.keys import STATE_DIR

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
    got = files_under(dest)
    assert all(data[k] == v for k, v in got.items()) and len(got) < 5
    subprocess.run(["mount", "-o", "remount,size=40m", str(small_disk)], check=True)
    r = run_cli("s3pull", f"s3://{name}/f/", str(dest), "--strategy", strategy, "--part-size", "1MiB",
                env=cli_env)
    assert r.returncode == 0, r.stderr.decode()
    assert files_under(dest) == data
