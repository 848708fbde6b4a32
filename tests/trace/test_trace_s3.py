"""`s3pull --trace/--profile` against a real S3 endpoint over HTTP (moto server mode)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from manyfiles import trace

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}
N = 24


@pytest.fixture(scope="module")
def endpoint():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def bucket(endpoint) -> str:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    name = f"trace-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=name)
    for i in range(N):
        s3.put_object(Bucket=name, Key=f"p/obj{i:03d}", Body=os.urandom(100 + i))
    return name


def env(endpoint: str) -> dict:
    return {**CREDS, "AWS_ENDPOINT_URL": endpoint, "MANYFILES_RETRY_BASE": "0.01"}


@pytest.mark.parametrize("strategy", ["async", "threads", "processes"])
def test_s3pull_trace_has_one_get_per_object(tmp_path: Path, run_cli, endpoint, bucket, strategy) -> None:
    t = tmp_path / "pull.mft"
    args = ["--trace", str(t), "--strategy", strategy, "-q", f"s3://{bucket}/p/", str(tmp_path / "dest")]
    if strategy == "processes":
        args[:0] = ["--processes", "2"]
    proc = run_cli("s3pull", *args, env=env(endpoint))
    assert proc.returncode == 0, proc.stderr
    assert len(os.listdir(tmp_path / "dest" / "p")) == N if (tmp_path / "dest" / "p").is_dir() else True
    ts = trace.load([t])
    s = {o.op: o for o in trace.summarize(ts).ops}
    gets = [r for r in ts.records() if r.op in ("s3.get", "s3.get_range")]
    assert len({r.path for r in gets}) == N
    assert {r.path.decode() for r in gets} == {f"{bucket}/p/obj{i:03d}" for i in range(N)}
    assert sum(r.length for r in gets if not trace.summary.is_error(r.op, r.result)) == sum(100 + i
                                                                                           for i in range(N))
    assert s["s3.list"].count >= 1 and s["s3.list"].errors == 0
    pids = {r.pid for r in gets}
    if strategy == "processes":
        assert len(trace.worker_files(t)) == 2
        workers = {int(f.header["pid"]) for f in ts.files if f.header["role"] == "worker"}
        assert len(pids) >= 1 and pids <= workers
    else:
        assert trace.worker_files(t) == []
