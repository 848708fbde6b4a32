"""Fixtures for the cache tests: a moto S3 server behind the fault proxy (tests/s3/s3util.FaultProxy),
which checks every SigV4 signature, records every request and misbehaves on request."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s3"))
from s3util import FAST_RETRY, SECRETS, FaultProxy

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="session")
def cache_moto():
    """A moto server for the whole session (its own: the s3 tests' fixture is theirs)."""
    from manyfiles.s3.localserver import local_s3

    old = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    with local_s3(small=0, medium=0, large=0, bucket="cache-tests-seed") as srv:
        yield srv.endpoint_url
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def s3(cache_moto):
    """A fresh bucket behind a fresh fault proxy: ``S3Env`` with put/delete helpers."""
    import boto3

    from manyfiles.s3 import ClientSettings

    admin = boto3.client("s3", endpoint_url=cache_moto, region_name="us-east-1",
                         aws_access_key_id="testing", aws_secret_access_key="testing")
    bucket = f"c-{uuid.uuid4().hex[:12]}"
    admin.create_bucket(Bucket=bucket)
    proxy = FaultProxy(cache_moto, secrets=SECRETS)
    env = S3Env(bucket, admin, proxy, ClientSettings(endpoint_url=proxy.url, region="us-east-1"))
    yield env
    proxy.close()


class S3Env:
    retry = FAST_RETRY          # what the tests' caches retry with (fast: the tests exercise retries)

    def __init__(self, bucket: str, admin, proxy: FaultProxy, settings) -> None:
        self.bucket, self.admin, self.proxy, self.settings = bucket, admin, proxy, settings

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put(self, key: str, data: bytes) -> bytes:
        self.admin.put_object(Bucket=self.bucket, Key=key, Body=data)
        return data

    def fault(self, kind: str, *, method: str = "GET", key: str = "", ranged: bool | None = None) -> None:
        """Apply ``kind`` once to the next ``method`` request on an object whose key ends with
        ``key`` (``ranged``: only to a ranged GET / only to a whole one)."""
        def pred(m, path, headers) -> bool:
            if m != method or "list-type" in path or not path.partition("?")[0].endswith(key):
                return False
            return ranged is None or ranged == bool(headers.get("Range"))
        self.proxy.faults.append((pred, kind))

    def gets(self) -> list[tuple[str, str, str | None]]:
        """Object GETs seen by the proxy (listings excluded)."""
        return [r for r in self.proxy.requests if r[0] == "GET" and "list-type" not in r[1]]

    def heads(self) -> list[tuple[str, str, str | None]]:
        return [r for r in self.proxy.requests if r[0] == "HEAD"]

    @property
    def env(self) -> dict[str, str]:
        """Environment for CLI subprocesses: the proxy as endpoint, fast retries."""
        return {**CREDS, "AWS_ENDPOINT_URL": self.proxy.url, "MANYFILES_RETRY_BASE": "0.01"}
