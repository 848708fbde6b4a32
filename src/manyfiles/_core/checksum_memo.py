"""A persistent memo of local files' checksums: an unchanged file is not read again to be compared.

A sync or check by checksum reads and hashes every local file of the same size as its object.  The
memo keeps, per local root, each file's checksums (the value an object's check must equal: an MD5
in hex, a CRC64NVME in base64...) keyed by what identifies its content without reading it: the
:class:`Identity` (device, inode, size, mtime_ns, ctime_ns) of the stat.  ctime moves on every write
and on every rename or chmod, and no user can set it (``os.utime`` sets mtime and atime only), so a
same-size edit with its mtime put back still misses the memo; a file of another inode moved into
place misses it too.

What is trusted, and when (see docs/s3push.md "The checksum memo"):

* **Identity**: a value is used only when all five fields equal the file's lstat now.
* **Racily clean** (git's index has the same problem): a write in the same timestamp tick as the
  hash would leave the identity unchanged, so an entry is used only when the file's mtime and ctime
  are older than the moment its hash started by more than :data:`MARGIN_NS` (kernel timestamps come
  from a coarse clock; some file systems keep whole or even seconds).  A younger file is hashed again
  next time (and memoized then).
* **Changed while hashed**: the caller gives the identity before and after reading (``fstat`` on the
  same fd); when they differ nothing is memoized.
* **The file**: one per root in ``$XDG_STATE_HOME/manyfiles/checksums`` (the memo is local state, like
  s3push's journal), written whole to a temporary file and renamed over the old one, its body
  covered by a CRC32 in its last line.  A file that is missing, truncated, corrupt, of another
  version or another root is ignored (an empty memo: every file is read), never an error.  Two runs
  on one root each rename a complete file: the last one wins, the other's new entries are lost
  (hashed again next time), nothing is corrupted.  A run killed while saving leaves the old memo and
  a temporary file, removed by a later save once it is an hour old.
* **Bounded**: at most :data:`MAX_ENTRIES` entries per root (the files seen by the run, then the
  entries the run did not look at because its filter left them out), at most :data:`MAX_ROOTS` roots
  (the least recently saved go first).

Example:
    >>> memo = ChecksumMemo.open("/data/run1")                     # doctest: +SKIP
    >>> memo.get("a.bin", Identity.of(os.lstat("/data/run1/a.bin")), "md5")   # doctest: +SKIP
    'd41d8cd98f00b204e9800998ecf8427e'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import NamedTuple

from manyfiles._core.checkpoints import reached

MAGIC = "manyfiles-checksum-memo 1"
MARGIN_NS = 2_000_000_000     # FAT keeps mtimes in 2 s; NFS servers stamp with their own clock
MAX_ENTRIES = 4_000_000
MAX_ROOTS = 64
STALE_TEMP_SECONDS = 3600
_SUFFIX = ".memo"


class Identity(NamedTuple):
    """What says a file's bytes are the ones hashed, without reading them (from a stat)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Identity:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def default_memo_dir() -> str:
    """``$XDG_STATE_HOME/manyfiles/checksums`` (``~/.local/state/...`` when unset)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "manyfiles", "checksums")


def _usable(rel: str) -> bool:
    return "\n" not in rel and "\t" not in rel and "\r" not in rel


class ChecksumMemo:
    """The memo of one local root: :meth:`get` a file's checksum, :meth:`put` one just computed,
    :meth:`save` at the end of a run.  Thread-safe.  A memo that could not be read is empty."""

    def __init__(self, root: str, path: str | None, loaded: dict[str, str],
                 margin_ns: int = MARGIN_NS) -> None:
        self.root, self.path, self.margin_ns = root, path, margin_ns
        self._loaded = loaded               # rel -> the rest of its record, parsed when asked
        self._fresh: dict[str, tuple[Identity, int, dict[str, str]]] = {}
        self._used: set[str] = set()      # loaded entries this run found true: written back as read
        self._lock = threading.Lock()
        self.puts = 0               # values memoized by this run (0: the memo file stays as it is)

    @classmethod
    def open(cls, root: str | os.PathLike, memo_dir: str | os.PathLike | None = None, *,
             margin_ns: int = MARGIN_NS) -> ChecksumMemo:
        """The memo of the folder ``root`` (its real path) kept in ``memo_dir`` (default
        :func:`default_memo_dir`)."""
        root = os.path.realpath(root)
        folder = os.fspath(memo_dir) if memo_dir is not None else default_memo_dir()
        name = hashlib.sha256(os.fsencode(root)).hexdigest()[:32] + _SUFFIX
        path = os.path.join(folder, name)
        return cls(root, path, _load(path, root), margin_ns)

    def get(self, rel: str, now: Identity, method: str) -> str | None:
        """The ``method`` checksum of the file ``rel`` (relative to the root) whose lstat is ``now``,
        when the memo holds it for exactly that identity and it was taken safely after the file's
        last change; else None (hash the file)."""
        fresh = self._fresh.get(rel)
        if fresh is not None:
            ident, taken_ns, sums = fresh
            if ident != now:
                return None
            value = sums.get(method)
        else:
            raw = self._loaded.get(rel)
            if raw is None:
                return None
            head = _identity_text(now)
            if not raw.startswith(head):
                return None
            taken, _, values = raw[len(head):].partition(" ")
            taken_ns = int(taken) if taken.isdigit() else 0
            value = _parse_values(values).get(method)
        if max(now.mtime_ns, now.ctime_ns) + self.margin_ns >= taken_ns:
            return None
        if value is not None and fresh is None:
            with self._lock:
                self._used.add(rel)     # (written back by the next save)
        return value

    def put(self, rel: str, before: Identity, after: Identity, taken_ns: int, method: str,
            value: str) -> None:
        """Remember that the file ``rel`` hashed to ``value`` by ``method``: ``before``/``after`` its
        fstat before and after the bytes were read, ``taken_ns`` (``time.time_ns()``) when the
        reading started.  Nothing is kept for a file that changed meanwhile, nor for one whose
        last change is too recent to tell from a later one (see the module docstring)."""
        if before != after or not _usable(rel) or not _usable(method) or not _usable(value) or " " in value:
            return
        if max(before.mtime_ns, before.ctime_ns) + self.margin_ns >= taken_ns:
            return
        with self._lock:
            old = self._fresh.get(rel)
            sums = dict(old[2]) if old is not None and old[0] == before else {}
            raw = self._loaded.get(rel) if old is None else None
            head = _identity_text(before) if raw is not None else ""
            if raw is not None and raw.startswith(head):       # (its other methods kept)
                sums = _parse_values(raw[len(head):].partition(" ")[2])
            sums[method] = value
            self._fresh[rel] = (before, taken_ns, sums)
            self.puts += 1

    def save(self, carry: Callable[[str], bool] | None = None) -> None:
        """Write the memo: the entries this run used or computed, then (``carry(rel)`` True) loaded
        entries it did not look at (files its filter left out).  Never raises: a memo that
        cannot be written only costs reading the files again next time."""
        if self.path is None:
            return
        with self._lock:
            fresh, used = dict(self._fresh), set(self._used)
        if not self.puts and all(rel in used or (carry is not None and carry(rel)) for rel in self._loaded):
            return                  # (every entry would be written as it was read)
        lines = [_record(rel, *entry) for rel, entry in fresh.items()][:MAX_ENTRIES]
        for rel, raw in self._loaded.items():
            if len(lines) >= MAX_ENTRIES:
                break
            if rel not in fresh and (rel in used or (carry is not None and carry(rel))):
                lines.append(f"{rel}\t{raw}\n")
        body = (f"{MAGIC}\t{self.root}\n" + "".join(lines)).encode("utf-8", "surrogateescape")
        data = body + f"end {len(lines)} {zlib.crc32(body)}\n".encode()
        folder = os.path.dirname(self.path)
        tmp = f"{self.path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                half = len(data) // 2
                os.write(fd, data[:half])
                reached("checksum-memo", (tmp,))      # (a test kills the run here: half a file)
                view = memoryview(data)[half:]
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError:
            _unlink(tmp)
            return
        _prune(folder, keep=self.path)


def _identity_text(ident: Identity) -> str:
    return f"{ident[0]} {ident[1]} {ident[2]} {ident[3]} {ident[4]} "


def _record(rel: str, ident: Identity, taken_ns: int, sums: dict[str, str]) -> str:
    values = " ".join(f"{k}={v}" for k, v in sums.items())
    return f"{rel}\t{_identity_text(ident)}{taken_ns} {values}\n"


def _parse_values(values: str) -> dict[str, str]:
    """A record's ``method=value`` pairs; {} when any does not parse (nothing of it trusted)."""
    sums = {}
    for pair in values.split(" "):
        method, eq, value = pair.partition("=")
        if not eq or not value or not method:
            return {}
        sums[method] = value
    return sums


def _load(path: str, root: str) -> dict[str, str]:
    """The records of the memo file at ``path`` by relative path; {} for anything but a whole,
    intact memo of ``root`` in this version."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return {}
    body, nl, trailer = data[:-1].rpartition(b"\n")
    if not nl or not data.endswith(b"\n"):
        return {}
    body += b"\n"
    parts = trailer.split(b" ")
    if len(parts) != 3 or parts[0] != b"end" or parts[2] != str(zlib.crc32(body)).encode():
        return {}
    text = body.decode("utf-8", "surrogateescape")
    header, _, records = text.partition("\n")
    if header != f"{MAGIC}\t{root}":
        return {}
    out: dict[str, str] = {}
    for line in records.splitlines():
        rel, tab, raw = line.partition("\t")
        if tab:
            out[rel] = raw
    if str(len(out)).encode() != parts[1]:
        return {}
    return out


def _prune(folder: str, keep: str) -> None:
    """Temporary files of killed runs older than an hour, and the least recently saved memos beyond
    :data:`MAX_ROOTS`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    memos = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if name.endswith(".tmp") and now - st.st_mtime > STALE_TEMP_SECONDS:
            _unlink(path)
        elif name.endswith(_SUFFIX) and path != keep:
            memos.append((st.st_mtime, path))
    memos.sort()
    for _, path in memos[:max(0, len(memos) - (MAX_ROOTS - 1))]:
        _unlink(path)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


__all__ = ["MARGIN_NS", "MAX_ENTRIES", "MAX_ROOTS", "ChecksumMemo", "Identity", "default_memo_dir"]
