"""The list step of a push: the local files under each SRC (the C walker), their keys, and the
names refused on the way.

Key rule (s5cmd's, rsync's): ``SRC/`` (a trailing slash) puts the folder's contents under the
prefix; ``SRC`` keeps the folder's name (``prefix/SRC/...``); a file goes to ``prefix/NAME``.
Names that cannot become a key are refused one each, never rewritten: bytes that are not UTF-8
(S3 keys are UTF-8), a newline or carriage return (one key, one line in every listing and log),
a key over S3's 1,024 bytes.  Symlinks are not followed unless asked (they are counted as
skipped); FIFOs, sockets and devices are refused.  Each file carries the (dev, inode) it was
listed with: the executor opens it with ``O_NOFOLLOW`` and refuses a file that is not that
inode any more, so nothing outside SRC is read even if a folder is swapped for a symlink after
the listing.

With ``--files-from`` (:func:`list_named`) the names come from a list, relative to one SRC folder,
and each is checked on its way down from SRC: a name that leaves SRC (``..``, an absolute path
elsewhere), passes through a symlink (unless ``follow_symlinks``), does not exist or is not a
regular file is refused one line each; nothing outside SRC is opened or read.
"""

from __future__ import annotations

import os
import stat as _stat
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from manyfiles.listing import walk

MAX_KEY_BYTES = 1024


class LocalFile(NamedTuple):
    """One file to push: its path (bytes, as listed), its key, and its identity when listed
    (``ctime_ns``: 0 when not known; a sync's checksum memo then never trusts it)."""

    path: bytes
    key: str
    size: int
    mtime_ns: int
    dev: int
    ino: int
    ctime_ns: int = 0


class Refusal(NamedTuple):
    """A listed name that is not pushed: where, why, and a short code."""

    path: bytes
    reason: str
    code: str


class Skip(NamedTuple):
    """A listed entry left alone by rule (a symlink without ``follow_symlinks``)."""

    path: bytes
    reason: str


def _key_of(prefix: str, rel: bytes, path: bytes) -> str | Refusal:
    try:
        text = rel.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal(path, "name is not valid UTF-8 (S3 keys are UTF-8): rename it", "bad-name")
    if "\n" in text or "\r" in text:
        return Refusal(path, "name holds a newline or carriage return: rename it", "bad-name")
    key = prefix + text
    if len(key.encode()) > MAX_KEY_BYTES:
        return Refusal(path, f"the key would be over {MAX_KEY_BYTES} bytes", "bad-name")
    return key


def _file(path: bytes, st: os.stat_result, key: str) -> LocalFile:
    return LocalFile(path, key, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, st.st_ctime_ns)


def list_files(sources: Iterable[str | os.PathLike], prefix: str, *,
               keep: Callable[[str], bool] | None = None,
               follow_symlinks: bool = False, threads: int = 16) -> Iterator[LocalFile | Refusal | Skip]:
    """Every file under ``sources`` as a :class:`LocalFile` (key = ``prefix`` + its relative
    name), or a :class:`Refusal` / :class:`Skip`, in walk order.  ``keep(rel)`` filters by the
    path relative to the source (the one glob rule set).  A source that does not exist is a
    Refusal with code ``ENOENT``."""
    for source in sources:
        raw = os.fsencode(source)
        try:
            st = os.stat(raw)    # the SRC named on the command line is followed, as find -H does
        except OSError as exc:
            yield Refusal(raw, exc.strerror or str(exc), _errno_name(exc))
            continue
        if _stat.S_ISREG(st.st_mode):
            name = os.path.basename(raw.rstrip(b"/"))
            key = _key_of(prefix, name, raw)
            if isinstance(key, Refusal):
                yield key
            elif keep is None or keep(key[len(prefix):]):
                yield _file(raw, st, key)
            continue
        if not _stat.S_ISDIR(st.st_mode):
            yield Refusal(raw, "not a regular file or folder", "not-a-file")
            continue
        root = raw.rstrip(b"/") or b"/"
        base = b"" if raw.endswith(b"/") else os.path.basename(root) + b"/"
        yield from _walk_tree(root, base, prefix, keep, follow_symlinks, threads)


def _walk_tree(root: bytes, base: bytes, prefix: str, keep, follow: bool, threads: int
               ) -> Iterator[LocalFile | Refusal | Skip]:
    cut = len(root) + 1 if root != b"/" else 1
    for d in walk(root, stat=True, follow_symlinks=follow, threads=threads):
        if d.error is not None:
            yield Refusal(d.path, d.error.strerror or str(d.error), _errno_name(d.error))
            continue
        rel_dir = d.path[cut:] + b"/" if len(d.path) >= cut else b""
        for entry, st in zip(d.entries, d.stats or (), strict=False):
            if st is None:          # vanished since it was listed
                continue
            path = d.path + b"/" + entry.name if d.path != b"/" else b"/" + entry.name
            mode = st.st_mode
            if _stat.S_ISDIR(mode):
                continue
            if keep is not None and not keep(os.fsdecode(rel_dir + entry.name)):
                continue        # (a name that is not UTF-8 is matched with its bytes as surrogates)
            if _stat.S_ISLNK(mode):
                if not follow:
                    yield Skip(path, "a symlink, not followed (--follow-symlinks)")
                    continue
                try:
                    st = os.stat(path)
                except OSError as exc:
                    yield Refusal(path, f"symlink to nothing usable: {exc.strerror}", _errno_name(exc))
                    continue
                if _stat.S_ISDIR(st.st_mode):
                    continue        # the walker enters it (follow_symlinks)
                mode = st.st_mode
            if not _stat.S_ISREG(mode):
                yield Refusal(path, "not a regular file (a FIFO, socket or device)", "not-a-file")
                continue
            rel = base + rel_dir + entry.name
            key = _key_of(prefix, rel, path)
            yield key if isinstance(key, Refusal) else _file(path, st, key)


def list_named(source: str | os.PathLike, names: Iterable[bytes | str], prefix: str, *,
               keep: Callable[[str], bool] | None = None,
               follow_symlinks: bool = False) -> Iterator[LocalFile | Refusal | Skip]:
    """The files named in ``names`` (paths relative to the folder ``source``, or absolute paths
    under it), in list order, once each, with the keys :func:`list_files` gives them (``SRC/``:
    the folder's contents under the prefix; ``SRC``: its name kept).  Refused one each: a name
    outside ``source``, through a symlink (without ``follow_symlinks``), missing, not a regular
    file, or one that cannot become a key (see :func:`_key_of`)."""
    raw = os.fsencode(source)
    root = os.path.normpath(raw)
    absroot = os.path.abspath(root)
    base = b"" if raw.endswith(b"/") else os.path.basename(absroot) + b"/"
    folders: dict[bytes, Refusal | None] = {}     # a checked folder under root -> its refusal
    seen: set[bytes] = set()
    for name in names:
        name = os.fsencode(name)
        rel = os.path.normpath(name)
        if os.path.isabs(rel):
            rel = os.path.relpath(rel, absroot) if rel.startswith(absroot.rstrip(b"/") + b"/") else b".."
        if rel == b".." or rel.startswith(b"../") or rel == b".":
            yield Refusal(name, f"not a file under {os.fsdecode(root)} (--files-from names paths relative "
                                "to SRC)", "outside-src")
            continue
        if rel in seen:
            continue
        seen.add(rel)
        path = root + b"/" + rel
        folder = rel.rpartition(b"/")[0]
        refused = _check_folders(root, folder, path, folders, follow_symlinks) if folder else None
        if refused is not None:
            yield refused
            continue
        if keep is not None and not keep(os.fsdecode(rel)):
            continue
        try:
            st = os.lstat(path)
            if _stat.S_ISLNK(st.st_mode):
                if not follow_symlinks:
                    yield Skip(path, "a symlink, not followed (--follow-symlinks)")
                    continue
                st = os.stat(path)
        except OSError as exc:
            yield Refusal(path, exc.strerror or str(exc), _errno_name(exc))
            continue
        if not _stat.S_ISREG(st.st_mode):
            what = "a folder (--files-from names files)" if _stat.S_ISDIR(st.st_mode) else \
                "not a regular file (a FIFO, socket or device)"
            yield Refusal(path, what, "not-a-file")
            continue
        key = _key_of(prefix, base + rel, path)
        yield key if isinstance(key, Refusal) else _file(path, st, key)


def _check_folders(root: bytes, folder: bytes, path: bytes, checked: dict[bytes, Refusal | None],
                   follow: bool) -> Refusal | None:
    """None if every folder of ``folder`` (relative to ``root``) is a real folder (or, with
    ``follow``, a symlink to one), else the refusal of ``path``; each folder is looked at once."""
    parts = folder.split(b"/")
    for i in range(1, len(parts) + 1):
        sub = b"/".join(parts[:i])
        if sub in checked:
            if checked[sub] is not None:
                return checked[sub]._replace(path=path)
            continue
        refused = None
        try:
            st = os.lstat(root + b"/" + sub)
            if _stat.S_ISLNK(st.st_mode) and follow:
                st = os.stat(root + b"/" + sub)
            if _stat.S_ISLNK(st.st_mode):
                refused = Refusal(path, f"{os.fsdecode(sub)} is a symlink, not followed (--follow-symlinks)",
                                  "symlink")
            elif not _stat.S_ISDIR(st.st_mode):
                refused = Refusal(path, "Not a directory", "ENOTDIR")
        except OSError as exc:
            refused = Refusal(path, exc.strerror or str(exc), _errno_name(exc))
        checked[sub] = refused
        if refused is not None:
            return refused
    return None


def _errno_name(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, "OSError")
