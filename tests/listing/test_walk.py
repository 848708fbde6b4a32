"""The tree walker (C threads and the Python fallback) against os.walk on real trees.

Every check runs on the C walker with 1 and 4 threads and on the single-threaded
os.scandir fallback: same listings, same errors, same filters.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import threading
from pathlib import Path

import pytest

import faults
import manyfiles as mf
from manyfiles import fastls, listing
from manyfiles.errors import PartialFailure
from manyfiles.listing import DirDone, DirListing, Filter, _fastls_core
from manyfiles.listing._directory import _dents
from manyfiles.trace import iotrace
from procstate import fds_into, threads_named

HAVE_C = _dents is not None
# (backend, threads)
WALKERS = ([("dents", 1), ("dents", 4)] if HAVE_C else []) + [("scandir", 1), ("getdents", 1)]
ODD = [b"plain", b"with\nnewline", b"bad\xff\xfebytes", b"caf\xc3\xa9", b"tab\there", b"q\"uote\\",
       b"ctl\x01\x7f", b"smile\xf0\x9f\x99\x82", b"n" * 255]


def make_tree(root: Path, fanout: int = 3, depth: int = 3) -> None:
    """Directories `d<j>` `fanout` wide and `depth` deep, each with the ODD file names, a
    symlink to a file and a dangling one."""
    broot = os.fsencode(root)

    def fill(d: bytes, level: int) -> None:
        for n in ODD:
            with open(os.path.join(d, n), "wb"):
                pass
        os.symlink(b"plain", os.path.join(d, b"link"))
        os.symlink(b"/nonexistent", os.path.join(d, b"dangling"))
        if level < depth:
            for j in range(fanout):
                sub = os.path.join(d, b"d%d" % j)
                os.mkdir(sub)
                fill(sub, level + 1)

    fill(broot, 0)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    make_tree(root)
    return root


def os_walk_paths(root: bytes) -> set[bytes]:
    out = set()
    for top, dirs, files in os.walk(root):
        out.update(os.path.join(top, n) for n in dirs + files)
    return out


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_walk_lists_every_entry_once_like_os_walk(tree: Path, backend: str, threads: int) -> None:
    root = os.fsencode(tree)
    listings = list(mf.walk(root, backend=backend, threads=threads))
    assert all(d.error is None for d in listings)
    assert sorted(d.path for d in listings) == sorted(top for top, _, _ in os.walk(root))
    paths = list(listing.iter_paths(listings))
    assert len(paths) == len(set(paths)) and set(paths) == os_walk_paths(root)
    types = {os.path.join(d.path, e.name): e.type for d in listings for e in d.entries}
    assert types[os.path.join(root, b"d0")] == "d" and types[os.path.join(root, b"link")] == "l"
    assert types[os.path.join(root, b"d1", b"plain")] == "f"
    inode = next(e.inode for d in listings if d.path == root for e in d.entries if e.name == b"plain")
    assert inode == os.lstat(os.path.join(root, b"plain")).st_ino


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_path_types_follow_the_root(tree: Path, backend: str, threads: int) -> None:
    for root, kind in ((tree, str), (str(tree), str), (os.fsencode(tree), bytes)):
        listings = list(mf.walk(root, backend=backend, threads=threads, max_depth=1))
        assert {type(d.path) for d in listings} == {kind}, root
        assert {type(e.name) for d in listings for e in d.entries} == {kind}
        assert str(tree) in {os.fsdecode(d.path) for d in listings}  # the root as given, not a Path


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_max_depth_min_depth_prune_and_descend(tree: Path, backend: str, threads: int) -> None:
    root = os.fsencode(tree)

    def depths(**kw: object) -> dict[int, int]:
        out: dict[int, int] = {}
        for d in mf.walk(root, backend=backend, threads=threads, **kw):
            out[d.depth] = out.get(d.depth, 0) + 1
        return out

    assert depths() == {0: 1, 1: 3, 2: 9, 3: 27}
    assert depths(max_depth=1) == {0: 1, 1: 3}
    assert depths(max_depth=0) == {0: 1}
    assert depths(min_depth=2) == {2: 9, 3: 27}
    assert depths(prune=["d1"]) == {0: 1, 1: 2, 2: 4, 3: 8}  # no d1 is entered, at any depth
    assert depths(prune=["d1/d2"]) == {0: 1, 1: 3, 2: 8, 3: 24}  # a "/" pattern: the relative path
    assert depths(descend=[["d0"], None, ["d2"]]) == {0: 1, 1: 1, 2: 3, 3: 3}


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_filters_select_entries_not_the_descent(tree: Path, backend: str, threads: int) -> None:
    root = os.fsencode(tree)
    f = Filter(include=("*e*",), exclude=("d*",), types="fl")
    got = set(listing.iter_paths(mf.walk(root, backend=backend, threads=threads, filter=f)))
    want = {p for p in os_walk_paths(root) if f.matches(os.path.basename(p), _letter(p))}
    # 40 directories, each: with\nnewline, bad\xff\xfebytes, caf\xc3\xa9, smile.., dangling (a link)
    assert got == want and len(got) == 40 * 5
    # a "/" pattern is matched against the path relative to the root (and `*` crosses "/")
    rel = Filter(include=("d0/d1/*",))
    got = set(listing.iter_paths(mf.walk(root, backend=backend, threads=threads, filter=rel)))
    assert got == {p for p in os_walk_paths(root) if p.startswith(os.path.join(root, b"d0/d1/"))}


def _letter(path: bytes) -> str:
    return "l" if os.path.islink(path) else "d" if os.path.isdir(path) else "f"


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_symlinks_not_followed_by_default_and_cycles_detected_with_follow(
    tmp_path: Path, backend: str, threads: int
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink("../..", tmp_path / "a" / "b" / "loop")  # back to the root
    os.symlink("b", tmp_path / "a" / "alias")            # a second way into a/b
    (tmp_path / "a" / "b" / "f").touch()
    plain = list(mf.walk(tmp_path, backend=backend, threads=threads))
    want = (tmp_path, tmp_path / "a", tmp_path / "a" / "b")
    assert sorted(d.path for d in plain) == sorted(str(p) for p in want)
    followed = list(mf.walk(tmp_path, backend=backend, threads=threads, follow_symlinks=True))
    errors = [d for d in followed if d.error is not None]
    # a/b is reached twice (as a/b and a/alias) and the root again through loop: two ELOOPs
    assert sorted(e.error.errno for e in errors) == [errno.ELOOP, errno.ELOOP]
    # which of the two ways wins is a race between threads; the loser and the loop are reported
    assert sorted(os.path.realpath(e.error.filename) for e in errors) == sorted(
        [str(tmp_path), str(tmp_path / "a" / "b")])
    assert all(e.error.strerror == "File system loop detected" for e in errors)
    found = set(listing.iter_paths(followed))
    assert len({str(tmp_path / "a" / "b" / "f"), str(tmp_path / "a" / "alias" / "f")} & found) == 1


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_one_filesystem_reports_mount_points_and_does_not_enter(backend: str, threads: int) -> None:
    """/proc is always a separate mount: with one_filesystem it is reported, not listed."""
    listings = {d.path: d for d in mf.walk("/", max_depth=1, one_filesystem=True, backend=backend,
                                          threads=threads)}
    proc = listings["/proc"]
    assert proc.error is not None and proc.error.errno == errno.EXDEV and proc.entries == []
    assert listings["/"].error is None and "proc" in {e.name for e in listings["/"].entries}
    crossing = {d.path: d for d in mf.walk("/", max_depth=1, backend=backend, threads=threads)}
    assert crossing["/proc"].error is None and crossing["/proc"].entries


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_postorder_reports_each_directory_after_everything_below(tree: Path, backend: str,
                                                                  threads: int) -> None:
    events = list(mf.walk(tree, backend=backend, threads=threads, postorder=True))
    listed = [e.path for e in events if isinstance(e, DirListing)]
    done = [e.path for e in events if isinstance(e, DirDone)]
    assert sorted(listed) == sorted(done) and len(done) == 40
    position = {("done" if isinstance(e, DirDone) else "listed", e.path): i for i, e in enumerate(events)}
    for p in done:
        assert position[("listed", p)] < position[("done", p)]
        parent = os.path.dirname(p)
        if parent in done:
            assert position[("done", p)] < position[("done", parent)], p


def test_closing_a_walk_midway_joins_threads_and_closes_fds(tmp_path: Path) -> None:
    """A consumer that stops early (break, or an exception) leaves no fd open and no thread running."""
    for i in range(200):
        d = tmp_path / f"d{i}" / "x" / "y"
        d.mkdir(parents=True)
        (d / "f").touch()
    # only the walk's own fds (into tmp_path) and threads (named mf-walker-N by the C core):
    # the rest of the process (a Dask cluster, servers of other tests) opens and closes its own
    assert fds_into(tmp_path) == {} and threads_named("mf-walker") == []
    for _ in range(5):
        it = mf.walk(tmp_path, threads=4, postorder=True)
        for i, _d in enumerate(it):
            if i == 3:
                break
        it.close()
    assert fds_into(tmp_path) == {}
    assert threads_named("mf-walker") == []


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_walk_from_an_fd_with_a_label(tree: Path) -> None:
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = {d.path for d in _dents.Walk(fd, label=b"LABEL", threads=2, max_depth=1, as_bytes=True)}
    finally:
        os.close(fd)
    assert got == {b"LABEL", b"LABEL/d0", b"LABEL/d1", b"LABEL/d2"}


# ---- count_tree / write_tree ---------------------------------------------------------------


@pytest.mark.parametrize(("backend", "threads"), WALKERS)
def test_count_tree_counts_per_type(tree: Path, backend: str, threads: int) -> None:
    tally = listing.count_tree(tree, backend=backend, threads=threads)
    assert tally.entries == len(os_walk_paths(os.fsencode(tree))) == mf.count(tree, recursive=True,
                                                                               backend=backend)
    assert tally.by_type == {"d": 39, "f": 40 * len(ODD), "l": 80}
    assert tally.directories == 40 and tally.failures == []
    assert listing.count_tree(tree, backend=backend, threads=threads, filter=Filter(types="l")).entries == 80


@pytest.mark.skipif(not HAVE_C, reason="C core only")
@pytest.mark.parametrize("sep", [b"\n", b"\0"])
def test_write_tree_writes_every_path_once(tree: Path, tmp_path: Path, sep: bytes) -> None:
    out = tmp_path / "out"
    with open(out, "wb") as f:
        tally = listing.write_tree(tree, f.fileno(), sep=sep, threads=4)
    data = out.read_bytes()
    assert data.endswith(sep)
    want = os_walk_paths(os.fsencode(tree))
    if sep == b"\0":
        got = data.split(b"\0")[:-1]
        assert len(got) == len(want) == tally.entries and set(got) == want
    else:  # names with newlines split; the count of separators is still exact
        assert data.count(b"\n") == sum(p.count(b"\n") + 1 for p in want)


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_write_tree_json_is_byte_identical_to_the_python_formatter(tree: Path, tmp_path: Path) -> None:
    """The C JSON writer must print exactly what fastls printed before (json.dumps, ensure_ascii)."""
    out = tmp_path / "out.jsonl"
    root = os.fsencode(tree)
    with open(out, "wb") as f:
        listing.write_tree(root, f.fileno(), json=True, threads=4)
    c_lines = sorted(out.read_bytes().splitlines(keepends=True))
    py_lines = sorted(_fastls_core._json_line(d, i, os.path.join(d.path, b""))
                      for d in mf.walk(root, backend="scandir") for i in range(len(d.entries)))
    assert c_lines == py_lines
    records = [json.loads(line) for line in c_lines]
    assert {fastls.decode_json_path(r) for r in records} == os_walk_paths(root)


def test_unreadable_directory_is_a_failure_and_the_rest_is_counted(world_readable_tmp: Path,
                                                                   run_unprivileged) -> None:
    root = world_readable_tmp
    make_tree(root, fanout=2, depth=2)
    (root / "d0" / "d1").chmod(0)
    code = (
        "import sys, manyfiles as mf\n"
        "from manyfiles import listing\n"
        "from manyfiles.errors import PartialFailure\n"
        "for backend in sys.argv[2:]:\n"
        "    t = listing.count_tree(sys.argv[1], backend=backend, threads=4)\n"
        "    (path, exc), = t.failures\n"
        "    try:\n"
        "        mf.count(sys.argv[1], recursive=True, backend=backend)\n"
        "    except PartialFailure as e:\n"
        "        raised = len(e.failures)\n"
        "    print(backend, t.entries, t.directories, path, exc.errno, raised)\n"
    )
    backends = ["dents", "scandir"] if HAVE_C else ["scandir"]
    out = run_unprivileged([sys.executable, "-c", code, str(root), *backends])
    per_dir = len(ODD) + 2
    for line in out.splitlines():
        _backend, entries, dirs, path, err, raised = line.split()
        # 7 directories, d0/d1 unreadable: 6 listed
        assert (int(entries), int(dirs)) == (6 * per_dir + 6, 6)
        assert (path, int(err), int(raised)) == (str(root / "d0" / "d1"), errno.EACCES, 1)


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_root_errors_raise(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        listing.count_tree(tmp_path / "missing")
    assert info.value.filename == os.fsencode(tmp_path / "missing")
    (tmp_path / "file").touch()
    with pytest.raises(NotADirectoryError):
        mf.count(tmp_path / "file", recursive=True)
    [d] = list(mf.walk(tmp_path / "missing"))
    assert isinstance(d.error, FileNotFoundError) and d.error.filename == str(tmp_path / "missing")
    with pytest.raises(PartialFailure):
        listing.TreeCount(failures=[("x", OSError(errno.EIO, "io"))]).raise_for_failures()


def test_tracing_records_one_getdents_per_directory_batch(tree: Path, tmp_path: Path) -> None:
    from manyfiles import trace

    t = tmp_path / "t.mft"
    with iotrace.tracing(str(t)):
        n = sum(len(d.entries) for d in mf.walk(tree, threads=2))
        tally = listing.count_tree(tree, threads=2)
    ts = trace.load([str(t)])
    records = [r for r in ts.records() if r.op == "getdents"]
    # two walks of 40 directories, one non-empty batch each; entries add up
    assert len(records) == 80
    assert sum(r.offset for r in records) == n + tally.entries
    # each record belongs to the thread that made the call: a C walker thread (before issue 10's
    # last step, the calling thread logged them all after the walk); without the core, the caller
    names = ts.thread_names()
    who = {names[r.pid, r.tid].rstrip("0123456789") for r in records}
    assert who == ({"manyfiles-walker-"} if HAVE_C else {"MainThread"}), who
    assert all(r.tid != threading.get_native_id() for r in records) == HAVE_C


# ---- the C core's knobs and fixes ------------------------------------------------------------


@pytest.mark.skipif(not HAVE_C, reason="C core only")
@pytest.mark.parametrize("fake", [0, 200])
def test_unknown_and_garbage_d_types_are_resolved_by_fstatat(tree: Path, fake: int) -> None:
    """0 is DT_UNKNOWN (sshfs, NFSv3); 200 is garbage a broken filesystem could send (it used to
    be `1u << 200`, undefined): both read as unknown and fstatat gives the real type."""
    want = {(d.path, e.name, e.type) for d in mf.walk(tree) for e in d.entries}
    with faults.fake_dtype(fake):
        assert {e.type for e in mf.iter_entries(tree, resolve_unknown=False)} == {"?"}
        got = {(d.path, e.name, e.type) for d in mf.walk(tree, threads=4) for e in d.entries}
        links = listing.count_tree(tree, filter=Filter(types="l")).entries
        dirs = mf.listdir(tree, filter=Filter(types="d"))
    assert got == want and links == 80 and sorted(dirs) == ["d0", "d1", "d2"]


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_buffers_of_4_gib_and_more_are_clamped(tree: Path) -> None:
    """getdents64 takes an unsigned int count: 4 GiB became 0 (EINVAL) and the call failed."""
    n = len(os.listdir(tree))
    for size in (1 << 32, (1 << 32) + 4096, 1 << 40):
        assert mf.count(tree, bufsize=size) == n
        assert listing.count_tree(tree, bufsize=size).entries == len(os_walk_paths(os.fsencode(tree)))
        fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert _dents.count(fd, size) == n  # the C core clamps too, not only Python
        finally:
            os.close(fd)


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_errors_keep_their_errno(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    fd = os.open(tmp_path / "file", os.O_RDONLY)
    try:
        with pytest.raises(NotADirectoryError) as info:
            _dents.count(fd, 4096, path=b"the-file")
    finally:
        os.close(fd)
    assert info.value.errno == errno.ENOTDIR and info.value.filename == b"the-file"
    rfd = os.open(tmp_path / "file", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            listing.write_names(str(tree), rfd)  # not writable
        assert info.value.errno == errno.EBADF
        with pytest.raises(OSError) as info:
            listing.write_tree(tree, rfd)
        assert info.value.errno == errno.EBADF
    finally:
        os.close(rfd)


@pytest.mark.skipif(not HAVE_C, reason="C core only")
def test_state_is_per_interpreter() -> None:
    """A subinterpreter importing the module gets its own Entry type and d_type override (they were
    C statics)."""
    interpreters = pytest.importorskip("_xxsubinterpreters")
    interp = interpreters.create()
    try:
        interpreters.run_string(interp, (
            "from manyfiles import _dents, listing\n"
            "_dents._set_fake_dtype(0)\n"
            "assert {e.type for e in listing.iter_entries('/usr', resolve_unknown=False)} == {'?'}\n"
        ))
        # the subinterpreter's Entry type and override did not leak into this interpreter's module
        entries = list(mf.iter_entries("/usr", resolve_unknown=False))
        assert all(type(e) is listing.Entry for e in entries)
        assert "?" not in {e.type for e in entries}
    finally:
        interpreters.destroy(interp)
