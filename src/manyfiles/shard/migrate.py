"""Crash-safe in-place migration: flat -> tree (apply), tree -> flat (revert), and re-sharding.

Data flow: list -> plan -> execute -> report.  Every file moves with one rename that never
replaces an existing name; each move is idempotent (source gone + destination present =
done), so a rerun after kill -9 at any point simply continues.  Work is partitioned by top
bucket: one worker owns ``ab/`` and everything below it, so no two workers ever create or
rename entries in the same bucket directory.  The design is explained in docs/shard.md.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from manyfiles import _fsops, listing
from manyfiles._testing import killpoint
from manyfiles.errors import ManyfilesError, UsageError, describe_oserror
from manyfiles.shard.journal import JOURNAL, Journal, Lock, lock_holder, name_to_json, read_records
from manyfiles.shard.layout import RESERVED_PREFIX, Layout
from manyfiles.shard.sharded_dir import (
    DESCRIPTOR,
    TMP_PREFIX,
    BucketStats,
    create_descriptor,
    estimate_files,
    open_dir,
    read_descriptor,
    remove_descriptor,
)

ASIDE = b".manyfiles-shard.aside"
Progress = Callable[[int, int], None]

_FATAL = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EXDEV, errno.EIO, errno.EACCES}
_MAX_ERRORS = 1000
_RESCANS = 3  # extra passes for files created while we run


# -- results -------------------------------------------------------------------------------------


@dataclass
class MigrationReport:
    """What a migration did.  ``ok`` is False when something was left in place."""

    op: str
    root: str
    layout: Layout
    moved: int = 0
    already: int = 0       # found done: a previous (killed) run or an NFS rename retry did it
    vanished: int = 0      # deleted by someone else before we got to it
    appeared: int = 0      # created during the migration and moved by a rescan
    set_aside: int = 0     # files named like a top bucket, parked in the aside directory first
    buckets: int = 0
    resumed: bool = False
    nothing_to_do: bool = False
    skipped: list[tuple[bytes, str]] = field(default_factory=list)   # left alone on purpose
    conflicts: list[bytes] = field(default_factory=list)             # name at source AND destination
    errors: list[tuple[bytes, str]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.conflicts and not self.errors

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Plan:
    """A dry run of ``apply``: nothing is moved."""

    root: str
    layout: Layout
    moves: list[tuple[bytes, bytes]]          # (name, relative destination)
    per_bucket: dict[bytes, int]
    collisions: list[bytes]                   # flat files named like a top bucket (moved aside first)
    skipped: list[tuple[bytes, str]]
    blocking: list[bytes]                     # subdirectories named like buckets: apply refuses
    already_sharded: bool

    @property
    def stats(self) -> BucketStats:
        return BucketStats.from_counts(list(self.per_bucket.values()))

    def write_csv(self, path: str) -> None:
        """``source,destination`` per move, relative to the root (names byte-exact)."""
        with open(path, "w", newline="", encoding="utf-8", errors="surrogateescape") as f:
            w = csv.writer(f)
            w.writerow(["source", "destination"])
            for name, dest in self.moves:
                w.writerow([os.fsdecode(name), os.fsdecode(dest)])


@dataclass
class VerifyReport:
    root: str
    layout: Layout
    files: int = 0
    buckets: int = 0
    flat: list[bytes] = field(default_factory=list)                    # files still at the root
    misplaced: list[tuple[bytes, bytes]] = field(default_factory=list)  # (where, where it should be)
    duplicates: list[bytes] = field(default_factory=list)
    temp_files: list[bytes] = field(default_factory=list)
    foreign: list[bytes] = field(default_factory=list)                 # directories we left alone
    in_progress: str | None = None
    expected: int | None = None

    @property
    def ok(self) -> bool:
        count_ok = self.expected is None or self.expected == self.files
        return count_ok and not (self.flat or self.misplaced or self.duplicates or self.temp_files
                                 or self.in_progress)


@dataclass
class Status:
    root: str
    layout: Layout | None
    flat_files: int
    estimate: int
    journal: dict[str, Any] | None      # header of an unfinished migration
    done: int                           # files moved so far by that migration
    running_pid: int | None


# -- shared helpers ------------------------------------------------------------------------------


def _abs(root: str | bytes | os.PathLike) -> bytes:
    return os.fsencode(os.path.abspath(os.fspath(root)))


def _open_root(rootb: bytes) -> int:
    try:
        return open_dir(rootb)
    except OSError as exc:
        raise ManyfilesError(f"{os.fsdecode(rootb)}: {describe_oserror(exc)}") from exc


def _layout_doc(layout: Layout | None) -> dict[str, Any] | None:
    return None if layout is None else json.loads(layout.to_json())


def _layout_from(doc: dict[str, Any] | None) -> Layout | None:
    return None if doc is None else Layout.from_json(json.dumps(doc).encode())


def _lexists(name: bytes, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def _scan_root(rootb: bytes, layout: Layout) -> tuple[list[bytes], list[bytes], list[tuple[bytes, str]]]:
    """(flat non-directory names, bucket-named subdirectories, skipped entries) of the root."""
    flat, buckets, skipped = [], [], []
    for e in listing.iter_entries(rootb):
        name = e.name
        if name.startswith(RESERVED_PREFIX):
            if not name.startswith(b".manyfiles-shard"):
                skipped.append((name, "reserved name"))
        elif e.type == "d":
            if layout.is_bucket(name, 0):
                buckets.append(name)
            else:
                skipped.append((name, "subdirectory left in place"))
        else:
            flat.append(name)
    return flat, buckets, skipped


def _group(layout: Layout, names: list[bytes]) -> dict[bytes, dict[bytes, list[bytes]]]:
    """top bucket -> leaf path -> names: the unit of work is one top bucket."""
    tops: dict[bytes, dict[bytes, list[bytes]]] = {}
    for name in names:
        parts = layout.buckets(name)
        leaf = b"/".join(parts)
        tops.setdefault(parts[0], {}).setdefault(leaf, []).append(name)
    return tops


_MEMORY_FS = ("tmpfs", "ramfs")


def default_workers(path: bytes) -> int:
    """1 on memory filesystems, 4 elsewhere.

    On tmpfs a rename never waits for I/O, and every move also locks the one flat directory,
    so extra threads only add lock and GIL hand-offs.  On disks and network filesystems the
    workers overlap the waits (journal commits, round trips); see docs/benchmarks.md.
    """
    real = os.path.realpath(path)
    best, fstype = b"", b""
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split()
                mnt = fields[4].replace(b"\\040", b" ")
                sep = fields.index(b"-")
                inside = real == mnt or real.startswith(mnt.rstrip(b"/") + b"/")
                if inside and len(mnt) >= len(best):
                    best, fstype = mnt, fields[sep + 1]
    except (OSError, ValueError, IndexError):
        return 4
    return 1 if fstype.decode(errors="replace") in _MEMORY_FS else 4


def _clean_descriptor_temps(rootfd: int, rootb: bytes) -> None:
    for e in listing.iter_entries(rootb):
        if e.name.startswith(DESCRIPTOR + b".") and e.name.endswith(b".tmp"):
            with contextlib.suppress(FileNotFoundError):
                _fsops.unlink(e.name, dir_fd=rootfd)


# -- the engine ----------------------------------------------------------------------------------


class _Migration:
    """State of one run: root fd, lock, journal, counters, worker pool."""

    def __init__(self, root: str | bytes | os.PathLike, op: str, workers: int | None,
                 progress: Progress | None, journal_sync: bool) -> None:
        self.rootb = _abs(root)
        workers = default_workers(self.rootb) if workers is None else workers
        self.op, self.workers, self.progress, self.journal_sync = op, max(1, workers), progress, journal_sync
        self.rootfd = _open_root(self.rootb)
        self.dev = os.fstat(self.rootfd).st_dev
        self.lock = Lock(self.rootfd, self.rootb)
        self.journal: Journal | None = None
        self.report: MigrationReport | None = None
        self._mutex = threading.Lock()
        self._stop = False
        self._layout: Layout | None = None
        self.done = self.total = 0

    # context management: lock on entry; always release the lock, keep the journal on failure
    def __enter__(self) -> _Migration:
        try:
            self.lock.acquire()
        except OSError as exc:
            os.close(self.rootfd)
            raise ManyfilesError(f"{os.fsdecode(self.rootb)}: {describe_oserror(exc)} "
                                 "(nothing was moved)") from exc
        except BaseException:
            os.close(self.rootfd)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.journal is not None:
            self.journal.flush()
            self.journal.close()
        # the flock is the lock; the file goes too, so a finished directory holds nothing of ours
        self.lock.release(remove=True)
        os.close(self.rootfd)

    def where(self, name: bytes) -> str:
        return os.fsdecode(os.path.join(self.rootb, name))

    def finish(self) -> None:
        """Make every rename durable, then drop the journal: the migration is complete."""
        _fsops.syncfs(self.rootfd, self.rootb)
        killpoint("finish")
        assert self.journal is not None
        self.journal.remove()
        self.journal = None

    def note(self, record: dict[str, Any], durable: bool = False) -> None:
        with self._mutex:
            assert self.journal is not None
            self.journal.append(record, durable=durable)

    # -- moving one name -----------------------------------------------------------------------

    def move(self, sfd: int, sname: bytes, dfd: int, dname: bytes, label: bytes,
             as_: str | None = "moved") -> bool:
        """Rename without replacing; True if this call moved it (False: done, vanished, conflict).

        ``as_`` names the report counter to bump; None leaves counting to the caller (hot loops
        count per bucket instead of taking the report lock per file).
        """
        rep = self.report
        assert rep is not None
        try:
            _fsops.rename_noreplace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        except FileNotFoundError:
            if _lexists(dname, dfd):
                self.tally("already")  # source gone + destination present = done
            elif _lexists(sname, sfd):
                raise ManyfilesError(f"{self.where(label)}: destination directory disappeared") from None
            else:
                self.tally("vanished")
            return False
        except FileExistsError:
            if _lexists(sname, sfd):
                rep.conflicts.append(label)  # two different files with one name: keep both
            else:
                self.tally("already")
            return False
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise ManyfilesError(f"{self.where(label)}: on another filesystem; shard only renames "
                                     "within one filesystem") from exc
            if exc.errno in _FATAL:
                raise ManyfilesError(f"{self.where(label)}: {describe_oserror(exc)}") from exc
            rep.errors.append((label, describe_oserror(exc)))
            if len(rep.errors) > _MAX_ERRORS:
                raise ManyfilesError(f"{self.where(label)}: too many errors, stopping") from exc
            return False
        if as_ is not None:
            self.tally(as_)
        killpoint("move")
        return True

    def open_bucket(self, rel: bytes, create: bool) -> int:
        """fd of the bucket directory ``rel`` (``ab/cd``), created level by level if asked."""
        if create:
            self.make_bucket(rel)
        fd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.rootfd)
        if os.fstat(fd).st_dev != self.dev:
            os.close(fd)
            raise ManyfilesError(f"{self.where(rel)}: is on another filesystem (a mount point); "
                                 "refusing a cross-device move")
        return fd

    def make_bucket(self, rel: bytes) -> None:
        # mkdir first: on a fresh run the bucket is usually new, so this is one syscall
        try:
            _fsops.mkdir(rel, dir_fd=self.rootfd)
        except FileExistsError:
            return
        except FileNotFoundError:
            parent = rel.rpartition(b"/")[0]
            if not parent:
                raise
            self.make_bucket(parent)
            with contextlib.suppress(FileExistsError):
                _fsops.mkdir(rel, dir_fd=self.rootfd)
        killpoint("mkdir")

    def count(self, n: int) -> None:
        with self._mutex:
            self.done += n

    def tally(self, what: str, n: int = 1) -> None:
        with self._mutex:  # workers share the report; += on an attribute is not atomic
            setattr(self.report, what, getattr(self.report, what) + n)

    # -- worker pool ---------------------------------------------------------------------------

    def run_parallel(self, fn: Callable[[Any], None], items: list[Any]) -> None:
        """Run ``fn(item)`` for each item on the workers, reporting progress meanwhile."""
        if self.workers == 1 or len(items) <= 1:
            last = 0.0
            for item in items:
                fn(item)
                if self.progress and time.monotonic() - last > 0.2:
                    last = time.monotonic()
                    self.progress(self.done, self.total)
        else:
            with ThreadPoolExecutor(self.workers, thread_name_prefix="shard") as pool:
                pending = {pool.submit(self._guarded, fn, item) for item in items}
                try:
                    while pending:
                        finished, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
                        for f in finished:
                            f.result()
                        if self.progress:
                            self.progress(self.done, self.total)
                except BaseException:
                    self._stop = True
                    for f in pending:
                        f.cancel()
                    raise
        if self.progress:
            self.progress(self.done, self.total)

    def _guarded(self, fn: Callable[[Any], None], item: Any) -> None:
        if not self._stop:
            fn(item)

    # -- apply: flat -> tree -------------------------------------------------------------------

    def apply_round(self, layout: Layout, flat: list[bytes]) -> None:
        rep = self.report
        assert rep is not None
        # 1. flat files named like a top bucket (a file "ab" where "ab/" must go) step aside first,
        #    before any worker can mkdir that bucket; the journal records each one before it moves.
        collide = [n for n in flat if layout.is_bucket(n, 0)]
        if collide:
            asidefd = self.open_bucket(ASIDE, create=True)
            try:
                for name in collide:
                    self.note({"type": "aside", "name": name_to_json(name)}, durable=True)
                    self.move(self.rootfd, name, asidefd, name, name, "set_aside")
                    killpoint("aside")
            finally:
                os.close(asidefd)
            moved_aside = set(collide)
            flat = [n for n in flat if n not in moved_aside]
        # 2. everything else, one top bucket per task
        tops = _group(layout, flat)
        rep.buckets += sum(len(leaves) for leaves in tops.values())
        self.run_parallel(self._apply_top, list(tops.items()))
        # 3. the set-aside files go to their buckets (also those of an earlier, killed run)
        self.place_aside(lambda name: layout.bucket_rel(name))

    def _apply_top(self, item: tuple[bytes, dict[bytes, list[bytes]]]) -> None:
        top, leaves = item
        n = 0
        for leaf, names in leaves.items():
            if self._stop:
                return
            lfd = self.open_bucket(leaf, create=True)
            moved = 0
            try:
                for name in names:
                    moved += self.move(self.rootfd, name, lfd, name, name, None)
            finally:
                os.close(lfd)
                self.tally("moved", moved)
            self.count(len(names))
            n += len(names)
        self.note({"type": "done", "top": name_to_json(top), "files": n})

    def place_aside(self, dest_rel: Callable[[bytes], bytes | None]) -> None:
        """Move every file in the aside directory to ``dest_rel(name)`` (None = the root)."""
        try:
            names = [e.name for e in listing.iter_entries(os.path.join(self.rootb, ASIDE))]
        except FileNotFoundError:
            return
        asidefd = self.open_bucket(ASIDE, create=False)
        try:
            for name in names:
                rel = dest_rel(name)
                dfd = self.rootfd if rel is None else self.open_bucket(rel, create=True)
                try:
                    self.move(asidefd, name, dfd, name, name)
                finally:
                    if dfd != self.rootfd:
                        os.close(dfd)
                killpoint("place")
        finally:
            os.close(asidefd)
        if _fsops.rmdir_if_empty(ASIDE, dir_fd=self.rootfd):
            self.note({"type": "aside-done"}, durable=True)

    # -- revert: tree -> flat ------------------------------------------------------------------

    def scan_tree(self, layout: Layout) -> tuple[dict[bytes, list[tuple[bytes, list[bytes]]]], int]:
        """top -> [(directory, non-directory names)] for every bucket directory, and the file count."""
        depth = len(layout.levels)
        tops: dict[bytes, list[tuple[bytes, list[bytes]]]] = {}
        total = 0
        rep = self.report
        assert rep is not None
        for d in listing.walk(self.rootb, max_depth=depth):
            if d.depth == 0:
                continue
            rel = d.path[len(self.rootb):].lstrip(b"/")
            parts = rel.split(b"/")
            if not all(layout.is_bucket(p, i) for i, p in enumerate(parts)):
                continue
            if d.error is not None:
                raise ManyfilesError(f"{self.where(rel)}: {describe_oserror(d.error)}")
            names = []
            for e in d.entries:
                if e.type != "d":
                    names.append(e.name)
                elif d.depth == depth:
                    rep.skipped.append((rel + b"/" + e.name, "directory inside a bucket left in place"))
            tops.setdefault(parts[0], []).append((rel, names))
            total += len(names)
        for dirs in tops.values():
            dirs.sort(key=lambda x: -x[0].count(b"/"))  # deepest first, so pruning goes bottom-up
        return tops, total

    def revert_round(self, layout: Layout) -> int:
        tops, total = self.scan_tree(layout)
        self.total += total
        if any(layout.is_bucket(n, 0) for dirs in tops.values() for _, names in dirs for n in names):
            _fsops.makedirs(os.path.join(self.rootb, ASIDE))
        self.report.buckets += sum(len(d) for d in tops.values())  # type: ignore[union-attr]
        self._layout = layout
        self.run_parallel(self._revert_top, list(tops.items()))
        self.place_aside(lambda name: None)
        return total

    def _revert_top(self, item: tuple[bytes, list[tuple[bytes, list[bytes]]]]) -> None:
        top, dirs = item
        layout = self._layout
        asidefd = None
        n = 0
        try:
            for rel, names in dirs:
                if self._stop:
                    return
                try:
                    sfd = self.open_bucket(rel, create=False)
                except FileNotFoundError:
                    continue  # pruned by an earlier (killed) run
                moved = 0
                try:
                    for name in names:
                        if name.startswith(TMP_PREFIX):
                            # an uncommitted put() of a killed writer: garbage by construction
                            with contextlib.suppress(FileNotFoundError):
                                _fsops.unlink(name, dir_fd=sfd)
                        elif layout.is_bucket(name, 0):
                            # a file named like a top bucket waits aside until the buckets are gone
                            if asidefd is None:
                                asidefd = self.open_bucket(ASIDE, create=False)
                            self.move(sfd, name, asidefd, name, rel + b"/" + name, "set_aside")
                        else:
                            moved += self.move(sfd, name, self.rootfd, name, rel + b"/" + name, None)
                finally:
                    os.close(sfd)
                    self.tally("moved", moved)
                self.count(len(names))
                n += len(names)
                if _fsops.rmdir_if_empty(rel, dir_fd=self.rootfd):
                    killpoint("prune")
        finally:
            if asidefd is not None:
                os.close(asidefd)
        self.note({"type": "done", "top": name_to_json(top), "files": n})

    def tree_left(self, layout: Layout) -> bool:
        return any(e.type == "d" and layout.is_bucket(e.name, 0) for e in listing.iter_entries(self.rootb))


# -- public operations ---------------------------------------------------------------------------


def _resume_check(journal: Journal, op: str, root: bytes) -> dict[str, Any]:
    header = journal.header
    if header.get("op") != op:
        raise ManyfilesError(f"{os.fsdecode(root)}: an interrupted `shard {header.get('op')}` must finish "
                             f"first: run `shard {header.get('op')} {os.fsdecode(root)}`")
    return header


def apply(root: str | bytes | os.PathLike, layout: Layout | None = None, *, workers: int | None = None,
          progress: Progress | None = None, journal_sync: bool = True) -> MigrationReport:
    """Move every file of the flat folder ``root`` into its bucket (in place, resumable).

    ``layout`` defaults to the recorded one (resume, already sharded) or ``Layout()``.
    Subdirectories are left alone and reported; a subdirectory named like a bucket makes
    the migration refuse before anything moves.
    """
    t0 = time.monotonic()
    with _Migration(root, "apply", workers, progress, journal_sync) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        recorded = read_descriptor(m.rootfd, m.rootb)
        if journal is not None:
            if journal.header.get("op") == "reshard":
                journal.close()
                raise ManyfilesError(f"{os.fsdecode(m.rootb)}: an interrupted `shard reshard` must finish "
                                     f"first: run `shard reshard {os.fsdecode(m.rootb)}`")
            m.journal = journal
            target = _layout_from(_resume_check(journal, "apply", m.rootb)["to"])
            assert target is not None
            if layout is not None and layout != target:
                raise UsageError(f"{os.fsdecode(m.rootb)}: the interrupted apply uses {target.describe()}; "
                                 "rerun it with the same options (or none) to finish")
        else:
            if recorded is not None and layout is not None and recorded != layout:
                raise UsageError(f"{os.fsdecode(m.rootb)}: already sharded with {recorded.describe()}; "
                                 f"use `shard reshard` to change it")
            target = recorded or layout or Layout()
        m.report = MigrationReport("apply", os.fsdecode(m.rootb), target, resumed=journal is not None)
        _run_apply(m, target, fresh=journal is None, recorded=recorded)
        m.report.seconds = time.monotonic() - t0
        return m.report


def _run_apply(m: _Migration, target: Layout, *, fresh: bool, recorded: Layout | None,
               op: str = "apply") -> None:
    rep = m.report
    assert rep is not None
    _clean_descriptor_temps(m.rootfd, m.rootb)
    flat, buckets, skipped = _scan_root(m.rootb, target)
    rep.skipped.extend(skipped)
    aside_left = _lexists(ASIDE, m.rootfd)
    if fresh:
        if recorded is None and buckets:
            names = ", ".join(os.fsdecode(b) for b in sorted(buckets)[:3])
            raise ManyfilesError(f"{os.fsdecode(m.rootb)}: subdirectories named like shard buckets already "
                                 f"exist ({names}); rename them or choose other --levels (nothing was moved)")
        if recorded is not None and not flat and not aside_left:
            rep.nothing_to_do = True
            return
        m.journal = Journal.create(m.rootfd, {"type": "header", "op": op, "from": None,
                                              "to": _layout_doc(target), "total": len(flat),
                                              "pid": os.getpid(), "started": time.time()},
                                   sync=m.journal_sync)
    else:
        m.note({"type": "resume", "remaining": len(flat), "pid": os.getpid()}, durable=True)
    if read_descriptor(m.rootfd, m.rootb) is None:
        create_descriptor(m.rootfd, target, m.rootb)
        killpoint("descriptor")
    m.total = len(flat)
    m.apply_round(target, flat)
    for _ in range(_RESCANS):
        # files created while we ran: move them too (later ones stay flat; verify reports them)
        stuck = set(rep.conflicts) | {n for n, _ in rep.errors}
        flat = [n for n in _scan_root(m.rootb, target)[0] if n not in stuck]
        if not flat:
            break
        before = rep.moved
        m.total += len(flat)
        m.apply_round(target, flat)
        rep.appeared += rep.moved - before
    m.finish()


def revert(root: str | bytes | os.PathLike, *, workers: int | None = None, progress: Progress | None = None,
           journal_sync: bool = True) -> MigrationReport:
    """Move every file of the sharded tree back to the root and remove the buckets (resumable)."""
    t0 = time.monotonic()
    with _Migration(root, "revert", workers, progress, journal_sync) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        if journal is not None:
            m.journal = journal
            if journal.header.get("op") == "reshard":
                raise ManyfilesError(f"{os.fsdecode(m.rootb)}: an interrupted `shard reshard` must finish "
                                     f"first: run `shard reshard {os.fsdecode(m.rootb)}`")
            source = _layout_from(_resume_check(journal, "revert", m.rootb)["from"])
            assert source is not None
        else:
            source = read_descriptor(m.rootfd, m.rootb)
            if source is None:
                raise ManyfilesError(f"{os.fsdecode(m.rootb)}: not sharded (no {DESCRIPTOR.decode()}); "
                                     "nothing to revert")
        m.report = MigrationReport("revert", os.fsdecode(m.rootb), source, resumed=journal is not None)
        _run_revert(m, source, fresh=journal is None)
        m.report.seconds = time.monotonic() - t0
        return m.report


def _run_revert(m: _Migration, source: Layout, *, fresh: bool, op: str = "revert",
                to: Layout | None = None) -> bool:
    """Flatten; True if the tree is gone (descriptor removed), False if something stayed."""
    rep = m.report
    assert rep is not None
    if fresh:
        m.journal = Journal.create(m.rootfd, {"type": "header", "op": op, "from": _layout_doc(source),
                                              "to": _layout_doc(to), "pid": os.getpid(),
                                              "started": time.time()}, sync=m.journal_sync)
    else:
        m.note({"type": "resume", "pid": os.getpid()}, durable=True)
    m.revert_round(source)
    for _ in range(_RESCANS):
        if not m.tree_left(source):
            break
        before = rep.moved
        if m.revert_round(source) == 0:
            break
        rep.appeared += rep.moved - before
    gone = not m.tree_left(source) and not _lexists(ASIDE, m.rootfd)
    if gone:
        remove_descriptor(m.rootfd)
        killpoint("descriptor")
    elif op == "revert":
        rep.errors.append((b"", "some entries stayed in the tree (see skipped/conflicts); the descriptor "
                                "is kept, resolve them and rerun"))
    if op == "revert":
        m.finish()
    return gone


def reshard(root: str | bytes | os.PathLike, layout: Layout | None = None, *, workers: int | None = None,
            progress: Progress | None = None, journal_sync: bool = True) -> MigrationReport:
    """Change the layout of a sharded tree: revert then apply, as one resumable operation.

    The descriptor is the phase marker: old layout = still flattening, new or none = building.
    """
    t0 = time.monotonic()
    with _Migration(root, "reshard", workers, progress, journal_sync) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        if journal is not None:
            header = _resume_check(journal, "reshard", m.rootb)
            m.journal = journal
            source, target = _layout_from(header["from"]), _layout_from(header["to"])
            assert source is not None and target is not None
            if layout is not None and layout != target:
                raise UsageError(f"{os.fsdecode(m.rootb)}: the interrupted reshard goes to "
                                 f"{target.describe()}; rerun it with the same options (or none)")
        else:
            if layout is None:
                raise UsageError("reshard needs the new layout (--levels, --hash or --key)")
            source, target = read_descriptor(m.rootfd, m.rootb), layout
            if source is None:
                raise ManyfilesError(f"{os.fsdecode(m.rootb)}: not sharded; use `shard apply`")
        m.report = MigrationReport("reshard", os.fsdecode(m.rootb), target, resumed=journal is not None)
        if source == target:
            m.report.nothing_to_do = True
            return m.report
        if read_descriptor(m.rootfd, m.rootb) == source and not _run_revert(
                m, source, fresh=journal is None, op="reshard", to=target):
            m.report.errors.append((b"", "the old tree could not be emptied; resolve the conflicts "
                                         "and rerun"))
            m.report.seconds = time.monotonic() - t0
            return m.report
        # the apply phase continues the same journal (its header says reshard)
        m.done = 0
        _run_apply(m, target, fresh=False, recorded=None, op="reshard")
        m.report.seconds = time.monotonic() - t0
        return m.report


# -- read-only operations ------------------------------------------------------------------------


def plan(root: str | bytes | os.PathLike, layout: Layout | None = None) -> Plan:
    """What ``apply`` would do, computed from one listing; nothing is written."""
    rootb = _abs(root)
    fd = _open_root(rootb)
    try:
        recorded = read_descriptor(fd, rootb)
    finally:
        os.close(fd)
    if recorded is not None and layout is not None and recorded != layout:
        raise UsageError(f"{os.fsdecode(rootb)}: already sharded with {recorded.describe()}")
    target = recorded or layout or Layout()
    try:
        flat, buckets, skipped = _scan_root(rootb, target)
    except OSError as exc:
        raise ManyfilesError(f"{os.fsdecode(rootb)}: {describe_oserror(exc)}") from exc
    moves, per_bucket = [], {}
    for name in flat:
        rel = target.bucket_rel(name)
        moves.append((name, rel + b"/" + name))
        per_bucket[rel] = per_bucket.get(rel, 0) + 1
    return Plan(os.fsdecode(rootb), target, moves, per_bucket,
                [n for n in flat if target.is_bucket(n, 0)], skipped,
                [] if recorded is not None else sorted(buckets), recorded is not None)


def verify(root: str | bytes | os.PathLike, *, expected: int | None = None) -> VerifyReport:
    """Check that every file is where its name says, with no strays, temp files or duplicates."""
    rootb = _abs(root)
    fd = _open_root(rootb)
    try:
        layout = read_descriptor(fd, rootb)
        journal = read_records(fd)
    finally:
        os.close(fd)
    if layout is None:
        raise ManyfilesError(f"{os.fsdecode(rootb)}: not sharded (no {DESCRIPTOR.decode()})")
    rep = VerifyReport(os.fsdecode(rootb), layout, expected=expected)
    if journal is not None and journal[0]:
        rep.in_progress = str(journal[0][0].get("op"))
    depth = len(layout.levels)
    seen: set[bytes] = set()
    dup: set[bytes] = set()

    def saw(name: bytes) -> None:
        if name in seen:
            dup.add(name)
        seen.add(name)

    for d in listing.walk(rootb, max_depth=depth):
        rel = d.path[len(rootb):].lstrip(b"/")
        parts = rel.split(b"/") if rel else []
        if parts and not all(layout.is_bucket(p, i) for i, p in enumerate(parts)):
            continue
        if d.error is not None:
            raise ManyfilesError(f"{os.fsdecode(d.path)}: {describe_oserror(d.error)}")
        if d.depth == depth:
            rep.buckets += 1
        for e in d.entries:
            path = rel + b"/" + e.name if rel else e.name
            if e.type == "d":
                if (d.depth == depth or not layout.is_bucket(e.name, d.depth)) \
                        and not e.name.startswith(RESERVED_PREFIX):
                    rep.foreign.append(path)
                continue
            if d.depth == 0:
                if not e.name.startswith(RESERVED_PREFIX):
                    rep.flat.append(e.name)
                    saw(e.name)
                continue
            if e.name.startswith(TMP_PREFIX):
                rep.temp_files.append(path)
                continue
            saw(e.name)
            should = layout.bucket_rel(e.name)
            if d.depth != depth or should != rel:
                rep.misplaced.append((path, should + b"/" + e.name))
            else:
                rep.files += 1
    rep.duplicates = sorted(dup)
    return rep


def status(root: str | bytes | os.PathLike) -> Status:
    """Layout, unfinished migration (if any), flat files left and an estimated file count."""
    rootb = _abs(root)
    fd = _open_root(rootb)
    try:
        layout = read_descriptor(fd, rootb)
        found = read_records(fd)
        pid = lock_holder(fd)
    finally:
        os.close(fd)
    header, done = None, 0
    if found is not None and found[0] and found[0][0].get("type") == "header":
        header = found[0][0]
        done = sum(r.get("files", 0) for r in found[0] if r.get("type") == "done")
    flat = sum(1 for e in listing.iter_entries(rootb)
               if e.type != "d" and not e.name.startswith(RESERVED_PREFIX))
    estimate = 0 if layout is None else estimate_files(rootb, layout)
    return Status(os.fsdecode(rootb), layout, flat, estimate, header, done, pid)


def iter_journal(root: str | bytes | os.PathLike) -> Iterator[dict[str, Any]]:
    """Records of an unfinished migration's journal (for debugging and `shard status -v`)."""
    rootb = _abs(root)
    fd = _open_root(rootb)
    try:
        found = read_records(fd)
    finally:
        os.close(fd)
    yield from (found[0] if found else [])


__all__ = ["JOURNAL", "MigrationReport", "Plan", "Status", "VerifyReport", "apply", "plan", "reshard",
           "revert", "status", "verify"]
