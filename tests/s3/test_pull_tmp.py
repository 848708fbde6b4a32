"""A pull that ends with exit 0 leaves ``DEST/.s3pull/tmp`` empty (the cluster form is checked in
test_pull_cluster.py, after a worker killed mid-slice)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from s3util import CREDS, blob, files_under

from manyfiles.s3 import pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.sink import SMALL_MAX

KiB = 1024


def test_a_run_ending_0_leaves_no_resumable_parts_it_did_not_need(bucket, proxy, settings, s3admin,
                                                                   tmp_path) -> None:
    """A run killed mid large object keeps its parts for resuming; the object is then deleted,
    and the rerun (exit 0, it never needs them) removes them."""
    name, put = bucket
    want = {f"{i}.bin": put(f"s/{i}.bin", blob(2000 + i, f"s{i}")) for i in range(5)}
    put("s/big.bin", blob(1024 * KiB, "big"))                  # 16 parts of 64 KiB
    proxy.delay = 0.3
    dest = tmp_path / "dest"
    code = ("from manyfiles.s3 import ClientSettings, pull\n"
            f"pull({f's3://{name}/s/'!r}, {str(dest)!r}, concurrency=2, part_size={64 * KiB},\n"
            f"     ranged_min={128 * KiB},\n"
            f"     settings=ClientSettings(endpoint_url={proxy.url!r}, region='us-east-1'))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, **CREDS}, stderr=subprocess.PIPE)
    tmp = dest / STATE_DIR / "tmp"

    def a_part_is_done() -> bool:        # the .parts record: the identity, then finished part numbers
        for n in os.listdir(tmp):
            with contextlib.suppress(FileNotFoundError):      # the object just completed
                if n.endswith(".parts") and len((tmp / n).read_text().splitlines()) >= 2:
                    return True
        return False

    deadline = time.monotonic() + 120
    try:
        while not (tmp.is_dir() and a_part_is_done()):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "no part finished"
            time.sleep(0.02)
    finally:
        proc.kill()
    proc.wait()
    assert any(n.endswith(".part") for n in os.listdir(tmp))          # kept for a resume

    s3admin.delete_object(Bucket=name, Key="s/big.bin")
    report = pull(f"s3://{name}/s/", str(dest), settings=settings)
    assert report.ok, report.failures
    assert files_under(dest) == want
    assert os.listdir(tmp) == []


def _ctrl_c_reaches_child() -> None:
    # a shell running CI in the background starts its children with SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_leaves_no_temp_of_an_object_it_did_not_finish(bucket, proxy, tmp_path) -> None:
    """A real SIGINT to a real s3pull while its worker processes are in the middle of objects (their
    GETs held by the server): the temp files of those objects went on lying, empty, in
    DEST/.s3pull/tmp (issue 26).  Now the interrupted run removes them: exit 130, one line."""
    name, put = bucket
    held = 6
    for i in range(held):       # above SMALL_MAX: a small object has no temp file before its bytes are in
        put(f"s/{i}.bin", blob(SMALL_MAX + 2000 + i, f"s{i}"))
    def an_object_get(method: str, path: str, headers) -> bool:
        return method == "GET" and "list-type" not in path

    proxy.faults += [(an_object_get, "stall")] * held
    dest = tmp_path / "dest"
    tmp = dest / STATE_DIR / "tmp"
    s3pull = str(Path(sys.executable).parent / "s3pull")
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": proxy.url}
    proc = subprocess.Popen([s3pull, f"s3://{name}/s/", str(dest), "--strategy", "processes"], env=env,
                            stderr=subprocess.PIPE, preexec_fn=_ctrl_c_reaches_child)
    deadline = time.monotonic() + 120
    try:
        while proxy.applied.count("stall") < held:          # every object's GET is held
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the GETs never came"
            time.sleep(0.02)
        # each object's temp was made before its GET went out
        assert len([n for n in os.listdir(tmp) if n.endswith(".tmp")]) == held
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, err) == (130, b"s3pull: interrupted\n")
    assert os.listdir(tmp) == []
