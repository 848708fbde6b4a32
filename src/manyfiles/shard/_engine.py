"""The migration engine: one run's root fd, lock, journal, counters and worker pool, and the one
move (a rename that never replaces) with the bucket opener that every round uses.

Every file moves with one rename that never replaces an existing name; each move is
idempotent (source gone + destination present = done), so a rerun after kill -9 at any
point simply continues.  Work is partitioned by top bucket: one worker owns ``ab/`` and
everything below it, so no two workers ever create or rename entries in the same bucket
directory.  The public operations (``apply``, ``revert``, ``reshard``) in
:mod:`manyfiles.shard.migrate` decide *what* to do, :mod:`manyfiles.shard._phases` and
:mod:`manyfiles.shard._rounds` in which order; this module does each move.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from manyfiles._core import fsops as _fsops
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.pool import Pool
from manyfiles._core.progress import Progress, ProgressArg, progress_for
from manyfiles.errors import ManyfilesError, describe_oserror, shown
from manyfiles.shard.journal import LOCK, Journal, Lock
from manyfiles.shard.scan import RootArg, abs_root, default_workers, open_root

_FATAL = {errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EXDEV, errno.EIO, errno.EACCES}
_MAX_ERRORS = 1000
_CONFLICT = "exists at both source and destination; both kept"


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
            why = f"{describe_oserror(exc)} (nothing was moved)"
            if exc.errno == errno.ENOENT and os.fstat(self.rootfd).st_nlink:
                # in a folder that is there (held open, not removed): /proc, /sys make no new files
                why = (f"cannot create {LOCK.decode()} here: this file system makes no new files "
                       f"({describe_oserror(exc)}); nothing was moved")
            os.close(self.rootfd)
            raise ManyfilesError(f"{shown(os.fsdecode(self.rootb))}: {why}") from exc
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
            if lexists(dname, dfd):
                self.tally("already")  # source gone + destination present = done
            elif lexists(sname, sfd):
                raise ManyfilesError(f"{self.where(label)}: destination directory disappeared") from None
            else:
                self.tally("vanished")
            return False
        except FileExistsError:
            if lexists(sname, sfd):
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

    def run_parallel(self, task: Callable[..., None], items: list[Any], *args: Any) -> None:
        """``task(self, *args, item)`` for each item (one top bucket each) on the workers; the first
        error stops the others and is raised.  Progress is rendered meanwhile and at the end.
        ``task`` is one of :data:`manyfiles.shard._rounds.TASKS` (a cluster run ships its name)."""
        fn = functools.partial(task, self, *args)
        self.pool = Pool(fn, min(self.workers, max(1, len(items))), name="shard")
        try:
            self.pool.run(items, tick=self.progress.tick)
        finally:
            self.pool = None
        self.progress.tick(force=True)  # a round is a natural point to show where we are

    def stopping(self) -> bool:
        return self.pool is not None and self.pool.cancelled

def lexists(name: bytes, dir_fd: int) -> bool:
    """Is there an entry ``name`` in ``dir_fd`` (a symlink counts, followed or not)?"""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True
