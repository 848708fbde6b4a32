"""The small-object sink (issue 26): an object up to ``SMALL_MAX`` is held in memory until it checked
out, then created, written and renamed into place in one call of the C core (``install_small``); the
Python twin of that call does the same steps one at a time where the core is not built."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from s3util import CREDS, FAST_RETRY, blob, files_under

from manyfiles._core import native
from manyfiles.s3 import ClientSettings, pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.sink import SMALL_MAX, FileTarget, FolderSink, SmallTarget, _install_small_py

KiB = 1024
INSTALLS = {"C core": native.dents.install_small if native.dents is not None else None,
            "Python": _install_small_py}


@pytest.fixture(params=list(INSTALLS))
def install_small(request):
    fn = INSTALLS[request.param]
    if fn is None:       # CI builds the core (MANYFILES_REQUIRE_C_EXTENSION=1): never skipped there
        pytest.skip("the C core is not built here")
    return fn


@pytest.fixture
def tmp_dir(tmp_path):
    """A descriptor of an empty temp folder, as s3pull's DEST/.s3pull/tmp is held."""
    (tmp_path / "tmp").mkdir()
    fd = os.open(tmp_path / "tmp", os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_install_small_creates_writes_and_renames_the_exact_bytes(install_small, tmp_dir, tmp_path) -> None:
    data = blob(1000, "one")
    final = tmp_path / "a.bin"
    ino, mtime_ns = install_small(tmp_dir, "x1.tmp", bytearray(data), str(final))
    st = os.stat(final)
    assert final.read_bytes() == data
    assert (ino, mtime_ns) == (st.st_ino, st.st_mtime_ns)
    assert os.listdir(tmp_dir) == []


def test_install_small_onto_a_directory_fails_and_leaves_no_temp(install_small, tmp_dir, tmp_path) -> None:
    (tmp_path / "d" / "inside").mkdir(parents=True)
    with pytest.raises(IsADirectoryError):
        install_small(tmp_dir, "x2.tmp", b"abc", str(tmp_path / "d"))
    assert os.listdir(tmp_dir) == []
    assert os.listdir(tmp_path / "d") == ["inside"]


def test_install_small_never_reuses_a_temp_name(install_small, tmp_dir, tmp_path) -> None:
    """O_EXCL: a name that exists (another writer's temp) is refused, left as it was, and removed by
    no one but its owner."""
    os.close(os.open("x3.tmp", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=tmp_dir))
    os.write(fd := os.open("x3.tmp", os.O_WRONLY, dir_fd=tmp_dir), b"theirs")
    os.close(fd)
    with pytest.raises(FileExistsError):
        install_small(tmp_dir, "x3.tmp", b"mine", str(tmp_path / "f.bin"))
    assert not (tmp_path / "f.bin").exists()
    with open(os.open("x3.tmp", os.O_RDONLY, dir_fd=tmp_dir), "rb") as f:
        assert f.read() == b"theirs"


def test_the_sink_gives_small_objects_of_known_size_the_small_target(tmp_path) -> None:
    sink = FolderSink(str(tmp_path / "dest")).open()
    try:
        small = sink.target("k/a.bin", "k/a.bin", 1 * KiB, "e")
        assert isinstance(small, SmallTarget)
        assert os.listdir(sink.state.tmp_fd) == []          # nothing on disk before the bytes are in
        small.append(b"x" * 1000)
        small.append(b"y" * 24)
        ino, _ = small.commit()
        assert (tmp_path / "dest" / "k" / "a.bin").read_bytes() == b"x" * 1000 + b"y" * 24
        assert os.stat(tmp_path / "dest" / "k" / "a.bin").st_ino == ino
        for size in (SMALL_MAX + 1, None):                  # larger, or of unknown size: a temp file
            target = sink.target("k/b.bin", "k/b.bin", size, "e")
            assert isinstance(target, FileTarget)
            target.abort()
        assert os.listdir(sink.state.tmp_fd) == []
    finally:
        sink.close()


def test_a_small_object_has_no_temp_file_while_its_get_is_held(bucket, proxy, settings, tmp_path) -> None:
    """A real s3pull (auto) whose 1 KiB GETs the server holds: no temp file exists for them (on the
    temp-file path each held object had an empty one); killed -9 there, the same command completes
    with the exact bytes and an empty temp folder."""
    name, put = bucket
    want = {f"{i}.bin": put(f"s/{i}.bin", blob(1 * KiB, f"s{i}")) for i in range(4)}

    def an_object_get(method: str, path: str, headers) -> bool:
        return method == "GET" and "list-type" not in path

    proxy.faults += [(an_object_get, "stall")] * 2
    dest = tmp_path / "dest"
    tmp = dest / STATE_DIR / "tmp"
    s3pull = os.path.join(os.path.dirname(sys.executable), "s3pull")
    env = {**os.environ, **CREDS, "AWS_ENDPOINT_URL": proxy.url}
    proc = subprocess.Popen([s3pull, f"s3://{name}/s/", str(dest), "-j", "8", "-q"], env=env,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while proxy.applied.count("stall") < 2:             # two GETs held by the server
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the GETs never came"
            time.sleep(0.02)
        assert os.listdir(tmp) == []
    finally:
        proc.kill()
        proc.wait()
    report = pull(f"s3://{name}/s/", str(dest), settings=settings, retry=FAST_RETRY)
    assert report.ok, report.failures
    assert files_under(dest) == want
    assert os.listdir(tmp) == []


def test_a_small_object_corrupted_on_every_try_is_never_installed(bucket, proxy, tmp_path) -> None:
    name, put = bucket
    good = put("c/good.bin", blob(1 * KiB, "good"))
    put("c/bad.bin", blob(1 * KiB, "bad"))

    def bad_get(method: str, path: str, headers) -> bool:
        return method == "GET" and path.split("?")[0].endswith("/c/bad.bin")

    proxy.random_faults = (1.0, "flip", bad_get)
    dest = tmp_path / "dest"
    report = pull(f"s3://{name}/c/", str(dest), retry=FAST_RETRY,
                  settings=ClientSettings(endpoint_url=proxy.url, region="us-east-1"))
    assert [f.path for f in report.failures] == ["c/bad.bin"]
    assert report.retries == FAST_RETRY.attempts - 1
    assert files_under(dest) == {"good.bin": good}
    assert os.listdir(dest / STATE_DIR / "tmp") == []
