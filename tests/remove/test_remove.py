"""manyfiles.remove_tree / purge on real trees (library level).

Every test runs on both engines: the C walker (where the core is built: the default) and the
Python engine (what runs without the core), which the tests choose as a build without the C
removal walk would (``faults.python_remove_engine``).  Both must give the same results.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import faults
import manyfiles as mf
import manyfiles.remove
from globcases import NAMES, PATTERNS, expected, selects
from manyfiles._core import fsops as _fsops
from manyfiles._core.progress import Snapshot
from manyfiles.errors import UsageError
from manyfiles.remove import _walker
from privileges import not_root_cmd
from procstate import fds_into

ENGINES = ["c", "python"] if _walker.NATIVE else ["python"]
if os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") == "1":
    assert _walker.NATIVE, "the C core (with remove_tree) must be built"


@pytest.fixture(autouse=True, params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Which removal engine the test runs on (``engine_setup`` gives it to a subprocess)."""
    if request.param == "python":
        request.addfinalizer(faults.python_remove_engine())
    return request.param


def engine_setup(engine: str) -> str:
    """Python statements that make a ``python -c`` subprocess use ``engine``."""
    if engine == "c":
        return "pass"
    return (f"import sys; sys.path.insert(0, {os.path.dirname(faults.__file__)!r}); "
            "import faults; faults.python_remove_engine()")


def make_tree(root: Path, n: int, levels: int = 2) -> tuple[int, int]:
    """``n`` empty files in an md5 ``ab/cd/name`` tree; returns (files, directories below root)."""
    dirs: set[str] = set()
    for i in range(n):
        name = f"f{i:06d}"
        h = hashlib.md5(name.encode()).hexdigest()
        parts = [h[2 * k : 2 * k + 2][:1] for k in range(levels)]  # 16-way to keep dirs small
        for k in range(1, levels + 1):
            dirs.add("/".join(parts[:k]))
        d = root.joinpath(*parts)
        d.mkdir(parents=True, exist_ok=True)
        (d / name).touch()
    return n, len(dirs)


def all_paths(root: Path) -> set[str]:
    out = {os.fsdecode(root)}
    for dirpath, dirnames, filenames in os.walk(root):
        out.update(os.path.join(dirpath, n) for n in dirnames + filenames)
    return out


@pytest.mark.parametrize("workers", [1, 4])
def test_remove_tree_removes_everything_and_counts(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "tree"
    files, dirs = make_tree(root, 600)
    (root / "top-file").touch()
    report = mf.remove_tree(root, workers=workers)
    assert not root.exists()
    assert report.ok and report.failures == []
    assert report.files == files + 1
    assert report.dirs == dirs + 1  # + the argument itself
    assert report.bytes is None  # nothing is stat'ed, so sizes are unknown
    assert os.listdir(tmp_path) == []


def test_flat_directory_many_workers(tmp_path: Path) -> None:
    root = tmp_path / "flat"
    root.mkdir()
    for i in range(12_000):  # above the inode-sort threshold
        (root / f"x{i}").touch()
    report = mf.remove_tree(str(root), workers=8)
    assert (report.files, report.dirs, report.failures) == (12_000, 1, [])
    assert not root.exists()


def test_symlinks_are_removed_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "precious").write_text("keep me")
    (outside / "sub" / "also").write_text("keep me too")
    tree = tmp_path / "tree"
    (tree / "d").mkdir(parents=True)
    (tree / "d" / "to-dir").symlink_to(outside)
    (tree / "to-file").symlink_to(outside / "precious")
    (tree / "dangling").symlink_to(tmp_path / "nowhere")
    (tree / "loop").symlink_to(tree)
    report = mf.remove_tree(tree, workers=3)
    assert report.ok, report.failures
    assert not tree.exists()
    assert (outside / "precious").read_text() == "keep me"
    assert (outside / "sub" / "also").read_text() == "keep me too"
    assert report.files == 4


@pytest.mark.parametrize("spelling", ["link", "link/", "link//"])
def test_argument_symlink_to_directory_removes_only_the_link(tmp_path: Path, spelling: str) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "data").write_text("x")
    (tmp_path / "link").symlink_to(target)
    report = mf.remove_tree(os.path.join(tmp_path, spelling))
    assert report.ok
    assert not os.path.lexists(tmp_path / "link")
    assert (target / "data").read_text() == "x"


def test_dry_run_removes_nothing_and_lists_what_would_go(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 200)
    before = all_paths(root)
    listed: list[str] = []
    report = mf.remove_tree(root, dry_run=True, on_removed=listed.extend)
    assert all_paths(root) == before
    assert set(listed) == before and len(listed) == len(before)
    assert report.dry_run and report.files + report.dirs == len(before)
    # the real run removes exactly what the dry run listed
    removed: list[str] = []
    real = mf.remove_tree(root, on_removed=removed.extend)
    assert sorted(removed) == sorted(listed)
    assert (real.files, real.dirs) == (report.files, report.dirs)


def test_removed_paths_come_deepest_first(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 300, levels=3)
    order: list[str] = []
    mf.remove_tree(root, workers=4, on_removed=order.extend)
    position = {p: i for i, p in enumerate(order)}
    for p, i in position.items():
        parent = os.path.dirname(p)
        if parent in position:  # every entry goes before its directory
            assert i < position[parent], (p, parent)


def test_purge_removes_matches_only(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "a" / "cache.tmp" / "deep").mkdir(parents=True)
    (root / "a" / "cache.tmp" / "deep" / "x.bin").touch()
    (root / "a" / "one.tmp").touch()
    (root / "a" / "one.txt").touch()
    (root / "two.tmp").touch()
    (root / "b").mkdir()
    report = mf.purge(root, "*.tmp")
    assert report.ok
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [".", "a", "a/one.txt", "b"]
    assert (report.files, report.dirs) == (3, 2)  # x.bin one.tmp two.tmp / deep cache.tmp


def test_glob_with_slash_matches_relative_path_and_exclude_keeps(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for rel in ["logs/a.log", "logs/keep.log", "other/a.log", "a.log"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    report = mf.remove_tree(root, include=["logs/*.log"], exclude=["keep*"])
    assert report.ok and report.files == 1
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [
        ".",
        "a.log",
        "logs",
        "logs/keep.log",
        "other",
        "other/a.log",
    ]


def test_exclude_keeps_entries_and_their_ancestors_without_errors(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 100)
    keep = root / "0" / "keep.me"
    keep.parent.mkdir(exist_ok=True)
    keep.write_text("k")
    (root / "kept-dir").mkdir()
    (root / "kept-dir" / "inside").touch()
    report = mf.remove_tree(root, exclude=["keep.me", "kept-dir"])
    assert report.ok, report.failures  # ancestors staying is not an error
    assert report.kept == 2
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [
        ".",
        "0",
        "0/keep.me",
        "kept-dir",
        "kept-dir/inside",
    ]


def test_rmdir_retries_when_a_writer_adds_entries(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    hot = root / "hot"
    hot.mkdir(parents=True)
    for i in range(5):
        (hot / f"f{i}").touch()
    added: list[str] = []

    def writer(batch: list[str]) -> None:
        # a concurrent writer: once hot's files are gone (before its rmdir), add more
        if not added and any(p.startswith(str(hot) + "/") for p in batch):
            (hot / "late").touch()
            (hot / "late-dir").mkdir()
            (hot / "late-dir" / "x").touch()
            added.append("yes")

    report = mf.remove_tree(root, workers=2, on_removed=writer)
    assert added and report.retries >= 1
    assert report.ok, report.failures
    assert not root.exists()
    assert report.files == 7 and report.dirs == 3


def test_rmdir_gives_up_after_retries_with_a_clear_reason(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    hot = root / "hot"
    hot.mkdir(parents=True)
    (hot / "f").touch()
    counter = iter(range(1_000_000))

    def writer(batch: list[str]) -> None:  # a writer that never stops
        if any(p.startswith(str(hot) + "/") for p in batch):
            (hot / f"new{next(counter)}").touch()

    report = mf.remove_tree(root, retries=2, on_removed=writer)
    assert [f.path for f in report.failures] == [str(hot)]  # the ancestor is not reported again
    assert "Directory not empty" in report.failures[0].reason
    assert "new" in report.failures[0].reason
    assert report.retries == 2
    assert root.exists() and hot.exists()
    with pytest.raises(mf.errors.PartialFailure):
        report.raise_for_failures()


def test_permission_denied_deep_in_tree_rest_still_removed(tmp_path: Path, engine: str) -> None:
    root = tmp_path / "tree"
    make_tree(root, 300)
    locked = root / "deep" / "locked"
    locked.mkdir(parents=True)
    (locked / "a").touch()
    (locked / "b").touch()
    (root / "deep" / "sibling").touch()
    locked.chmod(0o555)
    code = (
        "import json, sys, manyfiles as mf; exec(sys.argv[2]); "
        "r = mf.remove_tree(sys.argv[1], workers=4); "
        "print(json.dumps({'files': r.files, 'failures': [[f.path, f.code] for f in r.failures]}))"
    )
    try:
        out = subprocess.run(
            [*not_root_cmd(), sys.executable, "-c", code, str(root), engine_setup(engine)],
            capture_output=True,
            check=True,
            timeout=120,
        )
    finally:
        locked.chmod(0o755)
    result = json.loads(out.stdout)
    assert sorted(result["failures"]) == [[str(locked / "a"), "EACCES"], [str(locked / "b"), "EACCES"]]
    assert result["files"] == 301
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [
        ".",
        "deep",
        "deep/locked",
        "deep/locked/a",
        "deep/locked/b",
    ]


def test_non_utf8_and_newline_names(tmp_path: Path) -> None:
    root = os.fsencode(tmp_path / "odd")
    os.mkdir(root)
    names = [b"bad\xff\xfe", b"new\nline", b"tab\there", b" space ", b"-rf", b"\xe9t\xe9"]
    os.mkdir(os.path.join(root, b"dir\nwith\xffnewline"))
    for n in names:
        open(os.path.join(root, n), "wb").close()
        open(os.path.join(root, b"dir\nwith\xffnewline", n), "wb").close()
    seen: list[str] = []
    report = mf.remove_tree(root, on_removed=seen.extend)
    assert report.ok and report.files == 2 * len(names) and report.dirs == 2
    assert not os.path.exists(root)
    assert os.path.join(root, b"new\nline") in {os.fsencode(p) for p in seen}


def test_deeper_than_path_max(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    name = "d" * 100
    for _ in range(60):  # 60 x 101 bytes: well over PATH_MAX (4096)
        os.mkdir(name, dir_fd=fd)
        os.close(os.open("file", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    report = mf.remove_tree(root, workers=2)
    assert report.ok, report.failures[:1]
    assert (report.files, report.dirs) == (60, 61)
    assert not root.exists()


def test_missing_argument_is_reported_and_others_still_go(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").touch()
    (tmp_path / "f").touch()
    report = mf.remove_tree([tmp_path / "missing", tmp_path / "a", tmp_path / "f"])
    assert [(f.path, f.code) for f in report.failures] == [(str(tmp_path / "missing"), "ENOENT")]
    assert os.listdir(tmp_path) == []
    assert mf.remove_tree(tmp_path / "missing", missing_ok=True).ok


@pytest.mark.parametrize("path", ["/", "//", "/tmp/..", ".", "x/.."])
def test_refuses_root_and_dot(path: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        mf.remove_tree(path, dry_run=True)
    with pytest.raises(UsageError):  # forcing does not make '/' acceptable
        mf.remove_tree(path, dry_run=True, force_root=True)


def test_progress_callback_sees_growing_counts(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 300)
    seen: list[Snapshot] = []
    report = mf.remove_tree(root, workers=2, progress=seen.append)
    assert seen, "the final snapshot is always delivered"
    last = seen[-1]
    assert last.finished and last.done == report.files + report.dirs and last.total >= last.done
    assert last.unit == "entries" and last.task == "remove"
    assert all(a.done <= b.done for a, b in itertools.pairwise(seen))


def test_progress_true_works_without_a_terminal(tmp_path: Path, engine: str) -> None:
    make_tree(tmp_path / "tree", 50)
    code = ("import sys, manyfiles as mf; exec(sys.argv[2]); "
            "print(mf.remove_tree(sys.argv[1], progress=True).files)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tree"), engine_setup(engine)],
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "50" and not (tmp_path / "tree").exists()
    assert out.stderr.strip().endswith("[done]")  # one plain line at the end, no escape codes
    assert "\x1b" not in out.stderr


@pytest.mark.parametrize(
    "bad",
    [{"progress": "yes"}, {"workers": 0}, {"workers": "8"}, {"retries": -1}, {"include": 5},
     {"exclude": [b"*.tmp"]}, {"on_removed": "out.txt"}, {"output": "out.txt"}, {"output": -1},
     {"output": 1, "on_removed": print}, {"output": 1, "sep": "\n"}, {"output": 1, "sep": b"\r\n"}],
)
def test_bad_arguments_are_refused_before_anything_is_removed(tmp_path: Path, bad: dict) -> None:
    root = tmp_path / "tree"
    make_tree(root, 30)
    before = all_paths(root)
    with pytest.raises(UsageError):
        mf.remove_tree(root, **bad)
    assert all_paths(root) == before


@pytest.mark.parametrize("workers", [1, 4])
def test_ctrl_c_stops_and_releases_every_directory_fd(tmp_path: Path, workers: int) -> None:
    root = tmp_path / "tree"
    make_tree(root, 2000, levels=3)
    assert fds_into(tmp_path) == {}  # (the rest of the process opens and closes fds of its own)
    calls = []

    def interrupt(snap: Snapshot) -> None:  # progress runs in the waiting thread: Ctrl-C lands there
        calls.append(snap)
        if len(calls) == 2:
            raise KeyboardInterrupt

    def slowly(batch: list[str]) -> None:  # keeps the run going for seconds, so Ctrl-C lands mid-way
        time.sleep(0.002)

    with pytest.raises(KeyboardInterrupt):
        mf.remove_tree(root, workers=workers, progress=interrupt, on_removed=slowly)
    assert fds_into(tmp_path) == {}
    assert root.exists()  # interrupted part-way...
    report = mf.remove_tree(root)  # ...and the same call finishes the job
    assert report.ok and not root.exists()


def test_dry_run_is_a_plan_that_executes(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for rel in ["a/x.tmp", "a/y.txt", "b/c.tmp/inner", "d.tmp"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    before = all_paths(root)
    listed: list[str] = []
    plan = mf.remove.plan(root, include=["*.tmp"], on_removed=listed.extend)
    assert isinstance(plan, mf.remove.RemovePlan) and plan.dry_run
    assert all_paths(root) == before
    assert (plan.files, plan.dirs) == (3, 1)
    assert str(plan).startswith("would remove 3 files and 1 directories")
    removed: list[str] = []
    report = plan.execute(workers=2, on_removed=removed.extend)
    assert report.ok and not report.dry_run and sorted(removed) == sorted(listed)
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [".", "a", "a/y.txt", "b"]
    # remove_tree(dry_run=True) is the same plan
    again = mf.remove_tree(root / "a", dry_run=True)
    assert isinstance(again, mf.remove.RemovePlan) and (again.files, again.dirs) == (1, 1)


def test_a_stale_plan_does_not_remove_what_replaced_its_target(tmp_path: Path) -> None:
    old, new = tmp_path / "run", tmp_path / "run.new"
    make_tree(old, 20)
    (tmp_path / "file").write_text("planned")
    plan = mf.remove.plan([old, tmp_path / "file"])
    os.rename(old, tmp_path / "run.old")  # the argument now names another directory...
    new.mkdir()
    (new / "precious").write_text("keep")
    os.rename(new, old)
    (tmp_path / "file.new").write_text("new")  # ...and the file another file
    os.replace(tmp_path / "file.new", tmp_path / "file")
    report = plan.execute()
    assert sorted((os.path.basename(f.path), f.code) for f in report.failures) == [("file", "ESTALE"),
                                                                                    ("run", "ESTALE")]
    assert (old / "precious").read_text() == "keep" and (tmp_path / "file").read_text() == "new"
    assert (tmp_path / "run.old").exists()  # the planned directory is elsewhere now: not followed


def test_report_follows_the_shared_conventions(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    make_tree(root, 10)
    report = mf.remove_tree(root, dry_run=True)
    d = report.to_dict()
    assert d["ok"] is True and d["files"] == 10 and d["dry_run"] is True
    assert d["summary"].startswith("would remove 10 files")
    assert "RemovePlan" in report._repr_html_()
    missing = mf.remove_tree(tmp_path / "nope")
    with pytest.raises(mf.PartialFailure) as info:
        missing.raise_for_failures()
    assert info.value.report is missing and info.value.failures[0].code == "ENOENT"
    assert str(missing).splitlines()[1] == f"  {tmp_path / 'nope'}: No such file or directory"


def test_unlink_nondir_primitive(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "f").touch()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _fsops.unlink_nondir("d", dir_fd=fd) is False  # EISDIR: recurse, not an error
        assert _fsops.unlink_nondir("f", dir_fd=fd) is True
        with pytest.raises(FileNotFoundError):
            _fsops.unlink_nondir("f", dir_fd=fd)
        (tmp_path / "l").symlink_to(tmp_path / "d")
        with pytest.raises(OSError):
            os.close(_fsops.open_dir("l", dir_fd=fd))  # O_NOFOLLOW
    finally:
        os.close(fd)
    assert (tmp_path / "d").is_dir() and not (tmp_path / "f").exists()


def test_output_fd_lists_every_entry_before_its_directory(tmp_path: Path) -> None:
    """``output=``: the walker's threads write the paths themselves (NUL-ended here), and the
    file still reads as a log of the removal: nothing appears before what was inside it."""
    root = tmp_path / "tree"
    make_tree(root, 400, levels=3)
    before = all_paths(root)
    out = tmp_path / "removed"
    with open(out, "wb") as f:
        f.write(b"header\0")  # a file object's buffer is flushed before the threads write
        report = mf.remove_tree(root, workers=4, output=f, sep=b"\0")
    order = [os.fsdecode(p) for p in out.read_bytes().split(b"\0")[:-1]]
    assert order[0] == "header" and set(order[1:]) == before and len(order) == len(before) + 1
    assert report.files + report.dirs == len(before)
    position = {p: i for i, p in enumerate(order)}
    for p, i in position.items():
        parent = os.path.dirname(p)
        if parent in position:
            assert i < position[parent], (p, parent)


def table_selection(root: bytes, pattern: str | bytes, exclude: bool) -> set[bytes]:
    """What fastrm must pick from ``table_tree`` by the oracle (fnmatch.fnmatchcase): with
    ``--glob`` the matching entries (a matching directory whole); with ``--exclude`` all but
    the matching ones and their ancestors."""
    sub = os.path.join(root, b"sub")
    top, deep, sub_hit = expected(pattern), expected(pattern, under=b"sub"), selects(pattern, b"sub")
    if not exclude:
        whole = {sub} | {os.path.join(sub, n) for n in NAMES}
        below = whole if sub_hit else {os.path.join(sub, n) for n in deep}
        return {os.path.join(root, n) for n in top} | below
    if selects(pattern, os.path.basename(root)):
        return set()  # the argument itself is excluded: kept whole
    out = {os.path.join(root, n) for n in NAMES if n not in top}
    if not sub_hit:
        out |= {os.path.join(sub, n) for n in NAMES if n not in deep} | ({sub} if not deep else set())
    return out | ({root} if not (top or deep or sub_hit) else set())


def test_glob_table_selects_like_fnmatch(table_tree: bytes) -> None:
    """One glob rule set: every pattern of the parity table (fastls and s3pull run the same one)
    selects in fastrm's dry run exactly what fnmatch.fnmatchcase selects, as --glob and --exclude."""
    for pattern in PATTERNS:
        for exclude in (False, True):
            listed: list[str] = []
            option = {"exclude" if exclude else "include": os.fsdecode(pattern)}
            plan = mf.remove.plan(table_tree, on_removed=listed.extend, **option)
            got = [os.fsencode(p) for p in listed]
            assert sorted(got) == sorted(table_selection(table_tree, pattern, exclude)), (pattern, exclude)
            assert plan.files + plan.dirs == len(got)


def test_slash_patterns_match_the_relative_path_and_the_others_the_name(tmp_path: Path) -> None:
    """Mixed lists: a pattern with '/' is matched against the path below the argument, the others
    against the name (before issue 10, one '/' pattern made every pattern match the path)."""
    root = tmp_path / "data"
    for rel in ["logs/a.log", "logs/keep.log", "keep.log", "x/logs/a.log", "b.tmp"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).touch()
    report = mf.remove_tree(root, include=["logs/*.log", "*.tmp"], exclude=["keep*"])
    assert report.ok and report.files == 2 and report.kept == 2
    assert sorted(os.path.relpath(p, root) for p in all_paths(root)) == [
        ".", "keep.log", "logs", "logs/keep.log", "x", "x/logs", "x/logs/a.log"]


def test_unknown_d_type_is_handled_like_a_known_one(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """As on sshfs / NFSv3 (every d_type DT_UNKNOWN): a plain removal learns the directories from
    unlink's EISDIR, a dry run and a filtered one look (fstatat); the results are the same."""
    request.addfinalizer(faults.fake_dtype(0))
    root = tmp_path / "tree"
    files, dirs = make_tree(root, 200, levels=3)
    (root / "0" / "a.tmp").mkdir(parents=True, exist_ok=True)
    (root / "0" / "a.tmp" / "inside").touch()
    (root / "b.tmp").symlink_to(root / "0")
    plan = mf.remove.plan(root, include="*.tmp")
    assert (plan.files, plan.dirs) == (2, 1)
    assert plan.execute().ok and (root / "0").is_dir() and not (root / "b.tmp").exists()
    dry = mf.remove.plan(root)
    assert (dry.files, dry.dirs) == (files, dirs + 1) and root.exists()
    report = mf.remove_tree(root, workers=3)
    assert report.ok and (report.files, report.dirs) == (files, dirs + 1) and not root.exists()


def test_nfs_silly_renames_are_named_in_the_reason(tmp_path: Path) -> None:
    """An NFS client renames a deleted-but-open file to .nfsXXXX, which stays until the last
    opener closes it: the rmdir's failure says so (after the retries)."""
    root = tmp_path / "tree"
    (root / "job").mkdir(parents=True)
    (root / "job" / "ckpt").touch()
    counter = itertools.count()

    def nfs_client(batch: list[str]) -> None:  # a file that keeps being silly-renamed
        if any(p.startswith(str(root / "job") + "/") for p in batch):
            (root / "job" / f".nfs0000000000{next(counter):04d}").touch()

    report = mf.remove_tree(root, retries=1, on_removed=nfs_client)
    assert [f.path for f in report.failures] == [str(root / "job")]
    assert report.failures[0].code == "ENOTEMPTY"
    # ckpt's removal made .nfs...0000, the retry's cleaning removed it and made ...0001: that one stays
    assert report.failures[0].reason == (
        "Directory not empty (NFS silly-renamed files still open: .nfs00000000000001)")
    assert report.retries == 1 and sorted(os.listdir(root / "job")) == [".nfs00000000000001"]


def test_a_directory_swapped_for_a_symlink_after_listing_is_not_entered(tmp_path: Path) -> None:
    """Between the listing of a directory and its opening, someone moves it away and puts a symlink
    to precious data in its place: the symlink is removed, never followed (O_NOFOLLOW open)."""
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep")
    root = tmp_path / "tree"
    (root / "d").mkdir(parents=True)
    (root / "d" / "inner").write_text("x")
    (root / "a").touch()
    swapped: list[str] = []

    def swap(batch: list[str]) -> None:  # runs before the worker goes on to open d
        if not swapped:
            os.rename(root / "d", tmp_path / "d-moved")
            (root / "d").symlink_to(precious)
            swapped.append("yes")

    report = mf.remove_tree(root, workers=1, on_removed=swap)
    assert swapped and report.ok, report.failures
    assert not root.exists() and (precious / "data").read_text() == "keep"
    assert (tmp_path / "d-moved" / "inner").read_text() == "x"


def test_each_engine_removes_in_its_own_worker_threads(tmp_path: Path, engine: str) -> None:
    """Where the core is built, every unlink and rmdir happens in the C walker's native threads
    (no Python call per file); the Python engine uses its pool's threads.  The I/O log (--trace)
    attributes each call to the thread that made it (kernel tid and name)."""
    from manyfiles import trace

    root = tmp_path / "tree"
    files, dirs = make_tree(root, 500)
    log = tmp_path / "rm.mftrace"
    with mf.tracing(log):
        report = mf.remove_tree(root, workers=4)
    assert report.ok and not root.exists()
    ts = trace.load([log])
    names = ts.thread_names()
    # (the argument's parent is opened first, by the calling thread)
    records = [r for r in ts.records() if r.path != os.fsencode(tmp_path)]
    by_op: dict[str, set[str]] = {}
    for r in records:
        by_op.setdefault(r.op, set()).add(names[r.pid, r.tid].rstrip("0123456789"))
    workers = "manyfiles-walker-" if engine == "c" else "fastrm-"
    assert by_op == {op: {workers} for op in ("open", "getdents", "unlink", "rmdir")}
    assert sum(1 for r in records if r.op == "unlink") == files
    assert sum(1 for r in records if r.op == "rmdir") == dirs + 1
