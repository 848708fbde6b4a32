"""``shard apply/revert/reshard --cluster``: one top bucket per shard, on many machines at once.

The client runs the migration exactly as on one machine (:class:`~manyfiles.shard._engine.Migration`:
the root lock, the root journal, the descriptor, the files set aside, the rescans, the final
syncfs) except for one step: the moves of each top bucket, which the single-machine engine
hands to its thread pool, become Dask shards (:class:`ClusterMigration`).

A shard is a few top buckets (dealt round-robin, ``SHARDS_PER_THREAD`` shards per worker
thread: 256 one-bucket tasks cost more in Dask round trips and partition set-up than they
move on a small folder).  A worker running the shard whose first bucket is ``ab``
(:class:`PartitionMigration`) holds that partition's own lock and journal,
``ROOT/.manyfiles-shard.parts/ab/`` (the root's lock stays with the client), and moves names
with the same idempotent no-replace renames.  So:

* a worker killed mid-shard: Dask runs the shard again elsewhere; the renames it had done are
  found done (source gone, destination present), the rest are done now -- nothing lost, nothing
  moved twice, and each file counted once (as ``moved`` or ``already``);
* the client killed: the root journal is there; the same command (with or without
  ``--cluster``) resumes from the directory listing, which is the per-file record;
* two attempts of one shard never run at once: the second waits for the partition lock
  (a kill releases it; on NFS, when the server's lease expires).

The partition directory is reserved (``.manyfiles-shard*``): listings, ``verify`` and the
ShardedDir API ignore it, and the client removes it before the root journal at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from manyfiles._core import fsops as _fsops
from manyfiles._core.progress import Progress
from manyfiles.errors import ManyfilesError
from manyfiles.scale import lease
from manyfiles.scale.executor import (
    ClusterArg,
    ClusterReport,
    Executor,
    Job,
    Publish,
    ShardResult,
    connect,
    merge_report,
)
from manyfiles.shard._engine import Migration
from manyfiles.shard._rounds import TASKS
from manyfiles.shard.journal import Journal, Lock, name_to_json
from manyfiles.shard.layout import Layout
from manyfiles.shard.report import MigrationReport

PARTS = b".manyfiles-shard.parts"
LOCK_WAIT = 180.0       # seconds a re-run waits for a partition lock (an NFS lease outlives a kill)
SHARDS_PER_THREAD = 4   # top buckets are dealt into this many shards per worker thread


class ClusterMigration(Migration):
    """The client: a :class:`Migration` whose per-top-bucket rounds run on ``executor``."""

    def __init__(self, root: Any, op: str, workers: int | None, journal_sync: bool,
                 executor: Executor) -> None:
        super().__init__(root, op, workers, journal_sync)
        self.executor = executor
        self.cluster = ClusterReport(job=f"shard {op}", cluster=executor.address)

    def run_parallel(self, task: Any, items: list[Any], *args: Any) -> None:
        job = MoveJob(root=self.rootb, op=self.op, task=task.__name__, args=args,
                      workers=self.workers, journal_sync=self.journal_sync)
        self.progress.start_part()      # this round's snapshots count on from the rounds before
        run = self.executor.run(job, shards=groups(items, SHARDS_PER_THREAD * max(1, self.executor.workers)),
                                progress=self.progress.part_progress if self.progress else False)
        self.cluster.absorb(run)
        assert run.result is not None
        merge_report(self.report, run.result)
        self.progress.tick(force=True)

    def finish(self) -> None:
        # partition records first: a kill between the two leaves the root journal, so a rerun resumes
        remove_parts(self.rootfd, self.rootb)
        super().finish()

    def result(self) -> ClusterReport:
        """The migration report with the cluster's figures around it."""
        self.cluster.result = self.report
        self.cluster.failures = self.report.failures
        self.cluster.seconds = self.report.seconds
        return self.cluster


@dataclass(frozen=True)
class MoveJob(Job):
    """The moves of top buckets: shard = a few items of the engine's round (top bucket, its names)."""

    root: bytes
    op: str
    task: str                   # the round's task a worker runs on its item (a key of _rounds.TASKS)
    args: tuple = ()            # its arguments before the item (revert: the layout)
    workers: int = 1
    journal_sync: bool = True
    name = "shard"
    unit = "files"

    def new_report(self) -> Any:
        return MigrationReport(op=self.op, root=os.fsdecode(self.root), layout=self._layout())

    def _layout(self) -> Layout | None:
        return next((a for a in self.args if isinstance(a, Layout)), None)

    def run(self, group: tuple, publish: Publish) -> ShardResult:
        task = TASKS.get(self.task)
        if task is None:
            raise ManyfilesError(f"shard: no cluster form of {self.task}")
        rerun = bool(lease.current().earlier)      # a lost attempt of this shard came first
        with PartitionMigration(self.root, self.op, self.journal_sync, group[0][0], publish, rerun) as m:
            m.report = self.new_report()
            for item in group:
                task(m, *self.args, item)
            # on a local disk the client's syncfs covers us; on NFS renames are synchronous
            # server operations anyway: this makes "done" in the partition journal true everywhere
            _fsops.syncfs(m.rootfd, m.rootb)
            done = m.progress.snapshot().done
        return ShardResult(report=m.report, items=done)


class PartitionMigration(Migration):
    """A worker's view of one top bucket: the partition's lock and journal, not the root's.

    ``rerun``: an attempt of this shard died before this one, in this run.  The names it moved
    are found moved (source gone, destination there); they were in the client's listing, so
    this run moved them: they count as moved (or set aside), not as ``already``.
    """

    def __init__(self, root: bytes, op: str, journal_sync: bool, top: bytes, publish: Publish,
                 rerun: bool = False) -> None:
        super().__init__(root, op, 1, journal_sync)
        self.top = top
        self.progress = Progress(op, lambda snap: publish(snap.done, 0, snap.failures), interval=0.5)
        self.part_fd = -1
        self.rerun = rerun

    def move(self, sfd: int, sname: bytes, dfd: int, dname: bytes, label: bytes,
             as_: str | None = "moved") -> bool:
        already = self.report.already            # one thread per partition: no lock needed
        if super().move(sfd, sname, dfd, dname, label, as_):
            return True
        if not self.rerun or self.report.already == already:
            return False
        self.report.already = already            # moved by the lost attempt: by this run
        if as_ is not None:
            self.tally(as_)
        return True                              # as_=None: the caller counts it as moved

    def __enter__(self) -> PartitionMigration:
        where = os.fsdecode(os.path.join(self.rootb, PARTS, self.top))
        try:
            self.part_fd = _open_partition(self.rootfd, self.top)
            self.lock = Lock(self.part_fd, os.fsencode(where))
            _acquire(self.lock, where)
            journal = Journal.open(self.part_fd, sync=self.journal_sync)
            record = {"type": "header" if journal is None else "resume", "op": self.op,
                      "top": name_to_json(self.top), "pid": os.getpid(), "host": os.uname().nodename}
            if journal is None:
                self.journal = Journal.create(self.part_fd, record, sync=self.journal_sync)
            else:
                self.journal = journal
                journal.append(record, durable=True)
        except BaseException:
            self.lock.release(remove=False)
            if self.part_fd >= 0:
                os.close(self.part_fd)
            os.close(self.rootfd)
            raise
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            super().__exit__(exc_type, exc, tb)     # journal flushed and closed, lock released
        finally:
            os.close(self.part_fd)


def groups(items: list[Any], n: int) -> list[tuple]:
    """``items`` (top buckets, largest first as the engine lists them) dealt into at most ``n`` shards."""
    n = max(1, min(n, len(items)))
    return [tuple(items[i::n]) for i in range(n)]


def _open_partition(rootfd: int, top: bytes) -> int:
    """``ROOT/.manyfiles-shard.parts/<top>``, made if missing, opened without following links."""
    parts = _open_or_make(PARTS, rootfd)
    try:
        return _open_or_make(top, parts)
    finally:
        os.close(parts)


def _open_or_make(name: bytes, dir_fd: int) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    return _fsops.open_dir(name, dir_fd=dir_fd)


def _acquire(lock: Lock, where: str) -> None:
    """Take the partition lock, waiting for an attempt still holding it (killed, or a stale task)."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            lock.acquire()
            return
        except ManyfilesError:
            if time.monotonic() > deadline:
                raise ManyfilesError(f"{where}: still locked after {LOCK_WAIT:.0f} s by another attempt "
                                     "at this bucket") from None
            time.sleep(0.2)


def remove_parts(rootfd: int, rootb: bytes) -> None:
    """Drop the partition locks and journals (the migration they recorded is complete)."""
    try:
        st = os.stat(PARTS, dir_fd=rootfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise ManyfilesError(f"{os.fsdecode(os.path.join(rootb, PARTS))}: not a directory")
    shutil.rmtree(os.path.join(rootb, PARTS))


@contextlib.contextmanager
def cluster_migration(root: Any, op: str, workers: int | None, journal_sync: bool,
                      cluster: ClusterArg) -> Iterator[ClusterMigration]:
    """What ``shard.apply/revert/reshard(cluster=...)`` run in: the executor, then the migration."""
    with connect(cluster) as executor, ClusterMigration(root, op, workers, journal_sync, executor) as m:
        yield m


__all__ = ["PARTS", "ClusterMigration", "MoveJob", "PartitionMigration", "cluster_migration"]
