"""A large body on plain HTTP lands straight in its temp file (socket -> pipe -> file: ``splice``), and
is checked over the bytes in the file's pages: exact bytes, a flipped byte caught, a full disk one
line; TLS keeps the buffer path."""

from __future__ import annotations

import os
import subprocess

import pytest
from s3util import FAST_RETRY, SECRETS, FaultProxy, blob, files_under, make_ca

from manyfiles.errors import IntegrityError, ManyfilesError
from manyfiles.s3 import ClientSettings, pull
from manyfiles.s3.sink import LANDING_MIN, FileTarget, FolderSink
from manyfiles.s3.store import store_for

MiB = 1 << 20
SIZE = LANDING_MIN + 3 * MiB + 5        # large enough to land; not a multiple of a page or a window


class Watched(FileTarget):
    """A real temp file of a real sink that also counts what landed through its descriptor (a spy:
    every byte still goes to the file)."""

    landed_bytes = 0

    def landed(self, offset: int, n: int) -> None:
        self.landed_bytes += n
        super().landed(offset, n)


def landing(bucket, proxy, dest, seed: str):
    """The object (SIZE bytes, put now), the bucket's store through ``proxy``, and a watched temp file
    for it in a real sink at ``dest``: (data, store, sink, target)."""
    name, put = bucket
    data = put("big.bin", blob(SIZE, seed))
    store = store_for(ClientSettings(endpoint_url=proxy.url, region="us-east-1"), name, retry=FAST_RETRY)
    sink = FolderSink(str(dest)).open()
    sink._ensure_parent(sink.final_path("big.bin"))
    return data, store, sink, Watched(sink, "big.bin", sink.final_path("big.bin"), SIZE, None, None)


def test_a_large_plain_http_body_lands_in_its_file_and_is_checked_there(bucket, proxy, tmp_path):
    data, store, sink, target = landing(bucket, proxy, tmp_path / "o", "land")
    fetched = store.fetch_into("big.bin", target, etag=None, size=SIZE)
    assert fetched.size == SIZE and fetched.claim is not None
    # everything after the bytes that came with the response head landed through the descriptor
    assert SIZE - 1024 * 1024 < target.landed_bytes <= SIZE
    target.commit()
    assert (tmp_path / "o" / "big.bin").read_bytes() == data
    sink.close()


def test_a_tls_body_keeps_the_buffer_path(bucket, moto_direct, monkeypatch, tmp_path):
    from manyfiles.s3 import config

    ca, ctx = make_ca(tmp_path)
    tls = FaultProxy(moto_direct, tls=ctx, secrets=SECRETS)
    monkeypatch.setenv("AWS_CA_BUNDLE", ca)
    config.CONFIG.clear()
    try:
        data, store, sink, target = landing(bucket, tls, tmp_path / "o", "tls")
        store.fetch_into("big.bin", target, etag=None, size=SIZE)
        assert target.landed_bytes == 0, "a TLS socket cannot be spliced: received and written"
        target.commit()
        assert (tmp_path / "o" / "big.bin").read_bytes() == data
        sink.close()
    finally:
        tls.close()
        monkeypatch.delenv("AWS_CA_BUNDLE")
        config.CONFIG.clear()


def test_a_ranged_part_lands_at_its_offset(bucket, proxy, tmp_path):
    data, store, sink, target = landing(bucket, proxy, tmp_path / "o", "range")
    cut = 3 * MiB + 1
    store.fetch_range_into("big.bin", target, cut, SIZE - 1, etag=None, size=SIZE)
    store.fetch_range_into("big.bin", target, 0, cut - 1, etag=None, size=SIZE)
    assert target.landed_bytes > SIZE - cut - MiB
    target.commit()
    assert (tmp_path / "o" / "big.bin").read_bytes() == data
    sink.close()


def test_a_flipped_byte_in_a_landed_body_is_caught_then_fetched_again(bucket, proxy, tmp_path):
    name = bucket[0]
    data, store, sink, target = landing(bucket, proxy, tmp_path / "o", "flip")
    proxy.faults.append((lambda method, path, headers: method == "GET", "flip"))
    with pytest.raises(IntegrityError):
        store.fetch_into("big.bin", target, etag=None, size=SIZE)
    assert proxy.applied == ["flip"] and target.landed_bytes > SIZE - MiB
    target.abort()
    sink.close()
    # the same through a whole pull: the object is fetched again and lands exact
    proxy.faults.append((lambda method, path, headers: method == "GET"
                        and path.split("?")[0].endswith("/big.bin"), "flip"))
    report = pull(f"s3://{name}/", str(tmp_path / "p"), strategy="lean",
                  settings=ClientSettings(endpoint_url=proxy.url, region="us-east-1"), retry=FAST_RETRY)
    assert proxy.applied == ["flip", "flip"] and report.failures == [] and report.retries == 1
    assert files_under(tmp_path / "p") == {"big.bin": data}


def test_a_full_disk_while_a_body_lands_is_the_disk_error(bucket, proxy, small_disk, run_cli, cli_env):
    name = bucket[0]
    data, store, sink, target = landing(bucket, proxy, small_disk / "o", "full")
    with pytest.raises(ManyfilesError, match="No space left on device") as got:
        store.fetch_into("big.bin", target, etag=None, size=SIZE)
    assert not got.value.retryable
    assert 0 < target.landed_bytes < SIZE       # it was landing when the disk filled
    target.abort()
    sink.close()
    # the command: one line, nothing wrong installed, and the re-run completes once there is room
    dest = small_disk / "dest"
    r = run_cli("s3pull", f"s3://{name}/", str(dest), "--strategy", "lean", env=cli_env)
    err = r.stderr.decode()
    assert r.returncode == 1 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "No space left on device" in err and files_under(dest) == {}
    subprocess.run(["mount", "-o", "remount,size=60m", str(small_disk)], check=True)
    r = run_cli("s3pull", f"s3://{name}/", str(dest), "--strategy", "lean", env=cli_env)
    assert r.returncode == 0, r.stderr.decode()
    assert files_under(dest) == {"big.bin": data} and os.listdir(dest / ".s3pull" / "tmp") == []


@pytest.mark.parametrize("fault", ["reset", "truncate"])
def test_a_connection_lost_while_a_body_lands_is_fetched_again(fault, bucket, proxy, tmp_path):
    data, store, sink, target = landing(bucket, proxy, tmp_path / "o", fault)
    proxy.faults.append((lambda method, path, headers: method == "GET", fault))
    with pytest.raises(ManyfilesError) as got:
        store.fetch_into("big.bin", target, etag=None, size=SIZE)
    assert got.value.retryable and 0 < target.landed_bytes < SIZE
    target.abort()
    sink.close()
    proxy.faults.append((lambda method, path, headers: method == "GET"
                         and path.split("?")[0].endswith("/big.bin"), fault))
    report = pull(f"s3://{bucket[0]}/", str(tmp_path / "p"), strategy="lean",
                  settings=ClientSettings(endpoint_url=proxy.url, region="us-east-1"), retry=FAST_RETRY)
    assert proxy.applied == [fault, fault] and report.failures == [] and report.retries == 1
    assert files_under(tmp_path / "p") == {"big.bin": data}
