"""AWS Signature Version 4 for the hand-signed transports, on a configuration botocore resolved.

botocore spends about a millisecond of CPU building, signing and parsing each request;
signing one GET by hand costs a few microseconds (the signing key is cached per day).  What
to sign and where to send it is NOT decided here: :func:`aws_config` asks one botocore
session for the endpoint (``--endpoint-url``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the
profile's ``services`` section and ``endpoint_url``), the region, the credential provider
(env, profiles, SSO, credential_process, IMDS; refreshed as they expire), the addressing
style, the CA bundle and the proxies, exactly as a boto3 client would.  Every header we send
is signed (some servers, versitygw, refuse unsigned x-amz-* headers).
"""

from __future__ import annotations

import calendar
import email.utils
import hashlib
import hmac
import os
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from manyfiles._core.extras import require
from manyfiles.errors import UsageError, shown
from manyfiles.s3 import envconfig

if TYPE_CHECKING:       # annotations only: client.py imports this module
    from collections.abc import Iterator

    from manyfiles.s3.client import ClientSettings

S3_FEATURE = "S3 access"   # what a missing [s3] extra's message names (client.py re-exports it)

_UNSIGNED = "UNSIGNED-PAYLOAD"


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    host: str          # the Host header: host[:port], IPv6 literals in brackets
    connect_host: str  # what to connect to (no brackets)
    port: int
    path_prefix: str   # "/bucket" for path-style, "" for virtual-hosted
    proxy: tuple[str, int] | None = None   # (host, port) of an HTTP proxy, CONNECT for https

    @property
    def name(self) -> str:
        """``scheme://host[:port]``: the endpoint as network errors name it (``retry.endpoint_name``)."""
        return f"{self.scheme}://{self.host}"


@dataclass(frozen=True)
class AwsConfig:
    """What botocore resolved for S3: everything the hand-signed transports need."""

    endpoint_url: str | None
    region: str
    addressing_style: str          # "path", "virtual" or "auto"
    ca_bundle: str | None
    verify_tls: bool


_sessions: dict = {}
_AWS_FILES = (("AWS_CONFIG_FILE", "~/.aws/config"), ("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"))


_PROXY_VARS = frozenset({"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"})
_PROXY_VARS_B = frozenset(v.encode() for v in _PROXY_VARS)


def _aws_and_proxy_variables() -> Iterator[tuple[bytes, bytes] | tuple[str, str]]:
    # Asked before every S3 call and every cache hit of an s3:// URL: os.environ's own mapping
    # decodes every variable on each pass (0.4 ms for 50 variables); the bytes behind it (POSIX)
    # are scanned ten times faster, and a key made of them changes exactly when os.environ does.
    raw = getattr(os.environ, "_data", None)
    if os.name == "posix" and isinstance(raw, dict):       # bytes keys and values there
        return ((k, v) for k, v in raw.items() if k.startswith(b"AWS_") or k.upper() in _PROXY_VARS_B)
    return ((k, v) for k, v in os.environ.items() if k.startswith("AWS_") or k.upper() in _PROXY_VARS)


def environment_key() -> tuple:
    """What the configuration is resolved from besides our settings: every ``AWS_*`` variable, the
    proxy variables, and the config and credentials files (path, size, mtime).  A change to any of
    them is a new configuration."""
    env = tuple(sorted(_aws_and_proxy_variables()))
    files = []
    for var, default in _AWS_FILES:
        path = os.path.expanduser(os.environ.get(var) or default)
        try:
            st = os.stat(path)
            files.append((path, st.st_size, st.st_mtime_ns))
        except OSError:
            files.append((path, -1, -1))
    return env + tuple(files)


def botocore_session(settings: ClientSettings):
    """The botocore session for the profile, as the environment and the AWS files are now.

    Shared while they stay the same (a session caches the credentials it found); a change to an
    ``AWS_*`` variable or to the config/credentials files between two calls makes a new one, so
    keys that were changed or removed are never used again.  A profile that is not configured
    (``--aws-profile NAME``, or ``AWS_PROFILE``) is a UsageError (exit 2) here, the one place every
    S3 entry point passes, not a botocore traceback later."""
    env = environment_key()
    cached = _sessions.get(settings.profile)
    if cached is not None and cached[0] == env:
        return cached[1]
    require("s3", "botocore.session", S3_FEATURE)
    import botocore.session
    from botocore.exceptions import ConfigParseError, ProfileNotFound

    sess = botocore.session.Session(profile=settings.profile)
    try:
        sess.get_scoped_config()
    except ConfigParseError as exc:
        raise unreadable_aws_file(exc) from exc
    except ProfileNotFound as exc:
        source = "--aws-profile" if settings.profile else "AWS_PROFILE"
        name = settings.profile or os.environ.get("AWS_PROFILE", "")
        raise UsageError(f"AWS profile {name!r} ({source}) is not in the AWS config or credentials "
                         "files") from exc
    _sessions[settings.profile] = (env, sess)
    return sess


def unreadable_aws_file(exc: Exception) -> UsageError:
    """The one line for an AWS config or credentials file botocore cannot parse (a ``[default``
    without ``]``): configuration, like an unknown profile, so a usage error (exit 2)."""
    path = getattr(exc, "kwargs", {}).get("path") or "the AWS config"
    cause = getattr(exc, "kwargs", {}).get("error")
    where = ""
    if getattr(cause, "errors", None):             # configparser.ParsingError: (line number, line)
        where = f" at line {cause.errors[0][0]}"
    elif getattr(cause, "lineno", None):           # MissingSectionHeaderError
        where = f" at line {cause.lineno}"
    return UsageError(f"{shown(path)}: malformed{where} (an AWS config or credentials file holds "
                      "[section] headers and 'name = value' lines)")


def configured_endpoint(settings: ClientSettings) -> str | None:
    """The S3 endpoint botocore would use: settings, AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the
    profile's ``services`` section, the profile's ``endpoint_url`` (unless ignored by config)."""
    if settings.endpoint_url:
        return settings.endpoint_url
    if envconfig.env_only(settings):      # no botocore to import (see envconfig)
        return envconfig.endpoint()
    require("s3", "botocore.configprovider", S3_FEATURE)
    from botocore.configprovider import ConfiguredEndpointProvider

    sess = botocore_session(settings)
    if str(sess.get_config_variable("ignore_configured_endpoint_urls") or "").lower() == "true":
        return None
    provider = ConfiguredEndpointProvider(full_config=sess.full_config,
                                          scoped_config=sess.get_scoped_config(), client_name="s3")
    return provider.provide() or None


_configs: dict = {}


def aws_config(settings: ClientSettings) -> AwsConfig:
    """Endpoint, region, addressing style, CA bundle: resolved once per settings and environment."""
    key = (settings, environment_key())
    cfg = _configs.get(key)
    if cfg is None:
        endpoint = configured_endpoint(settings)
        if envconfig.env_only(settings):      # no botocore to import (see envconfig)
            region, configured_style, ca = envconfig.region(), None, envconfig.ca_bundle()
        else:
            sess = botocore_session(settings)
            region = sess.get_config_variable("region")
            s3cfg = (sess.get_scoped_config() or {}).get("s3") or {}
            configured_style = s3cfg.get("addressing_style") if isinstance(s3cfg, dict) else None
            ca = sess.get_config_variable("ca_bundle") or None
        style = "auto"
        if settings.path_style is not None:
            style = "path" if settings.path_style else "virtual"
        elif configured_style:
            style = configured_style
        elif endpoint:
            style = "path"
        cfg = AwsConfig(endpoint, settings.region or region or "", style, ca, settings.verify_tls)
        if len(_configs) > 64:
            _configs.clear()
        _configs[key] = cfg
    return cfg


def credentials_source(settings: ClientSettings):
    """Where the credentials come from now: the environment alone (no botocore import, see
    envconfig), else botocore's chain; None when none is found."""
    if envconfig.env_only(settings):
        return envconfig.credentials()
    from botocore.exceptions import ConfigParseError

    try:
        return botocore_session(settings).get_credentials()
    except ConfigParseError as exc:       # the credentials file
        raise unreadable_aws_file(exc) from exc


def credentials_key(settings: ClientSettings) -> str | None:
    """A digest of the credentials these settings resolve to now (None: unsigned or none found);
    long-lived transports are keyed by it, so they never sign with keys that were replaced."""
    if settings.no_sign:
        return None
    source = credentials_source(settings)
    if source is None:
        return None
    creds = source.get_frozen_credentials()
    return hashlib.sha256(f"{creds.access_key}\0{creds.secret_key}\0{creds.token}".encode()).hexdigest()


def set_region(settings: ClientSettings, bucket: str, region: str) -> None:
    """Remember that ``bucket`` lives in ``region`` (after a redirect)."""
    _regions[(settings, bucket)] = region


def _proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    u = urlsplit(url if "://" in url else f"http://{url}")
    return (u.hostname or "", u.port or 80)


def resolve_endpoint(settings: ClientSettings, bucket: str, region: str) -> Endpoint:
    """Where requests for ``bucket`` go (custom endpoints path-style unless configured otherwise)."""
    cfg = aws_config(settings)
    if cfg.endpoint_url:
        u = urlsplit(cfg.endpoint_url)
        scheme = u.scheme or "http"
        hostname = u.hostname or ""
        port = u.port or (443 if scheme == "https" else 80)
        netloc = u.netloc.rpartition("@")[2]
        base = u.path.rstrip("/")
        if cfg.addressing_style != "virtual":
            ep = Endpoint(scheme, netloc, hostname, port, f"{base}/{bucket}")
        else:
            ep = Endpoint(scheme, f"{bucket}.{netloc}", f"{bucket}.{hostname}", port, base)
    else:
        host = f"s3.{region}.amazonaws.com"
        if "." in bucket or cfg.addressing_style == "path":
            ep = Endpoint("https", host, host, 443, f"/{bucket}")
        else:
            ep = Endpoint("https", f"{bucket}.{host}", f"{bucket}.{host}", 443, "")
    proxy = _proxy_for(ep.scheme, ep.connect_host)
    return replace(ep, proxy=proxy) if proxy else ep


def ssl_context(settings: ClientSettings):
    """TLS context with botocore's CA bundle (AWS_CA_BUNDLE / ca_bundle), or no verification."""
    import ssl

    cfg = aws_config(settings)
    ctx = ssl.create_default_context(cafile=cfg.ca_bundle)
    if not cfg.verify_tls:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Signer:
    """Signs requests; temporary credentials come from botocore's provider and are refreshed by it."""

    REFRESH = 60.0

    def __init__(self, settings: ClientSettings, region: str) -> None:
        self.region = region
        self.unsigned = settings.no_sign
        self._settings = settings
        self._creds_source = None
        self._creds = None
        self._creds_at = 0.0
        self._keys: dict[str, bytes] = {}
        self._lock = threading.Lock()
        if not self.unsigned:
            self._creds_source = credentials_source(settings)
            if self._creds_source is None:
                NoCredentialsError = require("s3", "botocore.exceptions", S3_FEATURE).NoCredentialsError

                raise NoCredentialsError()
            self._refresh()

    def _refresh(self) -> None:
        # RefreshableCredentials refresh themselves here when they are about to expire
        self._creds = self._creds_source.get_frozen_credentials()
        self._creds_at = time.monotonic()

    @property
    def clock_offset(self) -> float:
        """Server time - our time, learned from a RequestTimeTooSkewed (shared by every signer of
        these settings, so engines started after the listing sign right from their first request)."""
        return _clock_offsets.get(self._settings, 0.0)

    def correct_clock(self, server_date: str | None) -> None:
        """Take the server's clock (its Date header) after a RequestTimeTooSkewed."""
        if not server_date:
            return
        parsed = email.utils.parsedate(server_date)
        if parsed:
            _clock_offsets[self._settings] = calendar.timegm(parsed) - time.time()

    def headers(self, host: str, path: str, extra: list[tuple[str, str]] = (), query: str = "",
                method: str = "GET", now: float | None = None) -> list[tuple[str, str]]:
        """All headers (Host first) for ``METHOD path?query`` (``path`` already URI-encoded)."""
        if self.unsigned:
            return [("Host", host), *extra]
        if time.monotonic() - self._creds_at > self.REFRESH:
            with self._lock:
                self._refresh()
        creds = self._creds
        region = self.region    # once: a redirect may move it while we sign
        t = (time.time() + self.clock_offset) if now is None else now
        amzdate = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
        day = amzdate[:8]
        hdrs = [("host", host), ("x-amz-content-sha256", _UNSIGNED), ("x-amz-date", amzdate)]
        if creds.token:
            hdrs.append(("x-amz-security-token", creds.token))
        hdrs += [(k.lower(), " ".join(v.split())) for k, v in extra]
        hdrs.sort()
        canon_headers = "".join(f"{k}:{v}\n" for k, v in hdrs)
        signed = ";".join(k for k, _ in hdrs)
        creq = f"{method}\n{path}\n{query}\n{canon_headers}\n{signed}\n{_UNSIGNED}"
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


class Route:
    """Where the requests for one bucket go and how they are signed, shared by a transport's
    connections.  A region redirect (301 PermanentRedirect, 400 AuthorizationHeaderMalformed
    with the bucket's region) moves it once, for every connection and every later engine;
    connections compare their endpoint with :attr:`ep` and reconnect when it moved."""

    def __init__(self, settings: ClientSettings, bucket: str) -> None:
        region = bucket_region(settings, bucket)
        self.settings, self.bucket = settings, bucket
        self.signer = Signer(settings, region)    # NoCredentialsError when there are none
        self.ep = resolve_endpoint(settings, bucket, region)
        self.ssl_ctx = ssl_context(settings) if self.ep.scheme == "https" else None
        self._lock = threading.Lock()

    @property
    def region(self) -> str:
        return self.signer.region

    def relocate(self, region: str) -> None:
        """The bucket lives in ``region``: sign for it, and send there (on AWS, another host)."""
        with self._lock:
            if region == self.signer.region:
                return          # another connection got there first
            set_region(self.settings, self.bucket, region)
            self.ep = resolve_endpoint(self.settings, self.bucket, region)
            self.signer.region = region


def uri_path(prefix: str, key: str) -> str:
    """The request path for ``key``: every byte but unreserved ones and '/' percent-encoded."""
    return f"{prefix}/{quote(key, safe='/~')}"


def query_string(params: dict[str, str]) -> str:
    """SigV4 canonical query string (also usable as the request's query)."""
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))


_regions: dict = {}
_clock_offsets: dict = {}


def bucket_region(settings: ClientSettings, bucket: str) -> str:
    """The bucket's region: settings/profile/env; on AWS without one, asked of S3 (x-amz-bucket-region).
    A region learnt from a redirect holds for these settings from then on."""
    key = (settings, bucket)
    region = _regions.get(key)
    if region is None:
        cfg = aws_config(settings)
        if cfg.region or cfg.endpoint_url:   # configured: follows the environment, not cached
            return cfg.region or "us-east-1"
        region = _regions[key] = _bucket_region(settings, bucket)
    return region


def _bucket_region(settings: ClientSettings, bucket: str) -> str:
    cfg = aws_config(settings)
    if cfg.region or cfg.endpoint_url:
        return cfg.region or "us-east-1"
    client = settings.client(pool=1)
    try:
        resp = client.head_bucket(Bucket=bucket)
        hdrs = resp["ResponseMetadata"]["HTTPHeaders"]
    except Exception as exc:
        hdrs = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return hdrs.get("x-amz-bucket-region") or client.meta.region_name or "us-east-1"


__all__ = ["AwsConfig", "Endpoint", "Route", "Signer", "aws_config", "bucket_region", "configured_endpoint",
           "credentials_key", "environment_key", "query_string", "resolve_endpoint", "ssl_context",
           "uri_path"]
