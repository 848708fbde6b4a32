"""Issue 12: every long public call takes ``progress=`` (True or a callable taking a Snapshot).

For each call on a real folder: a bad ``progress`` raises UsageError before anything on disk
changes (names, contents and mtimes compared before/after; output files stay empty), and a
callable receives Snapshots whose final one is ``finished`` with ``done`` equal to what the
call's result counts.  (The S3 calls are in tests/s3/test_pull_api.py; under a Jupyter kernel,
every call with ``progress=True`` in tests/notebooks/progress_everywhere.ipynb.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import manyfiles as mf
from manyfiles import fastls, listing, shard
from manyfiles._core.progress import Snapshot
from manyfiles.cache import Cache
from manyfiles.errors import UsageError

FILES = 120


def make_tree(root: Path) -> Path:
    for d in ("a", "a/b", "c"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for i in range(FILES):
        (root / ("a/b", "a", "c", ".")[i % 4] / f"f{i:04d}").write_bytes(b"x" * i)
    return root


def make_flat(root: Path) -> Path:
    root.mkdir()
    for i in range(FILES):
        (root / f"f{i:04d}").write_bytes(b"%d" % i)
    return root


def make_sharded(root: Path) -> Path:
    shard.apply(make_flat(root), shard.Layout(levels=(1,)), workers=2)
    return root


def state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """path -> (mtime_ns, size, content) of everything under ``root`` (directories: no content)."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mtime_ns, st.st_size,
                                             b"" if name in dirs else Path(p).read_bytes())
    return out


@dataclass
class Call:
    """A long call: ``make(tmp)`` builds its folder, ``run(root, out, progress)`` makes the call
    and returns what ``done`` must end at."""

    make: Callable[[Path], Path]
    run: Callable[[Path, Any, Any], int]


def _fastls(root: Path, out: Any, progress: Any) -> int:
    req = fastls.ListRequest(paths=(str(root),), recursive=True)
    return fastls.run(req, out.fileno(), progress=progress).entries


def _warm(root: Path, out: Any, progress: Any) -> int:
    with Cache(root.parent / "cache", min_free=0) as cache:
        return cache.warm([str(root)], progress=progress).objects


def _cache_verify(root: Path, out: Any, progress: Any) -> int:
    with Cache(root.parent / "cache", min_free=0) as cache:
        cache.warm([str(root)])
        return cache.verify(progress=progress).entries


CALLS: dict[str, Call] = {
    "walk": Call(make_tree, lambda r, o, p: sum(len(d.entries) for d in mf.walk(r, progress=p))),
    "count(recursive)": Call(make_tree, lambda r, o, p: mf.count(r, recursive=True, progress=p)),
    "count": Call(make_flat, lambda r, o, p: mf.count(r, progress=p)),
    "count_tree": Call(make_tree, lambda r, o, p: listing.count_tree(r, progress=p).entries),
    "write_tree": Call(make_tree, lambda r, o, p: listing.write_tree(r, o.fileno(), progress=p).entries),
    "scan": Call(make_tree, lambda r, o, p: len(mf.scan(r, recursive=True, progress=p))),
    "fastls.run": Call(make_tree, _fastls),
    "remove_tree": Call(make_tree, lambda r, o, p: (lambda rep: rep.files + rep.dirs)(
        mf.remove_tree(r, workers=2, progress=p))),
    "purge": Call(make_tree, lambda r, o, p: (lambda rep: rep.files + rep.dirs)(
        mf.purge(r, "f00*", workers=2, progress=p))),
    "shard.apply": Call(make_flat, lambda r, o, p: shard.apply(r, workers=2, progress=p).moved),
    "shard.plan": Call(make_flat, lambda r, o, p: len(shard.plan(r, progress=p).moves)),
    "shard.plan.execute": Call(make_flat, lambda r, o, p: shard.plan(r).execute(workers=2, progress=p).moved),
    "shard.revert": Call(make_sharded, lambda r, o, p: shard.revert(r, workers=2, progress=p).moved),
    "shard.reshard": Call(make_sharded, lambda r, o, p: shard.reshard(
        r, shard.Layout(levels=(2,)), workers=2, progress=p).moved),
    "shard.verify": Call(make_sharded, lambda r, o, p: shard.verify(r, progress=p).files),
    "ShardedDir.count": Call(make_sharded, lambda r, o, p: shard.ShardedDir(r).count(progress=p)),
    "ShardedDir.stats": Call(make_sharded, lambda r, o, p: shard.ShardedDir(r).stats(progress=p).files),
    "Cache.warm": Call(make_flat, _warm),
    "Cache.verify": Call(make_flat, _cache_verify),
}


BAD = pytest.mark.parametrize("bad", ["yes", 3, [print]], ids=["str", "int", "list"])


@BAD
@pytest.mark.parametrize("name", [n for n in CALLS if not n.startswith("Cache.")])
def test_bad_progress_is_refused_before_anything_changes(name: str, bad: object, tmp_path: Path) -> None:
    call = CALLS[name]
    root = call.make(tmp_path / "data")
    before = state(tmp_path)
    out_path = tmp_path.parent / f"{tmp_path.name}.out"
    with open(out_path, "wb") as out, pytest.raises(UsageError, match="progress"):
        call.run(root, out, bad)
    assert state(tmp_path) == before
    assert os.path.getsize(out_path) == 0


@BAD
def test_cache_calls_refuse_bad_progress_before_anything_changes(bad: object, tmp_path: Path) -> None:
    root = make_flat(tmp_path / "data")
    with Cache(tmp_path / "cache", min_free=0) as cache:   # opening the cache is not the call under test
        before = state(tmp_path)
        with pytest.raises(UsageError, match="progress"):
            cache.warm([str(root)], progress=bad)
        with pytest.raises(UsageError, match="progress"):
            cache.verify(progress=bad)
        assert state(tmp_path) == before


@pytest.mark.parametrize("name", CALLS)
def test_callable_gets_snapshots_ending_at_the_result(name: str, tmp_path: Path) -> None:
    call = CALLS[name]
    root = call.make(tmp_path / "data")
    seen: list[Snapshot] = []
    with open(tmp_path / "out", "wb") as out:
        result = call.run(root, out, seen.append)
    assert result > 0
    assert seen and all(isinstance(s, Snapshot) for s in seen)
    assert seen[-1].finished and not any(s.finished for s in seen[:-1])
    assert seen[-1].done == result, (seen[-1], result)
    assert [s.done for s in seen] == sorted(s.done for s in seen)   # never goes back


def test_walk_progress_finishes_when_the_consumer_stops_early(tmp_path: Path) -> None:
    root = make_tree(tmp_path / "t")
    seen: list[Snapshot] = []
    it = mf.walk(root, progress=seen.append, threads=1)
    first = next(it)
    it.close()
    assert seen[-1].finished and seen[-1].done == len(first.entries)


def test_walk_checks_progress_when_called_not_when_iterated(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        mf.walk(tmp_path, progress="yes")   # no next(): refused at the call


def test_count_tree_raw_hook_works_next_to_progress(tmp_path: Path) -> None:
    """``on_entries`` is the C walker's own callback (scale's subtree budget stops a walk with it)."""
    root = make_tree(tmp_path / "t")
    calls: list[int] = []
    tally = listing.count_tree(root, on_entries=calls.append, progress=lambda s: None)
    assert tally.entries == FILES + 3 and all(isinstance(n, int) for n in calls)
