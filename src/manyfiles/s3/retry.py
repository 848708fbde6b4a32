"""Which errors are worth retrying, and full-jitter backoff.

Retried: HTTP 5xx, SlowDown/throttling, connection resets and timeouts, bodies
shorter than announced, a 200 where a 206 was asked.  Never retried: auth and
permission errors, missing buckets/keys, an object that changed under us
(IfMatch failed), local filesystem errors.
"""

from __future__ import annotations

import errno

from manyfiles._retry import RetryPolicy
from manyfiles.errors import IntegrityError, ObjectChanged, TransferError

RETRYABLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
    "FlexibleChecksumError",
    "InternalError", "ServiceUnavailable", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "500", "502", "503", "504",
})

FATAL_CODES = frozenset({
    "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
    "NoSuchBucket", "AllAccessDisabled", "AuthorizationHeaderMalformed", "PermanentRedirect",
})


class LocalError(TransferError):
    """A local filesystem error while writing (ENOSPC, EIO, EACCES...): never retried."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc), retryable=False)
        self.errno = exc.errno

    @property
    def stops_the_run(self) -> bool:
        """A full, read-only or failing disk: every other object would fail the same way."""
        return self.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def classify(exc: BaseException) -> TransferError:
    """Turn any exception raised while downloading into a TransferError."""
    if isinstance(exc, TransferError):
        return exc
    from manyfiles._extras import require
    from manyfiles.s3.client import S3_FEATURE

    require("s3", "botocore.exceptions", S3_FEATURE)
    from botocore.exceptions import (
        ClientError,
        FlexibleChecksumError,
        NoCredentialsError,
        NoRegionError,
        ParamValidationError,
    )

    if isinstance(exc, FlexibleChecksumError):
        return IntegrityError(f"checksum of the body does not match the server's ({exc})")

    if isinstance(exc, (NoCredentialsError, NoRegionError, ParamValidationError)):
        return TransferError(str(exc), retryable=False)
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = err.get("Message") or code or str(exc)
        if code in ("PreconditionFailed", "412") or status == 412:
            return ObjectChanged()
        if code in ("NoSuchKey", "404") or status == 404:
            return TransferError("no such key (deleted since listing?)", retryable=False, status=404)
        if code in FATAL_CODES or status in (401, 403):
            return TransferError(f"{code}: {msg}", retryable=False, status=status)
        retryable = code in RETRYABLE_CODES or status >= 500 or status == 429
        return TransferError(f"{code or status}: {msg}", retryable=retryable, status=status)
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        FileExistsError)):
        return LocalError(exc)
    name = type(exc).__name__
    if isinstance(exc, OSError) and exc.errno is not None and name not in ("ConnectionResetError",
                                                                             "BrokenPipeError",
                                                                             "ConnectionAbortedError",
                                                                             "ConnectionRefusedError",
                                                                             "TimeoutError"):
        # local disk errors (ENOSPC, EIO...): retrying would just fail again
        return LocalError(exc)
    # botocore ConnectionError/ReadTimeout/ResponseStreamingError/IncompleteRead, urllib3
    # ProtocolError, aiohttp ClientPayloadError/ServerDisconnectedError, asyncio timeouts...
    return TransferError(f"{name}: {exc}".rstrip(": "), retryable=True)


__all__ = ["FATAL_CODES", "RETRYABLE_CODES", "LocalError", "ObjectChanged", "RetryPolicy", "TransferError",
           "classify"]
