"""``s3pull --sync [--delete]`` (manyfiles.mirror.pull_sync) against moto over HTTP, through the
test edge that records every request: a second sync fetches nothing, files placed by another tool
are kept when their bytes match, --delete removes exactly the extras (never a symlink, never
outside DEST), --max-delete refuses before anything changes, and a sync killed mid-delete
completes when run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from s3util import Bucket, blob, files_under

import faults
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.mirror import TooManyDeletions, pull_sync
from manyfiles.s3.keys import STATE_DIR

OBJECTS = {f"d/{i}.bin": blob(200 + i, str(i)) for i in range(6)} | {"d/sub/x.txt": b"x" * 10,
                                                                     "d/sp ace é+%.txt": b"odd name"}


@pytest.fixture
def b(moto_direct):
    bucket = Bucket(moto_direct, prefix="sync")
    for key, data in OBJECTS.items():
        bucket.put(key, data)
    yield bucket
    bucket.close()


def _sync(b: Bucket, dest: Path, **kw):
    return pull_sync(f"s3://{b.bucket}/d/", dest, settings=b.settings, retry=b.retry, **kw)


def _expected() -> dict[str, bytes]:
    return {k.removeprefix("d/"): v for k, v in OBJECTS.items()}


def test_a_second_sync_fetches_nothing_and_foreign_files_are_kept_by_their_bytes(b: Bucket, tmp_path: Path):
    dest = tmp_path / "dest"
    first = _sync(b, dest)
    assert first.ok and first.done == len(OBJECTS) and files_under(dest) == _expected()
    b.proxy.requests.clear()
    second = _sync(b, dest)
    assert second.ok and second.done == 0 and second.skipped == len(OBJECTS)
    assert b.gets() == [] and len(b.lists()) == 1 and b.heads() == []   # the state said so: nothing hashed

    # files another tool put there (no state record): the same bytes are kept, other bytes fetched
    other = tmp_path / "other"
    other.mkdir()
    for rel, data in _expected().items():
        (other / rel).parent.mkdir(exist_ok=True)
        (other / rel).write_bytes(data)
    (other / "0.bin").write_bytes(b"Z" * len(OBJECTS["d/0.bin"]))     # same size, other bytes
    (other / "1.bin").write_bytes(b"short")                             # other size
    b.proxy.requests.clear()
    r = _sync(b, other)
    assert r.ok and r.done == 2 and r.skipped == len(OBJECTS) - 2, r
    fetched = sorted(p.rpartition("/")[2] for _, p, _ in b.gets())
    assert fetched == ["0.bin", "1.bin"] and files_under(other) == _expected()


def test_delete_removes_exactly_the_extras_never_a_symlink_nor_outside(b: Bucket, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    assert _sync(b, dest).ok
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me")
    (dest / "extra.txt").write_bytes(b"no object")
    (dest / "sub" / "gone").mkdir()
    (dest / "sub" / "gone" / "deep.txt").write_bytes(b"no object either")
    os.symlink(outside, dest / "link")                      # not a file of the mirror: never followed
    os.symlink(tmp_path, dest / "dirlink")
    plan = _sync(b, dest, delete=True, dry_run=True)        # -n: listed, nothing deleted
    assert sorted(plan.deletions) == ["extra.txt", "sub/gone/deep.txt"] and plan.deleted == 2
    assert (dest / "extra.txt").exists()
    r = _sync(b, dest, delete=True, include=["*"], exclude=["nothing"])
    assert r.ok and r.deleted == 2 and r.done == 0, r
    assert files_under(dest) == _expected() | {"link": b"keep me"}      # files_under reads through links
    assert os.path.islink(dest / "link") and os.path.islink(dest / "dirlink")
    assert outside.read_bytes() == b"keep me" and (dest / STATE_DIR / "state.jsonl").exists()
    assert (dest / "sub" / "gone").is_dir()                  # folders stay (as rclone sync's)


def test_max_delete_and_an_empty_prefix_refuse_before_anything_changes(b: Bucket, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    assert _sync(b, dest).ok
    for i in range(3):
        (dest / f"extra{i}").write_bytes(b"x")
    b.put("d/new.bin", b"new object")
    b.proxy.requests.clear()
    with pytest.raises(TooManyDeletions, match="would delete 3 files, more than --max-delete 2"):
        _sync(b, dest, delete=True, max_delete=2)
    assert b.gets() == [] and not (dest / "new.bin").exists() and (dest / "extra0").exists()
    with pytest.raises(ManyfilesError, match="no object matched; nothing deleted"):
        pull_sync(f"s3://{b.bucket}/typo/", dest, settings=b.settings, delete=True)
    assert len(files_under(dest)) == len(OBJECTS) + 3
    r = _sync(b, dest, delete=True, max_delete=3)
    assert r.ok and r.deleted == 3 and r.done == 1
    assert files_under(dest) == _expected() | {"new.bin": b"new object"}
    with pytest.raises(UsageError, match="end SOURCE with '/'"):
        pull_sync(f"s3://{b.bucket}/d", dest, settings=b.settings)


def test_a_sync_killed_mid_delete_completes_when_run_again(b: Bucket, tmp_path: Path) -> None:
    """s3pull --sync --delete as a real process, SIGKILLed at its 3rd deletion; the same command
    run again deletes the rest and exits 0 (-n first shows them)."""
    dest = tmp_path / "dest"
    assert _sync(b, dest).ok
    for i in range(6):
        (dest / f"extra{i}").write_bytes(b"x")
    argv = [str(Path(sys.executable).parent / "s3pull"), f"s3://{b.bucket}/d/", str(dest), "--sync",
            "--delete", "-q"]
    env = {**os.environ, **b.env}
    shown = subprocess.run([*argv, "-n"], capture_output=True, env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert sorted(line for line in shown.stdout.decode().splitlines() if line.startswith("delete")) == [
        f"delete\t\textra{i}" for i in range(6)]
    killed = subprocess.run(faults.command(*argv, kill_at="sync-delete:3"), capture_output=True, env=env,
                            timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = sorted(p.name for p in dest.iterdir() if p.name.startswith("extra"))
    assert len(left) == 4                                    # two were deleted before the kill
    again = subprocess.run(argv, capture_output=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert files_under(dest) == _expected()
