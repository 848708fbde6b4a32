"""A throw-away local S3 endpoint (moto's server mode) with a seeded demo bucket.

Used by ``make demo`` and the notebooks.  Needs moto's S3 server: the ``demo``
extra (``pip install "manyfiles[demo]"``).

Example:
    >>> from manyfiles.s3.localserver import local_s3
    >>> with local_s3() as srv:                                     # doctest: +SKIP
    ...     report = pull(f"s3://{srv.bucket}/", "/tmp/demo", settings=srv.settings)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass

from manyfiles._core.extras import require
from manyfiles.s3.client import ClientSettings

DEMO_BUCKET = "manyfiles-demo"


@dataclass(frozen=True)
class LocalS3:
    endpoint_url: str
    bucket: str
    objects: int
    bytes: int

    @property
    def settings(self) -> ClientSettings:
        return ClientSettings(endpoint_url=self.endpoint_url, region="us-east-1")

    @property
    def env(self) -> dict[str, str]:
        """Environment for a subprocess (``s3pull``, aws cli) talking to this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": "demo",
                "AWS_SECRET_ACCESS_KEY": "demo", "AWS_DEFAULT_REGION": "us-east-1"}


def _payload(n: int, seed: str) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}:{i}".encode()).digest() * 64
        i += 1
    return bytes(out[:n])


@contextlib.contextmanager
def local_s3(*, small: int = 300, medium: int = 8, large: int = 1, large_size: int = 40 << 20,
             bucket: str = DEMO_BUCKET) -> Iterator[LocalS3]:
    """Start moto on 127.0.0.1 (a free port), seed ``bucket``, yield a :class:`LocalS3`, stop.

    The bucket holds ``small`` objects of 1-4 KiB under ``small/``, ``medium`` 2 MiB objects
    under ``medium/`` and ``large`` objects of ``large_size`` under ``large/``: one of each
    of the size classes the auto strategy routes differently.
    """
    boto3 = require("s3", "boto3", "the local S3 server")
    ThreadedMotoServer = require("demo", "moto.server", "the local S3 server").ThreadedMotoServer

    for k, v in (("AWS_ACCESS_KEY_ID", "demo"), ("AWS_SECRET_ACCESS_KEY", "demo")):
        os.environ.setdefault(k, v)
    # moto's server logs every request through werkzeug; a demo wants its own output
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        c = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                         aws_access_key_id="demo", aws_secret_access_key="demo")
        c.create_bucket(Bucket=bucket)
        total = 0
        n = 0
        for i in range(small):
            body = _payload(1024 + (i * 37) % 3072, f"s{i}")
            c.put_object(Bucket=bucket, Key=f"small/{i // 100:02d}/obj-{i:05d}.json", Body=body)
            total += len(body)
            n += 1
        for i in range(medium):
            body = _payload(2 << 20, f"m{i}")
            c.put_object(Bucket=bucket, Key=f"medium/chunk-{i:03d}.bin", Body=body)
            total += len(body)
            n += 1
        for i in range(large):
            body = _payload(large_size, f"l{i}")
            c.put_object(Bucket=bucket, Key=f"large/blob-{i}.bin", Body=body)
            total += len(body)
            n += 1
        yield LocalS3(url, bucket, n, total)
    finally:
        server.stop()
