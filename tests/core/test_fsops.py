"""The filesystem primitives of the mutating tools (_fsops): errors surface, capabilities per filesystem."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from manyfiles._core import fsops as _fsops
from manyfiles.trace import iotrace


class _Ops:
    """An I/O-trace sink: records every traced op, and can act right after one returns."""

    def __init__(self, after=None) -> None:
        self.ops: list[tuple[str, bytes | str, int]] = []
        self.after = after

    def record(self, op, path, offset, length, start_ns, dur_ns, result) -> None:
        self.ops.append((op, path, result))
        if self.after is not None:
            self.after(op, path, result)


@pytest.fixture
def traced_ops():
    def install(after=None) -> _Ops:
        sink = _Ops(after)
        iotrace.TRACER = sink
        return sink

    yield install
    iotrace.TRACER = None


def test_syncfs_reports_the_error_of_the_syscall() -> None:
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)  # a closed fd: syncfs(2) fails with EBADF, which used to be dropped
    with pytest.raises(OSError) as info:
        _fsops.syncfs(fd, "/gone")
    assert info.value.errno == errno.EBADF and info.value.filename == "/gone"
    dfd = os.open(tempfile.gettempdir(), os.O_RDONLY)
    try:
        _fsops.syncfs(dfd)  # and a healthy filesystem syncs without complaint
    finally:
        os.close(dfd)


def test_noreplace_capability_is_remembered_per_filesystem(tmp_path: Path, traced_ops, monkeypatch) -> None:
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        assert os.stat(shm).st_dev != os.stat(tmp_path).st_dev
        # /dev/shm's filesystem rejected RENAME_NOREPLACE once (as NFS and sshfs do): it alone falls back
        monkeypatch.setattr(_fsops, "_rejects_noreplace", {os.stat(shm).st_dev})
        for d in (tmp_path, shm):
            (d / "a").write_bytes(b"a")
            (d / "b").write_bytes(b"b")
        ops = traced_ops()
        _fsops.rename_noreplace(os.fsencode(tmp_path / "a"), os.fsencode(tmp_path / "c"))
        assert [op for op, _, _ in ops.ops] == ["rename"]              # renameat2, atomic
        ops.ops.clear()
        _fsops.rename_noreplace(os.fsencode(shm / "a"), os.fsencode(shm / "c"))
        assert [op for op, _, _ in ops.ops] == ["stat", "rename"]      # lstat + rename
        for d in (tmp_path, shm):  # both ways refuse to replace an existing name
            with pytest.raises(FileExistsError):
                _fsops.rename_noreplace(os.fsencode(d / "b"), os.fsencode(d / "c"))
            assert (d / "b").read_bytes() == b"b" and (d / "c").read_bytes() == b"a"
        # relative to a directory fd, with the device given by the caller (shard's hot path)
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            ops.ops.clear()
            _fsops.rename_noreplace(b"b", b"d", src_dir_fd=dfd, dst_dir_fd=dfd, dev=os.fstat(dfd).st_dev)
            assert [op for op, _, _ in ops.ops] == ["rename"]
        finally:
            os.close(dfd)
        assert _fsops._rejects_noreplace == {os.stat(shm).st_dev}
    finally:
        import shutil

        shutil.rmtree(shm)


def test_makedirs_outlasts_a_prune_that_wins_many_times_in_a_row(tmp_path: Path, traced_ops) -> None:
    # A concurrent ShardedDir.remove() can prune a level right after we made it.  Here the
    # "prune" wins 20 times in a row (the old makedirs gave up after 8): it removes level
    # a/ right after each of our mkdirs of it, before we can make a/b inside it.
    level = os.fsencode(tmp_path / "a")
    wins = {"left": 20}

    def prune(op, path, result) -> None:
        if op == "mkdir" and path == level and result == 0 and wins["left"]:
            wins["left"] -= 1
            os.rmdir(level)

    traced_ops(prune)
    _fsops.makedirs(os.fsencode(tmp_path / "a" / "b"))
    assert wins["left"] == 0 and (tmp_path / "a" / "b").is_dir()


def test_makedirs_gives_up_only_after_its_timeout(tmp_path: Path, traced_ops) -> None:
    level = os.fsencode(tmp_path / "a")

    def prune_forever(op, path, result) -> None:
        if op == "mkdir" and path == level and result == 0:
            os.rmdir(level)

    traced_ops(prune_forever)
    with pytest.raises(FileNotFoundError, match="keeps disappearing"):
        _fsops.makedirs(os.fsencode(tmp_path / "a" / "b"), timeout=0.2)


def test_makedirs_does_not_retry_what_cannot_succeed(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(NotADirectoryError):
        _fsops.makedirs(os.fsencode(tmp_path / "file" / "x"))


def test_open_dir_never_follows_a_symlink_unless_asked(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    with pytest.raises(OSError) as info:
        _fsops.open_dir(str(tmp_path / "link"))
    assert info.value.errno in (errno.ELOOP, errno.ENOTDIR)
    fd = _fsops.open_dir(str(tmp_path / "link"), follow_symlinks=True)  # the directory the user named
    try:
        assert os.fstat(fd).st_ino == os.stat(tmp_path / "d").st_ino
    finally:
        os.close(fd)
