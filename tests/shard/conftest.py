"""Fixtures for the shard tests (helpers live in shardkit.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def shard_bin():
    return str(Path(sys.executable).parent / "shard")


@pytest.fixture
def fast_tmp(tmp_path: Path):
    """A scratch directory on tmpfs when there is one (the disk here is shared and slow), else tmp_path."""
    import shutil
    import tempfile

    if not os.access("/dev/shm", os.W_OK):
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="mf-shard-test-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
