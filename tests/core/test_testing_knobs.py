"""The test-only knobs module: parsing, and that only the CLI entry reads the environment bridge."""

from __future__ import annotations

import subprocess
import sys

import pytest

from manyfiles._core import testing as _testing


def test_configure_parses_and_rejects_unknown_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_testing, "kill_at", None)
    _testing.configure("kill_at=move:3")
    assert _testing.kill_at == ("move", 3)
    assert [_testing.reached("move") for _ in range(4)] == [False, False, True, False]
    assert not _testing.reached("mkdir")
    _testing.configure("kill_at=")
    assert _testing.kill_at is None
    with pytest.raises(ValueError, match="unknown knob 'nope'"):
        _testing.configure("nope=1")


def test_importing_the_library_never_reads_the_bridge() -> None:
    code = ("import manyfiles.shard, manyfiles.remove, manyfiles._core.testing as t; "
            "print(t.kill_at); t.apply_environ(); print(t.kill_at)")
    env = {"MANYFILES_TESTING": "kill_at=finish:2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["None", "('finish', 2)"]
