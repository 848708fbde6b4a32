"""The state kept under ``DEST/.s3pull/`` so that a re-run skips finished work, opened safely.

``state.jsonl``  one line per finished object: key, size, ETag, the check its bytes passed
                 (method, value, part sizes), the installed file's path (relative to DEST),
                 inode and mtime
``tmp/``         temp files (random names, ``O_EXCL``); a large object also keeps
                 ``<random>.parts``: its identity on the first line, then finished part numbers
``failures.tsv`` key<TAB>reason for every object that failed in the last run
``shards/``      a cluster run's state (``s3pull --cluster``): one ``<slice>.<attempt>.jsonl`` per
                 download slice and attempt, so that workers on several machines never append to
                 one file over NFS; a slice reads its own files, a local run reads them all

Safety: everything here is opened relative to directory descriptors with ``O_NOFOLLOW``.
s3pull refuses to start (one line, exit 1) if ``.s3pull``, ``tmp`` or anything in them is a
symlink or is owned by another user, so a planted link can never redirect a write, an append
or a deletion outside DEST.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import secrets
import stat as _stat
import threading
import time
from collections.abc import Iterator

from manyfiles.errors import IntegrityError, ManyfilesError, from_oserror
from manyfiles.s3.integrity import SIZE_ONLY, Claim, rehash_file
from manyfiles.s3.keys import STATE_DIR

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SHARDS = "shards"


class UnsafeStateDir(ManyfilesError):
    """DEST/.s3pull (or something in it) is a symlink or belongs to someone else."""


def _refuse(path: str, why: str) -> UnsafeStateDir:
    return UnsafeStateDir(f"{path}: {why}; s3pull keeps its state only in a real folder it owns "
                          f"(remove it and run again)")


def _check(st: os.stat_result, path: str) -> None:
    if _stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symlink")
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"is not owned by you (uid {st.st_uid})")


def open_dir(parent_fd: int, name: str, path: str, create: bool) -> int | None:
    """Open (or create, mode 0700) directory ``name`` under ``parent_fd`` without following links."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent_fd)
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    _check(st, path)
    if not _stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory")
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):   # swapped between the two calls
        os.close(fd)
        raise _refuse(path, "changed while being opened")
    return fd


def check_entries(dir_fd: int, path: str) -> list[str]:
    """Names in the directory; refuses if any is a symlink or not ours."""
    names = os.listdir(dir_fd)
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            _check(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), os.path.join(path, name))
    return names


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o600) -> int:
    """``openat`` with O_NOFOLLOW; the result must be a regular file of ours with one link."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not _stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
        os.close(fd)
        raise OSError(1, "not a regular file of ours with a single link", name)
    return fd


_NAME_PREFIX = secrets.token_hex(6)
_names = itertools.count()
_names_of_this_process = ""     # names_of(os.getpid()), made once per process (not a getpid per name)


def _forget_pid() -> None:
    global _names_of_this_process
    _names_of_this_process = ""


os.register_at_fork(after_in_child=_forget_pid)


def unique_name(suffix: str) -> str:
    """A name no other run, process or thread makes: a random prefix drawn once per process, the
    process id and a counter (a getrandom call per temp file was measurable); O_EXCL still refuses
    anything that exists."""
    global _names_of_this_process
    if not _names_of_this_process:
        _names_of_this_process = names_of(os.getpid())
    return f"{_names_of_this_process}{next(_names):x}{suffix}"


def names_of(pid: int) -> str:
    """How every :func:`unique_name` of process ``pid`` begins, if it was forked from this one (the
    random prefix is inherited): what a worker process killed mid-object left is found by it."""
    return f"{_NAME_PREFIX}{pid:x}-"


class State:
    """Finished objects of previous runs (key -> record) plus an append log, in DEST/.s3pull."""

    def __init__(self, dest: str, *, slice: str | None = None) -> None:
        self.dest = dest
        self.slice = slice        # a cluster slice: its own record files under shards/ (see above)
        self.dir = os.path.join(dest, STATE_DIR)
        self.tmp = os.path.join(self.dir, "tmp")
        self.path = os.path.join(self.dir, "state.jsonl")
        self.fd: int | None = None
        self.tmp_fd: int | None = None
        self.shards_fd: int | None = None
        self.done: dict[str, dict] = {}
        self.tmp_names: list[str] = []
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._f = None
        self._lines = 0
        self._flushed = 0.0

    def open(self, *, create: bool = True, load: bool = True) -> State:
        """Open (create) the state folder safely; ``load`` reads state.jsonl and opens it to append."""
        try:
            dest_fd = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise from_oserror(exc, self.dest) from exc
        try:
            self.fd = open_dir(dest_fd, STATE_DIR, self.dir, create)
        finally:
            os.close(dest_fd)
        if self.fd is None:
            return self
        self.tmp_fd = open_dir(self.fd, "tmp", self.tmp, create)
        names = check_entries(self.fd, self.dir)
        if self.tmp_fd is not None:
            self.tmp_names = check_entries(self.tmp_fd, self.tmp)
        if not load:
            return self
        if "state.jsonl" in names and self.slice is None:
            self._load(self.fd, "state.jsonl")
        if SHARDS in names or (create and self.slice is not None):
            self._load_shards(create)
        if not create:
            return self
        if self.slice is not None:
            # this attempt's own file: a slice re-run elsewhere never appends to a file another
            # (maybe not quite dead) worker still holds
            name, flags = f"{self.slice}.{secrets.token_hex(6)}.jsonl", os.O_CREAT | os.O_EXCL
            dir_fd, self.path = self.shards_fd, os.path.join(self.dir, SHARDS, name)
        else:
            if self._lines > 2 * len(self.done) + 1000:
                self._compact()
            name, flags, dir_fd = "state.jsonl", os.O_CREAT, self.fd
        try:
            fd = open_file(dir_fd, name, os.O_WRONLY | os.O_APPEND | flags)
        except OSError as exc:
            raise from_oserror(exc, self.path) from exc
        self._f = os.fdopen(fd, "a", encoding="utf-8")
        return self

    def _load_shards(self, create: bool) -> None:
        """A slice: its own records of earlier attempts; a whole run: every slice's records."""
        where = os.path.join(self.dir, SHARDS)
        self.shards_fd = open_dir(self.fd, SHARDS, where, create)
        if self.shards_fd is None:
            return
        for name in sorted(check_entries(self.shards_fd, where)):
            if name.endswith(".jsonl") and (self.slice is None or name.startswith(self.slice + ".")):
                self._load(self.shards_fd, name)

    def _load(self, dir_fd: int, name: str) -> None:
        for rec in _records(dir_fd, name):
            self._lines += 1
            if rec is not None:
                self.done[rec["k"]] = rec

    def slice_records(self, slice: str) -> dict[str, dict[str, dict]]:
        """A cluster slice's state files (``<slice>.<attempt>.jsonl``, after :meth:`open`): file
        name -> its records (key -> record)."""
        where = os.path.join(self.dir, SHARDS)
        dir_fd = open_dir(self.fd, SHARDS, where, create=False) if self.fd is not None else None
        if dir_fd is None:
            return {}
        try:
            return {name: {rec["k"]: rec for rec in _records(dir_fd, name) if rec is not None}
                    for name in sorted(check_entries(dir_fd, where))
                    if name.startswith(slice + ".") and name.endswith(".jsonl")}
        finally:
            os.close(dir_fd)

    def is_done(self, key: str, size: int | None, etag: str | None, path: str, *,
                verify: bool = False) -> bool:
        """True if a previous run installed ``key`` with this size/ETag and the file still passes.

        A file whose size, inode or mtime changed since (or every file, with ``verify``) is
        re-hashed against the check recorded for it; a size-only record cannot be re-checked,
        so a changed file is fetched again.  A size-only record the object did not allow (an older
        run could not learn a multipart layout) is re-hashed with a layout search (and recorded
        with the check it then passed), or fetched again when that is not possible.
        """
        rec = self.done.get(key)
        if rec is None or size is None or rec["s"] != size or (etag and rec.get("e") and rec["e"] != etag):
            return False
        claim = Claim.from_record(rec).strengthened(rec.get("e"))
        if claim.weak:
            return False
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return False
        if not _stat.S_ISREG(st.st_mode) or st.st_size != size:
            return False
        unchanged = rec.get("i") == st.st_ino and rec.get("t") == st.st_mtime_ns
        if unchanged and not verify and not claim.pending:
            return True
        if claim.method == SIZE_ONLY:
            return unchanged
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                passed = rehash_file(fd, size, claim)
            finally:
                os.close(fd)
        except (OSError, IntegrityError):
            return False
        if not unchanged or claim.pending:
            self.record(key, size, etag, passed.to_record(), path)
        return True

    def record(self, key: str, size: int, etag: str | None, check: dict | None, path: str | None, *,
               stat: tuple[int, int] | None = None) -> None:
        """Remember that ``key`` is installed at ``path`` (absolute, under DEST) and passed ``check``;
        ``stat``: the file's (inode, mtime_ns) when the installer knows them (else stat'ed here)."""
        rec = {"k": key, "s": size, "e": etag, **(check or {"m": SIZE_ONLY})}
        if path is not None:
            under = self.dest + os.sep
            rec["r"] = path[len(under):] if path.startswith(under) else os.path.relpath(path, self.dest)
            if stat is not None:
                rec["i"], rec["t"] = stat
            else:
                with contextlib.suppress(OSError):
                    st = os.stat(path, follow_symlinks=False)
                    rec["i"], rec["t"] = st.st_ino, st.st_mtime_ns
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        with self._lock:
            self.done[key] = rec
            self._pending.append(line)
            now = time.monotonic()
            if len(self._pending) >= 256 or now - self._flushed > 0.5:
                self._flushed = now
                self._flush_locked()

    def _flush_locked(self) -> None:
        if self._f is not None and self._pending:
            try:
                self._f.write("".join(self._pending))
                self._f.flush()
            except OSError as exc:
                self._pending.clear()
                raise from_oserror(exc, self.path) from exc
            self._pending.clear()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and close; raises ManyfilesError (``PATH: reason``) if the disk refuses."""
        with self._lock:
            try:
                self._flush_locked()
            finally:
                if self._f is not None:
                    with contextlib.suppress(OSError):
                        self._f.close()
                    self._f = None

    def release(self) -> None:
        for fd in (self.shards_fd, self.tmp_fd, self.fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.tmp_fd = self.shards_fd = None

    def _replace(self, name: str, text: str) -> None:
        """Write ``name`` in the state folder atomically (random temp, O_EXCL, rename)."""
        tmp = unique_name(".new")
        fd = open_file(self.fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def _compact(self) -> None:
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in self.done.values())
        try:
            self._replace("state.jsonl", text)
        except OSError as exc:
            raise from_oserror(exc, self.path) from exc
        self._lines = len(self.done)

    def write_failures(self, failures: list[tuple[str, str]]) -> str | None:
        """Write ``failures.tsv`` (or remove a stale one); returns its path if written.

        Raises ManyfilesError (``PATH: reason``) if the disk refuses (full, read-only...).
        """
        path = os.path.join(self.dir, "failures.tsv")
        if self.fd is None or self.slice is not None:    # a cluster run's client writes the merged one
            return None
        try:
            if not failures:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink("failures.tsv", dir_fd=self.fd)
                return None
            self._replace("failures.tsv", "".join(f"{_escape(k)}\t{r}\n" for k, r in failures))
        except OSError as exc:
            raise from_oserror(exc, path) from exc
        return path


def _records(dir_fd: int, name: str) -> Iterator[dict | None]:
    """The records of one state file, None for a line that is not one (a torn last line from a crash)."""
    fd = open_file(dir_fd, name, os.O_RDONLY)
    with os.fdopen(fd, encoding="utf-8") as f:
        for line in f:
            try:
                rec = json.loads(line)
                rec["s"] = int(rec["s"])
                ok = "k" in rec
            except (ValueError, KeyError, TypeError):
                ok = False
            yield rec if ok else None


def _escape(key: str) -> str:
    return key.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
