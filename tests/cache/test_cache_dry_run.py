"""``Cache.evict(dry_run=True)`` / ``Cache.clear(dry_run=True)`` (``cache evict -n``, ``cache clear -n``):
the same victims a real run picks, and nothing removed: no index row, no block, no counter."""

from __future__ import annotations

import os
import time
from pathlib import Path

from cachekit import blob

from manyfiles.cache import Cache

BS = 64 << 10


def _blocks(cache: Cache) -> list[str]:
    root = os.path.join(cache.dir, "blocks")
    return sorted(os.path.join(d, f) for d, _, files in os.walk(root) for f in files)


def test_dry_runs_pick_what_the_real_run_removes_and_keep_everything(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):     # (over 1 MiB: each in a whole file of its own, not packed together)
        (src / f"f{i}").write_bytes(blob(BS * 20 * (i + 1), str(i)))
    with Cache(tmp_path / "cache", min_free=0, block_size=BS) as cache:
        assert cache.warm([str(src / f"f{i}") for i in range(6)]).ok
        time.sleep(0.05)
        with cache.open(str(src / "f0")) as f:     # f0 is now the most recently used
            f.read()
        stats, blocks = cache.stats(), _blocks(cache)

        want = cache.evict(to_size=stats.bytes // 2, dry_run=True)
        one = cache.evict([str(src / "f3")], dry_run=True)
        everything = cache.clear(dry_run=True)
        assert (one.entries, everything.entries, everything.bytes) == (1, 6, stats.bytes)
        assert want.dry_run and "would be evicted" in want.summary() and 0 < want.entries < 6
        after = cache.stats()
        assert (after.entries, after.bytes, after.evictions, _blocks(cache)) == (6, stats.bytes, 0, blocks)

        real = cache.evict(to_size=stats.bytes // 2)                  # the same choice, now for real
        assert (real.entries, real.bytes, real.dry_run) == (want.entries, want.bytes, False)
        assert cache.stats().evictions == want.entries and len(_blocks(cache)) < len(blocks)
