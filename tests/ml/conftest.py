"""Fixtures for the ML tests: a fresh bucket on the session's moto server behind its own fault proxy
(tests/s3/s3util.Bucket, which checks every SigV4 signature and records every request), a cache
directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3util import Bucket


@pytest.fixture
def s3(moto_direct):
    env = Bucket(moto_direct, prefix="ml")
    yield env
    env.close()


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")
