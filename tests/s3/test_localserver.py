"""The demo's local S3 server: starts, is seeded, and s3pull empties it into a folder."""

from __future__ import annotations

from manyfiles.s3 import pull
from manyfiles.s3.localserver import local_s3


def test_local_s3_seeds_a_bucket_that_pulls_cleanly(tmp_path):
    with local_s3(small=5, medium=1, large=1, large_size=9 << 20) as srv:
        report = pull(f"s3://{srv.bucket}/", str(tmp_path / "demo"), settings=srv.settings)
    assert report.failures == []
    assert (report.done, report.bytes) == (srv.objects, srv.bytes) == (7, report.bytes)
    assert set(report.engines) == {"loop", "lean"}       # 1-4 KiB on the loop, the rest whole
    assert (tmp_path / "demo" / "large" / "blob-0.bin").stat().st_size == 9 << 20
