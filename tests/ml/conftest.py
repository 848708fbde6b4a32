"""Fixtures for the ML tests: a fresh bucket on the session's moto server behind its own fault proxy
(tests/s3/s3util.Bucket, which checks every SigV4 signature and records every request), a cache
directory."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from s3util import Bucket

from manyfiles.cache import Cache


@pytest.fixture
def s3(moto_direct):
    env = Bucket(moto_direct, prefix="ml")
    yield env
    env.close()


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture
def local_files(tmp_path: Path) -> Callable[[int, int], tuple[Path, dict[str, bytes]]]:
    """make(n, dirs): ``n`` small files of random bytes (100 + i bytes) under ``dirs`` folders of
    ``tmp_path/data``; returns (the root, path -> content)."""
    def make(n: int, dirs: int) -> tuple[Path, dict[str, bytes]]:
        root, files = tmp_path / "data", {}
        for i in range(n):
            p = root / f"d{i % dirs}" / f"f{i:03d}.bin"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(os.urandom(100 + i))
            files[str(p)] = p.read_bytes()
        return root, files
    return make


@pytest.fixture
def cache(cache_dir: str) -> Iterator[Cache]:
    """The test's cache, opened with ``min_free=0``: what a test fills stays however full the disk
    is (a directory alone opens it with the default, which keeps 10% of the filesystem free)."""
    with Cache(cache_dir, min_free=0) as c:
        yield c
