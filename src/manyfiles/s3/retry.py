"""Which errors are worth retrying, what code a failure gets, and which failures stop the run.

Retried: HTTP 5xx, SlowDown/throttling, bodies shorter than announced, a 200 where a 206 was
asked (counted: the policy's ``attempts``), and network errors (:class:`NetworkError`: refused,
unreachable, timed out, reset, a DNS lookup that failed for now), which are retried for a time
while they heard nothing from the endpoint (the policy's ``stall_timeout``, half of it for an
endpoint that never answered in this process: see :mod:`manyfiles._core.retry`).  Never retried:
auth and permission errors, missing buckets/keys, an object that changed under us (IfMatch
failed), local filesystem errors, TLS certificate errors, an unknown host.

A network error says so in one human wording per cause, with the endpoint
(``http://10.0.0.5:9000: connection refused``), never a Python class name.  Every transport
records the endpoints that answered (:func:`answered`), so that an error can say whether the
endpoint ever did (``first_contact``).

Every failure gets a short ``code`` for reports (:func:`failure_code`): the S3 error code
(``NoSuchKey``, ``AccessDenied``, ``SlowDown``...), the errno name of a local error
(``ENOSPC``), a network error's cause (``refused``, ``unreachable``, ``timeout``, ``reset``, ``dns``),
or one of ``integrity``, ``unverifiable``, ``inconsistent``, ``changed``, ``unsafe-key``,
``cancelled``, ``transfer``.
"""

from __future__ import annotations

import errno
import socket
import ssl
import sys
from urllib.parse import urlsplit

from manyfiles._core import client_facts
from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import (
    AccessDenied,
    CredentialsError,
    IntegrityError,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    OriginTimeout,
    OriginUnreachable,
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


_STATUS_CODES = {403: "AccessDenied", 404: "NoSuchKey", 503: "SlowDown"}   # an error without a body


def s3_error(status: int, code: str, message: str = "") -> TransferError:
    """The error table: the TransferError of an S3 error answer (HTTP ``status``, the error
    document's ``code`` and ``message``), whoever read it (the hand-signed transports:
    :func:`manyfiles.s3.http1.http_error`; botocore: :func:`classify`).  Its failure code is the
    S3 code (for an answer without one, a HEAD's: the name S3 gives the status, else the status).

    412 / PreconditionFailed: :class:`ObjectChanged`.  NoSuchKey (a 404 without another code): not
    retried.  Retried: :data:`RETRYABLE_CODES`, 5xx and 429, unless the code is one of
    :data:`FATAL_CODES` or the status 401/403.  (RequestTimeTooSkewed is in both sets: only a
    transport that can sign again with the server's clock retries it, see ``http1.ClockSkewed``.)"""
    code = code or _STATUS_CODES.get(status) or str(status)
    if status == 412 or code == "PreconditionFailed":
        return ObjectChanged()
    if code == "NoSuchKey" or (status == 404 and code in ("404", "NotFound")):
        return coded(TransferError("no such key (deleted since listing?)", retryable=False, status=404),
                     "NoSuchKey")
    text = f"{code}: {message}" if message else code
    fatal = code in FATAL_CODES or code == "RequestTimeTooSkewed" or status in (401, 403)
    retryable = not fatal and (code in RETRYABLE_CODES or status >= 500 or status == 429)
    return coded(TransferError(text, retryable=retryable, status=status), code)


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


# -- network errors ----------------------------------------------------------------------------------

NETWORK_CODES = ("refused", "unreachable", "timeout", "reset", "dns")
_WORDING = {"refused": "connection refused", "unreachable": "host unreachable", "timeout": "timed out",
            "reset": "connection reset", "dns": "DNS lookup failed"}
_UNREACHABLE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN})
_RESET = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE})

_answered: set[str] = set()     # endpoints that answered a request in this process


def endpoint_name(url: str | None) -> str | None:
    """``scheme://host[:port]`` of a URL (what network errors and :func:`answered` name)."""
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else url


def answered(endpoint: str | None) -> None:
    """``endpoint`` answered a request (any status): from now on its network errors are those of
    an endpoint that went away, not of one that was never there."""
    if endpoint is not None:
        _answered.add(endpoint)


def has_answered(endpoint: str | None) -> bool:
    """Did ``endpoint`` answer a request in this process (or the client of this worker's job)?"""
    return endpoint in _answered


# a cluster job's workers learn which endpoints answered its client (see client_facts)
client_facts.share("endpoints answered", lambda: frozenset(_answered), _answered.update)


class NetworkError(TransferError):
    """The endpoint could not be reached, or did not answer: ``code`` is the cause (refused,
    unreachable, timeout, reset, dns), the message ``ENDPOINT: wording``.

    ``unanswered``: the request heard nothing from the endpoint (then the retry policy times it,
    rather than counting it); ``first_contact``: nor did any request of this process."""

    def __init__(self, endpoint: str | None, cause: str, *, answered: bool = False, detail: str = "",
                 retryable: bool = True) -> None:
        text = _WORDING[cause] + (f" ({detail})" if detail else "")
        super().__init__(f"{endpoint}: {text}" if endpoint else text, retryable=retryable)
        self.code = cause
        self.endpoint = endpoint
        self.unanswered = not answered
        self.first_contact = not answered and endpoint not in _answered

    def __reduce__(self):  # pickled by the processes engine and Dask: the same error again
        return _network_error, (self.args[0], self.code, self.endpoint, self.unanswered, self.first_contact,
                                self.retryable)

    def about(self, what: str) -> NetworkError:
        """The same error, its message prefixed with ``what`` (``s3://bucket/key: ...``)."""
        return _network_error(f"{what}: {self}", self.code, self.endpoint, self.unanswered,
                              self.first_contact, self.retryable)


def _network_error(message: str, code: str, endpoint: str | None, unanswered: bool, first_contact: bool,
                   retryable: bool) -> NetworkError:
    err = NetworkError.__new__(NetworkError)
    TransferError.__init__(err, message, retryable=retryable)
    err.code, err.endpoint, err.unanswered, err.first_contact = code, endpoint, unanswered, first_contact
    return err


def network_error(exc: BaseException, endpoint: str | None = None, *, answered: bool = False,
                  waited: str = "") -> NetworkError | None:
    """The :class:`NetworkError` an exception stands for (socket errors, botocore's and urllib3's
    connection errors and timeouts, aiohttp's), or None if it is not one.  ``endpoint``: where the
    request went (a botocore error names it itself); ``answered``: the response had begun;
    ``waited``: what a timeout waited for (``no answer in 60 s``), for its message."""
    if isinstance(exc, NetworkError):
        return exc
    botocore = sys.modules.get("botocore.exceptions")
    seen = 0
    node: BaseException | None = exc
    while node is not None and seen < 8:
        seen += 1
        if endpoint is None and botocore is not None and isinstance(node, botocore.BotoCoreError):
            endpoint = endpoint_name(getattr(node, "kwargs", {}).get("endpoint_url"))
        cause = _cause_of(node, botocore)
        if cause is not None:
            kind, detail, retryable = cause
            if kind == "timeout" and waited:
                detail = waited
            return NetworkError(endpoint, kind, answered=answered, detail=detail, retryable=retryable)
        node = _inner(node)
    return None


def origin_unreachable(exc: BaseException, where: str) -> OriginUnreachable | None:
    """The :class:`~manyfiles.errors.OriginUnreachable` (:class:`~manyfiles.errors.OriginTimeout`
    for a timeout) that ``exc`` means, with ``where`` in its message: a network error that found no
    endpoint to talk to (refused, unreachable, timed out, DNS: :func:`network_error`), or one made
    already further down its chain; None for any other error, a reset included (the endpoint was
    there).  The offline reads of the cache fall back on these (manyfiles.cache._offline)."""
    node: BaseException | None = exc
    for _ in range(12):
        if node is None:
            break
        if isinstance(node, OriginUnreachable):
            return node
        node = node.__cause__ or node.__context__
    net = network_error(exc)
    if net is None or net.code == "reset":
        return None
    timed_out = net.code == "timeout"
    what = "did not answer in time" if timed_out else "cannot be reached"
    err = (OriginTimeout if timed_out else OriginUnreachable)(
        f"{where}: the S3 endpoint {what} ({_WORDING[net.code]})")
    err.__cause__ = exc
    return err


def _cause_of(exc: BaseException, botocore) -> tuple[str, str, bool] | None:
    """(cause, detail, retryable) of one exception of the chain, or None."""
    if isinstance(exc, socket.gaierror):
        if exc.errno == socket.EAI_AGAIN:
            return "dns", "temporary failure", True
        return "dns", "unknown host", False
    if botocore is not None and isinstance(exc, (botocore.ConnectTimeoutError, botocore.ReadTimeoutError)):
        return "timeout", "", True
    if botocore is not None and isinstance(exc, botocore.ConnectionClosedError):
        return "reset", "closed before an answer", True
    if isinstance(exc, TimeoutError) or type(exc).__name__ in ("TimeoutError", "ServerTimeoutError"):
        return "timeout", "", True
    if isinstance(exc, ConnectionRefusedError):
        return "refused", "", True
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return "reset", "", True
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno == errno.ECONNREFUSED:
            return "refused", "", True
        if exc.errno in _UNREACHABLE:
            return "unreachable", (exc.strerror or "").lower(), True
        if exc.errno in _RESET:
            return "reset", "", True
        if exc.errno == errno.ETIMEDOUT:
            return "timeout", "", True
    if type(exc).__name__ in ("RemoteDisconnected", "ServerDisconnectedError"):
        return "reset", "closed before an answer", True
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)):
        return "reset", "", True
    return None


def _inner(exc: BaseException) -> BaseException | None:
    """The exception ``exc`` wraps: botocore's ``error``, aiohttp's ``os_error``, urllib3's
    reason, or the cause/context."""
    kwargs = getattr(exc, "kwargs", None)
    if isinstance(kwargs, dict) and isinstance(kwargs.get("error"), BaseException):
        return kwargs["error"]
    for name in ("os_error", "reason"):
        inner = getattr(exc, name, None)
        if isinstance(inner, BaseException):
            return inner
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, BaseException):
            return arg
    return exc.__cause__ or exc.__context__


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
    """The run-stopping error for a listing that failed: NotFound, AccessDenied, CredentialsError,
    the NetworkError (its message prefixed with ``where``), or a ManyfilesError."""
    stop = stopping_error(err, where)
    if stop is not None:
        return stop
    if isinstance(err, NetworkError):   # kept as such: what it says of the endpoint is for the caller
        return err.about(where)
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


def classify(exc: BaseException, *, answered: bool = False) -> TransferError:
    """Turn any exception raised while downloading into a TransferError (``answered``: the
    response had begun, for a network error)."""
    if isinstance(exc, TransferError):
        return exc
    # botocore's errors come only from botocore: where it was never imported (every read path
    # goes through the store), the exception is not one of them and it is not imported for it
    boto = sys.modules.get("botocore.exceptions")
    if boto is not None:
        if isinstance(exc, boto.FlexibleChecksumError):
            return IntegrityError(f"checksum of the body does not match the server's ({exc})")
        if isinstance(exc, boto.NoCredentialsError):
            return coded(TransferError(str(exc), retryable=False), "NoCredentials")
        if isinstance(exc, (boto.NoRegionError, boto.ParamValidationError)):
            return TransferError(str(exc), retryable=False)
        if isinstance(exc, boto.ClientError):
            err = exc.response.get("Error", {})
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            code = str(err.get("Code", ""))
            return s3_error(status, code, err.get("Message") or "" if code else str(exc))
    refused = tls_refusal(exc)
    if refused is not None:
        return refused
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                        FileExistsError)):
        return LocalError(exc)
    network = network_error(exc, answered=answered)
    if network is not None:
        return network
    if isinstance(exc, OSError) and exc.errno is not None:
        # local disk errors (ENOSPC, EIO...): retrying would just fail again
        return LocalError(exc)
    if boto is not None and isinstance(exc, boto.BotoCoreError):
        # ResponseStreamingError, IncompleteRead...: botocore's own words, no class name
        return TransferError(str(exc), retryable=True)
    # urllib3 ProtocolError, aiohttp ClientPayloadError, asyncio's IncompleteReadError...
    return TransferError(f"{type(exc).__name__}: {exc}".rstrip(": "), retryable=True)


__all__ = ["CREDENTIAL_CODES", "FATAL_CODES", "NETWORK_CODES", "RETRYABLE_CODES", "Inconsistent",
           "LocalError", "NetworkError", "ObjectChanged", "RetryPolicy", "TransferError", "answered",
           "classify", "coded", "endpoint_name", "failure_code", "has_answered", "listing_error",
           "network_error", "origin_unreachable", "s3_error", "stopping_error", "tls_refusal"]
