"""Which errors are worth retrying, what code a failure gets, and which failures stop the run.

Retried: HTTP 5xx, SlowDown/throttling, connection resets and timeouts, bodies
shorter than announced, a 200 where a 206 was asked.  Never retried: auth and
permission errors, missing buckets/keys, an object that changed under us
(IfMatch failed), local filesystem errors, TLS certificate errors.

Every failure gets a short ``code`` for reports (:func:`failure_code`): the S3 error code
(``NoSuchKey``, ``AccessDenied``, ``SlowDown``...), the errno name of a local error
(``ENOSPC``), or one of ``integrity``, ``unverifiable``, ``inconsistent``, ``changed``, ``unsafe-key``,
``cancelled``, ``transfer``.
"""

from __future__ import annotations

import errno
import ssl

from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import (
    AccessDenied,
    CredentialsError,
    IntegrityError,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    TransferError,
    UnsafeKey,
)

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

# Codes that fail every request of the run the same way: the first one stops it.
CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                              "TokenRefreshRequired", "NoCredentials", "RequestTimeTooSkewed"})


def coded(err: TransferError, code: str) -> TransferError:
    """``err`` with its failure code (the S3 error code, or one of ours)."""
    err.code = code  # type: ignore[attr-defined]
    return err


class Inconsistent(TransferError):
    """An answer that contradicts the listing or itself (a HEAD with another size or ETag,
    ``Content-Length: 0`` for an object whose ETag is not an empty one's, an unusable part
    layout): retried, since a correct answer is what the object pinned by its ETag must give."""

    code = "inconsistent"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


class LocalError(TransferError):
    """A local filesystem error while writing (ENOSPC, EIO, EACCES...): never retried."""

    def __init__(self, exc: OSError) -> None:
        super().__init__(exc.strerror or str(exc), retryable=False)
        self.errno = exc.errno

    @property
    def stops_the_run(self) -> bool:
        """A full, read-only or failing disk: every other object would fail the same way."""
        return self.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)

    @property
    def code(self) -> str:
        return errno.errorcode.get(self.errno or 0, "local")


def failure_code(err: BaseException) -> str:
    """The short code of a failure, for ``Failure.code`` (see the module docstring)."""
    code = getattr(err, "code", None)
    if isinstance(code, str) and code:
        return code
    if isinstance(err, IntegrityError):
        return "integrity"
    if isinstance(err, ObjectChanged):
        return "changed"
    if isinstance(err, UnsafeKey):
        return "unsafe-key"
    return "transfer"


def stopping_error(err: TransferError, where: str) -> ManyfilesError | None:
    """The run-stopping error for a failure that every other object would meet too, else None.

    No such bucket -> NotFound; refused or missing credentials -> CredentialsError; a server
    certificate the CA bundle refuses -> ManyfilesError (with ``where``, e.g.
    ``s3://bucket/prefix``, in the message).  The caller keeps ``err`` as the
    cause.
    """
    code = failure_code(err)
    if code == "NoSuchBucket":
        return NotFound(f"{where}: no such bucket")
    if code in CREDENTIAL_CODES:
        return CredentialsError(f"{where}: {err}")
    if code == "TLS":
        return ManyfilesError(f"{where}: {err}")
    return None


def listing_error(where: str, err: TransferError) -> ManyfilesError:
    """The run-stopping error for a listing that failed: NotFound, AccessDenied or CredentialsError."""
    stop = stopping_error(err, where)
    if stop is not None:
        return stop
    code = failure_code(err)
    if code == "AccessDenied" or err.status in (401, 403):
        return AccessDenied(f"{where}: {err}")
    if code in ("NoSuchKey", "404") or err.status == 404:
        return NotFound(f"{where}: no such bucket")
    return ManyfilesError(f"{where}: {err}")


def tls_refusal(exc: BaseException) -> TransferError | None:
    """A server certificate the CA bundle does not vouch for: the same on every try, never retried."""
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc):
        cert = exc if isinstance(exc, ssl.SSLCertVerificationError) else None
        why = f": {cert.verify_message}" if cert is not None and cert.verify_message else ""
        return coded(TransferError(f"TLS: certificate verify failed{why} (CA bundle: AWS_CA_BUNDLE or the "
                                   "profile's ca_bundle)", retryable=False), "TLS")
    return None


def cause_of(err: BaseException, exc: BaseException) -> BaseException | None:
    """What to raise ``err`` from in the handler of ``exc``: ``exc``, or None when ``err`` is ``exc``
    (classify() returns a TransferError as it is).  ``raise err from err`` makes an error its own
    cause, a loop every walker of the chain follows: pickling it where tblib is loaded (Dask loads
    it) recursed until RecursionError and the processes engine lost the failure."""
    return None if err is exc else exc


def classify(exc: BaseException) -> TransferError:
    """Turn any exception raised while downloading into a TransferError."""
    if isinstance(exc, TransferError):
        return exc
    from manyfiles._core.extras import require
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

    if isinstance(exc, NoCredentialsError):
        return coded(TransferError(str(exc), retryable=False), "NoCredentials")
    if isinstance(exc, (NoRegionError, ParamValidationError)):
        return TransferError(str(exc), retryable=False)
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = err.get("Message") or code or str(exc)
        if code in ("PreconditionFailed", "412") or status == 412:
            return ObjectChanged()
        if code == "NoSuchBucket":
            return coded(TransferError(f"{code}: {msg}", retryable=False, status=status), code)
        if code in ("NoSuchKey", "404") or status == 404:
            return coded(TransferError("no such key (deleted since listing?)", retryable=False, status=404),
                         "NoSuchKey")
        if code == "RequestTimeTooSkewed":
            # botocore cannot re-sign with the server's clock: retrying cannot help (the lean
            # transports can, see http1.ClockSkewed)
            return coded(TransferError(f"{code}: {msg}", retryable=False, status=status), code)
        if code in FATAL_CODES or status in (401, 403):
            return coded(TransferError(f"{code}: {msg}", retryable=False, status=status),
                         code or "AccessDenied")
        retryable = code in RETRYABLE_CODES or status >= 500 or status == 429
        return coded(TransferError(f"{code or status}: {msg}", retryable=retryable, status=status),
                     code or f"HTTP{status}")
    refused = tls_refusal(exc)
    if refused is not None:
        return refused
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


__all__ = ["CREDENTIAL_CODES", "FATAL_CODES", "RETRYABLE_CODES", "Inconsistent", "LocalError",
           "ObjectChanged", "RetryPolicy", "TransferError", "classify", "coded", "failure_code",
           "listing_error", "stopping_error", "tls_refusal"]
