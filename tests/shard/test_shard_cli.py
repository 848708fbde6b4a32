"""The `shard` command as a real subprocess: exit codes, one-line errors, status of a killed run."""

from __future__ import annotations

import os
from pathlib import Path

from shardkit import make_dataset, snapshot


def test_apply_verify_status_revert(fast_tmp: Path, run_cli) -> None:
    root = make_dataset(fast_tmp / "d", 300)
    before = snapshot(root)
    r = run_cli("shard", "apply", str(root), "--plan", "--csv", str(fast_tmp / "m.csv"))
    assert r.returncode == 0 and b"files to move        312" in r.stdout
    assert (fast_tmp / "m.csv").read_bytes().count(b"\n") > 300 and snapshot(root) == before
    r = run_cli("shard", "apply", str(root), "--workers", "2")
    assert r.returncode == 0 and r.stdout.startswith(b"apply: 312 files moved"), r.stderr
    r = run_cli("shard", "verify", str(root), "--expect", "312")
    assert r.returncode == 0 and r.stdout.startswith(b"ok: 312 files")
    r = run_cli("shard", "verify", str(root), "--expect", "313")
    assert r.returncode == 1 and b"312 files found, 313 expected" in r.stderr
    r = run_cli("shard", "status", str(root))
    assert r.returncode == 0 and b"levels 2:2" in r.stdout and b"migration" not in r.stdout
    r = run_cli("manyfiles", "shard", "revert", str(root))
    assert r.returncode == 0 and snapshot(root) == before


def test_status_shows_an_interrupted_migration(fast_tmp: Path, run_cli) -> None:
    make_dataset(fast_tmp, 1500, edge=False, symlinks=False)
    r = run_cli("shard", "apply", str(fast_tmp), "--levels", "1",
                env={"MANYFILES_TESTING": "kill_at=move:1000"})
    assert r.returncode == -9
    r = run_cli("shard", "status", str(fast_tmp))
    assert b"interrupted: run `shard apply" in r.stdout, r.stdout
    r = run_cli("shard", "verify", str(fast_tmp))
    assert r.returncode == 1 and b"interrupted `shard apply`" in r.stderr
    r = run_cli("shard", "apply", str(fast_tmp))  # no options needed: the journal has the layout
    assert r.returncode == 0 and b"resumed" in r.stdout
    assert run_cli("shard", "verify", str(fast_tmp), "--expect", "1500").returncode == 0


def test_errors_are_one_line_with_the_path(tmp_path: Path, run_cli) -> None:
    missing = tmp_path / "nope"
    r = run_cli("shard", "apply", str(missing))
    assert r.returncode == 1 and r.stderr.decode().strip() == f"shard: {missing}: No such file or directory"
    r = run_cli("shard", "revert", str(tmp_path))  # already flat: nothing to do, like apply on a tree
    assert r.returncode == 0 and r.stdout.strip() == f"{tmp_path}: not sharded; nothing to do".encode()
    r = run_cli("shard", "reshard", str(tmp_path), "--levels", "1")
    assert r.returncode == 1 and b"not sharded" in r.stderr
    r = run_cli("shard", "apply", str(tmp_path), "--levels", "x")
    assert r.returncode == 2 and b"--levels" in r.stderr
    r = run_cli("shard", "apply", str(tmp_path), "--csv", "m.csv")
    assert r.returncode == 2
    f = tmp_path / "file"
    f.write_bytes(b"")
    r = run_cli("shard", "apply", str(f))
    assert r.returncode != 0 and os.listdir(tmp_path) == ["file"]


def test_conflict_exits_1_and_names_the_file(fast_tmp: Path, run_cli) -> None:
    from manyfiles.shard import ShardedDir

    ShardedDir(fast_tmp).put("x", b"tree")
    (fast_tmp / "x").write_bytes(b"flat")
    r = run_cli("shard", "apply", str(fast_tmp))
    assert r.returncode == 1 and f"shard: {fast_tmp}/x: exists at both".encode() in r.stderr
