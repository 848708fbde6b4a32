"""Uploads of single objects (the read cache's write-through, ``mf.open(url, "wb")``).

One PUT with ``Content-MD5`` up to :data:`PUT_MAX` (the server checks every byte against it),
boto3's multipart upload above.  The client is built for the call (the credentials and
configuration as they are now) and its errors become the one-line errors of
:func:`manyfiles.s3.objects.object_error`; the upload is traced as ``s3.put``.
"""

from __future__ import annotations

import base64
import time
from typing import IO

from manyfiles.s3.client import ClientSettings
from manyfiles.s3.transfer import trace_request

PUT_MAX = 64 << 20


def upload(settings: ClientSettings, bucket: str, key: str, body: IO[bytes], size: int, *,
           md5: bytes | None = None) -> None:
    """Upload ``size`` bytes of ``body`` (a seekable binary file at offset 0) as ``s3://bucket/key``.

    ``md5``: the digest of the bytes, sent as ``Content-MD5`` with a single PUT.  Raises the
    one-line error of the object (AccessDenied, NotFound for a missing bucket, TransferError...).
    """
    from manyfiles.s3.objects import object_error

    t0 = time.monotonic_ns()
    try:
        client = settings.client(pool=4)
        if size <= PUT_MAX:
            extra = {"ContentMD5": base64.b64encode(md5).decode()} if md5 is not None else {}
            client.put_object(Bucket=bucket, Key=key, Body=body, **extra)
        else:
            client.upload_fileobj(body, bucket, key)
    except Exception as exc:
        trace_request("s3.put", bucket, key, 0, size, t0, getattr(exc, "status", 0) or -1)
        raise object_error(f"s3://{bucket}/{key}", exc) from exc
    trace_request("s3.put", bucket, key, 0, size, t0, 200)
