"""Exit codes and lines of the S3 verbs when the network fails (issue 24), beside test_exit_codes.py's
table: real processes, a real endpoint that accepts and never answers, the fault proxy in front of moto
going down in the middle of a job.

======================================== ==== ===============================================
condition                                exit what the user sees
======================================== ==== ===============================================
an endpoint that never answers           1    a progress line at least every 5 s saying
                                              ``stalled Ns: last error ...``, then one line naming
                                              the endpoint and the cause; no ``[done]``, no summary
an outage shorter than --stall-timeout   0    the exact bytes
nothing moves for --stall-timeout        1    one line naming the endpoint and the cause; a rerun
                                              completes
a timeout that is not a number > 0       2    one line
======================================== ==== ===============================================

The timeouts are small here (seconds); the defaults' arithmetic (a silent endpoint is given up on within
90 s, an outage of a minute is ridden out) is tests/core/test_retry_budget.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s3util import CREDS, Bucket, SilentServer, blob, files_under, nth_get

from terminal import stderr_on_a_terminal

BIN = Path(sys.executable).parent
CLASS_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)*(?:Error|Exception)\b|gaierror|Traceback")
# an endpoint that never answers: each try waits 3 s; the first-contact budget (half the stall
# timeout, 6 s) is spent by the second; a plain progress line comes at 5 s
SILENT = ["--read-timeout", "3", "--stall-timeout", "12"]


def env_for(endpoint: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MANYFILES_"))}
    env.update(CREDS, AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"), AWS_ENDPOINT_URL=endpoint,
               MANYFILES_RETRY_BASE="0.01")
    return env


def run(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, env=env, timeout=120)


@pytest.fixture
def silent():
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def store(moto_direct):
    b = Bucket(moto_direct, prefix="netcli")
    yield b
    b.close()


VERBS = {"s3pull": ("s3pull", "--progress", *SILENT, "s3://bucket/p/", "{dest}"),
         "cache warm": ("manyfiles", "cache", "warm", "--progress", *SILENT, "--dir", "{dest}", "s3://bucket/p/")}


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_an_endpoint_that_never_answers_is_one_line_after_progress_lines(verb, silent, tmp_path):
    """The issue's 368 s of nothing, then ``0 objects ... [done]`` (s3pull) or a raw ReadTimeoutError
    (cache warm): now a progress line says what is awaited, and one line ends it, exit 1."""
    dest = tmp_path / "dest"
    argv = [a.replace("{dest}", str(dest)) for a in VERBS[verb]]
    r = run(*argv, env=env_for(silent.url, tmp_path))
    lines = r.stderr.decode().splitlines()
    prog = argv[0]
    assert r.returncode == 1, lines
    assert lines[-1] == f"{prog}: s3://bucket/p/: {silent.url}: timed out (no answer in 3 s)", lines
    progress = lines[:-1]
    assert progress and all("stalled" in line and "last error:" in line for line in progress), lines
    assert not any("[done]" in line for line in lines) and not CLASS_NAME.search(r.stderr.decode())
    assert r.stdout == b""          # no summary that looks like success
    if verb == "s3pull":
        assert not dest.exists()


def test_the_live_bar_says_stalled_too(silent, tmp_path):
    drawn = stderr_on_a_terminal([str(BIN / "s3pull"), "--read-timeout", "1", "--stall-timeout", "4",
                                  "s3://bucket/p/", str(tmp_path / "dest")],
                                 env=env_for(silent.url, tmp_path), exit_code=1).decode(errors="replace")
    assert re.search(r"stalled \ds: last error: " + re.escape(f"{silent.url}: timed out (no answer in 1 s)"),
                     drawn), drawn
    assert f"s3pull: s3://bucket/p/: {silent.url}: timed out (no answer in 1 s)" in drawn
    assert "Traceback" not in drawn


def seed(store: Bucket) -> dict[str, bytes]:
    return {f"{i:03d}": store.put(f"p/{i:03d}", blob(2000 + 11 * i, f"c{i}")) for i in range(24)}


@pytest.mark.parametrize("verb", ["s3pull", "cache warm"])
def test_an_outage_shorter_than_the_stall_timeout_exits_0_with_the_exact_bytes(verb, store, tmp_path):
    objs = seed(store)
    store.proxy.faults.append((nth_get(8), "refuse-for:2"))
    timeouts = ["--read-timeout", "1", "--connect-timeout", "1", "--stall-timeout", "30"]
    if verb == "s3pull":
        r = run("s3pull", "-j", "4", *timeouts, store.url("p/"), str(tmp_path / "d"),
                env=env_for(store.endpoint, tmp_path))
        assert r.returncode == 0, r.stderr
        assert files_under(tmp_path / "d") == objs
    else:
        cache = str(tmp_path / "cache")
        r = run("manyfiles", "cache", "warm", "-j", "4", *timeouts, "--dir", cache, "--min-free", "0",
                store.url("p/"), env=env_for(store.endpoint, tmp_path))     # (what it fills stays)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().startswith(f"{len(objs)} objects: {len(objs)} fetched")
        from manyfiles.cache import Cache

        store.proxy.faults.clear()
        with Cache(cache, min_free=0, settings=store.settings) as c:
            gets = len(store.gets())
            assert {k: c.get_bytes(store.url(f"p/{k}")) for k in objs} == objs
            assert len(store.gets()) == gets, "not all of it was in the cache"
    assert store.proxy.outage_hits >= 1, "the outage was not met"


def test_nothing_moving_for_the_stall_timeout_is_one_line_and_a_rerun_completes(store, tmp_path):
    objs = seed(store)
    store.proxy.faults.append((nth_get(8), "hang-for:600"))
    argv = ["s3pull", "-j", "4", "--read-timeout", "1", "--stall-timeout", "3", store.url("p/"),
            str(tmp_path / "d")]
    r = run(*argv, env=env_for(store.endpoint, tmp_path))
    assert r.returncode == 1
    assert r.stderr.decode().splitlines() == [f"s3pull: {store.endpoint}: stalled, nothing moved for 3 s "
                                              "(last error: timed out (no answer in 1 s))"]
    store.proxy.come_back()
    r = run(*argv, env=env_for(store.endpoint, tmp_path))
    assert r.returncode == 0, r.stderr
    assert files_under(tmp_path / "d") == objs


@pytest.mark.parametrize(("option", "value"), [("--connect-timeout", "0"), ("--read-timeout", "-1"),
                                               ("--stall-timeout", "soon")])
def test_a_timeout_that_is_not_a_positive_number_is_a_usage_error(option, value, tmp_path):
    for argv in (["s3pull", option, value, "s3://bucket/p/", str(tmp_path / "d")],
                 ["manyfiles", "cache", "warm", "--dir", str(tmp_path / "c"), option, value, "s3://bucket/p/"]):
        r = run(*argv, env=env_for("http://127.0.0.1:9", tmp_path))
        lines = r.stderr.decode().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and option in lines[0], lines
        assert list(tmp_path.iterdir()) == []
