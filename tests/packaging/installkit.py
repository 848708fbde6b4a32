"""Helpers to build and drive other virtual environments (see conftest.py for the fixtures)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NEWER_BOTO3 = "1.44.5"  # newer than any botocore an aioboto3 release accepts (<= 1.40.61)


def pip(python: Path | None, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run this interpreter's pip, against ``python``'s environment when given."""
    target = ["--python", str(python)] if python else []
    proc = subprocess.run([sys.executable, "-m", "pip", *target, "--disable-pip-version-check", *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def copy_sources(dst: Path) -> Path:
    """The working tree's files as git sees them (tracked + untracked, not ignored) copied to ``dst``:
    what a clean clone holds, without .venv or build leftovers."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, files):
        source = REPO / os.fsdecode(rel)
        if source.is_file():
            (dst / os.fsdecode(rel)).parent.mkdir(parents=True, exist_ok=True)
            (dst / os.fsdecode(rel)).write_bytes(source.read_bytes())
    return dst


def make_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def clean_env() -> dict[str, str]:
    """The environment for subprocesses of another venv: nothing pointing back at ours."""
    env = dict(os.environ)
    for k in ("PYTHONPATH", "VIRTUAL_ENV", "MANYFILES_REQUIRE_C_EXTENSION"):
        env.pop(k, None)
    return env
