"""The configuration of S3 access, resolved as a boto3 client would, and the one cache of it.

What to sign and where to send it is decided here, from a :class:`~manyfiles.s3.client.ClientSettings`
and what botocore reads for it (or, for a run configured by environment variables alone, what
:mod:`manyfiles.s3.envconfig` reads without importing botocore): the endpoint
(``--endpoint-url``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's ``services``
section and ``endpoint_url``), the region, the credentials provider (env, profiles, SSO,
credential_process, IMDS; refreshed as they expire), the addressing style, the CA bundle and the
proxies.  :class:`Route` is where one bucket's requests go and who signs them
(:class:`~manyfiles.s3.sigv4.Signer`).

**One cache, one rule.**  Everything resolved here is kept in :data:`CONFIG` (a
:class:`ConfigCache`): botocore sessions, resolved settings, configurations, the regions learnt
for buckets, the server clocks learnt, and the stores built on them (:mod:`manyfiles.s3.store`).
It holds for one environment: when :func:`environment_key` changes (an ``AWS_*`` or proxy
variable, the config or credentials file), all of it is dropped, so keys that were changed or
removed are never used again.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol
from urllib.parse import urlsplit

from manyfiles._core.extras import require
from manyfiles.errors import UsageError, shown
from manyfiles.s3 import envconfig
from manyfiles.s3.sigv4 import ServerClock, Signer

S3_FEATURE = "S3 access"   # what a missing [s3] extra's message names


class Settings(Protocol):
    """What configuration is resolved from: the fields of a :class:`~manyfiles.s3.client.ClientSettings`."""

    profile: str | None
    region: str | None
    endpoint_url: str | None
    no_sign: bool
    path_style: bool | None
    connect_timeout: float
    read_timeout: float
    verify_tls: bool


@dataclass(frozen=True)
class Endpoint:
    """Where one bucket's requests go."""

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


# -- the one cache -----------------------------------------------------------------------------------

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
    """What the configuration is resolved from besides the settings: every ``AWS_*`` variable, the
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


class ConfigCache:
    """Everything resolved from one environment, by kind (``sessions``, ``resolved``, ``configs``,
    ``regions``, ``clocks``, ``stores``), each a dict keyed by the settings (and bucket).

    :meth:`current` is the one invalidation rule: it returns the cache, emptied first when the
    environment (:func:`environment_key`) is not the one its entries were resolved in.  A forked
    child keeps what its parent learnt (a region, the server's clock); the connections of the
    stores it inherits are its parent's, and are forgotten by the stores themselves
    (:class:`manyfiles.s3.transport.Transport`).
    """

    KINDS = ("sessions", "resolved", "configs", "regions", "clocks", "stores")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._env: tuple | None = None
        self.sessions: dict = {}
        self.resolved: dict = {}
        self.configs: dict = {}
        self.regions: dict = {}
        self.clocks: dict = {}
        self.stores: dict = {}

    def current(self) -> ConfigCache:
        """The cache for the environment as it is now (see the class docstring)."""
        env = environment_key()
        if env != self._env:
            with self._lock:
                if env != self._env:
                    self._drop()
                    self._env = env
        return self

    def remember(self, kind: str, key: Any, make: Callable[[], Any]) -> Any:
        """``kind[key]``, made by ``make()`` when missing (in the current environment)."""
        table = getattr(self.current(), kind)
        value = table.get(key)
        if value is None:
            value = make()
            with self._lock:
                table[key] = value
        return value

    def clear(self) -> None:
        """Forget everything (tests; a user who changed what no key sees)."""
        with self._lock:
            self._drop()
            self._env = None

    def _drop(self) -> None:
        # (a store dropped here may still serve a call in flight: it is replaced, not closed)
        for kind in self.KINDS:
            setattr(self, kind, {})


CONFIG = ConfigCache()


# -- botocore's view ------------------------------------------------------------------------------

def botocore_session(settings: Settings):
    """The botocore session for the profile, as the environment and the AWS files are now.

    Shared while they stay the same (a session caches the credentials it found).  A profile that
    is not configured (``--aws-profile NAME``, or ``AWS_PROFILE``) is a UsageError (exit 2) here,
    the one place every S3 entry point passes, not a botocore traceback later."""
    return CONFIG.remember("sessions", settings.profile, lambda: _new_session(settings))


def _new_session(settings: Settings):
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


def configured_endpoint(settings: Settings) -> str | None:
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


def aws_config(settings: Settings) -> AwsConfig:
    """Endpoint, region, addressing style, CA bundle: resolved once per settings and environment."""
    return CONFIG.remember("configs", settings, lambda: _aws_config(settings))


def _aws_config(settings: Settings) -> AwsConfig:
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
    return AwsConfig(endpoint, settings.region or region or "", style, ca, settings.verify_tls)


def credentials_source(settings: Settings):
    """Where the credentials come from now: the environment alone (no botocore import, see
    envconfig), else botocore's chain; None when none is found."""
    if envconfig.env_only(settings):
        return envconfig.credentials()
    from botocore.exceptions import ConfigParseError

    try:
        return botocore_session(settings).get_credentials()
    except ConfigParseError as exc:       # the credentials file
        raise unreadable_aws_file(exc) from exc


def credentials_key(settings: Settings) -> str | None:
    """A digest of the credentials these settings resolve to now (None: unsigned or none found)."""
    if settings.no_sign:
        return None
    source = credentials_source(settings)
    if source is None:
        return None
    creds = source.get_frozen_credentials()
    return hashlib.sha256(f"{creds.access_key}\0{creds.secret_key}\0{creds.token}".encode()).hexdigest()


def signer(settings: Settings, region: str) -> Signer:
    """A :class:`Signer` for ``settings`` in ``region``: their credentials provider (NoCredentialsError
    when there is none) and the server clock learnt for them."""
    if settings.no_sign:
        return Signer(None, region, clock=server_clock(settings))
    source = credentials_source(settings)
    if source is None:
        raise require("s3", "botocore.exceptions", S3_FEATURE).NoCredentialsError()
    return Signer(source, region, clock=server_clock(settings))


def server_clock(settings: Settings) -> ServerClock:
    return CONFIG.remember("clocks", settings, ServerClock)


# -- where a bucket's requests go ------------------------------------------------------------------

def learn_region(settings: Settings, bucket: str, region: str) -> None:
    """Remember that ``bucket`` lives in ``region`` (after a redirect, or asked of S3)."""
    CONFIG.current().regions[(settings, bucket)] = region


def known_region(settings: Settings, bucket: str) -> str | None:
    """The bucket's region: configured (settings, profile, environment), else learnt; None when
    neither (on AWS without a region: the store asks S3)."""
    cfg = aws_config(settings)
    learnt = CONFIG.current().regions.get((settings, bucket))
    if learnt is not None:
        return learnt
    if cfg.region or cfg.endpoint_url:
        return cfg.region or "us-east-1"
    return None


def proxy_for(scheme: str, host: str) -> tuple[str, int] | None:
    """The HTTP proxy of the environment for ``scheme://host`` (None: direct)."""
    if not any(k.lower().endswith("_proxy") for k in os.environ):
        return None     # (the usual case: no urllib.request to import, ~6 ms of start-up)
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    url = proxies.get(scheme)
    if not url or urllib.request.proxy_bypass_environment(host, proxies):
        return None
    u = urlsplit(url if "://" in url else f"http://{url}")
    return (u.hostname or "", u.port or 80)


def resolve_endpoint(settings: Settings, bucket: str, region: str) -> Endpoint:
    """Where requests for ``bucket`` go (custom endpoints path-style unless configured otherwise);
    ``bucket`` "": the service itself (ListBuckets)."""
    cfg = aws_config(settings)
    if cfg.endpoint_url:
        u = urlsplit(cfg.endpoint_url)
        scheme = u.scheme or "http"
        hostname = u.hostname or ""
        port = u.port or (443 if scheme == "https" else 80)
        netloc = u.netloc.rpartition("@")[2]
        base = u.path.rstrip("/")
        if cfg.addressing_style != "virtual" or not bucket:
            ep = Endpoint(scheme, netloc, hostname, port, f"{base}/{bucket}")
        else:
            ep = Endpoint(scheme, f"{bucket}.{netloc}", f"{bucket}.{hostname}", port, base)
    else:
        host = f"s3.{region}.amazonaws.com"
        if not bucket:
            ep = Endpoint("https", host, host, 443, "")
        elif "." in bucket or cfg.addressing_style == "path":
            ep = Endpoint("https", host, host, 443, f"/{bucket}")
        else:
            ep = Endpoint("https", f"{bucket}.{host}", f"{bucket}.{host}", 443, "")
    proxy = proxy_for(ep.scheme, ep.connect_host)
    return replace(ep, proxy=proxy) if proxy else ep


def ssl_context(settings: Settings):
    """TLS context with botocore's CA bundle (AWS_CA_BUNDLE / ca_bundle), or no verification."""
    import ssl

    cfg = aws_config(settings)
    ctx = ssl.create_default_context(cafile=cfg.ca_bundle)
    if not cfg.verify_tls:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class Route:
    """Where the requests for one bucket go and how they are signed, shared by a transport's
    connections.  A region redirect (301 PermanentRedirect, 400 AuthorizationHeaderMalformed
    with the bucket's region) moves it once, for every connection and every later store;
    connections compare their endpoint with :attr:`ep` and reconnect when it moved."""

    def __init__(self, settings: Settings, bucket: str, region: str) -> None:
        self.settings, self.bucket = settings, bucket
        self.signer = signer(settings, region)    # NoCredentialsError when there are none
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
            learn_region(self.settings, self.bucket, region)
            self.ep = resolve_endpoint(self.settings, self.bucket, region)
            self.signer.region = region


__all__ = ["CONFIG", "S3_FEATURE", "AwsConfig", "ConfigCache", "Endpoint", "Route", "ServerClock", "Settings",
           "aws_config", "botocore_session", "configured_endpoint", "credentials_key", "credentials_source",
           "environment_key", "known_region", "learn_region", "proxy_for", "resolve_endpoint", "server_clock",
           "signer", "ssl_context", "unreadable_aws_file"]
