"""Fixtures for the ML tests: moto's S3 server behind the fault proxy of tests/s3 (which checks
every SigV4 signature and records every request), a fresh bucket per test, a cache directory."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "s3"))

from s3util import CREDS, SECRETS, FaultProxy


@pytest.fixture(scope="session")
def ml_moto():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    old = {k: os.environ.get(k) for k in CREDS}
    os.environ.update(CREDS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


class S3:
    """A bucket behind its own fault proxy: ``put``, ``url``, request counters, ``settings``."""

    def __init__(self, moto: str) -> None:
        import boto3

        from manyfiles.s3 import ClientSettings

        self.admin = boto3.client("s3", endpoint_url=moto, region_name="us-east-1",
                                  aws_access_key_id="testing", aws_secret_access_key="testing")
        self.bucket = f"ml-{uuid.uuid4().hex[:12]}"
        self.admin.create_bucket(Bucket=self.bucket)
        self.proxy = FaultProxy(moto, secrets=SECRETS)
        self.endpoint = self.proxy.url
        self.settings = ClientSettings(endpoint_url=self.proxy.url, region="us-east-1")

    def put(self, key: str, data: bytes) -> bytes:
        self.admin.put_object(Bucket=self.bucket, Key=key, Body=data)
        return data

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def gets(self) -> list:
        """Object GETs the proxy saw (listings excluded)."""
        return [r for r in self.proxy.requests if r[0] == "GET" and "list-type" not in r[1]]

    def heads(self) -> list:
        return [r for r in self.proxy.requests if r[0] == "HEAD"]

    def lists(self) -> list:
        return [r for r in self.proxy.requests if r[0] == "GET" and "list-type" in r[1]]

    @property
    def env(self) -> dict:
        return {**CREDS, "AWS_ENDPOINT_URL": self.proxy.url}


@pytest.fixture
def s3(ml_moto):
    env = S3(ml_moto)
    yield env
    env.proxy.close()


@pytest.fixture
def cache_dir(tmp_path: Path) -> str:
    return str(tmp_path / "cache")
