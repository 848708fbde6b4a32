"""--cluster on the command lines (real subprocesses; each starts its own LocalCluster)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_fastrm_cluster_local_removes_the_tree(tmp_path: Path, run_cli) -> None:
    root = tmp_path / "t"
    for i in range(6):
        (root / f"d{i}" / "e").mkdir(parents=True)
        (root / f"d{i}" / "e" / "f").write_bytes(b"")
    proc = run_cli("fastrm", "-v", "--cluster", "local:1", str(root))
    assert proc.returncode == 0, proc.stderr
    assert not root.exists()
    lines = proc.stderr.decode().splitlines()
    assert lines[0].startswith("fastrm: removed 6 files and 13 directories"), lines
    assert "shards on 1 workers" in lines[0]
    assert lines[1].startswith("fastrm: ") and " shards, " in lines[1]           # the worker's line


def test_shard_apply_and_revert_with_cluster_from_the_environment(tmp_path: Path, run_cli) -> None:
    root = tmp_path / "flat"
    root.mkdir()
    for i in range(300):
        (root / f"n{i}").write_bytes(str(i).encode())
    env = {"MANYFILES_CLUSTER": "local:1"}
    proc = run_cli("shard", "apply", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    assert b"300 files moved" in proc.stdout and b"shards on 1 workers" in proc.stdout
    proc = run_cli("shard", "revert", str(root), env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(root)) == sorted(f"n{i}" for i in range(300))


@pytest.mark.parametrize("argv, message", [
    (("fastrm", "--cluster", "sched:8786", "x"), "--cluster sched:8786: expected tcp://HOST:PORT"),
    (("shard", "revert", "--cluster", "local:0", "."), "--cluster local:0: local:N needs at least 1 worker"),
    (("fastrm", "--cluster", "local:1", "--include", "*.tmp", "x"), "not with a cluster"),
])
def test_bad_cluster_use_is_one_line_and_exit_2(tmp_path: Path, run_cli, argv, message: str) -> None:
    proc = run_cli(*argv, cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert message in line, line


def test_fastls_recursive_count_and_listing_on_a_cluster(tmp_path: Path, run_cli) -> None:
    root = tmp_path / "tree"
    for i in range(8):
        for j in range(5):
            (root / f"d{i}" / f"e{j}").mkdir(parents=True)
            (root / f"d{i}" / f"e{j}" / "f").write_bytes(b"")
    want = sorted(os.fsencode(os.path.join(p, n)) for p, ds, fs in os.walk(root) for n in ds + fs)
    proc = run_cli("fastls", "-r", "-c", "--cluster", "local:1", str(root))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{len(want)}\n".encode()
    proc = run_cli("fastls", "-r", "-0", "--cluster", "local:1", "--parts-dir", str(tmp_path), str(root))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split(b"\0")[:-1]) == want
    assert os.listdir(tmp_path) == ["tree"]                     # the parts were removed
    proc = run_cli("fastls", "--cluster", "local:1", str(root))
    assert proc.returncode == 2 and proc.stderr == b"fastls: --cluster lists trees: add -r\n"


def test_cache_warm_cluster(tmp_path: Path, run_cli) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for i in range(12):
        (data / f"f{i}").write_bytes(bytes([i]) * (100 + i))
    proc = run_cli("manyfiles", "cache", "warm", "--dir", str(tmp_path / "c"), "--cluster", "local:1",
                   str(data))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(b"12 objects: 12 fetched") and b"shards on 1 workers" in proc.stdout
    assert b"manyfiles cache: " in proc.stderr and b" shards, " in proc.stderr       # the worker's line
