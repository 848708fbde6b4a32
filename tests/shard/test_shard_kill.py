"""kill -9 at many moments of `shard apply` / `shard revert`, then rerun: nothing lost, nothing left.

Exact moments are checkpoints (``manyfiles._core.checkpoints``): the real ``shard`` script runs
through the launcher of tests/faults.py, ``--kill-at <point>:<n>``, so the process SIGKILLs itself
the n-th time it reaches <point> ("journal" kills half-way through writing a record); the
random-time cases SIGKILL the real process from outside.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from shardkit import assert_flat_clean, assert_sharded_clean, make_dataset, snapshot

import faults

N = 10_000
JOURNAL = b".manyfiles-shard.journal"

# (apply kill point, revert kill point); None = kill at a random time from outside
CASES = [
    ("journal:1", "journal:1"),      # torn header: nothing had started yet
    ("journal:3", "journal:40"),     # apply: torn "aside" record; revert: torn progress record
    ("journal:60", "move:1"),        # apply: torn progress record half-way; revert: first rename
    ("aside:2", "move:4500"),        # apply: while setting bucket-named files aside; revert: mid-way
    ("move:6000", "prune:3000"),     # mid-migration / while pruning emptied buckets
    ("mkdir:700", "place:2"),        # right after creating a bucket / placing set-aside files back
    ("descriptor:1", "descriptor:1"),  # right after creating / removing the layout descriptor
    ("place:3", "finish:1"),         # placing set-aside files / all durable, journal not yet removed
    ("finish:1", None),
    (None, None),
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory):
    # tmpfs when there is one: same kill -9 semantics, and it keeps 100+ runs of 10k files quick
    base = Path(tempfile.mkdtemp(prefix="mf-shard-kill-", dir="/dev/shm")) if os.access("/dev/shm", os.W_OK) \
        else tmp_path_factory.mktemp("kill")
    root = make_dataset(base / "data", N)
    yield root, snapshot(root)
    shutil.rmtree(base, ignore_errors=True)


def _run(shard_bin: str, *args: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    argv = faults.command(shard_bin, *args, kill_at=kill_at) if kill_at else [shard_bin, *args]
    return subprocess.run(argv, capture_output=True, timeout=300)


def _kill_randomly(shard_bin: str, *args: str, rng: random.Random) -> int:
    proc = subprocess.Popen([shard_bin, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rng.uniform(0.3, 0.8))  # interpreter start-up is ~0.3 s; the work takes about half a second
    proc.send_signal(signal.SIGKILL)
    return proc.wait()


def _crash_and_resume(shard_bin: str, op: str, root: Path, point: str | None, rng: random.Random) -> None:
    args = (op, str(root), "--workers", "4", "-q")
    if point is None:
        _kill_randomly(shard_bin, *args, rng=rng)
    else:
        crashed = _run(shard_bin, *args, kill_at=point)
        assert crashed.returncode == -signal.SIGKILL, (point, crashed.returncode, crashed.stderr)
        if point.startswith("journal:"):
            data = (root / os.fsdecode(JOURNAL)).read_bytes()
            assert data and not data.endswith(b"\n"), "the kill should have torn a journal record"
    again = _run(shard_bin, *args)
    assert again.returncode == 0, again.stderr.decode(errors="replace")


@pytest.mark.parametrize(("apply_at", "revert_at"), CASES, ids=[f"{a}|{r}" for a, r in CASES])
def test_kill9_apply_then_revert(dataset, shard_bin, apply_at, revert_at) -> None:
    root, expected = dataset
    rng = random.Random(f"{apply_at}{revert_at}")
    _crash_and_resume(shard_bin, "apply", root, apply_at, rng)
    assert_sharded_clean(root, expected)
    _crash_and_resume(shard_bin, "revert", root, revert_at, rng)
    assert_flat_clean(root, expected)


def test_kill9_reshard(dataset, shard_bin) -> None:
    root, expected = dataset
    assert _run(shard_bin, "apply", str(root), "-q").returncode == 0
    for point in ("move:7500", "move:15000"):  # in the revert phase, in the apply phase
        crashed = _run(shard_bin, "reshard", str(root), "--levels", "1", "-q", kill_at=point)
        assert crashed.returncode == -signal.SIGKILL
        resumed = _run(shard_bin, "reshard", str(root), "-q")  # no options: the journal knows the target
        assert resumed.returncode == 0, resumed.stderr
        from manyfiles.shard import Layout, verify

        rep = verify(root)
        assert rep.ok and rep.files == len(expected) and rep.layout == Layout(levels=(1,))
        assert snapshot(root) == expected
        assert _run(shard_bin, "reshard", str(root), "--levels", "2:2", "-q").returncode == 0
    assert _run(shard_bin, "revert", str(root), "-q").returncode == 0
    assert_flat_clean(root, expected)
