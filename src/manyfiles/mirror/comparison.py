"""A local folder against an S3 prefix: what is missing on either side, what differs, what is the same.

One listing of each side: the local tree by the C walker (:func:`manyfiles.listing.walk`, an lstat
per entry, symlinks never followed), the prefix by the store's ListObjectsV2 (one LIST per 1,000
keys).  Paths are matched by name: the key is ``prefix + path`` (``/``-separated, relative to the
local root).  Pairs of the same name are then compared ``by`` one rule:

=============  ==================================================================================
``size``       the sizes only
``size-mtime`` the sizes, and the destination not older than the source (``source="local"``: the
               object's LastModified >= the file's mtime, as ``s5cmd sync`` and ``aws s3 sync``
               decide an upload; ``source="remote"``: the file's mtime >= LastModified, a download)
``checksum``   the sizes, then the file's bytes hashed against the object's own check
               (:func:`~manyfiles.s3.integrity.object_claim`): an ETag that is an MD5 (a single
               PUT) is compared with the file's MD5 without any request; any other object (a
               multipart ETag, an SSE-KMS ETag) gets one HEAD with ``x-amz-checksum-mode`` and its
               full-object checksum (CRC64NVME, CRC32C, CRC32, SHA) is compared, else its multipart
               ETag at the part sizes the server reports.  An MD5 that does not match is confirmed
               by a HEAD (an encrypted object's ETag is no MD5) before the pair counts as differing.
=============  ==================================================================================

Nothing is written on either side.  Names that cannot be compared are ``skipped`` (a symlink, a
device, a local name that is not UTF-8, a key that is no safe path: ``../x``, ``a//b``) or failures
(an unreadable folder or file, an object that allows no check).

Example:
    >>> from manyfiles.mirror import compare
    >>> from manyfiles.s3.store import store_for
    >>> c = compare("/data/run1", store_for(None, "bucket"), "runs/run1/")   # doctest: +SKIP
    >>> [e.path for e in c.missing_remote], c.equal                        # doctest: +SKIP
    (['logs/last.txt'], False)
"""

from __future__ import annotations

import os
import stat as _stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from manyfiles._core.checksum_memo import ChecksumMemo, Identity
from manyfiles._core.pool import Pool
from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles._core.report import Report
from manyfiles.errors import (
    IntegrityError,
    ManyfilesError,
    NotFound,
    TransferError,
    UsageError,
    WrongKind,
    describe_oserror,
    from_oserror,
    shown,
)
from manyfiles.listing import walk
from manyfiles.mirror.options import BY, SOURCES
from manyfiles.s3.integrity import SIZE_ONLY, Claim, Unverifiable, object_claim, rehash_file
from manyfiles.s3.keys import STATE_DIR, make_filter
from manyfiles.s3.layouts import etag_parts

# what ``Entry.why`` says for each kind of difference
MISSING_REMOTE = "missing remote"
MISSING_LOCAL = "missing local"
SIZE = "size"
RECORDED = "recorded"
# LastModified has whole seconds on some stores (and ms on others): a file written within the same
# second as its object counts as not newer, as s5cmd and aws compare them
MTIME_SLACK = 1.0
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    """One name on either side: its path relative to the local root (``/``-separated, the key minus
    the prefix), its key, what each side said (None: absent there) and ``why`` it is listed where
    it is (``"size"``, ``"md5"``, ``"crc64nvme"``, ``"local newer"``...: for a pair found the same,
    the check that said so)."""

    path: str
    key: str
    local_size: int | None = None
    remote_size: int | None = None
    local_mtime: float | None = None
    remote_mtime: float | None = None
    etag: str | None = None
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "key": self.key, "local_size": self.local_size,
                "remote_size": self.remote_size, "why": self.why}


@dataclass(kw_only=True)
class Comparison(Report):
    """What :func:`compare` found.  ``missing_remote``: files with no object; ``missing_local``:
    objects with no file (the extras of a push, what a pull would fetch); ``differing``: both
    there, not the same by the rule ``by``; ``same``; ``skipped``: names not compared (symlinks,
    special files, names that cannot be keys or paths).  ``failures``: what could not be read or
    checked.  ``equal``: nothing missing, differing or failed."""

    local_root: str = ""
    url: str = ""
    by: str = "checksum"
    source: str = "local"
    missing_remote: list[Entry] = field(default_factory=list)
    missing_local: list[Entry] = field(default_factory=list)
    differing: list[Entry] = field(default_factory=list)
    same: list[Entry] = field(default_factory=list)
    skipped: list[Entry] = field(default_factory=list)
    local_files: int = 0
    remote_objects: int = 0
    memo_hits: int = 0          # pairs found the same (or not) by the checksum memo, no byte read
    heads: int = 0              # objects asked with a HEAD (checksum: an ETag that is no MD5, or a
                                # mismatch to confirm; a multipart ETag's part sizes: one more each)
    hashed_bytes: int = 0       # local bytes read to compare checksums

    @property
    def equal(self) -> bool:
        """True when both sides hold the same names with the same content (by the rule ``by``)."""
        return not (self.missing_remote or self.missing_local or self.differing or self.failures)

    def differences(self) -> Iterator[tuple[str, Entry]]:
        """``("missing-remote" | "missing-local" | "differing", entry)`` for every difference, by path."""
        out = [("missing-remote", e) for e in self.missing_remote] + \
              [("missing-local", e) for e in self.missing_local] + [("differing", e) for e in self.differing]
        return iter(sorted(out, key=lambda ke: ke[1].path))

    def summary(self) -> str:
        return (f"{self.local_files:,} files, {self.remote_objects:,} objects compared by {self.by}: "
                f"{len(self.same):,} same, {len(self.differing):,} differing, "
                f"{len(self.missing_remote):,} missing remote, {len(self.missing_local):,} missing local"
                + (f", {len(self.skipped):,} skipped" if self.skipped else "") + f" in {self.seconds:.2f} s")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"local_root": self.local_root, "url": self.url, "by": self.by,
                               "source": self.source, "equal": self.equal, "local_files": self.local_files,
                               "remote_objects": self.remote_objects, "same": len(self.same),
                               "differing": len(self.differing), "missing_remote": len(self.missing_remote),
                               "missing_local": len(self.missing_local), "skipped": len(self.skipped),
                               "heads": self.heads, "hashed_bytes": self.hashed_bytes,
                               "memo_hits": self.memo_hits,
                               "seconds": round(self.seconds, 3),
                               "failures": [{"path": f.path, "code": f.code, "reason": f.reason}
                                            for f in self.failures]}
        return out


class LocalFile(NamedTuple):
    """One local file as the walk saw it (lstat): its size, mtime (seconds since the epoch) and
    identity (what the checksum memo keys on; None: unknown, the file is always read)."""

    size: int
    mtime: float
    identity: Identity | None = None


def _check_args(by: str, source: str, workers: int, progress: object) -> None:
    check_progress(progress)
    if by not in BY:
        raise UsageError(f"by must be one of {', '.join(BY)}, not {by!r}")
    if source not in SOURCES:
        raise UsageError(f"source must be 'local' or 'remote', not {source!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")


def folder_prefix(prefix: str) -> str:
    """``prefix`` as a folder: ``""`` (the whole bucket) or ending in ``/``."""
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def local_files(root: str | os.PathLike, *, keep: Callable[[str], bool] | None = None,
                threads: int = 16, report: Comparison | None = None) -> dict[str, LocalFile]:
    """Every regular file under ``root`` by its ``/``-separated relative path (str), with its size
    and mtime, walked by the C walker without following symlinks.  Symlinks, special files and
    names that are not UTF-8 (no key can hold them) go to ``report.skipped``, unreadable folders
    to its failures.  s3pull's state folder (``root/.s3pull``) is never listed."""
    base = os.fsencode(os.path.abspath(root))
    try:
        st = os.stat(base)
    except FileNotFoundError:
        raise NotFound(f"{shown(os.fspath(root))}: No such file or directory") from None
    except OSError as exc:
        raise ManyfilesError(f"{shown(os.fspath(root))}: {describe_oserror(exc)}") from exc
    if not _stat.S_ISDIR(st.st_mode):
        raise WrongKind(f"{shown(os.fspath(root))}: not a directory")
    report = report if report is not None else Comparison()
    out: dict[str, LocalFile] = {}
    cut = len(base) + 1
    for d in walk(base, threads=threads, stat=True):
        rel_dir = d.path[cut:] if len(d.path) > len(base) else b""
        if rel_dir == STATE_DIR.encode() or rel_dir.startswith(STATE_DIR.encode() + b"/"):
            continue
        if d.error is not None:
            if d.depth == 0:        # the folder named itself: the run cannot start (one line, exit 1)
                raise from_oserror(d.error, os.fspath(root)) from d.error
            report.add_failure(_text(rel_dir) or ".", describe_oserror(d.error), _errname(d.error))
            continue
        for entry, st in zip(d.entries, d.stats or [None] * len(d.entries), strict=True):
            name = entry.name
            raw = rel_dir + b"/" + name if rel_dir else name
            if entry.type == "d" or (st is not None and _stat.S_ISDIR(st.st_mode)):
                continue
            try:
                rel = raw.decode("utf-8")
            except UnicodeDecodeError:
                report.skipped.append(Entry(_text(raw), "", why="name is not UTF-8 (no S3 key can hold it)"))
                continue
            if keep is not None and not keep(rel):
                continue
            if st is None:          # vanished between the listing and its lstat
                continue
            if not _stat.S_ISREG(st.st_mode):
                kind = "symlink (not followed)" if _stat.S_ISLNK(st.st_mode) else "not a regular file"
                report.skipped.append(Entry(rel, "", local_size=st.st_size, why=kind))
                continue
            out[rel] = LocalFile(st.st_size, st.st_mtime, Identity.of(st))
    return out


def _text(raw: bytes) -> str:
    return shown(raw) if raw else ""


def _errname(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, "")


def compare(local_root: str | os.PathLike, store: Any, prefix: str = "", *, by: str = "checksum",
            source: str = "local", include: Iterable[str] = (), exclude: Iterable[str] = (),
            workers: int = 16, walk_threads: int = 16, known: Callable[[Entry], bool] | None = None,
            progress: ProgressArg = False, local: Mapping[str, LocalFile] | None = None,
            memo: bool | str | os.PathLike = True) -> Comparison:
    """Compare the files under ``local_root`` with the objects under ``prefix`` of ``store``.

    ``store``: a :class:`manyfiles.s3.store.Store` (one bucket; :func:`~manyfiles.s3.store.store_for`).
    ``prefix``: a folder of the bucket (``"runs/1/"``; a ``/`` is added when missing, ``""`` is the
    whole bucket).  ``by``: ``"size"``, ``"size-mtime"`` or ``"checksum"`` (see the module
    docstring); ``source``: the side a copy would go from (``size-mtime``: the destination must
    not be older).  ``include``/``exclude``: globs on the relative path (s3pull's rule: a pattern
    without ``/`` on the name).  ``workers``: files hashed and HEADs sent at once.  ``known``: a
    record of earlier copies (s3pull's state, a push journal): a pair of the same size it accepts
    (``known(entry)`` True: this file is that object's version, unchanged since) is the same
    without being hashed (``why="recorded"``).  ``local``: the files under ``local_root`` when the
    caller walked it already (:func:`local_files`' form, filtered by the same rules): it is not
    walked again (s3push --sync).  ``memo`` (``checksum`` only): the checksum memo of
    ``local_root`` (:mod:`manyfiles._core.checksum_memo`: a file whose stat identity is unchanged
    since it was hashed is not read again; docs/s3push.md says what it trusts); True: kept in
    ``$XDG_STATE_HOME/manyfiles/checksums``, a path: kept in that folder, False: every file is read.

    Raises NotFound / WrongKind for a ``local_root`` that is missing or no folder, and the
    listing's TransferError (no bucket, credentials refused); per-file problems are failures of
    the :class:`Comparison` returned, never raised.
    """
    _check_args(by, source, workers, progress)
    t0 = time.monotonic()
    prefix = folder_prefix(prefix)
    keep = make_filter(tuple(include), tuple(exclude))
    report = Comparison(local_root=os.path.abspath(local_root), url=f"s3://{store.bucket}/{prefix}", by=by,
                        source=source)
    memo_of = None
    if by == "checksum" and memo is not False:
        memo_of = ChecksumMemo.open(report.local_root, None if memo is True else memo)
    with progress_for(progress, "compare", unit="names") as shown_progress:
        files = dict(local) if local is not None else local_files(local_root, keep=keep, threads=walk_threads,
                                                                   report=report)
        report.local_files = len(files)
        pending: list[tuple[Entry, LocalFile]] = []
        for info in store.list(prefix, mtime=by == "size-mtime"):
            rel = info.key[len(prefix):]
            if keep is not None and not keep(rel):
                continue
            if info.key.endswith("/") and not info.size:
                continue            # a folder marker
            report.remote_objects += 1
            shown_progress.add(1)
            local = files.pop(rel, None)
            why = _unsafe(rel)
            if why:
                report.skipped.append(Entry(rel, info.key, remote_size=info.size, etag=info.etag, why=why))
                continue
            entry = Entry(rel, info.key, None if local is None else local.size, info.size,
                          None if local is None else local.mtime, info.mtime, info.etag)
            if local is None:
                report.missing_local.append(_with(entry, MISSING_LOCAL))
            elif local.size != info.size:
                report.differing.append(_with(entry, SIZE))
            elif by == "size":
                report.same.append(_with(entry, SIZE))
            elif known is not None and known(entry):
                report.same.append(_with(entry, RECORDED))
            elif by == "size-mtime":
                _by_mtime(entry, source, report)
            elif memo_of is not None and _memo_says_same(memo_of, entry, local.identity):
                report.memo_hits += 1
                report.same.append(_with(entry, "md5"))
            else:
                pending.append((entry, local))
        shown_progress.add(len(files))
        for rel, local in files.items():
            report.missing_remote.append(Entry(rel, prefix + rel, local.size, None, local.mtime, None, None,
                                               MISSING_REMOTE))
        if pending:
            _by_checksum(pending, report.local_root, store, report, workers, memo_of)
    if memo_of is not None:
        memo_of.save(carry=None if keep is None else (lambda rel: not keep(rel)))
    for name in ("missing_remote", "missing_local", "differing", "same", "skipped"):
        getattr(report, name).sort(key=lambda e: e.path)
    report.seconds = time.monotonic() - t0
    return report


def _with(entry: Entry, why: str) -> Entry:
    return Entry(entry.path, entry.key, entry.local_size, entry.remote_size, entry.local_mtime,
                 entry.remote_mtime, entry.etag, why)


def _unsafe(rel: str) -> str:
    """Why a key (minus the prefix) names no local path ('' when it does)."""
    from manyfiles.s3.keys import local_relpath

    try:
        local_relpath(rel)
    except ManyfilesError as exc:
        return f"unsafe key: {exc}"
    return ""


def _by_mtime(entry: Entry, source: str, report: Comparison) -> None:
    local, remote = entry.local_mtime, entry.remote_mtime
    if local is None or remote is None:
        report.differing.append(_with(entry, "no LastModified"))
    elif source == "local" and local > remote + MTIME_SLACK:
        report.differing.append(_with(entry, "local newer"))
    elif source == "remote" and remote > local + MTIME_SLACK:
        report.differing.append(_with(entry, "remote newer"))
    else:
        report.same.append(_with(entry, "size-mtime"))


def _memo_says_same(memo: ChecksumMemo, entry: Entry, identity: Identity | None) -> bool:
    """Whether the memo holds the file's MD5 and it is the listed ETag (the fast path: no thread,
    no HEAD; anything else goes to :func:`_by_checksum`).  A memoized MD5 is the value of an MD5
    claim the file passed, so an ETag equal to it is that claim's again (no need to make it)."""
    if identity is None or not entry.etag or len(entry.etag) != 32:
        return False
    return memo.get(entry.path, identity, "md5") == entry.etag


def _by_checksum(pending: list[tuple[Entry, LocalFile]], root: str, store: Any, report: Comparison,
                 workers: int, memo: ChecksumMemo | None = None) -> None:
    """Hash each file against its object's check, ``workers`` at once."""
    lock = threading.Lock()

    def one(item: tuple[Entry, LocalFile]) -> None:
        entry, identity = item[0], item[1].identity
        heads = hashed = 0
        try:
            claim = _listed_claim(entry)
            if claim is None:
                claim = _head_claim(store, entry)
                heads += 1
            ok, hashed = _matches(root, entry, claim, memo, identity)
            if not ok and claim.method == "md5":
                head = _head_claim(store, entry)      # an SSE-KMS ETag is no MD5: the server decides
                heads += 1
                if head.method != "md5":
                    claim = head
                    ok, more = _matches(root, entry, claim, memo, identity)
                    hashed += more
            result = ("same" if ok else "differing", _with(entry, _label(claim)))
        except (IntegrityError, TransferError, ManyfilesError, OSError) as exc:
            result = ("failure", exc)
        with lock:
            report.heads += heads
            report.hashed_bytes += hashed
            if result[0] == "failure":
                exc = result[1]
                if isinstance(exc, OSError):
                    report.add_failure(entry.path, describe_oserror(exc), _errname(exc))
                else:
                    report.add_failure(entry.path, str(exc), getattr(exc, "code", "") or "error")
            else:
                getattr(report, result[0]).append(result[1])

    Pool(one, workers, name="mirror-compare").run(pending)


def _listed_claim(entry: Entry) -> Claim | None:
    """The check the listing alone allows: an MD5 ETag (None: ask the server with a HEAD)."""
    if entry.etag and etag_parts(entry.etag) == 0 and len(entry.etag) == 32:
        try:
            claim = object_claim(entry.etag, {}, entry.remote_size, None)
        except Unverifiable:
            return None
        return claim if claim.method == "md5" else None
    return None


def _head_claim(store: Any, entry: Entry) -> Claim:
    head = store.head(entry.key, etag=entry.etag, size=entry.remote_size)
    return head.claim


def _label(claim: Claim) -> str:
    if claim.method == SIZE_ONLY:
        return f"size (no content check: {claim.why or 'none available'})"
    return claim.kind


def _matches(root: str, entry: Entry, claim: Claim, memo: ChecksumMemo | None = None,
             identity: Identity | None = None) -> tuple[bool, int]:
    """Whether the local file passes ``claim``, and the bytes read; a file that changed size
    since it was listed raises (it is a failure, not a difference).  With a ``memo`` and the
    file's listed ``identity``, a whole-object checksum is taken from the memo when it holds it,
    and memoized when the file passes (the value is then the claim's)."""
    if claim.method == SIZE_ONLY:
        return True, 0
    whole = memo is not None and bool(claim.value) and not claim.parts and not claim.composite \
        and not claim.layout_searched
    if whole and identity is not None:
        known = memo.get(entry.path, identity, claim.method)
        if known is not None:
            return known == claim.value, 0
    fd = os.open(os.path.join(root, entry.path), _READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode) or st.st_size != entry.local_size:
            raise ManyfilesError("changed while it was compared")
        taken_ns = time.time_ns()
        try:
            rehash_file(fd, st.st_size, claim)
        except IntegrityError:
            return False, st.st_size
        if whole:
            memo.put(entry.path, Identity.of(st), Identity.of(os.fstat(fd)), taken_ns, claim.method,
                     claim.value)
        return True, st.st_size
    finally:
        os.close(fd)


__all__ = ["BY", "MISSING_LOCAL", "MISSING_REMOTE", "RECORDED", "SOURCES", "Comparison", "Entry", "LocalFile",
           "compare",
           "folder_prefix", "local_files"]
