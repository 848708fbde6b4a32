"""The s3pull command as a real subprocess: exit codes, output modes, kill -9 and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from s3util import CREDS, blob, files_under

from manyfiles.s3.keys import STATE_DIR

S3PULL = str(Path(sys.executable).parent / "s3pull")


def test_pull_summary_and_rerun(run_cli, bucket, cli_env, tmp_path):
    name, put = bucket
    data = {f"k/{i}.txt": put(f"k/{i}.txt", blob(500 + i, str(i))) for i in range(8)}
    dest = tmp_path / "out"
    r = run_cli("s3pull", f"s3://{name}/k/", str(dest), env=cli_env)
    assert r.returncode == 0, r.stderr
    assert b"8 downloaded" in r.stderr and b"engines: loop 8" in r.stderr
    assert b"verified: crc32 8" in r.stderr      # botocore's uploads carry a CRC32
    assert files_under(dest) == {k[2:]: v for k, v in data.items()}
    r = run_cli("s3pull", f"s3://{name}/k/", str(dest), env=cli_env)
    assert r.returncode == 0 and b"0 downloaded" in r.stderr and b"8 skipped" in r.stderr
    # without content checks, the summary and --json say how many objects only had their size checked
    r = run_cli("s3pull", f"s3://{name}/k/", str(tmp_path / "nv"), "--no-verify", env=cli_env)
    assert r.returncode == 0 and b"verified: size-only 8" in r.stderr, r.stderr
    r = run_cli("s3pull", f"s3://{name}/k/", str(tmp_path / "nvj"), "--no-verify", "--json", env=cli_env)
    summary = json.loads(r.stdout.decode().splitlines()[-1])
    assert r.returncode == 0 and summary["verified"] == {"size-only": 8}


def test_json_events_and_failures_exit_1(run_cli, bucket, cli_env, tmp_path):
    name, put = bucket
    put("j/ok.txt", b"fine")
    put("j/../../etc/passwd", b"evil")
    dest = tmp_path / "out"
    r = run_cli("s3pull", f"s3://{name}/j/", str(dest), "--json", env=cli_env)
    assert r.returncode == 1
    events = [json.loads(line) for line in r.stdout.decode().splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "summary" and "done" in kinds and "failed" in kinds
    summary = events[-1]
    assert summary["done"] == 1 and summary["failed"] == 1
    assert summary["engines"] == {"loop": {"objects": 1, "bytes": 4}}
    failed = next(e for e in events if e["event"] == "failed")
    assert failed["key"] == "j/../../etc/passwd" and "unsafe key" in failed["reason"]
    assert (dest / STATE_DIR / "failures.tsv").read_text().startswith("j/../../etc/passwd\t")
    assert files_under(dest) == {"ok.txt": b"fine"}


def test_dry_run_prints_the_plan_and_writes_nothing(run_cli, bucket, cli_env, tmp_path):
    name, put = bucket
    put("d/small.txt", b"s" * 10)
    put("d/mid.bin", blob(2 << 20, "mid"))
    dest = tmp_path / "out"
    r = run_cli("s3pull", f"s3://{name}/d/", str(dest), "--dry-run", env=cli_env)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.decode().splitlines())
    assert lines == [f"lean\t{2 << 20}\td/mid.bin", "loop\t10\td/small.txt"]
    assert b"would fetch" in r.stderr
    assert not dest.exists()


def test_clear_one_line_errors(run_cli, bucket, cli_env, tmp_path):
    r = run_cli("s3pull", "s3://no-such-bucket-here/", str(tmp_path / "o"), env=cli_env)
    assert r.returncode == 1
    assert r.stderr.decode().strip() == "s3pull: s3://no-such-bucket-here/: no such bucket"
    assert not (tmp_path / "o").exists()
    r = run_cli("s3pull", "/not/s3", str(tmp_path / "o"), env=cli_env)
    assert r.returncode == 2 and r.stderr.decode().strip() == "s3pull: /not/s3: not an s3:// URL"
    name, put = bucket
    put("x", b"x")
    afile = tmp_path / "file"
    afile.write_text("")
    r = run_cli("s3pull", f"s3://{name}/", str(afile), env=cli_env)
    assert r.returncode != 0 and str(afile).encode() in r.stderr
    r = run_cli("s3pull", f"s3://{name}/", str(tmp_path / "o2"), "--manifest", str(tmp_path / "nope"),
                env=cli_env)
    assert r.returncode == 2 and b"does not exist" in r.stderr   # a missing --files-from list: usage error


def test_missing_credentials_is_one_line(run_cli, bucket, cli_env, tmp_path):
    name, _ = bucket
    env = {**cli_env, "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "HOME": str(tmp_path),
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    r = run_cli("s3pull", f"s3://{name}/x", str(tmp_path / "o"), env=env)
    assert r.returncode == 1
    assert r.stderr.decode() == f"s3pull: s3://{name}/x: Unable to locate credentials\n"
    assert not (tmp_path / "o").exists()


def test_wrong_credentials_fail_without_retries(run_cli, proxy, bucket, cli_env, tmp_path):
    name, put = bucket
    put("x/y", b"y")
    proxy.faults.append((lambda m, p, h: "list-type" in p, "403-always"))
    env = {**cli_env, "AWS_ENDPOINT_URL": proxy.url}
    r = run_cli("s3pull", f"s3://{name}/x/", str(tmp_path / "o"), env=env)
    assert r.returncode == 1 and b"AccessDenied" in r.stderr and r.stderr.count(b"\n") == 1, r.stderr
    assert proxy.applied == ["403-always"]   # one listing request, no retries
    assert not (tmp_path / "o").exists()


def _ctrl_c_reaches_child() -> None:
    # A shell running CI in the background starts its children with SIGINT ignored, and
    # Python keeps an ignored SIGINT ignored; a terminal's Ctrl-C finds the default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(proxy_url, name, dest, *extra):
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": proxy_url, "MANYFILES_RETRY_BASE": "0.01"}
    return subprocess.Popen([S3PULL, f"s3://{name}/s/", str(dest), "-j", "2", *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_ctrl_c_reaches_child)


def _wait_for_files(dest: Path, n: int, proc) -> None:
    deadline = time.monotonic() + 60
    while len(files_under(dest)) < n if dest.exists() else True:
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _slow_pull_under_way(proxy, bucket, dest: Path, seed: str, files: int):
    """30 objects behind a slow proxy; returns (data, the s3pull process) once ``files`` are in."""
    name, put = bucket
    data = {f"{i:02d}.bin": put(f"s/{i:02d}.bin", blob(30_000 + i, f"{seed}{i}")) for i in range(30)}
    proxy.delay = 0.2  # >= 2.7 s for the rest: the signal lands mid-run even on a loaded machine
    proc = _start(proxy.url, name, dest)
    _wait_for_files(dest, files, proc)
    return data, proc


def test_kill_9_then_rerun_completes(proxy, bucket, tmp_path):
    name, _ = bucket
    dest = tmp_path / "out"
    data, proc = _slow_pull_under_way(proxy, bucket, dest, "k", 4)
    proc.kill()
    proc.wait()
    got = files_under(dest)
    assert 4 <= len(got) < 30
    assert all(data[k] == v for k, v in got.items())      # no partial file under a final name
    proxy.delay = 0.0
    proc = _start(proxy.url, name, dest, "--json")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    summary = json.loads(out.decode().splitlines()[-1])
    assert summary["done"] + summary["skipped"] == 30
    assert files_under(dest) == data
    assert [f for f in os.listdir(dest / STATE_DIR / "tmp")] == []


def test_ctrl_c_exits_130_without_partial_files(proxy, bucket, tmp_path):
    dest = tmp_path / "out"
    data, proc = _slow_pull_under_way(proxy, bucket, dest, "c", 3)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.decode().strip().endswith("s3pull: interrupted")
    got = files_under(dest)
    assert len(got) < 30 and all(data[k] == v for k, v in got.items())
    assert [f for f in os.listdir(dest / STATE_DIR / "tmp") if f.endswith(".tmp")] == []
