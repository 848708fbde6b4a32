"""Connection settings and client factories (boto3, aioboto3).

:class:`ClientSettings` is a small picklable record, so worker processes can
build their own clients.  Everything else comes from botocore's configuration, resolved
once (:func:`manyfiles.s3.config.aws_config`): credentials from the standard AWS chain (env,
``~/.aws``, SSO, credential_process, instance metadata) unless ``no_sign`` is set, the
endpoint (``--endpoint-url``, ``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the profile's
``endpoint_url``), region, CA bundle and addressing style.  A custom endpoint switches to
path-style addressing unless the profile says otherwise, which is what local servers
(MinIO, versitygw, moto) expect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from manyfiles._core.extras import require, require_installed
from manyfiles._core.retry import CONNECT_TIMEOUT, READ_TIMEOUT
from manyfiles.errors import UsageError, shown
from manyfiles.s3 import envconfig
from manyfiles.s3.config import CONFIG, S3_FEATURE, aws_config, botocore_session, configured_endpoint
from manyfiles.s3.retry import answered, endpoint_name

ASYNC_FEATURE = "the async engine (--strategy async)"


def _check_endpoint_url(url: str | None, source: str | None) -> None:
    """UsageError (exit 2) for an endpoint that is not an http:// or https:// URL with a host: a
    typo such as ``--endpoint-url not-a-url`` is refused before anything is listed, not met as a
    failed name lookup.  ``source`` names where it came from (None: the variable that holds it)."""
    if url is None:
        return
    parts = urlsplit(url)
    try:
        port_is_fine = parts.port is None or parts.port >= 0    # raises for one outside 0..65535
    except ValueError:
        port_is_fine = False
    if port_is_fine and parts.scheme.lower() in ("http", "https") and parts.hostname:
        return
    if source is None:
        source = next((v for v in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL") if os.environ.get(v) == url),
                      "the AWS config file")
    raise UsageError(f"endpoint URL {shown(url)} ({source}): expected http:// or https:// and a host name")


@dataclass(frozen=True)
class ClientSettings:
    """Where and how to reach S3: profile, region, endpoint, unsigned requests, addressing style,
    the network timeouts of every request (seconds; ``read_timeout``: the wait for any byte of an
    answer) and TLS verification.  The defaults are in docs/s3pull.md ("Network errors and stalls")."""

    profile: str | None = None
    region: str | None = None
    endpoint_url: str | None = None
    no_sign: bool = False
    path_style: bool | None = None      # None: path-style iff endpoint_url is set
    connect_timeout: float = CONNECT_TIMEOUT    # seconds a connection may take
    read_timeout: float = READ_TIMEOUT          # seconds an answer may keep us waiting for a byte
    verify_tls: bool = True

    def resolved(self) -> ClientSettings:
        """Fill the endpoint botocore would use (env, then the profile's config) when not given.

        Every S3 entry point starts here, so a missing [s3] extra (MissingExtra), an AWS
        profile that is not configured and a timeout that is not a positive number (UsageError)
        are reported before anything is listed or written.
        """
        for name in ("connect_timeout", "read_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UsageError(f"{name} must be a number of seconds > 0, not {value!r}")
        require_installed("s3", "boto3", S3_FEATURE)
        if not envconfig.env_only(self):   # (no profile to check then, and no botocore to import)
            botocore_session(self)  # checks the profile (even where the endpoint is given)
        endpoint = configured_endpoint(self)
        _check_endpoint_url(endpoint, "--endpoint-url" if self.endpoint_url else None)
        return replace(self, endpoint_url=endpoint)

    def _config_kwargs(self, pool: int, checksums: bool = True) -> dict[str, Any]:
        UNSIGNED = require("s3", "botocore", S3_FEATURE).UNSIGNED
        style = aws_config(self).addressing_style
        kw: dict[str, Any] = {
            "max_pool_connections": max(1, pool),
            "connect_timeout": self.connect_timeout,
            "read_timeout": self.read_timeout,
            # We retry ourselves (full jitter, counted, per part); botocore's retries would
            # hide failures from the report and multiply the wait.
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "s3": {"addressing_style": style},
        }
        if not checksums:   # botocore would ask for them (and check them) on every GET by default
            kw["response_checksum_validation"] = "when_required"
        if self.no_sign:
            kw["signature_version"] = UNSIGNED
        return kw

    def boto3_session(self):
        boto3 = require("s3", "boto3", S3_FEATURE)

        return boto3.session.Session(profile_name=self.profile, region_name=self.region)

    def client(self, pool: int = 10, checksums: bool = True):
        """A boto3 S3 client whose connection pool holds ``pool`` connections (``checksums=False``:
        it never asks for flexible checksums on its own)."""
        Config = require("s3", "botocore.config", S3_FEATURE).Config

        session = self.boto3_session()
        config = Config(**self._config_kwargs(pool, checksums))
        client = session.client("s3", endpoint_url=self.endpoint_url, config=config,
                                verify=None if self.verify_tls else False)
        client.meta.events.register("after-call.s3", _answered)
        return client

    def aio_client(self, pool: int = 10, checksums: bool = True):
        """An aioboto3 client context manager (``async with``) with a ``pool``-sized pool."""
        aioboto3 = require("async", "aioboto3", ASYNC_FEATURE)
        AioConfig = require("async", "aiobotocore.config", ASYNC_FEATURE).AioConfig

        session = aioboto3.Session(profile_name=self.profile, region_name=self.region)
        config = AioConfig(**self._config_kwargs(pool, checksums))
        return _Answering(session.client("s3", endpoint_url=self.endpoint_url, config=config,
                                         verify=None if self.verify_tls else False))


def resolve(settings: ClientSettings | None) -> ClientSettings:
    """``settings`` (default: ``ClientSettings()``) :meth:`~ClientSettings.resolved`, remembered
    while the environment stays the same (:data:`manyfiles.s3.config.CONFIG`)."""
    settings = settings or ClientSettings()
    return CONFIG.remember("resolved", settings, settings.resolved)


def _answered(http_response: Any = None, **kwargs: Any) -> None:
    """botocore's ``after-call`` hook: the endpoint answered (see :func:`manyfiles.s3.retry.answered`)."""
    url = getattr(http_response, "url", None)
    if url:
        answered(endpoint_name(url))


class _Answering:
    """An aioboto3 client context manager whose client reports the endpoints that answered."""

    def __init__(self, cm: Any) -> None:
        self._cm = cm

    async def __aenter__(self) -> Any:
        client = await self._cm.__aenter__()
        client.meta.events.register("after-call.s3", _answered)
        return client

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._cm.__aexit__(*exc)
