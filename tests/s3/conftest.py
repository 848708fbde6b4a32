"""A real S3 endpoint over HTTP: moto's server mode, behind an edge that checks every SigV4
signature (moto's own server accepts any), and a fault-injecting proxy that checks them too.

``moto_server`` is the URL every test pulls from (signatures checked); ``moto_direct`` (tests/conftest.py)
is moto itself, for the admin client that seeds buckets.
"""

from __future__ import annotations

import uuid

import pytest
from s3util import CREDS, SECRETS, FaultProxy

from manyfiles.s3 import ClientSettings


@pytest.fixture(scope="session")
def moto_server(moto_direct):
    """moto behind an edge that refuses a wrong signature (403 SignatureDoesNotMatch)."""
    edge = FaultProxy(moto_direct, secrets=SECRETS)
    yield edge.url
    edge.close()


@pytest.fixture(scope="session")
def s3admin(moto_direct):
    import boto3

    return boto3.client("s3", endpoint_url=moto_direct, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def bucket(s3admin):
    """A fresh bucket per test: ``(name, put)`` where ``put(key, data)`` uploads and returns the data."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    s3admin.create_bucket(Bucket=name)

    def put(key: str, data: bytes) -> bytes:
        s3admin.put_object(Bucket=name, Key=key, Body=data)
        return data

    return name, put


@pytest.fixture
def settings(moto_server) -> ClientSettings:
    return ClientSettings(endpoint_url=moto_server, region="us-east-1")


@pytest.fixture
def cli_env(moto_server) -> dict:
    """Environment for s3pull subprocesses: moto via AWS_ENDPOINT_URL, fast retries."""
    return {**CREDS, "AWS_ENDPOINT_URL": moto_server, "MANYFILES_RETRY_BASE": "0.01"}


@pytest.fixture
def proxy(moto_direct):
    p = FaultProxy(moto_direct, secrets=SECRETS)
    yield p
    p.close()


@pytest.fixture(scope="session")
def s3plain(moto_direct):
    """An admin client that uploads without flexible checksums (objects with only an ETag)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=moto_direct, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(request_checksum_calculation="when_required"))
