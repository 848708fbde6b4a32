"""The migration engine: one run's root fd, lock, journal, counters and worker pool.

Every file moves with one rename that never replaces an existing name; each move is
idempotent (source gone + destination present = done), so a rerun after kill -9 at any
point simply continues.  Work is partitioned by top bucket: one worker owns ``ab/`` and
everything below it, so no two workers ever create or rename entries in the same bucket
directory.  The public operations (``apply``, ``revert``, ``reshard``) in
:mod:`manyfiles.shard.migrate` decide *what* to do; this module does it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from manyfiles import listing
from manyfiles._core import fsops as _fsops
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.pool import Pool
from manyfiles._core.progress import Progress, ProgressArg, progress_for
from manyfiles.errors import ManyfilesError, describe_oserror
from manyfiles.shard.journal import Journal, Lock, name_to_json
from manyfiles.shard.layout import Layout
from manyfiles.shard.scan import RootArg, abs_root, default_workers, group_by_top, open_root
from manyfiles.shard.sharded_dir import DESCRIPTOR, TMP_PREFIX, bucket_walk

ASIDE = b".manyfiles-shard.aside"

_FATAL = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EXDEV, errno.EIO, errno.EACCES}
_MAX_ERRORS = 1000
_CONFLICT = "exists at both source and destination; both kept"
_DIR_IN_BUCKET = "directory inside a bucket left in place"


class Migration:
    """State of one run.  Use as a context manager: the lock is taken on entry; on exit it is
    released and the journal closed (kept on disk unless :meth:`finish` removed it)."""

    def __init__(self, root: RootArg, op: str, workers: int | None, journal_sync: bool) -> None:
        self.rootb = abs_root(root)
        workers = default_workers(self.rootb) if workers is None else workers
        self.op, self.workers, self.journal_sync = op, max(1, workers), journal_sync
        self.progress = Progress(op, None)  # silent until showing()
        self.rootfd = open_root(self.rootb)
        self.dev = os.fstat(self.rootfd).st_dev
        self.lock = Lock(self.rootfd, self.rootb)
        self.journal: Journal | None = None
        self.report: Any = None  # the MigrationReport being filled
        self._mutex = threading.Lock()
        self.pool: Pool[Any] | None = None
        self.total = 0

    def __enter__(self) -> Migration:
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

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            if isinstance(exc, OSError):
                # a full disk (no space, no inodes: mkdir of a bucket, a journal write), a failing
                # one or a permission: one line that says what is safe and what to do, not a traceback
                raise self.stopped_by(exc) from exc
        finally:
            self._close(exc)

    def stopped_by(self, exc: OSError) -> ManyfilesError:
        """The error that ends a run stopped by ``exc``: where, why, what moved, how to finish."""
        where = os.fsdecode(self.rootb)
        what = os.fsdecode(exc.filename) if exc.filename is not None else None
        at = f" ({what})" if what and what != where else ""
        moved = getattr(self.report, "moved", 0) if self.report is not None else 0
        if self.journal is None:
            return ManyfilesError(f"{where}: {describe_oserror(exc)}{at}; nothing was moved")
        return ManyfilesError(f"{where}: {describe_oserror(exc)}{at}; stopped after {moved:,} files moved, "
                              f"nothing lost: fix it, then run `shard {self.op} {where}` again to finish")

    def _close(self, exc: BaseException | None) -> None:
        try:
            if self.journal is not None:
                try:
                    self.journal.flush()
                except OSError as err:
                    if exc is None:  # else the run failed already: keep its error, the journal stays
                        raise ManyfilesError(f"{os.fsdecode(self.rootb)}: {describe_oserror(err)} while "
                                             "writing the journal") from err
                finally:
                    self.journal.close()
        finally:
            # the flock is the lock; the file goes too, so a finished directory holds nothing of ours
            self.lock.release(remove=True)
            os.close(self.rootfd)

    @contextlib.contextmanager
    def showing(self, progress: ProgressArg) -> Iterator[None]:
        """Report progress (files moved / found) while the moves run."""
        with progress_for(progress, f"shard {self.op}", unit="files") as p:
            self.progress = p
            yield

    def result(self) -> Any:
        """What the operation returns: the report (a cluster run wraps it with its own figures)."""
        return self.report

    def where(self, name: bytes) -> str:
        return os.fsdecode(os.path.join(self.rootb, name))

    def finish(self) -> None:
        """Make every rename durable, then drop the journal: the migration is complete.

        If the filesystem reports a write-back error (EIO, ENOSPC), some renames may not be on
        disk: the journal stays, and a rerun after the problem is fixed completes the run.
        """
        try:
            _fsops.syncfs(self.rootfd, self.rootb)
        except OSError as exc:
            where = os.fsdecode(self.rootb)
            raise ManyfilesError(f"{where}: {describe_oserror(exc)} while flushing the moves to disk; the "
                                 f"journal is kept: fix the filesystem, then rerun `shard {self.op} {where}`"
                                 ) from exc
        checkpoint("finish")
        assert self.journal is not None
        self.journal.remove()
        self.journal = None

    def note(self, record: dict[str, Any], durable: bool = False) -> None:
        with self._mutex:
            assert self.journal is not None
            self.journal.append(record, durable=durable)

    # -- counters ------------------------------------------------------------------------------

    def tally(self, what: str, n: int = 1) -> None:
        with self._mutex:  # workers share the report; += on an attribute is not atomic
            setattr(self.report, what, getattr(self.report, what) + n)

    def fail(self, label: bytes, reason: str, code: str) -> None:
        with self._mutex:
            self.report.add_failure(self.where(label), reason, code)

    def add_total(self, n: int) -> None:
        self.total += n
        self.progress.set(total=self.total)

    # -- moving one name -----------------------------------------------------------------------

    def move(self, sfd: int, sname: bytes, dfd: int, dname: bytes, label: bytes,
             as_: str | None = "moved") -> bool:
        """Rename without replacing; True if this call moved it (False: done, vanished, conflict).

        ``as_`` names the report counter to bump; None leaves counting to the caller (hot loops
        count per bucket instead of taking the report lock per file).
        """
        try:
            _fsops.rename_noreplace(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, dev=self.dev)
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
                with self._mutex:  # two different files with one name: keep both
                    self.report.conflicts.append(label)
                self.fail(label, _CONFLICT, "EEXIST")
            else:
                self.tally("already")
            return False
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                raise ManyfilesError(f"{self.where(label)}: on another filesystem; shard only renames "
                                     "within one filesystem") from exc
            if exc.errno in _FATAL:
                raise ManyfilesError(f"{self.where(label)}: {describe_oserror(exc)}") from exc
            self.fail(label, describe_oserror(exc), errno.errorcode.get(exc.errno or 0, ""))
            if len(self.report.failures) > _MAX_ERRORS:
                raise ManyfilesError(f"{self.where(label)}: too many errors, stopping") from exc
            return False
        if as_ is not None:
            self.tally(as_)
        checkpoint("move")
        return True

    def open_bucket(self, rel: bytes, create: bool, *, under: tuple[int, bytes] | None = None) -> int:
        """fd of the bucket directory ``rel`` (``ab/cd``), created level by level if asked.

        Opened one level at a time without following symlinks, so a bucket replaced by a
        link cannot send files elsewhere; a bucket on another filesystem is refused.
        ``under=(fd, its rel)``: ``rel`` is relative to that open bucket instead of the root
        (a worker keeps its top bucket open and opens each leaf below it: one open per leaf).
        """
        start, prefix = under if under is not None else (self.rootfd, b"")
        where = prefix + b"/" + rel if prefix else rel
        if create:
            self.make_bucket(rel, start, prefix)
        fd = start
        try:
            for part in rel.split(b"/"):
                try:
                    child = _fsops.open_dir(part, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    raise ManyfilesError(f"{self.where(where)}: not a directory (a symlink or file where a "
                                         "bucket belongs); refusing to move files through it") from exc
                if fd != start:
                    os.close(fd)
                fd = child
            if os.fstat(fd).st_dev != self.dev:
                raise ManyfilesError(f"{self.where(where)}: is on another filesystem (a mount point); "
                                     "refusing a cross-device move")
        except BaseException:
            if fd != start:
                os.close(fd)
            raise
        return fd

    def make_bucket(self, rel: bytes, dir_fd: int, prefix: bytes = b"") -> None:
        """mkdir ``rel`` (relative to ``dir_fd``, which is bucket ``prefix``) and missing parents."""
        label = prefix + b"/" + rel if prefix else rel  # the I/O trace names buckets from the root
        # mkdir first: on a fresh run the bucket is usually new, so this is one syscall
        try:
            _fsops.traced("mkdir", label, os.mkdir, rel, dir_fd=dir_fd)
        except FileExistsError:
            return
        except FileNotFoundError:
            parent = rel.rpartition(b"/")[0]
            if not parent:
                raise
            self.make_bucket(parent, dir_fd, prefix)
            with contextlib.suppress(FileExistsError):
                _fsops.traced("mkdir", label, os.mkdir, rel, dir_fd=dir_fd)
        checkpoint("mkdir")

    # -- worker pool ---------------------------------------------------------------------------

    def run_parallel(self, fn: Callable[[Any], None], items: list[Any]) -> None:
        """``fn(item)`` for each item (one top bucket each) on the workers; the first error
        stops the others and is raised.  Progress is rendered meanwhile and at the end."""
        self.pool = Pool(fn, min(self.workers, max(1, len(items))), name="shard")
        try:
            self.pool.run(items, tick=self.progress.tick)
        finally:
            self.pool = None
        self.progress.tick(force=True)  # a round is a natural point to show where we are

    def stopping(self) -> bool:
        return self.pool is not None and self.pool.cancelled

    # -- apply: flat -> tree -------------------------------------------------------------------

    def apply_round(self, layout: Layout, flat: list[bytes]) -> None:
        rep = self.report
        # 1. flat files named like a top bucket (a file "ab" where "ab/" must go) step aside first,
        #    before any worker can mkdir that bucket; the journal records each one before it moves.
        collide = [n for n in flat if layout.is_bucket(n, 0)]
        if collide:
            asidefd = self.open_bucket(ASIDE, create=True)
            try:
                for name in collide:
                    self.note({"type": "aside", "name": name_to_json(name)}, durable=True)
                    self.move(self.rootfd, name, asidefd, name, name, "set_aside")
                    checkpoint("aside")
            finally:
                os.close(asidefd)
            moved_aside = set(collide)
            flat = [n for n in flat if n not in moved_aside]
        # 2. everything else, one top bucket per task
        tops = group_by_top(layout, flat)
        rep.buckets += sum(len(leaves) for leaves in tops.values())
        self.run_parallel(self._apply_top, list(tops.items()))
        # 3. the set-aside files go to their buckets (also those of an earlier, killed run)
        self.place_aside(lambda name: layout.bucket_rel(name))

    def _apply_top(self, item: tuple[bytes, dict[bytes, list[bytes]]]) -> None:
        top, leaves = item
        n = 0
        topfd = self.open_bucket(top, create=True)
        try:
            for leaf, names in leaves.items():
                if self.stopping():
                    return
                below = leaf[len(top) + 1:]
                lfd = self.open_bucket(below, create=True, under=(topfd, top)) if below else topfd
                moved = 0
                try:
                    for name in names:
                        moved += self.move(self.rootfd, name, lfd, name, name, None)
                finally:
                    if lfd != topfd:
                        os.close(lfd)
                    self.tally("moved", moved)
                self.progress.add(len(names))
                n += len(names)
        finally:
            os.close(topfd)
        self.note({"type": "done", "top": name_to_json(top), "files": n})

    def place_aside(self, dest_rel: Callable[[bytes], bytes | None]) -> None:
        """Move every file in the aside directory to ``dest_rel(name)`` (None = the root)."""
        try:
            asidefd = self.open_bucket(ASIDE, create=False)
        except FileNotFoundError:
            return
        try:
            for name in [e.name for e in listing.iter_entries(os.path.join(self.rootb, ASIDE))]:
                rel = dest_rel(name)
                dfd = self.rootfd if rel is None else self.open_bucket(rel, create=True)
                try:
                    self.move(asidefd, name, dfd, name, name)
                finally:
                    if dfd != self.rootfd:
                        os.close(dfd)
                checkpoint("place")
        finally:
            os.close(asidefd)
        if _fsops.rmdir_if_empty(ASIDE, dir_fd=self.rootfd):
            self.note({"type": "aside-done"}, durable=True)

    # -- revert: tree -> flat ------------------------------------------------------------------

    def scan_tree(self, layout: Layout) -> tuple[dict[bytes, list[tuple[bytes, list[bytes]]]], int]:
        """top -> [(directory, non-directory names)] for every bucket directory, and the file count.

        The C walker enters bucket directories only and does not report the root's own entries
        (min_depth 1): a half-reverted root of a million flat files costs no Python object here.
        """
        depth = len(layout.levels)
        exact = layout.bucket_globs() is not None  # else is_bucket() decides below
        tops: dict[bytes, list[tuple[bytes, list[bytes]]]] = {}
        total = 0
        for d in listing.walk(self.rootb, **bucket_walk(layout, min_depth=1)):
            rel = d.path[len(self.rootb):].lstrip(b"/")
            parts = rel.split(b"/")
            if not exact and not all(layout.is_bucket(p, i) for i, p in enumerate(parts)):
                continue
            if d.error is not None:
                raise ManyfilesError(f"{self.where(rel)}: {describe_oserror(d.error)}")
            names = []
            for e in d.entries:
                if e.type != "d":
                    names.append(e.name)
                elif d.depth == depth:
                    self.report.skipped.append((rel + b"/" + e.name, _DIR_IN_BUCKET))
            tops.setdefault(parts[0], []).append((rel, names))
            total += len(names)
        for dirs in tops.values():
            dirs.sort(key=lambda x: -x[0].count(b"/"))  # deepest first, so pruning goes bottom-up
        return tops, total

    def revert_round(self, layout: Layout) -> int:
        tops, total = self.scan_tree(layout)
        self.add_total(total)
        if any(layout.is_bucket(n, 0) for dirs in tops.values() for _, names in dirs for n in names):
            _fsops.makedirs(os.path.join(self.rootb, ASIDE))
        # leaf buckets only, as apply counts them (a 2:2 tree's 256 top directories are not buckets)
        depth = len(layout.levels) - 1
        self.report.buckets += sum(1 for dirs in tops.values() for rel, _ in dirs if rel.count(b"/") == depth)
        self.run_parallel(functools.partial(self._revert_top, layout), list(tops.items()))
        self.place_aside(lambda name: None)
        return total

    def _revert_top(self, layout: Layout, item: tuple[bytes, list[tuple[bytes, list[bytes]]]]) -> None:
        top, dirs = item
        asidefd = None
        n = 0
        try:
            for rel, names in dirs:
                if self.stopping():
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
                self.progress.add(len(names))
                n += len(names)
                if _fsops.rmdir_if_empty(rel, dir_fd=self.rootfd):
                    checkpoint("prune")
        finally:
            if asidefd is not None:
                os.close(asidefd)
        self.note({"type": "done", "top": name_to_json(top), "files": n})

    def tree_left(self, layout: Layout) -> bool:
        """Is any top bucket left?  (After a revert the root may hold millions of flat files: the
        C core filters them, creating no object per entry, for hashed layouts.)"""
        globs = layout.bucket_globs()
        if globs is not None:
            return listing.count(self.rootb, filter=listing.Filter(include=(globs[0],), types="d")) > 0
        return any(e.type == "d" and layout.is_bucket(e.name, 0) for e in listing.iter_entries(self.rootb))

    def aside_left(self) -> bool:
        return _lexists(ASIDE, self.rootfd)

    def clean_descriptor_temps(self) -> None:
        """Temp files of a descriptor write that a kill interrupted (picked by the C core's glob)."""
        temps = listing.Filter(include=(os.fsdecode(DESCRIPTOR) + ".*.tmp",))
        for name in listing.listdir(self.rootb, filter=temps):
            with contextlib.suppress(FileNotFoundError):
                _fsops.unlink(name, dir_fd=self.rootfd)


def _lexists(name: bytes, dir_fd: int) -> bool:
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True
