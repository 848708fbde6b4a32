"""The listing core: every backend cross-checked against os.listdir on real directories."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import faults
import manyfiles as mf
from manyfiles import listing
from manyfiles.listing._directory import _dents

pytestmark = pytest.mark.skipif(
    _dents is None and os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") != "1",
    reason="C core not built (CI requires it: MANYFILES_REQUIRE_C_EXTENSION=1 makes this a failure)",
)

ALL_BACKENDS = list(listing.BACKENDS)
NAME_255 = "n" * 255


def test_c_core_is_built_when_required() -> None:
    if os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") == "1":
        assert _dents is not None
        assert listing.default_backend() == "dents"


@pytest.fixture(scope="module")
def odd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with every kind of awkward name and entry type, plus enough files for many batches."""
    root = tmp_path_factory.mktemp("odd")
    broot = os.fsencode(root)
    names = [b"plain", b"with\nnewline", b"bad\xff\xfebytes", b"-leading-dash", b" space ", b"caf\xc3\xa9",
             NAME_255.encode(), b".hidden", b"*glob?chars["]
    for n in names:
        with open(os.path.join(broot, n), "wb") as f:
            f.write(b"x")
    for i in range(3000):
        (root / f"bulk{i:05d}").touch()
    (root / "subdir").mkdir()
    os.symlink("plain", root / "link")
    os.symlink("/nonexistent/target", root / "dangling")
    os.mkfifo(root / "fifo")
    return root


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("as_bytes", [False, True])
def test_listdir_matches_os_listdir(odd_dir: Path, backend: str, as_bytes: bool) -> None:
    path = os.fsencode(odd_dir) if as_bytes else str(odd_dir)
    got = mf.listdir(path, backend=backend)
    assert sorted(got) == sorted(os.listdir(path))
    assert len(got) == len(set(got))  # no duplicates across batches


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("bufsize", [280, 4096, 1 << 20])
def test_small_and_large_buffers(odd_dir: Path, backend: str, bufsize: int) -> None:
    # 280 bytes holds exactly one 255-byte-name record: the minimum that can make progress
    assert sorted(mf.listdir(str(odd_dir), bufsize=bufsize, backend=backend)) == sorted(os.listdir(odd_dir))
    assert mf.count(str(odd_dir), bufsize=bufsize, backend=backend) == len(os.listdir(odd_dir))


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_iter_entries_of_an_open_directory_fd(tmp_path: Path, backend: str) -> None:
    """An fd lists exactly the directory it was opened on (fastrm's fallback engine walks its own
    O_NOFOLLOW fds): even after the path was renamed away and replaced by a symlink, from the
    start every time, and the fd (its offset, its ownership) stays the caller's."""
    moved = tmp_path / "moved"
    (moved / "subdir").mkdir(parents=True)
    for i in range(500):  # several batches of a 4 KiB buffer
        (moved / f"f{i:03d}-{'x' * 40}").touch()
    os.symlink("f000", moved / "link")
    fd = os.open(moved, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.rename(moved, tmp_path / "elsewhere")
        os.symlink("/usr", moved)
        want = sorted(os.listdir(tmp_path / "elsewhere"))
        first = list(mf.iter_entries(fd, backend=backend, bufsize=4096))
        again = [e.name for e in mf.iter_entries(fd, backend=backend)]
        assert sorted(e.name for e in first) == sorted(again) == want
        assert {e.name: e.type for e in first}["subdir"] == "d"
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)


def test_bufsize_below_minimum_is_refused(odd_dir: Path) -> None:
    with pytest.raises(ValueError, match="280"):
        mf.listdir(str(odd_dir), bufsize=279)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_entry_types_and_inodes(odd_dir: Path, backend: str) -> None:
    entries = {e.name: e for e in mf.iter_entries(str(odd_dir), backend=backend)}
    assert entries["plain"].type == "f"
    assert entries["subdir"].type == "d"
    assert entries["link"].type == "l"
    assert entries["dangling"].type == "l"
    assert entries["fifo"].type == "p"
    assert entries["plain"].inode == os.lstat(odd_dir / "plain").st_ino


def test_dt_unknown_entries_are_kept_and_resolved(odd_dir: Path) -> None:
    """sshfs, NFSv3 and XFS ftype=0 report DT_UNKNOWN: entries must not be dropped (the
    PyPI package's default filter drops them all) and types come from fstatat."""
    with faults.fake_dtype(0):
        raw = list(mf.iter_entries(str(odd_dir), resolve_unknown=False))
        resolved = {e.name: e.type for e in mf.iter_entries(str(odd_dir))}
        dirs_only = mf.listdir(str(odd_dir), filter=listing.Filter(types="d"))
        n = mf.count(str(odd_dir))
    assert len(raw) == len(os.listdir(odd_dir)) == n
    assert {e.type for e in raw} == {"?"}
    assert resolved["subdir"] == "d" and resolved["link"] == "l" and resolved["plain"] == "f"
    assert dirs_only == ["subdir"]


def test_getdents_package_default_filter_drops_unknown_entries(tmp_path: Path) -> None:
    """Documents the defect that makes us call the package with filter_function=None."""
    import getdents

    (tmp_path / "a").touch()
    assert not getdents.ls_a((1, getdents.DT_UNKNOWN, "a"))
    assert mf.listdir(str(tmp_path), backend="getdents") == ["a"]


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_filters(odd_dir: Path, backend: str) -> None:
    f = listing.Filter(include=("bulk0*",), exclude=("bulk00*",))
    got = sorted(mf.listdir(str(odd_dir), backend=backend, filter=f))
    want = sorted(n for n in os.listdir(odd_dir) if n.startswith("bulk0") and not n.startswith("bulk00"))
    assert got == want and len(got) == 2000
    assert mf.count(str(odd_dir), backend=backend, filter=listing.Filter(types="l")) == 2


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_errors_carry_errno_and_filename(tmp_path: Path, backend: str) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError) as info:
        mf.listdir(missing, backend=backend)
    assert info.value.errno == errno.ENOENT and info.value.filename == missing
    (tmp_path / "file").touch()
    with pytest.raises(NotADirectoryError):
        mf.count(str(tmp_path / "file"), backend=backend)


def test_write_names_to_fd(odd_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "names.bin"
    with open(out, "wb") as f:
        n = listing.write_names(os.fsencode(odd_dir), f.fileno(), sep=b"\0", prefix=b"P/")
    data = out.read_bytes().split(b"\0")
    assert data[-1] == b""
    assert n == len(data) - 1
    assert sorted(data[:-1]) == sorted(b"P/" + x for x in os.listdir(os.fsencode(odd_dir)))


def test_getdents_batches_are_reported(odd_dir: Path) -> None:
    batches: list = []
    fd = os.open(odd_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        n = _dents.count(fd, 4096, batches=batches)
    finally:
        os.close(fd)
    assert n == len(os.listdir(odd_dir))
    assert len(batches) > 10  # 4 KiB batches over ~3000 entries
    assert sum(b[3] for b in batches) == n
    assert all(b[1] >= 0 and 0 < b[2] <= 4096 for b in batches)


def _make_tree(root: Path, fanout: int = 4, depth: int = 3, files: int = 5) -> set[str]:
    paths: set[str] = set()

    def fill(d: Path, level: int) -> None:
        for i in range(files):
            (d / f"file{i}").touch()
            paths.add(str(d / f"file{i}"))
        if level < depth:
            for j in range(fanout):
                sub = d / f"dir{j}"
                sub.mkdir()
                paths.add(str(sub))
                fill(sub, level + 1)

    fill(root, 0)
    return paths


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_walk_finds_everything_once(tmp_path: Path, threads: int, backend: str) -> None:
    expected = _make_tree(tmp_path)
    found = list(listing.iter_paths(mf.walk(str(tmp_path), threads=threads, backend=backend)))
    assert len(found) == len(set(found))
    assert set(found) == expected


def test_walk_max_depth_and_stat(tmp_path: Path) -> None:
    _make_tree(tmp_path)
    depths = {d.depth for d in mf.walk(str(tmp_path), max_depth=1)}
    assert depths == {0, 1}
    (tmp_path / "file0").write_bytes(b"12345")
    root = next(d for d in mf.walk(str(tmp_path), max_depth=0, stat=True))
    sizes = {e.name: st.st_size for e, st in zip(root.entries, root.stats, strict=True)}
    assert sizes["file0"] == 5


def test_walk_does_not_follow_symlink_loops_by_default(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    os.symlink("..", tmp_path / "a" / "up")
    listings = list(mf.walk(str(tmp_path)))
    assert len(listings) == 2 and all(d.error is None for d in listings)


def test_walk_follow_detects_cycles(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink("../..", tmp_path / "a" / "b" / "loop")
    (tmp_path / "a" / "b" / "f").touch()
    listings = list(mf.walk(str(tmp_path), follow_symlinks=True))
    loops = [d for d in listings if d.error is not None]
    assert len(loops) == 1 and loops[0].error.errno == errno.ELOOP
    assert str(tmp_path / "a" / "b" / "f") in set(listing.iter_paths(listings))


def test_walk_reports_unreadable_directory_and_continues(world_readable_tmp: Path, run_unprivileged) -> None:
    """Run as an unprivileged user (root ignores permissions): the locked dir is reported,
    everything else is still listed."""
    root = world_readable_tmp
    _make_tree(root, fanout=2, depth=2, files=2)
    locked = root / "dir0" / "dir1"
    locked.chmod(0o000)
    code = (
        "import manyfiles as mf, sys\n"
        f"ls = list(mf.walk({str(root)!r}, threads=4))\n"
        "bad = [d for d in ls if d.error is not None]\n"
        "print(len(bad), bad[0].path, bad[0].error.errno, sum(len(d.entries) for d in ls))\n"
    )
    out = run_unprivileged([sys.executable, "-c", code])
    n_bad, path, err, n_entries = out.split()
    assert (int(n_bad), path, int(err)) == (1, str(locked), errno.EACCES)
    # root 4 (2 files, 2 dirs) + dir0 4 + dir1 4 + three readable leaves of 2 files each
    assert int(n_entries) == 4 + 4 + 4 + 3 * 2


def test_memory_does_not_grow_over_repeated_listings(roomy_dir: Path) -> None:
    """Listing 100k entries 5 times grows RSS by < 10 MiB (the getdents package leaks ~80 B/entry:
    40 MB over these listings).  On a tmpfs of its own: 100k creations on the suite's disk cost
    seconds (after the suite's deletions, each new inode scans the recently freed ones)."""
    d = roomy_dir / "many"
    d.mkdir()
    code = (
        "import os, sys, manyfiles as mf\n"
        "d = sys.argv[1]\n"
        "fd = os.open(d, os.O_RDONLY)\n"
        "for i in range(100000): os.close(os.open(f'f{i:07d}', os.O_CREAT | os.O_WRONLY, dir_fd=fd))\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS'): return int(line.split()[1])\n"
        "names = mf.listdir(d); del names\n"
        "ents = list(mf.iter_entries(d)); del ents\n"
        "before = rss()\n"
        "for _ in range(5):\n"
        "    names = mf.listdir(d); assert len(names) == 100000; del names\n"
        "    ents = list(mf.iter_entries(d)); del ents\n"
        "    assert mf.count(d) == 100000\n"
        "print(rss() - before)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 10 * 1024  # KiB
