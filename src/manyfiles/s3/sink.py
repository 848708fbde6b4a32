"""Where downloaded bytes go: a folder (plain or sharded) or memory.

Every object is written to a temp file under ``DEST/.s3pull/tmp`` and renamed to
its final name only once its size (and checksum, where we have one) checked out,
so an interrupted run never leaves a partial file under a final name.  Parent
directories are created by us and checked on the way: a symlink planted in DEST
cannot redirect a write outside it.
"""

from __future__ import annotations

import contextlib
import os
import stat as _stat
import threading
import time
from collections.abc import Callable

from manyfiles._core import fsops as _fsops
from manyfiles._core import native as _native
from manyfiles.errors import from_oserror
from manyfiles.s3.keys import UnsafeKey
from manyfiles.s3.state import State, names_of, open_file, unique_name
from manyfiles.s3.transport import pwrite_all as _pwrite_all
from manyfiles.trace import iotrace

PREALLOCATE_MIN = 8 << 20   # whole-object temp files from this size are preallocated
SMALL_MAX = 64 << 10        # objects up to this size are held in memory and installed in one call


class Target:
    """One object being written; engines call ``write_at``/``append`` then ``commit`` or ``abort``.

    Every write is complete or raises (a short write is retried, then ENOSPC); ``read`` returns
    bytes already written, for hashing ranges that finished out of order.
    """

    resumable_parts: set[int] = set()  # noqa: RUF012 -- overridden per instance

    def write_at(self, offset: int, data) -> None:
        raise NotImplementedError

    def append(self, data) -> None:
        raise NotImplementedError

    def read(self, offset: int, n: int) -> bytes:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget what was written (a retried whole-object GET starts again)."""

    def part_done(self, index: int) -> None:
        """Remember that part ``index`` is complete (for resuming)."""

    def forget_parts(self) -> None:
        """The finished parts cannot be trusted (the object failed its check): start over."""

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self, keep: bool = False) -> None:
        raise NotImplementedError


class FileTarget(Target):
    """A temp file in DEST/.s3pull/tmp, opened relative to the tmp folder's descriptor.

    Plain temps get a random name (O_EXCL).  Resumable ones (large objects fetched in parts) get
    a random name too; their identity (key, ETag, size, part layout) is the first line of the
    ``.parts`` record next to them, which is how a re-run finds them.
    """

    def __init__(self, sink: FolderSink, key: str, final: str, size: int | None, etag: str | None,
                 identity: str | None) -> None:
        self.sink, self.key, self.final, self.size, self.etag = sink, key, final, size, etag
        self.resumable_parts = set()
        self._parts_f = None
        self.dir_fd = sink.state.tmp_fd
        self.name = None
        self.fd = -1
        if identity is not None:
            self._open_resumable(identity)
        else:
            self.name = unique_name(".tmp")
            self.fd = self._create(self.name)
            if size and size >= PREALLOCATE_MIN:
                # one allocation up front instead of a growing file's per-write ones
                with contextlib.suppress(OSError):
                    os.posix_fallocate(self.fd, 0, size)
        self._pos = 0

    @property
    def tmp(self) -> str:
        """The temp file's path (for traces and errors: it is opened by descriptor)."""
        return os.path.join(self.sink.state.tmp, self.name)

    def _create(self, name: str) -> int:
        # O_CREAT | O_EXCL | O_NOFOLLOW in our own 0700 folder: a new regular file of ours with one
        # link, so open_file's fstat check has nothing to find (one syscall less per object)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        if iotrace.TRACER is None:
            return os.open(name, flags, 0o644, dir_fd=self.dir_fd)
        return _fsops.traced("open", os.path.join(self.sink.state.tmp, name), os.open, name, flags, 0o644,
                             dir_fd=self.dir_fd)

    def _open_resumable(self, identity: str) -> None:
        sink, size = self.sink, self.size
        name = sink.resume_index.pop(identity, None)
        if name is not None:
            try:
                self.fd = open_file(self.dir_fd, name + ".part", os.O_RDWR)
                if os.fstat(self.fd).st_size == size:
                    pfd = open_file(self.dir_fd, name + ".parts", os.O_RDONLY)
                    with os.fdopen(pfd, encoding="utf-8") as f:
                        lines = f.read().split("\n")
                    self.resumable_parts = {int(x) for x in lines[1:] if x.strip()}
                else:
                    os.close(self.fd)
                    self.fd = -1
            except (OSError, ValueError):
                if self.fd >= 0:
                    os.close(self.fd)
                self.fd = -1
                self.resumable_parts = set()
            if self.fd < 0:
                _unlink_quiet(self.dir_fd, name + ".part")
                _unlink_quiet(self.dir_fd, name + ".parts")
        if self.fd < 0:
            name = unique_name("")
            self.fd = self._create(name + ".part")
            if size:
                try:
                    os.posix_fallocate(self.fd, 0, size)
                except OSError:
                    os.ftruncate(self.fd, size)
            pfd = open_file(self.dir_fd, name + ".parts", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            self._parts_f = os.fdopen(pfd, "w", encoding="utf-8")
            self._parts_f.write(identity + "\n")
            self._parts_f.flush()
        else:
            pfd = open_file(self.dir_fd, name + ".parts", os.O_WRONLY | os.O_APPEND)
            self._parts_f = os.fdopen(pfd, "a", encoding="utf-8")
        self.name = name + ".part"
        self._parts_name = name + ".parts"
        self._parts_lock = threading.Lock()
        self._identity = identity

    def write_at(self, offset: int, data) -> None:
        tr = iotrace.TRACER
        t0 = time.monotonic_ns() if tr is not None else 0
        _pwrite_all(self.fd, data, offset)
        if tr is not None:
            tr.record("write", self.tmp, offset, len(data), t0, time.monotonic_ns() - t0, 0)

    def append(self, data) -> None:
        self.write_at(self._pos, data)
        self._pos += len(data)

    def read(self, offset: int, n: int) -> bytes:
        return os.pread(self.fd, n, offset)

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

    def forget_parts(self) -> None:
        self.resumable_parts = set()
        if self._parts_f is not None:
            with self._parts_lock:
                self._parts_f.truncate(0)
                self._parts_f.write(self._identity + "\n")
                self._parts_f.flush()

    def commit(self) -> tuple[int, int]:
        """Install the file under its final name; returns its (inode, mtime_ns), which the rename
        keeps (for the state record, without a stat of the final path)."""
        try:
            if self.sink.fsync:
                _fsops.fsync(self.fd, self.tmp)
            st = os.fstat(self.fd)
        finally:
            os.close(self.fd)
            self.fd = -1
        self.sink.install(self.dir_fd, self.name, self.tmp, self.final)
        if self._parts_f is not None:
            self._parts_f.close()
            _unlink_quiet(self.dir_fd, self._parts_name)
        return st.st_ino, st.st_mtime_ns

    def abort(self, keep: bool = False) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        if self._parts_f is not None:
            with contextlib.suppress(OSError):
                self._parts_f.close()
        if not keep:
            _unlink_quiet(self.dir_fd, self.name)
            if self._parts_f is not None:
                _unlink_quiet(self.dir_fd, self._parts_name)


class _InMemory(Target):
    """A target whose bytes are held in ``buf`` until it is committed (grown as writes land)."""

    buf: bytearray

    def write_at(self, offset: int, data) -> None:
        end = offset + len(data)
        if end > len(self.buf):
            self.buf.extend(bytes(end - len(self.buf)))
        self.buf[offset:end] = data

    def read(self, offset: int, n: int) -> bytes:
        return bytes(self.buf[offset:offset + n])

    def abort(self, keep: bool = False) -> None:
        self.buf = bytearray()


class SmallTarget(_InMemory):
    """A small object (up to SMALL_MAX, size known from the listing) held in memory until it checked
    out, then written to a temp file in DEST/.s3pull/tmp and renamed to its final name in one call
    of the C core (:func:`install_small`): one GIL release for the create, write, stat, close and
    rename instead of one each, and no temp file at all while the GET is in flight."""

    def __init__(self, sink: FolderSink, final: str) -> None:
        self.sink, self.final = sink, final
        self.buf = bytearray()
        self.resumable_parts = set()

    def append(self, data) -> None:
        self.buf += data

    def reset(self) -> None:
        self.buf = bytearray()

    def commit(self) -> tuple[int, int]:
        """Install the bytes under the final name; (inode, mtime_ns) of the installed file."""
        try:
            return install_small(self.sink.state.tmp_fd, unique_name(".tmp"), self.buf, self.final)
        except IsADirectoryError:
            rel = os.path.relpath(self.final, self.sink.dest)
            raise UnsafeKey(f"'{rel}' is a directory in DEST") from None
        finally:
            self.buf = bytearray()


def _install_small_py(dir_fd: int, name: str, data, final: str) -> tuple[int, int]:
    """:func:`install_small` without the C core: the same steps, one system call at a time."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    try:
        try:
            _pwrite_all(fd, data, 0)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        os.rename(name, final, src_dir_fd=dir_fd)
    except BaseException:
        _unlink_quiet(dir_fd, name)
        raise
    return st.st_ino, st.st_mtime_ns


install_small = _native.dents.install_small if _native.dents is not None else _install_small_py


def _unlink_quiet(dir_fd: int | None, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


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

    def __init__(self, dest: str, *, layout: str = "folder", fsync: bool = False,
                 state_slice: str | None = None) -> None:
        self.dest = os.path.abspath(dest)
        self.layout = layout
        self.fsync = fsync
        self.state = State(self.dest, slice=state_slice)
        self._dirs: set[str] = {""}
        self._parents: set[str] = set()     # absolute parents already checked (the common case, cheap)
        self._sharded = None
        self.memory = False
        self.resume_index: dict[str, str] = {}

    def open(self, load_state: bool = True) -> FolderSink:
        """Create DEST and open its state folder (refusing unsafe ones); ``load_state`` also reads
        the state file and tidies the temp folder (the main process only)."""
        try:
            _fsops.makedirs(self.dest)
        except OSError as exc:
            raise from_oserror(exc, self.dest) from exc
        self.state.open(load=load_state)
        if load_state:
            # a cluster slice shares tmp/ with the other workers' slices: it only looks for the
            # resumable parts of its own objects; the run's client tidies before the slices start
            self._tidy_temps(remove=self.state.slice is None)
        if self.layout == "sharded":
            from manyfiles.shard import ShardedDir

            self._sharded = ShardedDir(self.dest)
            if load_state:   # record the layout (descriptor) once, before the first file lands
                self._sharded.ensure_described()
        return self

    def _tidy_temps(self, remove: bool = True) -> None:
        """Index resumable parts by identity; remove temps of interrupted runs.

        Only names s3pull makes are touched, in a temp folder already checked to be a real
        folder of ours holding no symlink: ``*.tmp``/``*.new`` (killed runs) and ``.part``
        files whose ``.parts`` record is missing or unreadable.
        """
        fd = self.state.tmp_fd
        names = set(self.state.tmp_names)
        for name in sorted(names):
            if name.endswith(".parts"):
                base = name[: -len(".parts")]
                try:
                    pfd = open_file(fd, name, os.O_RDONLY)
                    with os.fdopen(pfd, encoding="utf-8") as f:
                        identity = f.readline().rstrip("\n")
                except (OSError, ValueError):
                    identity = ""
                if identity and base + ".part" in names:
                    self.resume_index[identity] = base
                elif remove:
                    _unlink_quiet(fd, name)
        if not remove:
            return
        keep = set(self.resume_index.values())
        for name in names:
            stale = name.endswith((".tmp", ".new")) or (name.endswith(".part") and name[:-5] not in keep)
            if stale:
                _unlink_quiet(fd, name)

    def remove_temps_of(self, pid: int) -> None:
        """Remove the whole-object temps (``*.tmp``) of a worker process forked from this one that
        was stopped mid-object (Ctrl-C); the parts of large objects stay for resuming."""
        fd = self.state.tmp_fd
        prefix = names_of(pid)
        for name in os.listdir(fd):
            if name.startswith(prefix) and name.endswith(".tmp"):
                _unlink_quiet(fd, name)

    def final_path(self, rel: str) -> str:
        if self._sharded is not None:
            return os.fspath(self._sharded.path_for(shard_name(rel)))
        return os.path.join(self.dest, rel)

    def target(self, key: str, rel: str, size: int | None, etag: str | None,
               identity: str | None = None) -> FileTarget | SmallTarget:
        """A temp file for ``key``; ``identity`` (key, ETag, size, layout) makes it resumable.  A small
        object (size known, up to SMALL_MAX) gets a :class:`SmallTarget`, unless every write must be
        synced (``fsync``) or traced one call at a time."""
        final = self.final_path(rel)
        self._ensure_parent(final)
        if (identity is None and size is not None and size <= SMALL_MAX and not self.fsync
                and iotrace.TRACER is None):
            return SmallTarget(self, final)
        return FileTarget(self, key, final, size, etag, identity)

    def _ensure_parent(self, final: str) -> None:
        parent = os.path.dirname(final)
        if parent in self._parents:
            return
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
        self._parents.add(parent)

    def install(self, dir_fd: int, name: str, tmp: str, final: str) -> None:
        tr = iotrace.TRACER
        t0 = time.monotonic_ns()
        try:
            os.rename(name, final, src_dir_fd=dir_fd)
        except IsADirectoryError:
            _unlink_quiet(dir_fd, name)
            raise UnsafeKey(f"'{os.path.relpath(final, self.dest)}' is a directory in DEST") from None
        if tr is not None:
            tr.record("rename", f"{tmp} -> {final}", 0, 0, t0, time.monotonic_ns() - t0, 0)
        if self.fsync:
            _fsops.fsync_dir(os.path.dirname(final))

    def close(self) -> None:
        self.state.close()
        self.state.release()
        self._dirs = {""}
        self._parents = set()


class MemoryTarget(_InMemory):
    def __init__(self, sink: MemorySink, key: str, size: int | None) -> None:
        self.sink, self.key, self.size = sink, key, size
        self.buf = bytearray(size) if size else bytearray()
        self._pos = 0
        self.resumable_parts = set()

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


class MemorySink:
    """Hands each finished object to ``deliver(key, data)`` instead of writing a file."""

    memory = True
    state = None

    def __init__(self, deliver: Callable[[str, bytes], None]) -> None:
        self.deliver = deliver

    def open(self) -> MemorySink:
        return self

    def target(self, key: str, rel: str, size: int | None, etag: str | None,
               identity: str | None = None) -> MemoryTarget:
        return MemoryTarget(self, key, size)

    def close(self) -> None:
        pass
