"""The AWS configuration of a run configured by environment variables alone, without botocore.

Importing botocore costs a small pull most of its client start-up (callgrind: ~1 G instructions,
awscrt included, which botocore.compat imports; a 2000 x 1 KiB download costs ~1.3 G in all).
When nothing but the environment can configure the run, what botocore would resolve is read
straight from the same variables, by botocore's own precedence:

* no profile (``--aws-profile``, ``AWS_PROFILE``, ``AWS_DEFAULT_PROFILE``) and no config file
  (``AWS_CONFIG_FILE``, else ``~/.aws/config``): nothing else can name an endpoint, a region,
  an addressing style or a CA bundle;
* credentials: ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+ ``AWS_SESSION_TOKEN``), the
  first provider of botocore's chain when no profile is named (or an unsigned run); variables
  this module does not handle (``AWS_SECURITY_TOKEN``, ``AWS_CREDENTIAL_EXPIRATION``) send the run
  to botocore;
* endpoint: ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL`` (none if
  ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` is true); region ``AWS_DEFAULT_REGION``; CA bundle
  ``AWS_CA_BUNDLE``; addressing style path for a custom endpoint, else auto.

Anything else (a profile, a config file, SSO, credential_process, instance roles) goes through
botocore as before.  tests/s3/test_aws_config.py compares both on the same environments.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

_HANDLED_ELSEWHERE = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SECURITY_TOKEN", "AWS_CREDENTIAL_EXPIRATION")


class EnvCredentials(NamedTuple):
    """Static credentials, shaped like botocore's frozen credentials (what the signer reads)."""

    access_key: str
    secret_key: str
    token: str | None

    def get_frozen_credentials(self) -> EnvCredentials:
        return self


def env_only(settings: Any) -> bool:
    """True when the environment alone configures S3 for ``settings`` (a
    :class:`~manyfiles.s3.client.ClientSettings`: its ``profile`` and ``no_sign``; see the module
    docstring).  This module imports nothing of manyfiles: the configuration builds on it."""
    env = os.environ
    if settings.profile is not None or any(env.get(k) for k in _HANDLED_ELSEWHERE):
        return False
    if os.path.exists(os.path.expanduser(env.get("AWS_CONFIG_FILE") or "~/.aws/config")):
        return False
    return settings.no_sign or bool(env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"))


def endpoint() -> str | None:
    """The endpoint botocore would take from the environment."""
    env = os.environ
    if (env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS") or "").lower() == "true":
        return None
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None


def region() -> str | None:
    return os.environ.get("AWS_DEFAULT_REGION") or None


def ca_bundle() -> str | None:
    return os.environ.get("AWS_CA_BUNDLE") or None


def credentials() -> EnvCredentials:
    env = os.environ
    return EnvCredentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"],
                          env.get("AWS_SESSION_TOKEN") or None)
