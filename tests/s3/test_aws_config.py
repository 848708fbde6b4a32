"""The hand-signed transports sign like botocore and use the configuration botocore resolves.

* the signer's Authorization header equals botocore's S3SigV4Auth for the same request and
  date, over a table of awkward keys, queries and headers;
* every engine pulls from a moto server that CHECKS signatures (an IAM user's key; auth turned
  on through moto's /moto-api/reset-auth), and a wrong secret is refused with one line;
* an ``endpoint_url`` in a profile of ``AWS_CONFIG_FILE`` is used by every engine;
* IPv6 endpoints, a skewed clock and a region redirect work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
from s3util import CREDS, blob, files_under, free_port, put_multipart

from manyfiles.errors import CredentialsError
from manyfiles.s3 import ClientSettings, RetryPolicy, pull
from manyfiles.s3.config import signer as signer_for
from manyfiles.s3.routing import STRATEGIES
from manyfiles.s3.sigv4 import query_string, uri_path

FAST = RetryPolicy(attempts=3, base=0.002, cap=0.01)
NOW = 1_790_000_000.0   # a fixed date for both signers

SIGNER_CASES = [
    ("plain/key.txt", {}, []),
    ("with space/and+plus.txt", {}, []),
    ("tilde~and%percent", {}, []),
    ("ünïcödé/ключ/名前.bin", {}, []),
    ("double//slash", {}, []),
    ("dots/./and/../x", {}, []),
    ("q", {"partNumber": "3"}, []),
    ("", {"list-type": "2", "prefix": "a b/", "encoding-type": "url", "continuation-token": "x/y+z=="}, []),
    ("ranged", {}, [("range", "bytes=0-1023"), ("if-match", '"0123456789abcdef0123456789abcdef"')]),
    ("mode", {}, [("x-amz-checksum-mode", "ENABLED")]),
]


@pytest.mark.parametrize("token", [None, "FQoGZXIvYXdzEXAMPLETOKEN+/=="])
@pytest.mark.parametrize("key,params,extra", SIGNER_CASES)
def test_signer_matches_botocore(key, params, extra, token, monkeypatch):
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
    if token:
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    else:
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    from manyfiles.s3 import config

    config.CONFIG.clear()
    signer = signer_for(ClientSettings(), "eu-west-1")
    host = "bucket.s3.eu-west-1.amazonaws.com"
    path = uri_path("", key) if key else "/"
    qs = query_string(params)
    ours = dict(signer.headers(host, path, extra, query=qs, now=NOW))

    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    req = AWSRequest(method="GET", url=f"https://{host}{path}" + (f"?{qs}" if qs else ""),
                     headers={k: v for k, v in ours.items() if k.lower() not in ("authorization",)})
    req.context["timestamp"] = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(NOW))
    auth = S3SigV4Auth(creds, "s3", "eu-west-1")
    canonical = auth.canonical_request(req)
    signature = auth.signature(auth.string_to_sign(req, canonical), req)
    assert ours["Authorization"].endswith(f"Signature={signature}")
    assert ours["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")


# --- a moto server that checks signatures -------------------------------------------------------

@pytest.fixture(scope="module")
def auth_server():
    """moto_server in a subprocess; an IAM user with s3:* is created, then auth is switched on."""
    import boto3

    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1).read()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto_server did not start"
                time.sleep(0.1)
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1", aws_access_key_id="setup",
                           aws_secret_access_key="setup")
        iam.create_user(UserName="puller")
        iam.put_user_policy(UserName="puller", PolicyName="s3", PolicyDocument=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
        key = iam.create_access_key(UserName="puller")["AccessKey"]
        req = urllib.request.Request(f"{url}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(req).read()
        yield url, key["AccessKeyId"], key["SecretAccessKey"]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def auth_bucket(auth_server):
    import boto3

    url, key_id, secret = auth_server
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key_id,
                      aws_secret_access_key=secret)
    name = f"a-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    data = {}
    for key in ("x/plain.txt", "x/with space+plus.txt", "x/ünï/ключ.txt", "x/tilde~%25.bin"):
        data[key] = blob(700 + len(key), key)
        s3.put_object(Bucket=name, Key=key, Body=data[key])
    data["x/big.bin"] = blob(3 << 20, "big")
    s3.put_object(Bucket=name, Key="x/big.bin", Body=data["x/big.bin"])
    data["x/multi.bin"] = put_multipart(s3, name, "x/multi.bin", [blob(5 << 20, "m1"), blob(1000, "m2")])
    return name, data


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_engine_against_a_signature_checking_server(strategy, auth_server, auth_bucket, tmp_path,
                                                           monkeypatch):
    url, key_id, secret = auth_server
    name, data = auth_bucket
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    from manyfiles.s3 import config

    config.CONFIG.clear()
    settings = ClientSettings(endpoint_url=url, region="us-east-1")
    report = pull(f"s3://{name}/x/", str(tmp_path / "o"), strategy=strategy, settings=settings,
                  ranged_min=1 << 20, part_size=1 << 20, retry=FAST, processes=2, concurrency=4)
    assert report.failures == []
    for key, body in data.items():
        assert (tmp_path / "o" / key.removeprefix("x/")).read_bytes() == body


def test_wrong_secret_is_refused_with_one_line(auth_server, auth_bucket, run_cli, tmp_path):
    url, key_id, _ = auth_server
    name, _ = auth_bucket
    env = {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": "not-the-secret", "AWS_ENDPOINT_URL": url,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}
    r = run_cli("s3pull", f"s3://{name}/x/", str(tmp_path / "o"), env=env)
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert "SignatureDoesNotMatch" in err and err.startswith(f"s3pull: s3://{name}/x/: ")
    assert not (tmp_path / "o").exists()


# --- configuration from a profile ------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_profile_endpoint_url_is_used_by_every_engine(strategy, moto_server, bucket, tmp_path, monkeypatch):
    name, put = bucket
    data = {f"p/{i}.bin": put(f"p/{i}.bin", blob(1000 + i, f"p{i}")) for i in range(3)}
    data["p/big.bin"] = put("p/big.bin", blob(3 << 20, "pbig"))
    cfg = tmp_path / "config"
    # an explicit profile skips the environment's keys (botocore's rule), so they are in it too
    cfg.write_text(f"[profile local]\nregion = us-east-1\nendpoint_url = {moto_server}\n"
                   "aws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    from manyfiles.s3 import config

    config.CONFIG.clear()
    report = pull(f"s3://{name}/p/", str(tmp_path / "o"), strategy=strategy,
                  settings=ClientSettings(profile="local"), ranged_min=1 << 20, part_size=1 << 20,
                  retry=FAST, processes=2, concurrency=4)
    assert report.failures == []
    for key, body in data.items():
        assert (tmp_path / "o" / key.removeprefix("p/")).read_bytes() == body


CREDENTIAL_PROCESS = """import datetime, json, sys
with open(sys.argv[1], "a+") as f:
    f.write("x")
    f.seek(0)
    n = len(f.read())
soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=12)
print(json.dumps({"Version": 1, "AccessKeyId": "testing", "SecretAccessKey": "testing",
                  "SessionToken": f"token-{n}", "Expiration": soon.isoformat()}))
"""


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_credential_process_tokens_are_used_and_refreshed_by_every_engine(strategy, bucket, proxy, tmp_path,
                                                                           monkeypatch):
    """Temporary credentials from a profile's credential_process, expiring within botocore's
    refresh window: every engine signs with them (session token included, signatures checked)
    and takes the refreshed ones (the hand-signed engines ask botocore again every REFRESH s)."""
    from manyfiles.s3 import config, sigv4

    name, put = bucket
    data = {f"c/{i}.bin": put(f"c/{i}.bin", blob(900 + i, f"c{i}")) for i in range(4)}
    data["c/big.bin"] = put("c/big.bin", blob(3 << 20, "cbig"))
    (tmp_path / "creds.py").write_text(CREDENTIAL_PROCESS)
    calls = tmp_path / "calls"
    cfg = tmp_path / "config"
    cfg.write_text(f"[profile proc]\nregion = us-east-1\n"
                   f"credential_process = {sys.executable} {tmp_path / 'creds.py'} {calls}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(cfg))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sigv4.Signer, "REFRESH", 0.0)
    tokens: list[str | None] = []
    proxy.faults.append((lambda m, p, h: tokens.append(h.get("x-amz-security-token")) and False, "never"))
    config.CONFIG.clear()
    try:
        report = pull(f"s3://{name}/c/", str(tmp_path / "o"), strategy=strategy,
                      settings=ClientSettings(profile="proc", endpoint_url=proxy.url), ranged_min=1 << 20,
                      part_size=1 << 20, retry=FAST, processes=2, concurrency=4)
    finally:
        config.CONFIG.clear()
    assert report.failures == [] and proxy.refused == []
    assert files_under(tmp_path / "o") == {k[2:]: v for k, v in data.items()}
    assert tokens and all(t and t.startswith("token-") for t in tokens), tokens
    if strategy != "processes":       # the workers of `processes` keep the class default
        assert len(set(tokens)) > 1, tokens


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_keys_changed_or_removed_between_two_pulls_in_one_process(strategy, bucket, proxy, tmp_path,
                                                                   monkeypatch):
    """Credentials are resolved for each pull: after the keys in the environment are replaced (and
    the old key revoked at the edge), the next pull in the same process signs with the new ones;
    after they are removed, the next pull fails with one CredentialsError and signs nothing."""
    name, put = bucket
    data = {f"k/{i}.bin": put(f"k/{i}.bin", blob(700 + i, f"k{i}")) for i in range(3)}
    data["k/big.bin"] = put("k/big.bin", blob(3 << 20, "kbig"))
    old_key = CREDS["AWS_ACCESS_KEY_ID"]
    proxy.secrets = {old_key: CREDS["AWS_SECRET_ACCESS_KEY"], "rotated": "rotated-secret"}
    keys: list[str] = []
    proxy.faults.append((lambda m, p, h: keys.append((h.get("Authorization") or "").split("/")[0]) and False,
                         "never"))
    via = ClientSettings(endpoint_url=proxy.url, region="us-east-1")
    kw = {"strategy": strategy, "settings": via, "ranged_min": 1 << 20, "part_size": 1 << 20, "retry": FAST,
          "processes": 2, "concurrency": 4}
    first = pull(f"s3://{name}/k/", str(tmp_path / "a"), **kw)
    assert first.failures == [] and set(keys) == {f"AWS4-HMAC-SHA256 Credential={old_key}"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rotated")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rotated-secret")
    del proxy.secrets[old_key]           # revoked: a request signed with it is refused
    keys.clear()
    second = pull(f"s3://{name}/k/", str(tmp_path / "b"), **kw)
    assert second.failures == [] and proxy.refused == []
    assert set(keys) == {"AWS4-HMAC-SHA256 Credential=rotated"}
    assert files_under(tmp_path / "b") == {k[2:]: v for k, v in data.items()}
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    keys.clear()
    with pytest.raises(CredentialsError):
        pull(f"s3://{name}/k/", str(tmp_path / "c"), **kw)
    assert keys == [] and proxy.refused == [] and not (tmp_path / "c").exists()


def test_ipv6_endpoint(bucket, tmp_path):
    from moto.server import ThreadedMotoServer

    try:
        server = ThreadedMotoServer(ip_address="::1", port=0, verbose=False)
        server.start()
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    try:
        import boto3

        _, port = server.get_host_and_port()
        url = f"http://[::1]:{port}"
        s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
        s3.create_bucket(Bucket="six")
        s3.put_object(Bucket="six", Key="a/x.bin", Body=b"v6" * 1000)
        s3.put_object(Bucket="six", Key="a/big.bin", Body=blob(3 << 20, "v6"))
        for strategy in ("auto", "http", "sync"):
            dest = tmp_path / strategy
            report = pull("s3://six/a/", str(dest), strategy=strategy,
                          settings=ClientSettings(endpoint_url=url, region="us-east-1"),
                          ranged_min=1 << 20, part_size=1 << 20, retry=FAST)
            assert report.failures == [], strategy
            assert (dest / "x.bin").read_bytes() == b"v6" * 1000
            assert (dest / "big.bin").read_bytes() == blob(3 << 20, "v6")
    finally:
        server.stop()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_suites_server_checks_every_engines_signature(strategy, bucket, moto_server, tmp_path,
                                                          monkeypatch):
    """Every s3 test pulls through an edge that checks signatures: a wrong secret is refused
    by it, for the GETs of every engine (a manifest: no listing first)."""
    from manyfiles.errors import CredentialsError
    from manyfiles.s3 import config

    name, put = bucket
    put("w/x.bin", blob(1000, "x"))
    manifest = tmp_path / "keys"
    manifest.write_text("w/x.bin\t1000\n")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    config.CONFIG.clear()
    try:
        with pytest.raises(CredentialsError, match="SignatureDoesNotMatch") as refused:
            pull(f"s3://{name}/w/", str(tmp_path / "o"), strategy=strategy, manifest=str(manifest),
                 settings=ClientSettings(endpoint_url=moto_server, region="us-east-1"), retry=FAST,
                 processes=2, concurrency=2)
    finally:
        config.CONFIG.clear()
    assert not (tmp_path / "o" / "x.bin").exists()
    assert_chain_pickles(refused.value)


def assert_chain_pickles(error: BaseException) -> None:
    """No error of the chain is its own cause, and the chain pickles with its causes and
    tracebacks the way Dask sends errors (tblib's reducers; they recursed on a self-cause)."""
    import copyreg
    import io
    import pickle
    import types

    from tblib.pickling_support import pickle_exception, pickle_traceback

    chain, e = [], error
    while e is not None:
        assert all(e is not seen for seen in chain), f"a loop in the cause chain: {chain}"
        chain.append(e)
        e = e.__cause__ or e.__context__
    pickler = pickle.Pickler(io.BytesIO())
    pickler.dispatch_table = copyreg.dispatch_table.copy()
    pickler.dispatch_table.update({type(x): pickle_exception for x in chain})
    pickler.dispatch_table[types.TracebackType] = pickle_traceback
    pickler.dump(error)
