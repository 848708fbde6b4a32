"""What the network between s3pull and S3 may do, for every engine: HTTPS with a private CA,
HTTP(S) proxies, a server clock far from ours, and a bucket in another region.

The servers are real: moto behind a TLS-terminating edge (a CA generated here), a forward proxy
that records what goes through it, an edge with its own clock that refuses skewed signatures,
and an edge that redirects requests signed for the wrong region, as S3 does.
"""

from __future__ import annotations

import os

import pytest
from s3util import FAST_RETRY, SECRETS, FaultProxy, ForwardProxy, blob, files_under, make_ca, put_multipart

from manyfiles.errors import CredentialsError, ManyfilesError
from manyfiles.s3 import ClientSettings, pull
from manyfiles.s3.routing import STRATEGIES

MiB = 1 << 20
# hand-signed: can take the server's clock
LEAN_CLOCK = ("auto", "lean", "loop", "ranged", "http", "processes")


def cfg(**kw):
    return {"ranged_min": MiB, "part_size": MiB // 2, "retry": FAST_RETRY, "concurrency": 4, "processes": 2,
            **kw}


@pytest.fixture(scope="module")
def corpus(s3plain):
    """Small objects, one fetched in ranges by auto, one multipart (its layout comes from a HEAD)."""
    import uuid

    name = f"n-{uuid.uuid4().hex[:12]}"
    s3plain.create_bucket(Bucket=name)
    data = {}
    for key, n in (("n/a.bin", 1000), ("n/sub/b.bin", 7000), ("n/ranged.bin", MiB + MiB // 3)):
        data[key] = blob(n, key)
        s3plain.put_object(Bucket=name, Key=key, Body=data[key])
    data["n/multi.bin"] = put_multipart(s3plain, name, "n/multi.bin", [blob(5 * MiB, "m1"), blob(500, "m2")])
    return name, data


def want(data) -> dict[str, bytes]:
    return {k.removeprefix("n/"): v for k, v in data.items()}


@pytest.fixture
def aws_env(monkeypatch):
    """A clean AWS configuration: botocore's caches cleared, no proxy or CA from the environment."""
    from manyfiles.s3 import config

    for var in ("AWS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY",
                "no_proxy", "ALL_PROXY", "all_proxy", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)

    def clear() -> None:
        config.CONFIG.clear()

    clear()
    yield monkeypatch
    clear()


@pytest.fixture
def edge(proxy):
    """An S3 edge of our own in front of moto (signatures checked), set up by the test: the
    conftest's fault proxy, under the name these tests give it."""
    return proxy


@pytest.fixture(scope="module")
def tls_edge(moto_direct, tmp_path_factory):
    ca, ctx = make_ca(tmp_path_factory.mktemp("ca"))
    edge = FaultProxy(moto_direct, tls=ctx, secrets=SECRETS)
    yield edge, ca
    edge.close()


def manifest_for(tmp_path, data) -> str:
    import hashlib

    path = tmp_path / "keys.tsv"
    lines = []
    for key, body in data.items():
        etag = None if key.endswith("multi.bin") else hashlib.md5(body).hexdigest()
        lines.append(f"{key}\t{len(body)}" + (f"\t{etag}" if etag else ""))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def got_every_object(edge: FaultProxy, data) -> bool:
    paths = {p.split("?")[0] for m, p, _ in edge.requests if m == "GET"}
    return all(any(p.endswith("/" + k) for p in paths) for k in data)


# --- HTTPS with a private CA ------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["AWS_CA_BUNDLE", "profile ca_bundle"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_https_with_a_private_ca(strategy, how, corpus, tls_edge, aws_env, tmp_path):
    name, data = corpus
    edge, ca = tls_edge
    edge.requests.clear()
    if how == "AWS_CA_BUNDLE":
        aws_env.setenv("AWS_CA_BUNDLE", ca)
        settings = ClientSettings(endpoint_url=edge.url, region="us-east-1")
    else:
        config = tmp_path / "config"
        config.write_text(f"[profile tls]\nregion = us-east-1\nca_bundle = {ca}\n"
                          "aws_access_key_id = testing\naws_secret_access_key = testing\n")
        aws_env.setenv("AWS_CONFIG_FILE", str(config))
        settings = ClientSettings(profile="tls", endpoint_url=edge.url)
    report = pull(f"s3://{name}/n/", str(tmp_path / "o"), strategy=strategy, settings=settings, **cfg())
    assert report.failures == []
    assert files_under(tmp_path / "o") == want(data)
    assert got_every_object(edge, data)       # the engine's GETs went over TLS to the edge


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_https_without_the_ca_is_refused_not_retried(strategy, corpus, tls_edge, aws_env, tmp_path):
    name, data = corpus
    edge, _ = tls_edge
    edge.requests.clear()
    edge.handshakes_refused = 0
    settings = ClientSettings(endpoint_url=edge.url, region="us-east-1")
    # a manifest: no listing, so the engine's own connections meet the certificate
    with pytest.raises(ManyfilesError, match="certificate verify failed"):
        pull(f"s3://{name}/n/", str(tmp_path / "o"), strategy=strategy, settings=settings,
             manifest=manifest_for(tmp_path, data), **cfg())
    assert edge.requests == [] and files_under(tmp_path / "o") == {}
    assert 1 <= edge.handshakes_refused <= 2 * cfg()["concurrency"] * 2   # no retry rounds


def test_https_without_the_ca_is_one_line_in_the_cli(corpus, tls_edge, run_cli, cli_env, tmp_path):
    name, _ = corpus
    edge, _ = tls_edge
    env = {**cli_env, "AWS_ENDPOINT_URL": edge.url, "AWS_CA_BUNDLE": ""}
    r = run_cli("s3pull", f"s3://{name}/n/", str(tmp_path / "o"), env=env)
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"s3pull: s3://{name}/n/: TLS: certificate verify failed")
    assert not (tmp_path / "o").exists()


# --- proxies ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_http_proxy_and_https_proxy_carry_every_request(strategy, corpus, moto_server, tls_edge, aws_env,
                                                        tmp_path):
    name, data = corpus
    edge, ca = tls_edge
    fwd = ForwardProxy()
    try:
        aws_env.setenv("HTTP_PROXY", fwd.url)
        aws_env.setenv("HTTPS_PROXY", fwd.url)
        plain = ClientSettings(endpoint_url=moto_server, region="us-east-1")
        report = pull(f"s3://{name}/n/", str(tmp_path / "plain"), strategy=strategy, settings=plain, **cfg())
        assert report.failures == [] and files_under(tmp_path / "plain") == want(data)
        got = {url.split("?")[0] for m, url in fwd.requests if m == "GET"}
        assert all(f"{moto_server}/{name}/{k}" in got for k in data), sorted(got)
        assert any("list-type=2" in url for _, url in fwd.requests)
        # https through the proxy: CONNECT tunnels to the edge, TLS inside them
        aws_env.setenv("AWS_CA_BUNDLE", ca)
        edge.requests.clear()
        tls = ClientSettings(endpoint_url=edge.url, region="us-east-1")
        report = pull(f"s3://{name}/n/", str(tmp_path / "tls"), strategy=strategy, settings=tls, **cfg())
        assert report.failures == [] and files_under(tmp_path / "tls") == want(data)
        assert set(fwd.tunnels) == {edge.url.removeprefix("https://")}
        assert got_every_object(edge, data)
    finally:
        fwd.close()


# --- a server clock far from ours -------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_clock_skew_is_corrected_from_the_servers_date(strategy, corpus, edge, aws_env, tmp_path):
    from manyfiles.s3 import config

    name, data = corpus
    edge.clock_offset = 2 * 3600.0
    settings = ClientSettings(endpoint_url=edge.url, region="us-east-1")
    if strategy not in LEAN_CLOCK:
        # botocore signs with the local clock and cannot be told otherwise: one clear error
        with pytest.raises(CredentialsError, match="RequestTimeTooSkewed"):
            pull(f"s3://{name}/n/", str(tmp_path / "o"), strategy=strategy, settings=settings, **cfg())
        assert files_under(tmp_path / "o") == {}
        return
    report = pull(f"s3://{name}/n/", str(tmp_path / "o"), strategy=strategy, settings=settings, **cfg())
    assert report.failures == [] and files_under(tmp_path / "o") == want(data)
    # the listing's first request learned the server's clock; every engine signed right after
    assert [code for _, _, code in edge.refused] == ["RequestTimeTooSkewed"]
    # without a listing, the engines learn it themselves (HEADs of ranged objects included)
    config.CONFIG.clear()
    report = pull(f"s3://{name}/n/", str(tmp_path / "m"), strategy=strategy, settings=settings,
                  manifest=manifest_for(tmp_path, data), **cfg())
    assert report.failures == [] and files_under(tmp_path / "m") == want(data)


# --- a bucket in another region ---------------------------------------------------------------------

@pytest.mark.parametrize("strategy", STRATEGIES)
def test_region_redirects_are_followed_for_listing_and_gets(strategy, corpus, edge, aws_env, tmp_path):
    from manyfiles.s3 import config

    name, data = corpus
    edge.bucket_region, edge.redirect = "eu-west-1", "301"
    settings = ClientSettings(endpoint_url=edge.url, region="us-east-1")
    report = pull(f"s3://{name}/n/", str(tmp_path / "o"), strategy=strategy, settings=settings, **cfg())
    assert report.failures == [] and files_under(tmp_path / "o") == want(data)
    assert edge.refused and all(code == "PermanentRedirect" for _, _, code in edge.refused)
    # a manifest run never lists: the GETs (and HEADs) meet the redirect themselves
    config.CONFIG.clear()
    edge.redirect = "400"
    edge.refused.clear()
    report = pull(f"s3://{name}/n/", str(tmp_path / "m"), strategy=strategy, settings=settings,
                  manifest=manifest_for(tmp_path, data), **cfg())
    assert report.failures == [] and files_under(tmp_path / "m") == want(data)
    assert edge.refused and all(code == "AuthorizationHeaderMalformed" for _, _, code in edge.refused)
    # an object request met it (not a listing): a GET, or the HEAD auto sends first, whose answer
    # teaches the region to the GETs that follow (in a fresh-clone run no GET was refused after it)
    assert any(m in ("GET", "HEAD") and "list-type" not in p for m, p, _ in edge.refused)


def test_a_redirect_is_followed_once(corpus, edge, aws_env, tmp_path):
    name, _ = corpus
    edge.bucket_region, edge.redirect_always = "eu-west-1", True
    settings = ClientSettings(endpoint_url=edge.url, region="us-east-1")
    with pytest.raises(ManyfilesError, match="PermanentRedirect"):
        pull(f"s3://{name}/n/", str(tmp_path / "o"), settings=settings, **cfg())
    assert len(edge.refused) == 2 and not os.path.exists(tmp_path / "o")
