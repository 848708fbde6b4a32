"""Space: max_size and min_free watermarks, LRU order, evict(), a full cache disk."""

from __future__ import annotations

import contextlib
import os
import subprocess
import warnings
from pathlib import Path

import pytest
from cachekit import blob

import manyfiles as mf
from manyfiles.cache import Cache

BS = 64 << 10
ENTRY = 2 * BS                      # one two-block file (packed: a record of its own in a small cache)
WHOLE = 17 * BS                     # a file over PACK_MAX_OBJECT: held whole in a file of its own


def _files(folder: Path, n: int, size: int = 2 * BS) -> dict[Path, bytes]:
    folder.mkdir(exist_ok=True)
    out = {}
    for i in range(n):
        p = folder / f"f{i:03d}"
        out[p] = blob(size, f"{folder.name}{i}")
        p.write_bytes(out[p])
    return out


def test_max_size_evicts_least_recently_used_and_reads_never_fail(tmp_path: Path):
    files = _files(tmp_path / "src", 30)
    hot = next(iter(files))
    with Cache(tmp_path / "c", block_size=BS, max_size=10 * ENTRY, low_water=0.8, min_free=0) as cache:
        for p, data in files.items():
            assert cache.get_bytes(p) == data
            assert cache.get_bytes(hot) == files[hot]          # keep one entry hot
            cache.flush()
            assert cache.stats().bytes <= 10 * ENTRY
        s = cache.stats()
        assert s.evictions >= 20 and s.fills_dropped == 0
        assert s.bytes + ENTRY >= 8 * ENTRY, "hysteresis: evicted down to the low mark, not far below"
        hits = s.hits
        assert cache.get_bytes(hot) == files[hot]
        assert cache.stats().hits == hits + 2, "the hot entry was evicted"
        last = list(files)[-1]
        assert cache.get_bytes(last) == files[last]
        assert cache.stats().hits == hits + 4, "the newest entry was evicted"


def test_evict_by_source_size_and_age(tmp_path: Path):
    files = _files(tmp_path / "src", 8, size=WHOLE)
    with Cache(tmp_path / "c", min_free=0, block_size=BS) as cache:
        assert cache.warm([tmp_path / "src"]).fetched == 8
        first, second = list(files)[:2]
        r = cache.evict([first, second])
        assert (r.entries, r.bytes) == (2, 2 * WHOLE)
        r = cache.evict(to_size=3 * WHOLE)
        assert r.entries == 3 and cache.stats().bytes == 3 * WHOLE
        assert cache.evict(older_than=3600).entries == 0
        assert cache.evict(older_than=0).entries == 3
        s = cache.stats()
        assert (s.entries, s.bytes, s.evictions) == (0, 0, 6)
        for p, data in files.items():
            assert cache.get_bytes(p) == data
        cache.flush()
        cache.clear()
        assert cache.stats().entries == 0 and not os.listdir(os.path.join(cache.dir, "blocks"))
        assert cache.get_bytes(first) == files[first]


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_a_full_cache_disk_degrades_to_pass_through_with_one_warning(tmp_path: Path):
    files = _files(tmp_path / "src", 20, size=3 * BS + 5)
    with _tmpfs(tmp_path / "small", "8m") as mnt:
        with Cache(mnt / "c", block_size=BS, min_free=0) as cache:
            assert cache.get_bytes(next(iter(files))) == files[next(iter(files))]
            cache.flush()
            with open(mnt / "ballast", "wb", buffering=0) as f:     # someone else fills the disk
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * (1 << 20))
                with contextlib.suppress(OSError):
                    while True:
                        f.write(b"\0" * 4096)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for p, data in files.items():
                    assert cache.get_bytes(p) == data
                    with mf.open(p, cache=cache) as f:
                        f.seek(BS + 7)
                        assert f.read(100) == data[BS + 7:BS + 107]
                cache.flush()
            full = [w for w in caught if "cache disk is full" in str(w.message)]
            assert len(full) == 1, [str(w.message) for w in caught]
            assert "reading through without caching" in str(full[0].message)
            os.unlink(mnt / "ballast")
        with Cache(mnt / "c") as cache:                 # space again: the first entry survived
            assert cache.get_bytes(next(iter(files))) == files[next(iter(files))]
            assert cache.stats().misses >= 1


def test_min_free_keeps_room_on_the_cache_filesystem(tmp_path: Path):
    files = _files(tmp_path / "src", 40, size=2 * BS)
    # (12 MiB: the index takes ~2 MiB of it, and 5 MiB / low_water are kept free: room for ~20 entries)
    with _tmpfs(tmp_path / "small", "12m") as mnt, warnings.catch_warnings():
        warnings.simplefilter("error")            # no "disk full": eviction comes first
        with Cache(mnt / "c", block_size=BS, min_free=5 << 20) as cache:
            for p, data in files.items():
                assert cache.get_bytes(p) == data
                cache.flush()
            st = os.statvfs(mnt)
            assert st.f_bavail * st.f_frsize >= 5 << 20
            s = cache.stats()
            assert s.evictions > 0 and s.entries >= 5


def test_a_full_fill_queue_drops_blocks_and_never_the_read(tmp_path: Path):
    files = _files(tmp_path / "src", 6, size=20 * BS + 3)
    with Cache(tmp_path / "c", block_size=BS, fill_queue=BS, min_free=0) as cache:
        for p, data in files.items():
            assert cache.get_bytes(p) == data
        cache.flush()
        s = cache.stats()
    # every miss was either written or dropped (a queue of one block cannot hold a burst)
    assert s.misses == 6 * 21 and s.fills + s.fills_dropped == s.misses
    with Cache(tmp_path / "c", min_free=0) as cache:
        for p, data in files.items():
            assert cache.get_bytes(p) == data
        assert cache.stats().fills_dropped == s.fills_dropped
