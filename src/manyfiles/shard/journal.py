"""The migration journal and the lock.

The journal is an append-only file of checksummed JSON lines at the root.  It records
intent (operation and both layouts), the names moved aside, phase changes and progress.
It does not list every file: a rename is atomic and the directory listing says what is
left, so the filesystem itself is the per-file record (see docs/shard.md).  A torn last
line (kill -9 during a write) fails its checksum and is dropped on the next open.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time
import zlib
from typing import Any

from manyfiles._core import fsops as _fsops
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles.errors import ManyfilesError

JOURNAL = b".manyfiles-shard.journal"
LOCK = b".manyfiles-shard.lock"


# -- lock ----------------------------------------------------------------------------------------


class Lock:
    """An exclusive flock on ``<root>/.manyfiles-shard.lock``; released by the kernel on kill -9."""

    def __init__(self, rootfd: int, root: bytes) -> None:
        self.rootfd, self.root = rootfd, root
        self.fd: int | None = None

    def acquire(self) -> None:
        for _ in range(10):
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=self.rootfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise running(self.root, holder) from None
            # a finishing run unlinks the file while holding it: make sure ours is the live one
            try:
                same = os.stat(LOCK, dir_fd=self.rootfd).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self.fd = fd
                return
            os.close(fd)
        raise ManyfilesError(f"{os.fsdecode(self.root)}: could not take the shard lock")

    def release(self, remove: bool = True) -> None:
        if self.fd is None:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                _fsops.unlink(LOCK, dir_fd=self.rootfd)
        os.close(self.fd)
        self.fd = None


def running(root: bytes, pid: object) -> ManyfilesError:
    """The error of a shard command that finds another one running on ``root`` (every verb's)."""
    return ManyfilesError(f"{os.fsdecode(root)}: another shard command is running (pid {pid})")


def refuse_if_running(rootfd: int, root: bytes) -> None:
    """The read-only verbs (verify, the dry runs) refuse, as the others do, while a shard command
    holds the lock: what they would read is half moved."""
    pid = lock_holder(rootfd)
    if pid is not None:
        raise running(root, pid if pid > 0 else "?")


def lock_holder(rootfd: int) -> int | None:
    """Pid of the running shard command holding the lock, or None."""
    try:
        fd = os.open(LOCK, os.O_RDONLY | os.O_CLOEXEC, dir_fd=rootfd)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int(os.pread(fd, 64, 0) or b"0") or -1
        except ValueError:
            return -1
    finally:
        os.close(fd)
    return None


# -- journal -------------------------------------------------------------------------------------


def _encode(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), ensure_ascii=True).encode()
    return b"%08x " % zlib.crc32(body) + body + b"\n"


def _decode(line: bytes) -> dict[str, Any] | None:
    if len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def name_to_json(name: bytes) -> str:
    return os.fsdecode(name)  # surrogateescape: non-UTF-8 bytes survive the JSON round trip


def name_from_json(text: str) -> bytes:
    return os.fsencode(text)


def read_records(rootfd: int) -> tuple[list[dict[str, Any]], int] | None:
    """Valid records and the byte length they span, or None if there is no journal."""
    try:
        fd = os.open(JOURNAL, os.O_RDONLY | os.O_CLOEXEC, dir_fd=rootfd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    records, good = [], 0
    for line in data.splitlines(keepends=True):
        record = _decode(line.rstrip(b"\n")) if line.endswith(b"\n") else None
        if record is None:
            break  # torn tail from a kill during a write: everything after it is void
        records.append(record)
        good += len(line)
    return records, good


class Journal:
    """Append-only, fsync'd record of one migration (see the module docstring)."""

    def __init__(self, rootfd: int, fd: int, records: list[dict[str, Any]], *, sync: bool = True) -> None:
        self.rootfd, self.fd, self.records, self.sync = rootfd, fd, records, sync
        self._last_sync = time.monotonic()
        self._dirty = False

    @classmethod
    def create(cls, rootfd: int, header: dict[str, Any], *, sync: bool = True) -> Journal:
        fd = os.open(JOURNAL, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644,
                     dir_fd=rootfd)
        journal = cls(rootfd, fd, [], sync=sync)
        journal.append(header, durable=True)
        _fsops.traced("fsync", JOURNAL, _fsync_dirfd, rootfd)  # the journal's own entry must survive too
        return journal

    @classmethod
    def open(cls, rootfd: int, *, sync: bool = True) -> Journal | None:
        """Reopen an interrupted journal; None if absent or it never got a complete header."""
        found = read_records(rootfd)
        if found is None:
            return None
        records, good = found
        if not records or records[0].get("type") != "header":
            return None
        fd = os.open(JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC, dir_fd=rootfd)
        os.ftruncate(fd, good)  # drop a torn tail so new records follow valid ones
        return cls(rootfd, fd, records, sync=sync)

    @property
    def header(self) -> dict[str, Any]:
        return self.records[0]

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        """Write one record; ``durable`` records are fsync'd now, others at most 0.5 s later."""
        data = _encode(record)
        checkpoint("journal", (self.fd, data))  # the record about to be written (a crash may tear it)
        _fsops.traced("write", JOURNAL, os.write, self.fd, data)
        self.records.append(record)
        self._dirty = True
        if self.sync and (durable or time.monotonic() - self._last_sync > 0.5):
            self.flush()

    def flush(self) -> None:
        if self._dirty and self.sync:
            _fsops.fsync(self.fd, JOURNAL)
        self._dirty = False
        self._last_sync = time.monotonic()

    def close(self) -> None:
        os.close(self.fd)

    def remove(self) -> None:
        """Delete the journal: the migration is complete and durable."""
        self.close()
        _fsops.unlink(JOURNAL, dir_fd=self.rootfd)
        _fsync_dirfd(self.rootfd)


def _fsync_dirfd(rootfd: int) -> None:
    try:
        os.fsync(rootfd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EBADF):  # some filesystems cannot fsync a dir
            raise
