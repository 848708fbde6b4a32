"""Fixtures for the cache tests: a fresh bucket on the session's moto server behind its own fault
proxy (tests/s3/s3util.Bucket), which checks every SigV4 signature, records every request and
misbehaves on request."""

from __future__ import annotations

import pytest
from s3util import Bucket


@pytest.fixture
def s3(moto_direct):
    """A fresh bucket behind a fresh fault proxy (``s3util.Bucket``)."""
    env = Bucket(moto_direct, prefix="c")
    yield env
    env.close()
