"""Checkpoints (manyfiles._core.checkpoints) and the faults the tests install through them
(tests/faults.py): in-process, and in a real CLI started through the launcher."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

import pytest

import faults
from manyfiles._core import checkpoints


def test_hooks_see_their_point_and_context_and_nothing_else() -> None:
    seen: list[tuple[str, tuple]] = []
    checkpoints.add("move", lambda *context: seen.append(("move", context)))
    checkpoints.add("move", lambda *context: seen.append(("second", context)))
    try:
        checkpoints.reached("mkdir")
        checkpoints.reached("move", (3, b"x"))
    finally:
        checkpoints.remove("move")
    checkpoints.reached("move")
    assert seen == [("move", (3, b"x")), ("second", (3, b"x"))]
    assert checkpoints._hooks == {}  # production's state: nothing registered


def test_nothing_in_the_library_registers_a_hook() -> None:
    code = ("import manyfiles, manyfiles.shard, manyfiles.remove, manyfiles.listing, manyfiles.cli, "
            "manyfiles.s3.sink; from manyfiles._core import checkpoints; print(checkpoints._hooks)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "{}\n"


def test_hold_at_stops_the_nth_pass_until_released() -> None:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    passed: list[int] = []

    def run() -> None:
        for i in range(1, 5):
            checkpoints.reached("place")
            passed.append(i)

    with faults.hold_at("place", 3, ready_w, go_r):
        worker = threading.Thread(target=run)
        worker.start()
        assert os.read(ready_r, 1) == b"h"   # the event: held at its 3rd pass
        assert passed == [1, 2]
        os.close(go_w)
        worker.join(60)
    assert passed == [1, 2, 3, 4] and not worker.is_alive()
    for fd in (ready_r, ready_w, go_r):
        os.close(fd)


def test_the_write_fault_replaces_pwrite_and_goes_away(tmp_path) -> None:
    real = os.pwrite
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        with faults.write_fault("short"):
            assert os.pwrite(fd, b"abcdef", 0) == 3
        with faults.write_fault("EIO", 2):
            assert os.pwrite(fd, b"x", 0) == 1
            with pytest.raises(OSError, match="Input/output error"):
                os.pwrite(fd, b"y", 0)
            assert os.pwrite(fd, b"z", 1) == 1
    finally:
        os.close(fd)
    assert os.pwrite is real and (tmp_path / "f").read_bytes() == b"xzc"


def test_the_launcher_kills_a_real_shard_at_the_nth_move(tmp_path) -> None:
    for i in range(40):
        (tmp_path / f"file-{i}.txt").write_bytes(b"")
    argv = faults.command("shard", "apply", "-j", "1", "--levels", "1", str(tmp_path), kill_at="move:7")
    r = subprocess.run(argv, capture_output=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert sum(1 for p in tmp_path.iterdir() if p.name.startswith("file-")) == 40 - 7  # 7 moved, no 8th


@pytest.mark.parametrize("args", [["-r", "."], ["--type", "d", "."]], ids=["fast path", "click path"])
def test_the_launcher_holds_both_fastls_entry_paths_at_command(args: list[str], tmp_path) -> None:
    """fastls runs its common forms without click: both paths reach the ``command`` checkpoint."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    argv = faults.command("fastls", *args, hold_at=f"command:1:{ready_w}:{go_r}")
    proc = subprocess.Popen(argv, cwd=tmp_path, pass_fds=(ready_w, go_r), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    os.close(ready_w)
    os.close(go_r)
    try:
        held, _, _ = select.select([ready_r], [], [], 120)
        assert held and os.read(ready_r, 1) == b"h", proc.poll()
        assert proc.poll() is None
    finally:
        os.close(go_w)
        os.close(ready_r)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out == b"", err


def test_the_launcher_runs_only_our_console_scripts() -> None:
    r = subprocess.run(faults.command("pip", "--version"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a console script of manyfiles" in r.stderr
