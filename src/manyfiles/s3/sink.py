"""Where downloaded bytes go: a folder (plain or sharded) or memory.

Every object is written to a temp file under ``DEST/.s3pull/tmp`` and renamed to
its final name only once its size (and checksum, where we have one) checked out,
so an interrupted run never leaves a partial file under a final name.  Parent
directories are created by us and checked on the way: a symlink planted in DEST
cannot redirect a write outside it.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import stat as _stat
import threading
import time
from collections.abc import Callable

from manyfiles import _fsops, iotrace
from manyfiles.s3.keys import UnsafeKey
from manyfiles.s3.state import State

_counter = itertools.count()


class Target:
    """One object being written; engines call ``write_at``/``append`` then ``commit`` or ``abort``."""

    resumable_parts: set[int] = set()  # noqa: RUF012 -- overridden per instance

    def write_at(self, offset: int, data) -> None:
        raise NotImplementedError

    def append(self, data) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget what was written (a retried whole-object GET starts again)."""

    def part_done(self, index: int) -> None:
        """Remember that part ``index`` is complete (for resuming)."""

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self, keep: bool = False) -> None:
        raise NotImplementedError


class FileTarget(Target):
    def __init__(self, sink: FolderSink, key: str, final: str, size: int | None, etag: str | None,
                 resumable: bool) -> None:
        self.sink, self.key, self.final, self.size, self.etag = sink, key, final, size, etag
        self.resumable_parts = set()
        self._parts_f = None
        if resumable:
            # a deterministic name, so a re-run finds the parts this run finished
            tag = hashlib.sha1(f"{key}\0{etag}\0{size}".encode("utf-8", "surrogateescape")).hexdigest()
            self.tmp = os.path.join(sink.state.tmp, tag + ".part")
            parts_path = self.tmp + "s"
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
            self.fd = _open(self.tmp, flags)
            if os.fstat(self.fd).st_size == size:
                try:
                    with open(parts_path, encoding="ascii") as f:
                        self.resumable_parts = {int(x) for x in f.read().split()}
                except (OSError, ValueError):
                    self.resumable_parts = set()
            else:
                os.ftruncate(self.fd, 0)
                if size:
                    try:
                        os.posix_fallocate(self.fd, 0, size)
                    except OSError:
                        os.ftruncate(self.fd, size)
            self._parts_f = open(parts_path, "a" if self.resumable_parts else "w",  # noqa: SIM115
                                 encoding="ascii")
            self._parts_lock = threading.Lock()
        else:
            self.tmp = os.path.join(sink.state.tmp, f"{os.getpid()}-{next(_counter)}.tmp")
            self.fd = _open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC)
        self._pos = 0

    def write_at(self, offset: int, data) -> None:
        tr = iotrace.TRACER
        if tr is None:
            os.pwrite(self.fd, data, offset)
            return
        t0 = time.monotonic_ns()
        os.pwrite(self.fd, data, offset)
        tr.record("write", self.tmp, offset, len(data), t0, time.monotonic_ns() - t0, 0)

    def append(self, data) -> None:
        self.write_at(self._pos, data)
        self._pos += len(data)

    def reset(self) -> None:
        self._pos = 0
        os.ftruncate(self.fd, 0)

    def part_done(self, index: int) -> None:
        if self._parts_f is None:
            return
        if self.sink.fsync:
            os.fdatasync(self.fd)
        with self._parts_lock:
            self._parts_f.write(f"{index}\n")
            self._parts_f.flush()

    def commit(self) -> None:
        try:
            if self.sink.fsync:
                _fsops.fsync(self.fd, self.tmp)
        finally:
            os.close(self.fd)
        self.sink.install(self.tmp, self.final)
        if self._parts_f is not None:
            self._parts_f.close()
            _unlink_quiet(self.tmp + "s")

    def abort(self, keep: bool = False) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self._parts_f is not None:
            self._parts_f.close()
        if not keep:
            _unlink_quiet(self.tmp)
            if self._parts_f is not None:
                _unlink_quiet(self.tmp + "s")


def _open(path: str, flags: int) -> int:
    return _fsops.traced("open", path, os.open, path, flags, 0o644)


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _fsops.unlink(path)


def shard_name(rel: str) -> str:
    """The flat file name of ``rel`` in a sharded layout: '%' -> '%25', '/' -> '%2F' (reversible)."""
    name = rel.replace("%", "%25").replace("/", "%2F")
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        raise UnsafeKey("name longer than 255 bytes once flattened for the sharded layout")
    if name.startswith(".manyfiles-"):
        raise UnsafeKey("names starting with .manyfiles- are reserved by the sharded layout")
    return name


class FolderSink:
    """Writes objects under ``dest``; ``layout`` is "folder" (key -> path) or "sharded"."""

    def __init__(self, dest: str, *, layout: str = "folder", fsync: bool = False) -> None:
        self.dest = os.path.abspath(dest)
        self.layout = layout
        self.fsync = fsync
        self.state = State(self.dest)
        self._dirs: set[str] = {""}
        self._sharded = None
        self.memory = False

    def open(self, load_state: bool = True) -> FolderSink:
        _fsops.makedirs(self.dest)
        if load_state:
            self.state.open()
        if self.layout == "sharded":
            from manyfiles.shard import ShardedDir

            self._sharded = ShardedDir(self.dest)
            if load_state:   # record the layout (descriptor) once, before the first file lands
                self._sharded.ensure_described()
        return self

    def clean_stale_temps(self) -> None:
        """Remove temp files of interrupted runs (resumable ``.part`` files are kept)."""
        try:
            names = os.listdir(self.state.tmp)
        except OSError:
            return
        for name in names:
            if name.endswith(".tmp"):
                _unlink_quiet(os.path.join(self.state.tmp, name))

    def final_path(self, rel: str) -> str:
        if self._sharded is not None:
            return os.fspath(self._sharded.path_for(shard_name(rel)))
        return os.path.join(self.dest, rel)

    def target(self, key: str, rel: str, size: int | None, etag: str | None, resumable: bool) -> FileTarget:
        final = self.final_path(rel)
        self._ensure_parent(final)
        return FileTarget(self, key, final, size, etag, resumable)

    def _ensure_parent(self, final: str) -> None:
        parent = os.path.dirname(final)
        relparent = os.path.relpath(parent, self.dest)
        if relparent == ".":
            relparent = ""
        if relparent in self._dirs:
            return
        cur = self.dest
        so_far = ""
        for seg in relparent.split("/"):
            so_far = f"{so_far}/{seg}" if so_far else seg
            cur = os.path.join(cur, seg)
            if so_far in self._dirs:
                continue
            try:
                st = os.lstat(cur)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    _fsops.mkdir(cur)
                st = os.lstat(cur)
            if _stat.S_ISLNK(st.st_mode):
                raise UnsafeKey(f"'{so_far}' in DEST is a symlink; refusing to write through it")
            if not _stat.S_ISDIR(st.st_mode):
                raise UnsafeKey(f"'{so_far}' in DEST is a file, not a directory")
            self._dirs.add(so_far)

    def install(self, tmp: str, final: str) -> None:
        try:
            _fsops.rename(tmp, final)
        except IsADirectoryError:
            _unlink_quiet(tmp)
            raise UnsafeKey(f"'{os.path.relpath(final, self.dest)}' is a directory in DEST") from None
        if self.fsync:
            _fsops.fsync_dir(os.path.dirname(final))

    def close(self) -> None:
        self.state.close()
        self._dirs = {""}


class MemoryTarget(Target):
    def __init__(self, sink: MemorySink, key: str, size: int | None) -> None:
        self.sink, self.key, self.size = sink, key, size
        self.buf = bytearray(size) if size else bytearray()
        self._pos = 0
        self.resumable_parts = set()

    def write_at(self, offset: int, data) -> None:
        end = offset + len(data)
        if end > len(self.buf):
            self.buf.extend(b"\0" * (end - len(self.buf)))
        self.buf[offset:end] = data

    def append(self, data) -> None:
        self.write_at(self._pos, data)
        self._pos += len(data)

    def reset(self) -> None:
        self._pos = 0
        if self.size is None:
            self.buf = bytearray()

    def commit(self) -> None:
        data = bytes(self.buf) if self.size is not None else bytes(self.buf[: self._pos])
        self.buf = bytearray()
        self.sink.deliver(self.key, data)

    def abort(self, keep: bool = False) -> None:
        self.buf = bytearray()


class MemorySink:
    """Hands each finished object to ``deliver(key, data)`` instead of writing a file."""

    memory = True
    state = None

    def __init__(self, deliver: Callable[[str, bytes], None]) -> None:
        self.deliver = deliver

    def open(self) -> MemorySink:
        return self

    def target(self, key: str, rel: str, size: int | None, etag: str | None, resumable: bool) -> MemoryTarget:
        return MemoryTarget(self, key, size)

    def close(self) -> None:
        pass
