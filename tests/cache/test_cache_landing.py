"""A streamed first read over plain HTTP lands each block straight in the object's whole file (the
kernel splices it there; the reader is served from those pages), checked over what landed: the
write-behind queue carries none of it, a flipped byte still ends the read and nothing is kept."""

from __future__ import annotations

from pathlib import Path

import pytest
from cachekit import blob, held

import manyfiles as mf
from manyfiles.cache import Cache

BS = 64 << 10


@pytest.fixture
def cache(tmp_path: Path, s3):
    """Objects over 4 blocks are streamed (read by block, not checked whole first)."""
    c = Cache(tmp_path / "cache", min_free=0, block_size=BS, settings=s3.settings, retry=s3.retry,
              verify_whole_max=4 * BS)
    yield c
    c.close()


def test_a_streamed_object_lands_in_its_whole_file_not_through_the_queue(s3, cache: Cache):
    data = s3.put("big.bin", blob(37 * BS + 123, "land"))
    got = bytearray()
    with mf.open(s3.url("big.bin"), cache=cache) as f:
        while chunk := f.read(BS // 3):         # reads across the blocks' edges
            got += chunk
    assert got == data
    assert [r[2] for r in s3.gets()] == [None], "one whole-object GET, no block fetched by range"
    cache.flush()
    stats = cache.process_stats()
    assert stats["fill_bytes_queued"] == 0, "every block landed in the file, none queued"
    assert stats["fill_bytes"] == len(data) and stats["fills_dropped"] == 0
    report = cache.verify()
    assert (report.verified, report.unverified, report.corrupt) == (1, 0, 0)
    assert len(held(cache)) == 1
    assert cache.get_bytes(s3.url("big.bin")) == data and len(s3.gets()) == 1


def test_a_flipped_byte_in_a_landed_stream_ends_the_read_and_nothing_is_kept(s3, cache: Cache):
    data = s3.put("big.bin", blob(37 * BS + 123, "flip"))
    s3.fault(f"flip@{len(data) // 2 + 7}", key="big.bin")
    got = bytearray()
    with mf.open(s3.url("big.bin"), cache=cache) as f, pytest.raises(mf.IntegrityError, match=r"big\.bin"):
        while chunk := f.read(BS // 2):
            got += chunk
    assert len(got) < len(data), "the last block is served only after the check passed"
    cache.flush()
    assert cache.process_stats()["fill_bytes_queued"] == 0
    assert held(cache) == [] and cache.stats().entries == 0, "no byte of the object is kept"
    assert cache.get_bytes(s3.url("big.bin")) == data      # again, no fault: right bytes, held whole
    cache.flush()
    assert len(held(cache)) == 1
