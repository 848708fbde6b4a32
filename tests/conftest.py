"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def run_cli(tmp_path: Path):
    """Run a console script of ours as a real subprocess; returns CompletedProcess (bytes)."""
    import subprocess

    bindir = Path(sys.executable).parent

    def run(script: str, *args: str | bytes, input: bytes | None = None, env: dict | None = None,
            cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([str(bindir / script), *args], input=input, capture_output=True,
                              env=full_env, cwd=cwd, timeout=timeout)

    return run
