"""AWS Signature Version 4 for S3 GETs, and the endpoint/credential resolution the lean engine needs.

botocore spends about a millisecond of CPU building, signing and parsing each
request; signing one GET by hand costs a few microseconds (the signing key is
cached per day).  Only what a GetObject needs is here: host, x-amz-date,
x-amz-content-sha256 (UNSIGNED-PAYLOAD) and the session token are signed; Range
and If-Match are sent unsigned, which S3 allows.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from manyfiles._extras import require
from manyfiles.s3.client import S3_FEATURE, ClientSettings

_UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str          # host[:port] as sent in the Host header
    port: int
    path_prefix: str   # "/bucket" for path-style, "" for virtual-hosted


def resolve_endpoint(settings: ClientSettings, bucket: str, region: str) -> Endpoint:
    """Where GETs for ``bucket`` go: custom endpoints path-style, AWS virtual-hosted (https)."""
    if settings.endpoint_url:
        u = urlsplit(settings.endpoint_url)
        scheme = u.scheme or "http"
        port = u.port or (443 if scheme == "https" else 80)
        host = u.netloc
        path_style = settings.path_style if settings.path_style is not None else True
        base = u.path.rstrip("/")
        if path_style:
            return Endpoint(scheme, host, port, f"{base}/{bucket}")
        return Endpoint(scheme, f"{bucket}.{host}", port, base)
    if "." in bucket or settings.path_style:
        return Endpoint("https", f"s3.{region}.amazonaws.com", 443, f"/{bucket}")
    return Endpoint("https", f"{bucket}.s3.{region}.amazonaws.com", 443, "")


class Signer:
    """Signs GET requests; refreshes temporary credentials from the botocore chain as they age."""

    REFRESH = 60.0

    def __init__(self, settings: ClientSettings, region: str) -> None:
        self.region = region
        self.unsigned = settings.no_sign
        self._creds_source = None
        self._creds = None
        self._creds_at = 0.0
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()
        if not self.unsigned:
            env = os.environ
            if (not settings.profile and not env.get("AWS_PROFILE") and env.get("AWS_ACCESS_KEY_ID")
                    and env.get("AWS_SECRET_ACCESS_KEY")):
                # first link of the standard chain; skipping botocore's import saves ~0.2 s of CPU
                self._creds_source = _StaticCreds(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                                                  env.get("AWS_SESSION_TOKEN") or None)
            else:
                self._creds_source = botocore_session(settings).get_credentials()
            if self._creds_source is None:
                NoCredentialsError = require("s3", "botocore.exceptions", S3_FEATURE).NoCredentialsError

                raise NoCredentialsError()
            self._refresh()

    def _refresh(self) -> None:
        self._creds = self._creds_source.get_frozen_credentials()
        self._creds_at = time.monotonic()

    def headers(self, host: str, path: str, extra: list[tuple[str, str]] = (),
                query: str = "") -> list[tuple[str, str]]:
        """All headers (Host first) for ``GET path`` (``path`` already URI-encoded), ``extra`` signed too.

        Every header we send is signed: some servers (versitygw) refuse unsigned x-amz-* headers.
        """
        if self.unsigned:
            return [("Host", host), *extra]
        if time.monotonic() - self._creds_at > self.REFRESH:
            with self._lock:
                self._refresh()
        creds = self._creds
        amzdate = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        day = amzdate[:8]
        hdrs = [("host", host), ("x-amz-content-sha256", _UNSIGNED), ("x-amz-date", amzdate)]
        if creds.token:
            hdrs.append(("x-amz-security-token", creds.token))
        hdrs += [(k.lower(), v.strip()) for k, v in extra]
        hdrs.sort()
        canon_headers = "".join(f"{k}:{v}\n" for k, v in hdrs)
        signed = ";".join(k for k, _ in hdrs)
        creq = f"GET\n{path}\n{query}\n{canon_headers}\n{signed}\n{_UNSIGNED}"
        scope = f"{day}/{self.region}/s3/aws4_request"
        sts = f"AWS4-HMAC-SHA256\n{amzdate}\n{scope}\n{hashlib.sha256(creq.encode()).hexdigest()}"
        key = self._signing_key(creds.secret_key, day)
        sig = hmac.new(key, sts.encode(), hashlib.sha256).hexdigest()
        hdrs = [("Host", host)] + [h for h in hdrs if h[0] != "host"]
        hdrs.append(("Authorization", f"AWS4-HMAC-SHA256 Credential={creds.access_key}/{scope}, "
                                      f"SignedHeaders={signed}, Signature={sig}"))
        return hdrs

    def _signing_key(self, secret: str, day: str) -> bytes:
        cache_key = f"{secret}\0{day}"
        key = self._keys.get(cache_key)
        if key is None:
            k = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
            for part in (self.region, "s3", "aws4_request"):
                k = hmac.new(k, part.encode(), hashlib.sha256).digest()
            self._keys = {cache_key: k}
            key = k
        return key


def uri_path(prefix: str, key: str) -> str:
    """The request path for ``key``: every byte but unreserved ones and '/' percent-encoded."""
    return f"{prefix}/{quote(key, safe='/~')}"


@dataclass(frozen=True)
class _StaticCreds:
    access_key: str
    secret_key: str
    token: str | None

    def get_frozen_credentials(self) -> _StaticCreds:
        return self


_sessions: dict = {}


def botocore_session(settings: ClientSettings):
    """A botocore session for the profile (the credential chain), shared; cheaper than boto3's."""
    sess = _sessions.get(settings.profile)
    if sess is None:
        require("s3", "botocore.session", S3_FEATURE)
        import botocore.session

        sess = botocore.session.Session(profile=settings.profile)
        _sessions[settings.profile] = sess
    return sess


def query_string(params: dict[str, str]) -> str:
    """SigV4 canonical query string (also usable as the request's query)."""
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))


_regions: dict = {}


def bucket_region(settings: ClientSettings, bucket: str) -> str:
    """The bucket's region: from the settings/profile, else asked of S3 (x-amz-bucket-region)."""
    key = (settings, bucket)
    region = _regions.get(key)
    if region is None:
        region = _regions[key] = _bucket_region(settings, bucket)
    return region


def _bucket_region(settings: ClientSettings, bucket: str) -> str:
    if settings.endpoint_url:
        env_region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if settings.region or (env_region and not settings.profile):
            return settings.region or env_region
        return botocore_session(settings).get_config_variable("region") or "us-east-1"
    client = settings.client(pool=1)
    try:
        resp = client.head_bucket(Bucket=bucket)
        hdrs = resp["ResponseMetadata"]["HTTPHeaders"]
    except Exception as exc:
        hdrs = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return hdrs.get("x-amz-bucket-region") or settings.region or client.meta.region_name or "us-east-1"
