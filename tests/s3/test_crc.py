"""The C core's CRC32C / CRC64NVME (s3pull's checks of small bodies without loading awscrt): the same
values as awscrt's, continued like them, and every check still made when awscrt is missing."""

from __future__ import annotations

import base64
import os

import pytest

from manyfiles.errors import IntegrityError
from manyfiles.s3 import integrity

native = pytest.importorskip("manyfiles._dents")
crt = pytest.importorskip("awscrt.checksums")


@pytest.mark.parametrize("alg", ["crc64nvme", "crc32c"])
def test_c_core_crcs_are_awscrts(alg):
    ours, theirs = getattr(native, alg), getattr(crt, alg)
    assert ours(b"123456789") == {"crc64nvme": 0xAE8B14860A799888, "crc32c": 0xE3069283}[alg]
    for n in (0, 1, 7, 8, 9, 63, 4096, 100_003):
        data = os.urandom(n)
        assert ours(data) == theirs(data)
        cut = n // 3
        assert ours(data[cut:], ours(data[:cut])) == theirs(data)       # continued like awscrt's
        assert ours(memoryview(bytearray(data))) == theirs(data)        # any buffer


@pytest.mark.parametrize("order", ["streamed", "ranges out of order"])
def test_crc_checks_without_awscrt(order, monkeypatch):
    """Without awscrt: bodies of any size by the C core, ranges hashed in order (no combine)."""
    monkeypatch.setattr(integrity, "_CRT_INSTALLED", False)
    monkeypatch.setattr(integrity, "_crt_module", None)
    data = bytearray(os.urandom(3 * (1 << 20) + 5))
    want = base64.b64encode(native.crc64nvme(bytes(data)).to_bytes(8, "big")).decode()
    claim = integrity.claim_for(None, {"x-amz-checksum-crc64nvme": want}, len(data), None)
    assert claim.method == "crc64nvme"

    def fetch(body: bytes) -> integrity.Digest:
        d = integrity.Digest(claim, len(body), lambda off, n: body[off:off + n])
        if order == "streamed":
            d.stream(body)
            return d
        assert d.combine is None
        step = 1 << 20
        for off in sorted(range(0, len(body), step), key=lambda o: -o):
            feed = d.claim_feed(off)
            if feed is not None:
                feed.update(body[off:off + step])
            d.written(off, len(body[off:off + step]), feed)
        return d

    assert fetch(bytes(data)).check() == "crc64nvme"
    data[2_000_000] ^= 1
    with pytest.raises(IntegrityError):
        fetch(bytes(data)).check()
