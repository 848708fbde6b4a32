"""ShardedDir on real files: put/open/exists/remove, iteration, count/estimate/stats, races."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path

import pytest

from manyfiles.errors import UsageError
from manyfiles.shard import Layout, MigrationInProgress, ShardedDir


def test_put_is_atomic_and_lands_where_path_for_says(tmp_path: Path) -> None:
    d = ShardedDir(tmp_path / "t")
    p = d.put("cat.jpg", b"meow")
    assert p == d.path_for("cat.jpg") == str(tmp_path / "t" / Layout().relpath("cat.jpg"))
    assert Path(p).read_bytes() == b"meow"
    d.put("cat.jpg", io.BytesIO(b"purr"))       # replace, from a file object
    d.put(b"dog\xff", iter([b"wo", b"of"]))       # bytes name, from chunks
    assert d.open("cat.jpg").read() == b"purr"
    assert d.exists(b"dog\xff") and not d.exists("cow")
    assert sorted(d) == ["cat.jpg", os.fsdecode(b"dog\xff")]
    leaf = os.path.dirname(p)
    assert os.listdir(leaf) == ["cat.jpg"]        # no temp file left behind
    # the descriptor was recorded on first write, so a fresh handle agrees
    assert ShardedDir(tmp_path / "t").layout == Layout()


def test_failed_write_leaves_old_content_and_no_temp(tmp_path: Path) -> None:
    d = ShardedDir(tmp_path)
    d.put("a", b"old")
    with pytest.raises(RuntimeError), d.writer("a") as f:
        f.write(b"half")
        raise RuntimeError("download failed")
    assert d.open("a").read() == b"old"
    assert os.listdir(os.path.dirname(d.path_for("a"))) == ["a"]


def test_remove_prunes_empty_levels_only(tmp_path: Path) -> None:
    d = ShardedDir(tmp_path, Layout(levels=(1, 1)))
    d.put("x", b"1")
    top = tmp_path / Layout(levels=(1, 1)).relpath("x").split("/")[0]
    d.remove("x")
    assert not top.exists() and sorted(os.listdir(tmp_path)) == [".manyfiles-shard.json"]
    d.remove("x", missing_ok=True)
    with pytest.raises(FileNotFoundError):
        d.remove("x")


def test_layout_mismatch_is_refused(tmp_path: Path) -> None:
    ShardedDir(tmp_path, Layout(levels=(1,))).put("a", b"")
    assert ShardedDir(tmp_path).layout == Layout(levels=(1,))
    with pytest.raises(UsageError):
        ShardedDir(tmp_path, Layout(levels=(2, 2)))


def test_count_estimate_stats(tmp_path: Path) -> None:
    d = ShardedDir(tmp_path, Layout(levels=(1,)))
    for i in range(3000):
        d.put(f"n{i}", b"")
    os.mkdir(tmp_path / "not-a-bucket")
    (tmp_path / "not-a-bucket" / "zz").write_bytes(b"")  # not counted
    assert d.count() == 3000
    s = d.stats()
    assert s.files == 3000 and s.buckets == 16 and s.min <= s.mean <= s.max and s.stddev >= 0
    est = d.estimate(samples=8)
    assert 1500 < est < 6000  # 16 buckets of ~187: a sample is within a factor of 2


def test_put_racing_with_prune_never_loses_a_file(tmp_path: Path) -> None:
    # one thread keeps creating and removing a name whose bucket it prunes; others write
    # names in the same bucket: every put must succeed and the file must be there afterwards.
    lay = Layout(levels=(1, 1), key="prefix")
    d = ShardedDir(tmp_path, lay)
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        while not stop.is_set():
            d.put("ab-churn", b"")
            d.remove("ab-churn")

    def writer(k: int) -> None:
        try:
            for i in range(300):
                name = f"ab-{k}-{i}"
                d.put(name, name.encode())
                assert d.open(name).read() == name.encode()
                d.remove(name)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=churn)
    t.start()
    writers = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    t.join()
    assert not errors, errors[:1]
    d.put("ab-final", b"kept")
    assert d.open("ab-final").read() == b"kept"


def test_migration_in_progress_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".manyfiles-shard.journal").write_bytes(b"x")
    with pytest.raises(MigrationInProgress):
        ShardedDir(tmp_path)
