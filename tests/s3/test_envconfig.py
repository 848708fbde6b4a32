"""A run configured by environment variables alone resolves what botocore would, without botocore.

The same environments are resolved both ways (envconfig, and the botocore path that every other
configuration takes) and must agree; a pull configured that way must not import botocore at all
(that import was most of a small pull's start-up), and anything envconfig does not handle (a
profile, a config file, expiring credentials) must still go through botocore.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from s3util import CREDS

from manyfiles.s3 import ClientSettings, config, envconfig

ENVIRONMENTS = {
    "global endpoint": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"},
    "s3 endpoint wins": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ENDPOINT_URL_S3": "http://[::1]:9001/x"},
    "endpoints ignored": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                          "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true", "AWS_DEFAULT_REGION": "eu-west-3"},
    "region, CA bundle, token": {"AWS_DEFAULT_REGION": "ap-south-1", "AWS_CA_BUNDLE": "/etc/ssl/some.pem",
                                 "AWS_SESSION_TOKEN": "tok", "AWS_ENDPOINT_URL": "https://s3.example:8443"},
}


def _clean(monkeypatch, tmp_path, extra: dict) -> None:
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret/example")
    for k, v in extra.items():
        monkeypatch.setenv(k, v)
    config.CONFIG.clear()
    config.CONFIG.clear()


@pytest.mark.parametrize("path_style", [None, True, False])
@pytest.mark.parametrize("env", list(ENVIRONMENTS), ids=list(ENVIRONMENTS))
def test_environment_alone_resolves_what_botocore_resolves(env, path_style, monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path, ENVIRONMENTS[env])
    settings = ClientSettings(path_style=path_style)
    assert envconfig.env_only(settings)
    fast = (config.configured_endpoint(settings), config.aws_config(settings),
            config.signer(settings, "us-east-1")._creds)

    config.CONFIG.clear()
    monkeypatch.setattr(envconfig, "env_only", lambda settings: False)
    slow = (config.configured_endpoint(settings), config.aws_config(settings),
            config.signer(settings, "us-east-1")._creds)
    assert fast[:2] == slow[:2]
    assert (fast[2].access_key, fast[2].secret_key, fast[2].token) == \
        (slow[2].access_key, slow[2].secret_key, slow[2].token)
    config.CONFIG.clear()


@pytest.mark.parametrize("case", ["profile setting", "AWS_PROFILE", "config file", "expiring credentials",
                                  "no credentials"])
def test_anything_else_goes_through_botocore(case, monkeypatch, tmp_path):
    _clean(monkeypatch, tmp_path, {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    settings = ClientSettings()
    if case == "profile setting":
        settings = ClientSettings(profile="other")
    elif case == "AWS_PROFILE":
        monkeypatch.setenv("AWS_PROFILE", "other")
    elif case == "config file":
        (tmp_path / "no-config").write_text("[default]\ns3 =\n  addressing_style = virtual\n")
    elif case == "expiring credentials":
        monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", "2030-01-01T00:00:00Z")
    else:
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    assert not envconfig.env_only(settings)
    if case == "config file":   # and what only the config file says is taken
        assert config.aws_config(settings).addressing_style == "virtual"
        config.CONFIG.clear()
    # an unsigned run needs no credentials; the profile and the config file still rule it out
    assert envconfig.env_only(ClientSettings(no_sign=True)) == (case in ("profile setting", "no credentials"))


def _run_configured_by_the_environment(code: str, endpoint: str, tmp_path) -> str:
    """Run ``code`` in a fresh interpreter configured by AWS_* variables alone; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDS, AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=str(tmp_path / "no-config"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout


def test_a_pull_configured_by_the_environment_never_imports_botocore(moto_server, bucket, tmp_path):
    name, put = bucket
    for i in range(3):
        put(f"e/{i}.bin", os.urandom(1000 + i))
    code = ("import sys\nfrom manyfiles import s3\n"
            f"r = s3.pull('s3://{name}/e/', {str(tmp_path / 'o')!r})\n"
            "assert r.done == 3 and not r.failures, r\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('botocore', 'boto3', 'awscrt')))\n")
    out = _run_configured_by_the_environment(code, moto_server, tmp_path)
    assert out.strip() == "[]"
    assert sorted(p.name for p in (tmp_path / "o").glob("*.bin")) == ["0.bin", "1.bin", "2.bin"]


def test_many_threads_loading_awscrt_at_once_all_get_it_whole(moto_server, s3admin, bucket, tmp_path):
    """In a process configured by the environment nothing loads awscrt at start: the first ranged
    CRC64NVME objects load it (for its combine) from many threads at once, and every one of them
    must wait for the import to complete (a module still being initialised has no functions yet)."""
    name, _ = bucket
    bodies = {f"r/{i}.bin": os.urandom(3 * (1 << 20) + i) for i in range(8)}
    for key, body in bodies.items():
        s3admin.put_object(Bucket=name, Key=key, Body=body, ChecksumAlgorithm="CRC64NVME")
    code = ("import sys\nfrom manyfiles import s3\n"
            "assert 'awscrt' not in sys.modules\n"
            f"r = s3.pull('s3://{name}/r/', {str(tmp_path / 'o')!r}, ranged_min=1 << 20, part_size=1 << 20,"
            " concurrency=64)\n"
            "print(r.done, dict(r.verified), [f.reason for f in r.failures][:3])\n")
    out = _run_configured_by_the_environment(code, moto_server, tmp_path)
    assert out.split("\n")[0] == "8 {'crc64nvme': 8} []"
    for key, body in bodies.items():
        assert (tmp_path / "o" / key.removeprefix("r/")).read_bytes() == body
