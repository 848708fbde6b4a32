"""Uploads of single objects (the read cache's write-through, ``mf.open(url, "wb")``), through the
bucket's store.

One PUT with ``Content-MD5`` up to :data:`PUT_MAX` (the server checks every byte against it); a
multipart upload above, :data:`PART_SIZE` parts sent by a few threads, each with its Content-MD5,
completed only once every part is in (aborted otherwise: no partial object is ever visible).
Bodies are sent from the file (``sendfile`` on plain HTTP).  Errors become the one-line errors of
:func:`manyfiles.s3.objects.object_error`; the requests are traced (``s3.put``, ``s3.put_part``...).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import IO

from manyfiles.s3.client import ClientSettings
from manyfiles.s3.http1 import FileBody

PUT_MAX = 64 << 20
PART_SIZE = 16 << 20
PART_THREADS = 4


def upload(settings: ClientSettings, bucket: str, key: str, body: IO[bytes], size: int, *,
           md5: bytes | None = None) -> None:
    """Upload ``size`` bytes of ``body`` (a binary file, from offset 0) as ``s3://bucket/key``.

    ``md5``: the digest of the bytes, sent as ``Content-MD5`` with a single PUT.  Raises the
    one-line error of the object (AccessDenied, NotFound for a missing bucket, TransferError...).
    """
    from manyfiles.s3.objects import object_error
    from manyfiles.s3.store import store_for

    fd = body.fileno()
    try:
        store = store_for(settings, bucket)
        if size <= PUT_MAX:
            store.put(key, FileBody(fd, 0, size), content_md5=md5)
            return
        upload_id = store.create_multipart(key)
        try:
            def part(n: int):
                start = (n - 1) * PART_SIZE
                length = min(PART_SIZE, size - start)
                digest = hashlib.md5()
                pos = start
                while pos < start + length:     # (os.pread: the threads share the file)
                    chunk = os.pread(fd, min(1 << 20, start + length - pos), pos)
                    if not chunk:
                        raise OSError(0, "the file got shorter while it was uploaded")
                    digest.update(chunk)
                    pos += len(chunk)
                return store.upload_part(key, upload_id, n, FileBody(fd, start, length),
                                         content_md5=digest.digest())

            count = -(-size // PART_SIZE)
            with ThreadPoolExecutor(PART_THREADS) as pool:
                parts = list(pool.map(part, range(1, count + 1)))
            store.complete_multipart(key, upload_id, parts)
        except BaseException:
            with contextlib.suppress(Exception):   # (else a stale upload: lifecycle rules clean it)
                store.abort_multipart(key, upload_id)
            raise
    except Exception as exc:
        raise object_error(f"s3://{bucket}/{key}", exc) from exc
