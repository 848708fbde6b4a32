"""apply / revert / reshard / plan / verify on real directories: every edge case of issue 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest
from shardkit import EDGE_NAMES, assert_flat_clean, assert_sharded_clean, make_dataset, snapshot, top_level

import manyfiles as mf
from manyfiles._core.progress import Snapshot
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.shard import Layout, ShardedDir, apply, plan, reshard, revert, verify
from manyfiles.shard.journal import Lock
from manyfiles.trace import iotrace

OURS = {b".manyfiles-shard.json", b".manyfiles-shard.journal", b".manyfiles-shard.lock",
        b".manyfiles-shard.aside"}


def test_round_trip_with_bucket_named_files_odd_names_and_symlinks(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 500)
    before = snapshot(root)
    rep = apply(root, workers=3)
    assert rep.ok and rep.moved == len(before) and rep.set_aside == 4  # ab 00 ff e3
    assert_sharded_clean(root, before)
    sd = ShardedDir(root)
    for name in EDGE_NAMES:  # a file named "ab" sits in its own bucket, not confused with bucket ab/
        assert os.path.isfile(sd.path_for(name)), name
    # symlinks moved as links (a link to "." is not followed into a loop), targets untouched
    link = os.fsencode(sd.path_for(b"link-to-dir"))
    assert os.path.islink(link) and os.readlink(link) == b"."
    rep = revert(root, workers=3)
    assert rep.ok and rep.moved == len(before)
    assert_flat_clean(root, before)


def test_subdirectories_are_left_alone_and_reported(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 50, edge=False, symlinks=False)
    (root / "images").mkdir()
    (root / "images" / "f0000001").write_bytes(b"same name, other dir")
    rep = apply(root)
    assert rep.ok and (b"images", "subdirectory left in place") in rep.skipped
    assert (root / "images" / "f0000001").read_bytes() == b"same name, other dir"
    v = verify(root)
    assert v.ok and v.foreign == [b"images"] and v.files == 50
    assert revert(root).ok
    assert (root / "images" / "f0000001").read_bytes() == b"same name, other dir"
    assert len(top_level(root)) == 51


def test_subdirectory_named_like_a_bucket_is_refused_before_anything_moves(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 50, edge=False, symlinks=False)
    (root / "ab").mkdir()
    before = snapshot(root)
    with pytest.raises(ManyfilesError, match="named like shard buckets"):
        apply(root)
    assert snapshot(root) == before and not (top_level(root) & OURS)
    assert plan(root).blocking == [b"ab"]


def test_empty_folder(tmp_path: Path) -> None:
    rep = apply(tmp_path)
    assert rep.ok and rep.moved == 0
    assert top_level(tmp_path) == {b".manyfiles-shard.json"}
    assert verify(tmp_path).ok and verify(tmp_path).files == 0
    assert revert(tmp_path).ok and top_level(tmp_path) == set()


def test_already_sharded_is_a_no_op_and_other_levels_are_refused(tmp_path: Path) -> None:
    make_dataset(tmp_path, 100, edge=False, symlinks=False)
    apply(tmp_path)
    before = snapshot(tmp_path)
    again = apply(tmp_path)
    assert again.nothing_to_do and again.moved == 0 and snapshot(tmp_path) == before
    with pytest.raises(UsageError, match="reshard"):
        apply(tmp_path, Layout(levels=(1,)))
    # a stray flat file (written after the migration) is picked up by a rerun
    (tmp_path / "late").write_bytes(b"late")
    assert apply(tmp_path).moved == 1 and verify(tmp_path).ok


def test_files_appearing_during_migration_are_not_lost(fast_tmp: Path) -> None:
    root = make_dataset(fast_tmp / "d", 3000, edge=False, symlinks=False)
    created: list[str] = []

    def progress(snap: Snapshot) -> None:
        if not created:  # while the workers run: new files land in the flat folder
            for i in range(40):
                name = f"new{i}"
                (root / name).write_bytes(name.encode())
                created.append(name)

    rep = apply(root, workers=2, progress=progress)
    assert created and rep.ok and rep.appeared == 40
    sd = ShardedDir(root)
    assert all(sd.open(n).read() == n.encode() for n in created)
    assert verify(root, expected=3040).ok


def test_same_name_flat_and_in_tree_is_a_conflict_and_both_are_kept(tmp_path: Path) -> None:
    sd = ShardedDir(tmp_path)
    sd.put("x", b"in the tree")
    (tmp_path / "x").write_bytes(b"flat copy")
    rep = apply(tmp_path)
    assert not rep.ok and rep.conflicts == [b"x"]
    assert (tmp_path / "x").read_bytes() == b"flat copy" and sd.open("x").read() == b"in the tree"
    v = verify(tmp_path)
    assert not v.ok and v.duplicates == [b"x"] and v.flat == [b"x"]
    # the shared report conventions: Failure records, raise_for_failures, to_dict, str
    assert [(f.path, f.code) for f in rep.failures] == [(str(tmp_path / "x"), "EEXIST")]
    with pytest.raises(mf.PartialFailure) as info:
        rep.raise_for_failures()
    assert info.value.report is rep
    d = json.loads(json.dumps(rep.to_dict()))
    assert d["ok"] is False and d["layout"]["levels"] == [2, 2] and d["conflicts"] == ["x"]
    assert {f.code for f in v.failures} == {"flat", "duplicate"} and str(v).startswith("FAILED: 1 files")


def test_workers_never_share_a_bucket_directory(fast_tmp: Path) -> None:
    make_dataset(fast_tmp, 2000, edge=False, symlinks=False)
    tops = {Layout().buckets(n)[0] for n in os.listdir(os.fsencode(fast_tmp))}

    class Recorder:
        def __init__(self) -> None:
            self.by_top: dict[bytes, set[int]] = defaultdict(set)

        def record(self, op, path, offset, length, start_ns, dur_ns, result) -> None:
            if op in ("mkdir", "rmdir") and isinstance(path, bytes) and b"/" in path:
                self.by_top[path.split(b"/")[0]].add(threading.get_ident())

    for op in (apply, revert):
        rec = Recorder()
        iotrace.TRACER = rec
        try:
            op(fast_tmp, workers=4)
        finally:
            iotrace.TRACER = None
        assert set(rec.by_top) == tops
        assert all(len(threads) == 1 for threads in rec.by_top.values())
        assert len(set().union(*rec.by_top.values())) > 1  # and more than one worker did work


def test_prefix_key_and_reshard(fast_tmp: Path) -> None:
    import uuid

    names = [uuid.UUID(int=i * 7919 + 1).hex for i in range(400)]
    for n in names:
        (fast_tmp / n).write_bytes(n.encode())
    before = snapshot(fast_tmp)
    assert apply(fast_tmp, Layout(levels=(2,), key="prefix")).ok
    assert (fast_tmp / names[5][:2] / names[5]).is_file()
    assert verify(fast_tmp).ok
    rep = reshard(fast_tmp, Layout(levels=(1, 2)))
    assert rep.ok and verify(fast_tmp).layout == Layout(levels=(1, 2)) and verify(fast_tmp).ok
    assert snapshot(fast_tmp) == before
    assert revert(fast_tmp).ok and snapshot(fast_tmp) == before


def test_an_interrupted_operation_must_be_finished_first(fast_tmp: Path, shard_bin: str) -> None:
    make_dataset(fast_tmp, 2000, edge=False, symlinks=False)
    env = dict(os.environ, MANYFILES_TESTING="kill_at=move:500")
    r = subprocess.run([shard_bin, "apply", str(fast_tmp), "-q"], env=env, capture_output=True)
    assert r.returncode == -9
    with pytest.raises(ManyfilesError, match="shard apply"):
        revert(fast_tmp)
    with pytest.raises(UsageError, match="same options"):
        apply(fast_tmp, Layout(levels=(1,)))
    assert apply(fast_tmp).resumed and verify(fast_tmp, expected=2000).ok


def test_verify_finds_misplaced_temp_and_stray_files(tmp_path: Path) -> None:
    sd = ShardedDir(tmp_path)
    for i in range(50):
        sd.put(f"n{i}", b"x")
    assert verify(tmp_path).ok
    wrong = Path(sd.path_for("n1")).parent.parent / "00"
    wrong.mkdir(exist_ok=True)
    os.rename(sd.path_for("n1"), wrong / "n1")
    (Path(sd.path_for("n2")).parent / ".manyfiles-tmp-0123").write_bytes(b"")
    (tmp_path / "stray").write_bytes(b"")
    v = verify(tmp_path)
    assert not v.ok
    assert [w for w, _ in v.misplaced] == [os.path.relpath(wrong / "n1", tmp_path).encode()]
    assert len(v.temp_files) == 1 and v.flat == [b"stray"]
    assert not verify(tmp_path, expected=50).ok  # 49 in place


def test_plan_moves_nothing_and_writes_the_csv(tmp_path: Path) -> None:
    import csv

    root = make_dataset(tmp_path / "d", 200, symlinks=False)
    before = snapshot(root)
    p = plan(root)
    out = tmp_path / "moves.csv"
    p.write_csv(str(out))
    assert snapshot(root) == before and not (top_level(root) & OURS)
    with open(out, newline="", encoding="utf-8", errors="surrogateescape") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["source", "destination"] and len(rows) == 1 + len(before)
    assert {os.fsencode(r[0]) for r in rows[1:]} == set(before)  # newline/non-UTF-8 names survive
    assert all(r[1] == Layout().relpath(r[0]) for r in rows[1:])
    assert p.stats.files == len(before) and len(p.collisions) == 4


def test_lock_refuses_a_second_migration(tmp_path: Path) -> None:
    make_dataset(tmp_path, 10, edge=False, symlinks=False)
    fd = os.open(tmp_path, os.O_RDONLY)
    lock = Lock(fd, os.fsencode(tmp_path))
    lock.acquire()
    try:
        with pytest.raises(ManyfilesError, match="another shard command is running"):
            apply(tmp_path)
    finally:
        lock.release()
        os.close(fd)
    assert apply(tmp_path).moved == 10


def test_read_only_folder_is_a_clear_error_and_nothing_moves(tmp_path: Path, shard_bin: str) -> None:
    root = make_dataset(tmp_path / "ro", 20, edge=False, symlinks=False)
    before = snapshot(root)
    root.chmod(0o555)
    try:
        cmd = [shard_bin, "apply", str(root)]
        if os.geteuid() == 0:  # root ignores permission bits: drop the override capabilities
            cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--", *cmd]
        r = subprocess.run(cmd, capture_output=True)
    finally:
        root.chmod(0o755)
    assert r.returncode == 1
    assert r.stderr.decode().strip() == f"shard: {root}: Permission denied (nothing was moved)"
    assert snapshot(root) == before and not (top_level(root) & OURS)


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="needs root to mount a tmpfs")
def test_cross_device_bucket_is_refused(tmp_path: Path) -> None:
    sd = ShardedDir(tmp_path)
    top = Layout().relpath("moved")[:2]
    (tmp_path / top).mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tmp_path / top)]).returncode != 0:
        pytest.skip("mount not permitted here")
    try:
        sd.put("other", b"")  # make it look sharded
        (tmp_path / "moved").write_bytes(b"stay")
        with pytest.raises(ManyfilesError, match="another filesystem"):
            apply(tmp_path)
        assert (tmp_path / "moved").read_bytes() == b"stay"
    finally:
        subprocess.run(["umount", str(tmp_path / top)])


def test_default_workers_follow_the_filesystem(tmp_path: Path, fast_tmp: Path) -> None:
    from manyfiles.shard.scan import default_workers

    for path in (tmp_path, fast_tmp):
        fstype = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout
        assert default_workers(os.fsencode(path)) == (1 if fstype.strip() in ("tmpfs", "ramfs") else 4)


# -- conventions: arguments checked first, shared progress and reports, plans ---------------------


_COMMON_BAD = [{"progress": "yes"}, {"progress": 3}, {"workers": 0}, {"workers": "4"}, {"journal_sync": "no"}]
_BAD_ARGS = ([("apply", bad) for bad in [*_COMMON_BAD, {"layout": "2:2"}, {"plan": "moves.csv"}]]
             + [("revert", bad) for bad in _COMMON_BAD]
             + [("reshard", bad) for bad in [*_COMMON_BAD, {"layout": (1,)}]]
             + [("verify", bad) for bad in [{"progress": "yes"}, {"expected": "10"}]])


@pytest.mark.parametrize(("call", "bad"), _BAD_ARGS, ids=[f"{c}-{b}" for c, b in _BAD_ARGS])
def test_bad_arguments_are_refused_before_anything_moves(tmp_path: Path, call: str, bad: dict) -> None:
    ops = {"apply": apply, "revert": revert, "reshard": reshard, "verify": verify}
    root = make_dataset(tmp_path / "d", 30, edge=False, symlinks=False)
    if call != "apply":
        apply(root, Layout(levels=(1,)))
    kwargs = dict(bad)
    if call == "reshard" and "layout" not in bad:
        kwargs["layout"] = Layout(levels=(2,))
    before, names = snapshot(root), top_level(root)
    with pytest.raises(UsageError):
        ops[call](root, **kwargs)
    assert snapshot(root) == before and top_level(root) == names  # no lock, journal or bucket made


def test_progress_true_shows_a_display_and_moves_everything(tmp_path: Path, capsys) -> None:
    # issue 12: progress=True used to raise TypeError ('bool' object is not callable) after files moved
    root = make_dataset(tmp_path / "d", 300)
    before = snapshot(root)
    rep = apply(root, workers=2, progress=True)
    assert rep.ok and rep.moved == len(before)
    assert_sharded_clean(root, before)
    assert verify(root, progress=True).ok
    assert revert(root, progress=True).ok
    assert_flat_clean(root, before)
    err = capsys.readouterr().err.splitlines()  # no terminal here: one plain line at the end of each
    assert [line.split(":")[0] for line in err if line.endswith("[done]")] == [
        "shard apply", "shard verify", "shard revert"]


def test_progress_callable_gets_snapshots_of_files(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 500, edge=False, symlinks=False)
    seen: list[Snapshot] = []
    apply(root, workers=3, progress=seen.append)
    assert seen[-1].finished and seen[-1].done == seen[-1].total == 500 and seen[-1].unit == "files"


def test_progress_counts_the_files_set_aside_once(tmp_path: Path) -> None:
    # files named like a top bucket ("ab") step aside before the buckets exist: the display counts
    # them once, as every other file, both ways (done = total = files moved)
    root = make_dataset(tmp_path / "d", 500)
    for op in (apply, revert):
        seen: list[Snapshot] = []
        rep = op(root, workers=3, progress=seen.append)
        assert rep.ok and rep.set_aside == 4
        assert seen[-1].finished and seen[-1].done == seen[-1].total == rep.moved, op.__name__


def test_revert_of_a_flat_folder_is_nothing_to_do(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 5, edge=False, symlinks=False)
    rep = revert(root)
    assert rep.ok and rep.nothing_to_do and rep.moved == 0
    assert str(rep) == f"{root}: not sharded; nothing to do"
    assert top_level(root) == {b"f%07d" % i for i in range(5)}


def test_files_that_keep_appearing_are_left_flat_and_counted(fast_tmp: Path) -> None:
    root = make_dataset(fast_tmp / "d", 200, edge=False, symlinks=False)
    made: list[str] = []

    def writer(snap: Snapshot) -> None:  # a writer that never stops adding files
        if not snap.finished:
            for _ in range(3):
                made.append(f"late{len(made)}")
                (root / made[-1]).write_bytes(b"x")

    rep = apply(root, workers=2, progress=writer)
    flat = {n for n in top_level(root) if not n.startswith(b".manyfiles")} - {
        n for n in top_level(root) if (root / os.fsdecode(n)).is_dir()}
    assert rep.ok and rep.left_flat == len(flat) > 0 and rep.appeared > 0
    assert f"{rep.left_flat:,} left flat" in rep.summary()
    assert rep.moved + rep.left_flat == 200 + len(made)
    assert apply(root).moved == rep.left_flat and verify(root, expected=200 + len(made)).ok


def test_a_plan_executes_exactly_its_moves(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 300)
    p = plan(root, Layout(levels=(1, 1)))
    assert str(p).startswith(f"plan for {root} (levels 1:1") and "Plan" in p._repr_html_()
    (root / "after-the-plan").write_bytes(b"not reviewed")  # not in the plan: stays where it is
    rep = p.execute(workers=2)
    assert rep.ok and rep.moved == len(p.moves) and rep.left_flat == 1
    assert (root / "after-the-plan").read_bytes() == b"not reviewed"
    sd = ShardedDir(root)
    assert sd.layout == Layout(levels=(1, 1))
    assert all(os.path.lexists(sd.path_for(name)) for name, _ in p.moves)
    assert apply(root).moved == 1 and verify(root).ok
    again = p.execute()  # the same plan again: everything it names is in place already
    assert again.ok and again.nothing_to_do and again.moved == 0


def test_a_stale_plan_moves_nothing(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 50, edge=False, symlinks=False)
    p = plan(root)
    apply(root, Layout(levels=(1,)))  # someone sharded it meanwhile, with other levels
    before = snapshot(root)
    with pytest.raises(UsageError, match="layout changed since the plan"):
        apply(plan=p)
    assert snapshot(root) == before
    # the same path, another directory
    p = plan(root)
    os.rename(root, tmp_path / "old")
    make_dataset(root, 5, edge=False, symlinks=False)
    with pytest.raises(UsageError, match="not the directory this plan was made for"):
        p.execute()
    assert top_level(root) == {b"f%07d" % i for i in range(5)}
    with pytest.raises(UsageError, match="the plan is for"):
        apply(tmp_path, plan=p)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mkfs.ext4"),
                    reason="needs root, unshare and mkfs.ext4 to mount a failing loop device")
def test_write_back_error_keeps_the_journal(shard_bin: str) -> None:
    # A real filesystem whose write-back fails: ext4 on a loop device whose backing file sits on a
    # 4 MiB tmpfs, with 20 MiB of dirty file data.  syncfs(2) then reports the error: before the
    # fix it was ignored, the journal deleted and the run reported success.
    r = subprocess.run(["unshare", "-m", sys.executable, "-c", _FAILING_DISK, shard_bin],
                       capture_output=True, text=True, timeout=120)
    if r.returncode == 99:
        pytest.skip(f"cannot mount a loop device here: {r.stderr.strip()[-200:]}")
    result = json.loads(r.stdout)
    assert result["code"] == 1, result
    assert "while flushing the moves to disk; the journal is kept" in result["stderr"]
    assert len(result["stderr"].splitlines()) == 1
    assert result["ours"] == [".manyfiles-shard.journal", ".manyfiles-shard.json"]  # lock released


_FAILING_DISK = """
import json, os, subprocess, sys, tempfile
d = tempfile.mkdtemp(prefix="mf-eio-")
small, mnt = os.path.join(d, "small"), os.path.join(d, "mnt")
os.mkdir(small); os.mkdir(mnt)
try:
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", small], check=True)
        img = os.path.join(small, "disk.img")
        subprocess.run(["truncate", "-s", "64M", img], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-E", "nodiscard", img], check=True)
        subprocess.run(["mount", "-o", "loop", img, mnt], check=True, capture_output=True)
    except subprocess.CalledProcessError as exc:
        print(exc, file=sys.stderr); sys.exit(99)
    root = os.path.join(mnt, "data")
    os.mkdir(root)
    for i in range(20):
        with open(os.path.join(root, "f%03d" % i), "wb") as f:
            f.write(os.urandom(1 << 20))
    r = subprocess.run([sys.argv[1], "apply", root, "-q"], capture_output=True, text=True)
    print(json.dumps({"code": r.returncode, "stderr": r.stderr,
                      "ours": sorted(n for n in os.listdir(root) if n.startswith(".manyfiles"))}))
finally:
    for m in (mnt, small):
        subprocess.run(["umount", m], capture_output=True)
    os.rmdir(mnt); os.rmdir(small); os.rmdir(d)
"""


def test_bucket_scans_list_bucket_directories_only(tmp_path: Path) -> None:
    """verify and revert's scan run in the C walker, which enters only directories named like
    buckets: a foreign directory (and the files below it) is seen in the root's listing and
    reported, never listed itself.  Before issue 10 every subdirectory was walked, then skipped."""
    from manyfiles import trace

    root = tmp_path / "d"
    make_dataset(root, 300)
    assert apply(root).ok
    (root / "foreign" / "ab" / "cd").mkdir(parents=True)  # bucket-like names below a foreign name
    for i in range(50):
        (root / "foreign" / "ab" / "cd" / f"x{i}").touch()
    log = tmp_path / "scan.mftrace"
    with mf.tracing(log):
        rep = verify(root)
        status_flat = mf.shard.status(root).flat_files
        rev = revert(root)
    assert rep.ok and rep.foreign == [b"foreign"] and status_flat == 0
    assert rev.ok and (root / "foreign" / "ab" / "cd" / "x0").exists()
    listed = {r.path for r in trace.load([log]).records() if r.op == "getdents"}
    assert listed and not any(b"/foreign" in p for p in listed), sorted(p for p in listed if b"foreign" in p)


def test_revert_and_reshard_dry_runs_count_and_move_nothing(tmp_path: Path) -> None:
    root = make_dataset(tmp_path / "d", 200)
    before = snapshot(root)
    rep = revert(root, dry_run=True)
    assert rep.dry_run and rep.nothing_to_do and rep.moved == 0           # flat: nothing to revert
    with pytest.raises(ManyfilesError, match="not sharded"):
        reshard(root, Layout(levels=(1,)), dry_run=True)
    assert apply(root).ok
    listing = sorted(os.walk(root))
    rep = revert(root, dry_run=True)
    assert (rep.dry_run, rep.planned, rep.moved, rep.ok) == (True, len(before), 0, True)
    assert "would move back" in rep.summary()
    rep = reshard(root, Layout(levels=(1,)), dry_run=True)
    assert (rep.planned, rep.layout) == (len(before), Layout(levels=(1,)))
    assert reshard(root, Layout(), dry_run=True).nothing_to_do            # the same layout
    with pytest.raises(UsageError, match="new layout"):
        reshard(root, None, dry_run=True)
    assert sorted(os.walk(root)) == listing                                 # nothing moved
    assert_sharded_clean(root, before)
