"""HTTP/1.1 framing shared by the hand-signed transports (listing, ``lean`` threads, ``http`` asyncio).

Pure functions on bytes and strings: the request head, the response head, S3 error documents.
No sockets here, so the transports can import it without importing each other.
"""

from __future__ import annotations

import re

from manyfiles.errors import ObjectChanged, TransferError
from manyfiles.s3.retry import FATAL_CODES, RETRYABLE_CODES, coded

_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MSG = re.compile(rb"<Message>([^<]*)</Message>")
_REGION = re.compile(rb"<Region>([^<]*)</Region>")


def request_head(method: str, target: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")


def request_target(ep, path: str, query: str) -> str:
    """The request line's target: origin form, or absolute form through a plain-HTTP proxy."""
    target = f"{path}?{query}" if query else path
    if ep.proxy and ep.scheme != "https":
        target = f"http://{ep.host}{target}"
    return target


def parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """(status, headers with lower-case names) of a response head."""
    text = head.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise TransferError(f"bad HTTP status line {status_line[:60]!r}", retryable=True)
    headers = {}
    for line in rest.split("\r\n"):
        k, sep, v = line.partition(":")
        if sep:
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


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


def http_error(status: int, body: bytes, headers: dict[str, str] | None = None,
               signed: list[tuple[str, str]] = ()) -> TransferError:
    """The TransferError for an S3 error response (``body`` is the XML error document).

    ``signed``: the request's headers.  A HEAD's 403 has no body to say RequestTimeTooSkewed,
    so one whose ``Date`` is more than 15 minutes from the request's ``x-amz-date`` is taken
    for it."""
    headers = headers or {}
    if status == 403 and not body and _skewed(headers.get("date"), dict(signed).get("x-amz-date")):
        return coded(ClockSkewed("RequestTimeTooSkewed: (a HEAD refused; the server's Date is more than "
                                 "15 minutes from ours)", headers.get("date")), "RequestTimeTooSkewed")
    m = _CODE.search(body)
    # a HEAD's error has no body: name the status as S3 would
    code = m.group(1).decode("utf-8", "replace") if m else {
        403: "AccessDenied", 404: "NoSuchKey", 503: "SlowDown"}.get(status, str(status))
    m = _MSG.search(body)
    msg = m.group(1).decode("utf-8", "replace") if m else ""
    text = f"{code}: {msg}" if msg else code
    if status == 412 or code == "PreconditionFailed":
        return ObjectChanged()
    if status == 404 and code == "NoSuchKey":
        return coded(TransferError("no such key (deleted since listing?)", retryable=False, status=404), code)
    m = _REGION.search(body)
    region = headers.get("x-amz-bucket-region") or (m.group(1).decode() if m else "")
    # (a HEAD's 400 has no body: with the region header it is AuthorizationHeaderMalformed)
    if region and (status in (301, 307) or (status == 400 and not body)
                   or code in ("PermanentRedirect", "AuthorizationHeaderMalformed",
                               "IllegalLocationConstraintException")):
        return coded(RegionRedirect(text, region, status), code)
    if code == "RequestTimeTooSkewed":
        return coded(ClockSkewed(text, headers.get("date")), code)
    retryable = code in RETRYABLE_CODES or status >= 500 or status == 429
    return coded(TransferError(text, retryable=retryable and code not in FATAL_CODES, status=status), code)
