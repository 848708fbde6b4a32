"""The fsspec filesystem "manyfiles": every entry point byte-exact, pyarrow and pandas through it,
listings that validate, read only, and a flipping link that never yields wrong bytes."""

from __future__ import annotations

import io
import os
import pickle

import pytest

fsspec = pytest.importorskip("fsspec")       # the [fsspec] extra (in [dev])


def _fs(s3, cache, **kw):
    return fsspec.filesystem("manyfiles", cache=cache, endpoint_url=s3.endpoint, region="us-east-1",
                             skip_instance_cache=True, **kw)


def test_every_entry_point_reads_the_exact_bytes(s3, cache_dir, tmp_path):
    objs = {f"d/sub{i % 2}/f{i}.bin": s3.put(f"d/sub{i % 2}/f{i}.bin", os.urandom(1000 + 77 * i))
            for i in range(6)}
    fs = _fs(s3, cache_dir)
    b = s3.bucket
    # names come back as s3fs gives them: bucket/key
    assert sorted(e["name"] for e in fs.ls(f"s3://{b}/d", detail=True)) == [f"{b}/d/sub0", f"{b}/d/sub1"]
    sub0 = [f"{b}/d/{k[2:]}" for k in sorted(objs) if "sub0" in k]
    assert fs.ls(f"s3://{b}/d/sub0", detail=False) == sub0
    assert fs.find(f"s3://{b}/d") == [f"{b}/{k}" for k in sorted(objs)]
    assert fs.glob(f"s3://{b}/d/*/f1.bin") == [f"{b}/d/sub1/f1.bin"]
    assert fs.isdir(f"s3://{b}/d/sub1") and fs.isfile(f"s3://{b}/d/sub1/f1.bin")
    assert not fs.exists(f"s3://{b}/d/nope.bin")
    for key, data in objs.items():
        url = f"s3://{b}/{key}"
        assert fs.info(url)["size"] == len(data)
        assert fs.cat_file(url) == data
        assert fs.cat_file(url, 10, 50) == data[10:50] and fs.cat_file(url, -20) == data[-20:]
        with fs.open(url) as f:
            f.seek(333)
            assert f.read(100) == data[333:433] and f.path == f"{b}/{key}" and f.fs is fs
            f.seek(0)
            assert f.read() == data
    urls = [f"s3://{b}/{k}" for k in objs]
    got = fs.cat_ranges(urls + urls, [0] * 6 + [5] * 6, [10] * 6 + [-5] * 6)
    assert got == [d[:10] for d in objs.values()] + [d[5:-5] for d in objs.values()]
    # the URL form and the chained form (fsspec resolves the s3 link's class too: s3fs is in [dev])
    key, data = next(iter(objs.items()))
    opts = {"cache": cache_dir, "endpoint_url": s3.endpoint, "region": "us-east-1"}
    with fsspec.open(f"manyfiles://s3://{b}/{key}", **opts) as f:
        assert f.read() == data
    with fsspec.open(f"manyfiles::s3://{b}/{key}", manyfiles=opts) as f:
        assert f.read() == data
    # local files through the same filesystem
    p = tmp_path / "local.bin"
    p.write_bytes(os.urandom(4096))
    assert fs.cat_file(str(p)) == p.read_bytes() and fs.cat_file(str(p), 100, 200) == p.read_bytes()[100:200]
    assert [e["name"] for e in fs.ls(str(tmp_path), detail=True) if e["name"].endswith(".bin")] == [str(p)]
    # pickled (as Dask and DataLoader do), it reads the same
    assert pickle.loads(pickle.dumps(fs)).cat_file(f"s3://{b}/{key}") == data


def test_a_listing_validates_so_opens_send_no_head_and_rereads_nothing(s3, cache):
    objs = {f"p/{i}.bin": s3.put(f"p/{i}.bin", os.urandom(2000 + i)) for i in range(10)}
    fs = _fs(s3, cache)
    names = fs.find(f"s3://{s3.bucket}/p/")
    for n in names:
        with fs.open(n) as f:
            assert f.read() == objs[n.split("/", 1)[1]]
    assert s3.heads() == [] and len(s3.gets()) == len(objs)
    fs.cache.flush()
    fs2 = _fs(s3, cache)
    fs2.find(f"s3://{s3.bucket}/p/")
    assert [fs2.cat_file(n) for n in names] == [objs[n.split("/", 1)[1]] for n in names]
    assert s3.heads() == [] and len(s3.gets()) == len(objs), "a reread after a listing sent requests"
    # a changed object: a new listing has its new ETag, so it is fetched again
    s3.put("p/0.bin", b"changed")
    fs2.invalidate_cache()
    fs2.find(f"s3://{s3.bucket}/p/")
    assert fs2.cat_file(f"s3://{s3.bucket}/p/0.bin") == b"changed"


def test_parquet_through_pyarrow_and_pandas(s3, cache):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pd = pytest.importorskip("pandas")
    table = pa.table({"id": list(range(5000)), "name": [f"row-{i}" for i in range(5000)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1000)
    s3.put("t/part-0.parquet", buf.getvalue())
    csv = s3.put("c/small.csv", b"a,b\n1,2\n3,4\n")
    fs = _fs(s3, cache)
    url = f"s3://{s3.bucket}/t/part-0.parquet"
    assert pq.read_table(url, filesystem=fs).equals(table)
    assert pq.read_table(f"{s3.bucket}/t/", filesystem=fs).select(["id", "name"]).equals(table)
    fs.cache.flush()
    gets = len(s3.gets())
    opts = {"cache": cache, "endpoint_url": s3.endpoint, "region": "us-east-1"}
    df = pd.read_parquet(f"manyfiles://{url}", storage_options=opts)
    assert df["id"].tolist() == list(range(5000))
    assert len(s3.gets()) == gets, "the reread of the Parquet file went to S3"
    assert pd.read_csv(f"manyfiles://s3://{s3.bucket}/c/small.csv", storage_options=opts).to_csv(
        index=False).encode() == csv


def test_writing_is_refused_in_one_line(s3, cache_dir):
    fs = _fs(s3, cache_dir)
    x = f"s3://{s3.bucket}/x"
    for call in (lambda: fs.open(x, "wb"), lambda: fs.pipe_file(x, b"1"), lambda: fs.rm(x),
                 lambda: fs.mkdir(f"s3://{s3.bucket}/d")):
        with pytest.raises(PermissionError) as info:
            call()
        assert "read-only" in str(info.value) and "\n" not in str(info.value)
    assert [r for r in s3.proxy.requests if r[0] in ("PUT", "DELETE", "POST")] == []


def test_without_options_the_cache_is_the_one_of_the_environment(s3, roomy_dir, monkeypatch):
    """Libraries that pass no options (datasets' ``manyfiles::`` forms) still read through the cache:
    the directory of $MANYFILES_CACHE_DIR, as the CLI's."""
    monkeypatch.setenv("MANYFILES_CACHE_DIR", str(roomy_dir / "envcache"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    data = s3.put("e.bin", os.urandom(3000))
    fs = fsspec.filesystem("manyfiles", skip_instance_cache=True)
    assert fs.cache.dir == str(roomy_dir / "envcache")
    assert fs.cat_file(f"{s3.bucket}/e.bin") == data
    fs.cache.flush()
    assert fs.cache.stats().entries == 1


def test_a_flipping_link_never_reaches_pyarrow_or_cat(s3, cache_dir):
    objs = {f"f/{i}.bin": s3.put(f"f/{i}.bin", os.urandom(3000 + i)) for i in range(20)}
    s3.proxy.random_faults = (0.5, ("flip", "wrong-range"),
                              lambda m, p, h: m == "GET" and "list-type" not in p)
    fs = _fs(s3, cache_dir)
    served = 0
    for key, data in objs.items():
        try:
            got = fs.cat_file(f"s3://{s3.bucket}/{key}")
        except OSError as exc:          # every retry hit a fault: an error, never wrong bytes
            assert "does not match" in str(exc) or "checksum" in str(exc) or "MD5" in str(exc), exc
            continue
        assert got == data
        served += 1
    assert served and s3.proxy.applied
    fs.cache.flush()
    s3.proxy.random_faults = None
    clean = _fs(s3, cache_dir)
    assert all(clean.cat_file(f"s3://{s3.bucket}/{k}") == d for k, d in objs.items()), "wrong bytes kept"


def test_an_endpoint_that_cannot_be_reached_is_a_connection_error_naming_the_url(tmp_path, monkeypatch):
    """The fsspec boundary's family for network failures (``offline=False``: no fallback): a refused
    connection is a ConnectionError, an endpoint that never answers a TimeoutError (also a
    ConnectionError), each with the path in a one-line message."""
    import socket

    from s3util import CREDS

    import manyfiles as mf
    from manyfiles.s3 import ClientSettings, RetryPolicy

    for name, value in CREDS.items():
        monkeypatch.setenv(name, value)

    class Quick(RetryPolicy):       # a test's budget: unanswered requests retried for 0.5 s, no grace
        GRACE = 0.0

    with socket.socket() as refusing, socket.socket() as silent:
        refusing.bind(("127.0.0.1", 0))                 # bound, never listening: connections refused
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)                               # connections queued, never accepted nor answered
        for sock, family, other in ((refusing, ConnectionError, TimeoutError), (silent, TimeoutError, None)):
            settings = ClientSettings(endpoint_url=f"http://127.0.0.1:{sock.getsockname()[1]}",
                                      region="us-east-1", connect_timeout=0.3, read_timeout=0.3)
            cache = mf.Cache(tmp_path / family.__name__, min_free=0, settings=settings, offline=False,
                             retry=Quick(attempts=2, base=0.01, cap=0.02, stall_timeout=0.5))
            fs = fsspec.filesystem("manyfiles", cache=cache, settings=settings, skip_instance_cache=True)
            for call in (fs.cat_file, fs.info, fs.ls, fs.open):
                with pytest.raises(family) as info:
                    call("bkt/some key.bin")
                assert isinstance(info.value, ConnectionError), (call, info.value)
                assert other is None or not isinstance(info.value, other), (call, info.value)
                assert "bkt/some key.bin" in str(info.value) and "\n" not in str(info.value), str(info.value)
            cache.close()
