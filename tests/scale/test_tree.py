"""fastls -r / count on a real 2-process Dask cluster: the same answers as os.walk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import faults
from manyfiles.errors import NotFound
from manyfiles.listing import _cluster as listing_cluster
from manyfiles.listing._cluster import Dir, Split, SubdirSlice, TreeJob
from manyfiles.scale.executor import InProcessExecutor

# Small numbers so that a thousand entries make dozens of shards on both workers: the first shard
# lists two levels looking for 20 subtrees per thread, and "wide" (40 subdirectories) is sliced.
SMALL = {"subtrees_per_thread": 20, "dirs_per_shard": 4, "threads": 2, "slice_dirs": 20}


def make_tree(root: Path) -> None:
    """Nested dirs, a wide dir (slices), odd names (newline, non-UTF-8), symlinks, an empty dir."""
    for i in range(12):
        for j in range(6):
            d = root / f"d{i}" / f"e{j}"
            d.mkdir(parents=True)
            for k in range(12):
                (d / f"f{k}").write_bytes(b"")
    for odd in ("e*", "e[1]", "e?"):              # glob characters: each subtree entered literally
        (root / "d0" / odd).mkdir()
        (root / "d0" / odd / "inside").write_bytes(b"")
    wide = root / "wide"
    wide.mkdir()
    for i in range(40):
        (wide / f"w{i}").mkdir()
        (wide / f"w{i}" / "x").write_bytes(b"")
    os.mkdir(os.path.join(os.fsencode(root), b"odd\nname\xff"))
    (root / "odd\nname\udcff" / "inner").write_bytes(b"")
    (root / "empty").mkdir()
    (root / "link-to-d0").symlink_to(root / "d0")       # counted, never followed
    (root / "dangling").symlink_to(root / "nowhere")


def walk_paths(root: bytes) -> set[bytes]:
    out = set()
    for parent, dirs, files in os.walk(root):
        out.update(os.path.join(parent, n) for n in dirs + files)
    return out


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    make_tree(root)
    return root


def test_count_equals_os_walk_and_spreads_over_both_workers(tree: Path, dask_client) -> None:
    want = len(walk_paths(os.fsencode(tree)))
    report = listing_cluster.count_tree(tree, cluster=dask_client, **SMALL)
    assert report.entries == want
    real_dirs = sum(1 for p, ds, _ in os.walk(tree) for d in ds if not os.path.islink(os.path.join(p, d)))
    assert report.directories == 1 + real_dirs
    assert report.ok, report.failures
    assert report.shards >= 8 and len(report.workers) == 2, report.worker_lines()
    assert sum(w.items for w in report.workers.values()) == want


def test_written_listing_equals_os_walk_paths_byte_for_byte(tree: Path, tmp_path: Path, dask_client) -> None:
    out = tmp_path / "parts"
    out.mkdir()
    report = listing_cluster.write_tree(str(tree), out, cluster=dask_client, sep=b"\0", **SMALL)
    listing = tmp_path / "all"
    with open(listing, "wb") as f:
        listing_cluster.copy_parts(report.parts, f.fileno())
    names = listing.read_bytes().split(b"\0")
    assert names.pop() == b""
    assert len(names) == len(set(names)) == report.entries       # nothing listed twice
    assert set(names) == walk_paths(os.fsencode(tree))         # tmp_path is absolute: so are the paths
    assert os.listdir(out) == []                                 # parts copied and removed, no temps


def test_json_listing_is_fastls_json(tree: Path, tmp_path: Path, dask_client) -> None:
    import json

    from manyfiles.fastls import decode_json_path

    out = tmp_path / "parts"
    out.mkdir()
    report = listing_cluster.write_tree(tree, out, cluster=dask_client, json=True, **SMALL)
    records = [json.loads(line) for p in report.parts for line in Path(p).read_bytes().splitlines()]
    assert {decode_json_path(r) for r in records} == walk_paths(os.fsencode(tree))
    assert {r["type"] for r in records} == {"f", "d", "l"}


def test_max_depth_and_filter_apply_as_in_fastls(tree: Path, dask_client) -> None:
    report = listing_cluster.count_tree(tree, cluster=dask_client, max_depth=1, **SMALL)
    want = sum(1 for p in walk_paths(os.fsencode(tree)) if p.count(b"/") - os.fsencode(tree).count(b"/") <= 2)
    assert report.entries == want
    from manyfiles.listing import Filter

    files = listing_cluster.count_tree(tree, cluster=dask_client, filter=Filter(include=("f1*",)), **SMALL)
    assert files.entries == 12 * 6 * 3      # f1, f10, f11 in every leaf
    dirs = listing_cluster.count_tree(tree, cluster=dask_client, filter=Filter(types="d"), **SMALL)
    assert dirs.entries == 1 + 12 * 7 + 3 + 40 + 2       # wide, d*, d*/e*, d0/e[*?, wide/w*, odd, empty


def test_unreadable_directory_is_a_failure_with_its_path_and_the_rest_is_counted(
        world_readable_tmp: Path, run_unprivileged) -> None:
    # As user nobody (root reads everything): the cluster runs in that process's children.
    root = world_readable_tmp / "t"
    (root / "ok" / "sub").mkdir(parents=True)
    (root / "ok" / "sub" / "f").write_bytes(b"")
    (root / "locked").mkdir()
    (root / "locked" / "hidden").write_bytes(b"")
    os.chmod(root / "locked", 0o000)
    code = ("from manyfiles.listing import _cluster as listing_cluster\n"
            "from manyfiles.scale.executor import InProcessExecutor\n"
            f"r = listing_cluster.count_tree({str(root)!r}, cluster=InProcessExecutor())\n"
            "print(r.entries, [(f.path, f.code) for f in r.failures])\n")
    import sys

    out = run_unprivileged([sys.executable, "-c", code])
    assert out.strip() == f"4 [('{root}/locked', 'EACCES')]"


def test_missing_root_is_not_found(tmp_path: Path, dask_client) -> None:
    with pytest.raises(NotFound, match="nope"):
        listing_cluster.count_tree(tmp_path / "nope", cluster=dask_client)


def test_a_shard_run_twice_writes_the_same_part_once(tree: Path, tmp_path: Path) -> None:
    job = TreeJob(root=os.fsencode(tree), shown=b"T", out_dir=str(tmp_path), **SMALL)
    shard = (Dir(b"d3", 1), Split(b"wide", 1, 100))           # a subtree, and a directory to split
    first = job.run(shard, lambda *a: None)
    data = Path(first.report.parts[0]).read_bytes()
    second = job.run(shard, lambda *a: None)
    assert first.report.parts == second.report.parts
    assert os.listdir(tmp_path) == [Path(first.report.parts[0]).name]     # no second part, no temp
    assert sorted(Path(second.report.parts[0]).read_bytes().split()) == sorted(data.split())
    assert data.count(b"\n") == first.report.entries == second.report.entries == 6 * 13 + 40
    slices = [item for s in first.more for item in s]
    assert first.more == second.more and {type(i) for i in slices} == {SubdirSlice}   # wide's 40 subdirs
    assert sum(len(job.run((s,), lambda *a: None).report.parts) for s in slices) == len(slices)


def test_a_subtree_over_budget_is_split_and_its_partial_output_dropped(tree: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    from manyfiles import listing

    real = listing.write_tree

    def ticks_at_once(path, fd, **kw):          # the walker's 100 ms tick, before it walks
        if path.endswith(b"/d5") and "on_entries" in kw:
            os.write(fd, b"half a listing\n")
            kw["on_entries"](10**9)
        return real(path, fd, **kw)

    monkeypatch.setattr(listing, "write_tree", ticks_at_once)
    job = TreeJob(root=os.fsencode(tree), shown=b"T", out_dir=str(tmp_path), **SMALL)
    result = job.run((Dir(b"d5", 1), Dir(b"d6", 1)), lambda *a: None)
    lines = Path(result.report.parts[0]).read_bytes().splitlines()
    assert b"half a listing" not in lines and result.report.splits == 1
    assert result.report.entries == len(lines) == 6 + 78      # d5's own entries, and all of d6
    assert sorted(d.rel for s in result.more for d in s) == [f"d5/e{j}".encode() for j in range(6)]


def test_in_process_executor_gives_the_same_report(tree: Path, dask_client) -> None:
    here = listing_cluster.count_tree(tree, cluster=InProcessExecutor(), **SMALL)
    there = listing_cluster.count_tree(tree, cluster=dask_client, **SMALL)
    assert (here.entries, here.directories) == (there.entries, there.directories)


def test_a_worker_killed_mid_listing_loses_nothing_and_lists_nothing_twice(tree: Path, tmp_path: Path,
                                                                          dask_client, wait_for_two) -> None:
    """One worker SIGKILLs itself after its third walker call: mid-shard, its part file written
    but not committed.  The re-run writes the whole part; the temp of the lost attempt goes."""
    victim = sorted(dask_client.nthreads())[0]
    pid = dask_client.run(os.getpid, workers=[victim])[victim]
    dask_client.run(faults.kill_worker_at, "tree", 3, workers=[victim])
    out = tmp_path / "parts"
    out.mkdir()
    report = listing_cluster.write_tree(str(tree), out, cluster=dask_client, sep=b"\0", **SMALL)
    wait_for_two()
    assert pid not in dask_client.run(os.getpid).values()          # it really died
    assert report.ok and report.reruns >= 1
    want = walk_paths(os.fsencode(tree))
    assert report.entries == len(want) == sum(w.items for w in report.workers.values())
    assert sorted(os.listdir(out)) == sorted(os.path.basename(p) for p in report.parts)   # no temps
    listing = tmp_path / "all"
    with open(listing, "wb") as f:
        listing_cluster.copy_parts(report.parts, f.fileno())
    names = listing.read_bytes().split(b"\0")
    assert names.pop() == b""
    assert len(names) == len(set(names)) and set(names) == want
