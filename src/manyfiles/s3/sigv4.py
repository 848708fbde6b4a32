"""AWS Signature Version 4, by hand: the signer alone.

botocore spends about a millisecond of CPU building, signing and parsing each request; signing
one request by hand costs a few microseconds (the signing key is cached per day).  What to sign
for and where to send it is decided by :mod:`manyfiles.s3.config`; this module only turns a
request (method, path, query, headers) and a set of credentials into its signed headers.  Every
header we send is signed (some servers, versitygw, refuse unsigned x-amz-* headers); the payload
is ``UNSIGNED-PAYLOAD`` (bodies are checked by their checksum or Content-MD5 header instead).
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from typing import Any
from urllib.parse import quote

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"


class ServerClock:
    """Server time - our time, learnt from a RequestTimeTooSkewed (:meth:`take`): one per
    settings (:func:`manyfiles.s3.config.server_clock`), shared by their signers, so engines
    started after the listing sign right from their first request."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = 0.0

    def take(self, server_date: str | None) -> None:
        """Take the server's clock (its Date header)."""
        import calendar
        import email.utils

        parsed = email.utils.parsedate(server_date) if server_date else None
        if parsed:
            self.offset = calendar.timegm(parsed) - time.time()


class Signer:
    """Signs requests for ``region`` with the credentials of ``source`` (botocore's credentials,
    refreshed by it when they expire, or :class:`~manyfiles.s3.envconfig.EnvCredentials`: anything
    with ``get_frozen_credentials()``); ``source`` None signs nothing (unsigned requests).
    ``clock``: the server clock to sign with (shared by the signers of the same settings)."""

    REFRESH = 60.0

    def __init__(self, source: Any, region: str, *, clock: ServerClock | None = None) -> None:
        self.region = region
        self.unsigned = source is None
        self.clock = clock if clock is not None else ServerClock()
        self._creds_source = source
        self._creds = None
        self._creds_at = 0.0
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()
        if source is not None:
            self._refresh()

    def _refresh(self) -> None:
        # RefreshableCredentials refresh themselves here when they are about to expire
        self._creds = self._creds_source.get_frozen_credentials()
        self._creds_at = time.monotonic()

    @property
    def clock_offset(self) -> float:
        """Server time - our time, learnt from a RequestTimeTooSkewed."""
        return self.clock.offset

    def correct_clock(self, server_date: str | None) -> None:
        """Take the server's clock (its Date header) after a RequestTimeTooSkewed."""
        self.clock.take(server_date)

    def headers(self, host: str, path: str, extra: list[tuple[str, str]] = (), query: str = "",
                method: str = "GET", now: float | None = None) -> list[tuple[str, str]]:
        """All headers (Host first) for ``METHOD path?query`` (``path`` already URI-encoded,
        ``query`` canonical: :func:`query_string`)."""
        if self.unsigned:
            return [("Host", host), *extra]
        if time.monotonic() - self._creds_at > self.REFRESH:
            with self._lock:
                self._refresh()
        creds = self._creds
        region = self.region    # once: a redirect may move it while we sign
        t = (time.time() + self.clock.offset) if now is None else now
        amzdate = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
        day = amzdate[:8]
        hdrs = [("host", host), ("x-amz-content-sha256", UNSIGNED_PAYLOAD), ("x-amz-date", amzdate)]
        if creds.token:
            hdrs.append(("x-amz-security-token", creds.token))
        hdrs += [(k.lower(), " ".join(v.split())) for k, v in extra]
        hdrs.sort()
        canon_headers = "".join(f"{k}:{v}\n" for k, v in hdrs)
        signed = ";".join(k for k, _ in hdrs)
        creq = f"{method}\n{path}\n{query}\n{canon_headers}\n{signed}\n{UNSIGNED_PAYLOAD}"
        scope = f"{day}/{region}/s3/aws4_request"
        sts = f"AWS4-HMAC-SHA256\n{amzdate}\n{scope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
        key = self._signing_key(creds.secret_key, day, region)
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        hdrs = [("Host", host)] + [h for h in hdrs if h[0] != "host"]
        hdrs.append(("Authorization", f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                      f"SignedHeaders={signed}, Signature={sig}"))
        return hdrs

    def _signing_key(self, secret: str, day: str, region: str) -> bytes:
        cache_key = f"{secret}\0{day}\0{region}"
        key = self._keys.get(cache_key)
        if key is None:
            k = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
            for part in (region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = {cache_key: k}
            key = k
        return key


def uri_path(prefix: str, key: str) -> str:
    """The request path for ``key``: every byte but unreserved ones and '/' percent-encoded."""
    return f"{prefix}/{quote(key, safe='/~')}"


def query_string(params: dict[str, str]) -> str:
    """SigV4 canonical query string (also usable as the request's query)."""
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))


__all__ = ["UNSIGNED_PAYLOAD", "ServerClock", "Signer", "query_string", "uri_path"]
