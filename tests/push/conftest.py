"""s3push's tests: a fresh bucket on the session's moto server behind its own fault proxy (which
checks every signature and every body against its Content-MD5 / x-amz-checksum-*), and a state
folder per test for the resume journal."""

from __future__ import annotations

import pytest
from s3util import Bucket


@pytest.fixture
def dest(moto_direct):
    b = Bucket(moto_direct, "push")
    yield b
    b.close()


@pytest.fixture
def state(tmp_path):
    return tmp_path / "state"
