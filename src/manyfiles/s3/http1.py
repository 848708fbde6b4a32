"""The HTTP/1.1 core of the hand-signed transports, without I/O (sans-IO).

Everything a request to S3 decides, whichever shell does the I/O (the blocking sockets of
:class:`manyfiles.s3.transport.Transport`, the asyncio streams of
:class:`manyfiles.s3.transport.AsyncConnection`): the request head, signed for the route's
endpoint; the response head (repeated headers kept); S3's error documents turned into errors (the
error table is :func:`manyfiles.s3.retry.s3_error`); a region redirect followed once (the route
moves, the request is signed again); a keep-alive connection the server closed while idle sent
again once on a new one (not a POST nor a conditional PUT: they are not idempotent, and the server
may have done them before it closed; that is a retryable error, for the caller's retry to see); the
server's clock taken after a RequestTimeTooSkewed; the endpoint recorded as having answered; and
what a failed request's exception means (:func:`request_error`).

:func:`exchange` is that logic as a generator: it yields what the shell must do (:class:`Send`:
send these bytes on a connection to this endpoint and return the response head;
:class:`ErrorBody`: read at most this much of the error document, then drop the connection) and
returns the answer's status and headers, or raises the answer's error.  A shell drives it::

    steps = exchange(route, "GET", path, extra, ok=(200, 206))
    reply = None
    while True:
        try:
            op = steps.send(reply)
        except StopIteration as done:
            status, headers = done.value
            break
        reply = do(op)        # the I/O, blocking or awaited
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterable
from typing import NamedTuple

from manyfiles.errors import TransferError
from manyfiles.s3.config import Endpoint, Route
from manyfiles.s3.retry import answered, classify, coded, network_error, s3_error, tls_refusal

MAX_HEAD = 64 << 10          # a response head longer than this is not S3's
MAX_ERROR_BODY = 1 << 16     # what is read of an error document (its <Code> is near the start)

_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MSG = re.compile(rb"<Message>([^<]*)</Message>")
_REGION = re.compile(rb"<Region>([^<]*)</Region>")


# -- heads -----------------------------------------------------------------------------------------

class Headers(dict):
    """A response's headers: lower-case names to values.  A header sent more than once keeps every
    value (:meth:`get_all`, in order); looked up as a mapping it is its last value, as a dict built
    from the lines would be (a ``Date`` sent twice: the second)."""

    __slots__ = ("repeated",)

    def __init__(self) -> None:
        super().__init__()
        self.repeated: dict[str, list[str]] | None = None

    def add(self, name: str, value: str) -> None:
        old = self.get(name)
        if old is not None:
            if self.repeated is None:
                self.repeated = {}
            self.repeated.setdefault(name, [old]).append(value)
        self[name] = value

    def get_all(self, name: str) -> list[str]:
        """Every value sent for ``name`` (lower case), in order."""
        if self.repeated is not None and name in self.repeated:
            return list(self.repeated[name])
        value = self.get(name)
        return [] if value is None else [value]


def parse_head(head: bytes) -> tuple[int, Headers]:
    """(status, headers with lower-case names) of a response head."""
    text = head.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise TransferError(f"bad HTTP status line {status_line[:60]!r}", retryable=True)
    headers = Headers()
    for line in rest.split("\r\n"):
        k, sep, v = line.partition(":")
        if sep:
            headers.add(k.strip().lower(), v.strip())
    return int(parts[1]), headers


def request_head(method: str, target: str, headers: Iterable[tuple[str, str]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def request_target(ep: Endpoint, path: str, query: str) -> str:
    """The request line's target: origin form, or absolute form through a plain-HTTP proxy."""
    target = f"{path}?{query}" if query else path
    if ep.proxy and ep.scheme != "https":
        target = f"http://{ep.host}{target}"
    return target


def connect_request(ep: Endpoint) -> bytes:
    """The CONNECT request that opens a tunnel through ``ep.proxy`` (HTTPS_PROXY) before TLS."""
    return (f"CONNECT {ep.connect_host}:{ep.port} HTTP/1.1\r\nHost: {ep.connect_host}:{ep.port}\r\n\r\n"
            .encode())


def check_tunnel(head: bytes) -> None:
    """The proxy's answer to :func:`connect_request`: raises unless it opened the tunnel."""
    status, _ = parse_head(head)
    if status != 200:
        raise TransferError(f"proxy refused CONNECT (HTTP {status})", retryable=False, status=status)


def split_head(data: bytes) -> tuple[bytes, bytes] | None:
    """(head, the bytes after it) once ``data`` holds a whole response head, else None; raises for a
    head past :data:`MAX_HEAD`."""
    i = data.find(b"\r\n\r\n")
    if i >= 0:
        return data[: i + 4], data[i + 4:]
    if len(data) > MAX_HEAD:
        raise TransferError("response head too large", retryable=True)
    return None


def content_length(headers: Headers) -> int:
    """The Content-Length (-1: none, or not a number); raises for two that differ (RFC 9112: which
    one frames the body cannot be known)."""
    if headers.repeated is not None and len(set(headers.get_all("content-length"))) > 1:
        raise TransferError("conflicting Content-Length headers", retryable=True)
    try:
        return int(headers.get("content-length", "-1"))
    except ValueError:
        return -1


def keeps_alive(headers: Headers) -> bool:
    return headers.get("connection", "").lower() != "close"


# -- errors ----------------------------------------------------------------------------------------

class RegionRedirect(TransferError):
    """The bucket lives in another region (301 PermanentRedirect / 400 AuthorizationHeaderMalformed)."""

    def __init__(self, message: str, region: str, status: int) -> None:
        super().__init__(message, retryable=False, status=status)
        self.region = region


class ClockSkewed(TransferError):
    """RequestTimeTooSkewed: retryable once the signer takes the server's clock (``server_date``)."""

    def __init__(self, message: str, server_date: str | None) -> None:
        super().__init__(message, retryable=True, status=403)
        self.server_date = server_date


def _skewed(date: str | None, amzdate: str | None) -> bool:
    import calendar
    import email.utils
    import time

    parsed = email.utils.parsedate(date) if date else None
    if not parsed or not amzdate:
        return False
    sent = calendar.timegm(time.strptime(amzdate, "%Y%m%dT%H%M%SZ"))
    return abs(calendar.timegm(parsed) - sent) > 900


def http_error(status: int, body: bytes, headers: Headers | dict | None = None,
               signed: Iterable[tuple[str, str]] = ()) -> TransferError:
    """The TransferError for an S3 error response (``body``: its XML error document, or the start of it).

    ``signed``: the request's headers.  A HEAD's 403 has no body to say RequestTimeTooSkewed,
    so one whose ``Date`` is more than 15 minutes from the request's ``x-amz-date`` is taken
    for it.  A region the answer names (header or document) with a redirect's status or code is
    a :class:`RegionRedirect`; RequestTimeTooSkewed a :class:`ClockSkewed`; the rest is the error
    table's (:func:`~manyfiles.s3.retry.s3_error`)."""
    headers = headers or {}
    if status == 403 and not body and _skewed(headers.get("date"), dict(signed).get("x-amz-date")):
        return coded(ClockSkewed("RequestTimeTooSkewed: (a HEAD refused; the server's Date is more than "
                                 "15 minutes from ours)", headers.get("date")), "RequestTimeTooSkewed")
    m = _CODE.search(body)
    code = m.group(1).decode("utf-8", "replace") if m else ""
    m = _MSG.search(body)
    msg = m.group(1).decode("utf-8", "replace") if m else ""
    m = _REGION.search(body)
    region = headers.get("x-amz-bucket-region") or (m.group(1).decode() if m else "")
    # (a HEAD's 400 has no body: with the region header it is AuthorizationHeaderMalformed)
    if region and (status in (301, 307) or (status == 400 and not body)
                   or code in ("PermanentRedirect", "AuthorizationHeaderMalformed",
                               "IllegalLocationConstraintException")):
        return coded(RegionRedirect(f"{code}: {msg}" if msg else code or str(status), region, status),
                     code or str(status))
    if code == "RequestTimeTooSkewed":
        return coded(ClockSkewed(f"{code}: {msg}" if msg else code, headers.get("date")), code)
    return s3_error(status, code, msg)


def error_in_body(body: bytes) -> TransferError | None:
    """The error of a 200 answer whose document is an ``<Error>`` (CompleteMultipartUpload, CopyObject:
    S3 may fail them after sending 200), else None."""
    head = body[:512].lstrip()
    if head.startswith(b"<?xml"):
        head = head[head.find(b"?>") + 2:].lstrip()
    if not head.startswith(b"<Error>"):
        return None
    return http_error(500 if b"<Code>InternalError" in body else 400, body)


def request_error(exc: BaseException, endpoint: str, timeout: float, answered: bool = False) -> TransferError:
    """The TransferError of a request to ``endpoint`` that failed with ``exc`` (``answered``: its
    response had begun; ``timeout``: the read timeout, for the words of a timeout)."""
    if isinstance(exc, TransferError):
        return exc
    refused = tls_refusal(exc)
    if refused is not None:
        return refused
    waited = f"no data for {timeout:g} s" if answered else f"no answer in {timeout:g} s"
    if isinstance(exc, BlockingIOError):    # SO_RCVTIMEO / SO_SNDTIMEO ran out
        exc = TimeoutError(exc.errno, "timed out")
    err = network_error(exc, endpoint, answered=answered, waited=waited)
    if err is not None:
        return err
    if isinstance(exc, OSError) and exc.errno is not None:   # any other socket error: another connection
        return TransferError(f"{endpoint}: {exc.strerror or exc}", retryable=True)
    return classify(exc)


def connect_error(exc: BaseException, endpoint: str, connect_timeout: float) -> BaseException:
    """What a failed connection attempt raises (the NetworkError of ``exc``, else ``exc``)."""
    err = network_error(exc, endpoint, waited=f"connecting, {connect_timeout:g} s")
    return exc if err is None else err


# -- one exchange ------------------------------------------------------------------------------------

class Send(NamedTuple):
    """Send ``data`` (the request head, and a small body) then ``body`` (a large one: bytes-like, or a
    :class:`FileBody`) on a connection to ``ep``, and return the response head, or None when a
    *reused* connection was closed before any byte of it (``fresh``: on a new connection)."""

    ep: Endpoint
    data: bytes
    body: object
    fresh: bool


class ErrorBody(NamedTuple):
    """Read ``want`` more bytes of the error document (``length_known`` False: at most that many,
    until the server closes, briefly), return them, and drop the connection (always: keep-alive
    after an error is not worth the risk)."""

    want: int
    length_known: bool


class FileBody(NamedTuple):
    """``size`` bytes of the open file ``fd`` from ``offset``: a body sent from the file (``sendfile``)."""

    fd: int
    offset: int
    size: int


INLINE_BODY = 64 << 10     # bodies up to this size go in the same send as the head


def exchange(route: Route, method: str, path: str, extra: list[tuple[str, str]], query: str = "",
             body: object = None, ok: tuple[int, ...] = (200,)
             ) -> Generator[Send | ErrorBody, bytes | None, tuple[int, Headers, bytes]]:
    """One request (see the module docstring): returns (status, headers, the bytes read after the
    head) of an answer whose status is in ``ok``; raises the error of any other."""
    length = None
    if body is not None:
        length = body.size if isinstance(body, FileBody) else len(body)
        extra = [*extra, ("content-length", str(length))]
    elif method in ("PUT", "POST"):
        extra = [*extra, ("content-length", "0")]
    for redirected in (False, True):
        ep = route.ep
        signed = route.signer.headers(ep.host, path, extra, query=query, method=method)
        data = request_head(method, request_target(ep, path, query), signed)
        rest_body = body
        if body is not None and not isinstance(body, FileBody) and length <= INLINE_BODY:
            data += bytes(body)
            rest_body = None
        reply = yield Send(ep, data, rest_body, False)
        if reply is None:
            if method == "POST" or (method == "PUT" and any(k == "if-none-match" for k, _ in extra)):
                # not idempotent (a CreateMultipartUpload sent twice makes two uploads; a conditional
                # PUT sent twice finds its own object), and the server may have done it before it
                # closed: the caller's retry sends it again, and knows (its on_retry hears of it)
                raise TransferError("the connection closed before the answer (the server may have "
                                    "done the request)", retryable=True)
            # the server closed an idle keep-alive connection: not a failure, send it again
            reply = yield Send(ep, data, rest_body, True)
        head, rest = reply
        status, headers = parse_head(head)
        answered(ep.name)
        if status in ok:
            return status, headers, rest
        n = content_length(headers)
        want = 0 if method == "HEAD" else (min(n, MAX_ERROR_BODY) if n >= 0 else MAX_ERROR_BODY)
        more = yield ErrorBody(max(0, want - len(rest)), n >= 0)
        doc = (bytes(rest) + more)[:want]
        err = http_error(status, doc, headers, signed)
        if isinstance(err, ClockSkewed):
            route.signer.correct_clock(err.server_date)
        if isinstance(err, RegionRedirect) and not redirected:
            route.relocate(err.region)
            continue
        raise err
    raise AssertionError("unreachable")


__all__ = ["INLINE_BODY", "MAX_ERROR_BODY", "MAX_HEAD", "ClockSkewed", "ErrorBody", "FileBody", "Headers",
           "RegionRedirect", "Send", "check_tunnel", "connect_error", "connect_request", "content_length",
           "error_in_body", "exchange", "http_error", "keeps_alive", "parse_head", "request_error",
           "request_head", "request_target", "split_head"]
