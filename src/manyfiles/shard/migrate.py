"""Crash-safe in-place migration: flat -> tree (apply), tree -> flat (revert), and re-sharding.

Data flow: scan -> plan -> execute -> report.  :func:`plan` lists the root once and says what
:func:`apply` would move where; ``apply(plan=...)`` (or ``plan.execute()``) runs exactly that
plan after checking it against the disk.  Every operation is resumable: after a crash, run
the same call again.  This module checks the arguments and decides what a run starts from (a
fresh run, or the journal of an interrupted one; from which layout to which); the journaled
phases are in :mod:`manyfiles.shard._phases`, the moves themselves in
:mod:`manyfiles.shard._engine`.  The design is explained in docs/shard.md.
"""

from __future__ import annotations

import contextlib
import csv
import html
import io
import os
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import ManyfilesError, UsageError, describe_oserror
from manyfiles.shard._engine import Migration
from manyfiles.shard._phases import build_tree, flatten_tree, layout_from, reshard_tree
from manyfiles.shard.journal import Journal, refuse_if_running
from manyfiles.shard.layout import Layout
from manyfiles.shard.report import MigrationReport
from manyfiles.shard.scan import RootArg, abs_root, open_root, scan_root
from manyfiles.shard.sharded_dir import DESCRIPTOR, BucketStats, read_descriptor

# -- the plan --------------------------------------------------------------------------------------


@dataclass
class Plan:
    """What :func:`apply` would do, from one listing of the root; nothing is moved.

    ``moves`` are ``(name, destination relative to the root)``; ``collisions`` are flat files
    named like a top bucket (set aside first, then moved); ``blocking`` are subdirectories
    named like buckets, which make ``apply`` refuse.  ``identity`` (st_dev, st_ino of the
    root) and the layout are checked against the disk by :meth:`execute` before anything
    moves (``recorded`` is the descriptor's layout when planned, None if not sharded yet).
    """

    root: str
    layout: Layout
    moves: list[tuple[bytes, bytes]]
    per_bucket: dict[bytes, int]
    collisions: list[bytes]
    skipped: list[tuple[bytes, str]]
    blocking: list[bytes]
    already_sharded: bool
    identity: tuple[int, int] = (-1, -1)
    recorded: Layout | None = None

    @property
    def names(self) -> frozenset[bytes]:
        return frozenset(name for name, _ in self.moves)

    @property
    def stats(self) -> BucketStats:
        return BucketStats.from_counts(list(self.per_bucket.values()))

    def summary(self) -> str:
        text = (f"plan for {self.root} ({self.layout.describe()}): {len(self.moves):,} files to move "
                f"into {self.stats.buckets:,} buckets")
        if self.blocking:
            text += f"; apply would refuse: {len(self.blocking):,} subdirectories named like buckets"
        return text

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        s = self.stats
        return (f"<div><b>Plan</b>: {html.escape(self.summary())}<br>files per bucket: min {s.min:,}, "
                f"max {s.max:,}, mean {s.mean:.1f}, stddev {s.stddev:.1f}</div>")

    def to_dict(self) -> dict[str, Any]:
        """Counts as plain JSON values (what ``shard apply -n --json`` prints; no per-file list)."""
        s = self.stats
        return {"ok": not self.blocking, "summary": self.summary(), "dry_run": True, "root": self.root,
                "layout": self.layout.describe(), "moves": len(self.moves), "buckets": s.buckets,
                "per_bucket": {"min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev},
                "collisions": len(self.collisions), "skipped": len(self.skipped),
                "blocking": [os.fsdecode(b) for b in self.blocking], "already_sharded": self.already_sharded}

    def write_csv(self, path: str) -> None:
        """``source,destination`` per move, relative to the root (names byte-exact)."""
        with open(path, "wb") as f:
            self.write_csv_to(f)

    def write_csv_to(self, out: BinaryIO) -> None:
        """:meth:`write_csv` into an open binary stream (``shard apply -n --csv -``: stdout)."""
        text = io.TextIOWrapper(out, encoding="utf-8", errors="surrogateescape", newline="")
        try:
            w = csv.writer(text)
            w.writerow(["source", "destination"])
            for name, dest in self.moves:
                w.writerow([os.fsdecode(name), os.fsdecode(dest)])
            text.flush()
        finally:
            text.detach()       # ``out`` stays open: it is the caller's

    def execute(self, *, workers: int | None = None, progress: ProgressArg = False,
                journal_sync: bool = True) -> MigrationReport:
        """Move the planned files: ``apply(plan=self)``."""
        return apply(plan=self, workers=workers, progress=progress, journal_sync=journal_sync)


# -- argument checks (all before anything is touched) -----------------------------------------------


def _check_common(workers: object, progress: object, journal_sync: object) -> None:
    check_progress(progress)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise UsageError(f"workers must be a positive integer or None, not {workers!r}")
    if not isinstance(journal_sync, bool):
        raise UsageError(f"journal_sync must be True or False, not {journal_sync!r}")


def _check_layout(layout: object) -> None:
    if layout is not None and not isinstance(layout, Layout):
        raise UsageError(f"layout must be a manyfiles.shard.Layout or None, not {layout!r}")


def _check_root(root: object) -> None:
    if not isinstance(root, (str, bytes, os.PathLike)):
        raise UsageError(f"root must be a path, not {root!r}")


def _check_plan(plan: Plan, m: Migration, recorded: Layout | None, journal: Journal | None) -> None:
    """A stale plan must not move anything: same directory, same recorded layout, no blockers."""
    where = os.fsdecode(m.rootb)
    st = os.fstat(m.rootfd)
    if (st.st_dev, st.st_ino) != plan.identity:
        raise UsageError(f"{where}: not the directory this plan was made for (replaced since); "
                         "make a new plan (nothing was moved)")
    if plan.blocking:
        raise ManyfilesError(f"{where}: the plan found subdirectories named like buckets; apply refuses "
                             "(nothing was moved)")
    if journal is None and recorded is not None and recorded != plan.layout:
        raise UsageError(f"{where}: the layout changed since the plan (now: {recorded.describe()}); make a "
                         "new plan (nothing was moved)")


# -- apply, revert, reshard: what the run starts from, then its phases (shard/_phases.py) -----------


def _engine(root: RootArg, op: str, workers: int | None, journal_sync: bool,
            cluster: object) -> contextlib.AbstractContextManager[Migration]:
    """This machine's engine, or the one whose top-bucket rounds run on ``cluster``."""
    if cluster is None:
        return Migration(root, op, workers, journal_sync)
    from manyfiles.shard._cluster import cluster_migration

    return cluster_migration(root, op, workers, journal_sync, cluster)


def _adopt_journal(m: Migration, journal: Journal | None, op: str) -> dict[str, Any] | None:
    """The header of an interrupted ``op`` (this run takes its journal over), None if there is
    none; an interrupted migration of another op must finish first."""
    if journal is None:
        return None
    m.journal = journal
    header = journal.header
    if header.get("op") != op:
        raise ManyfilesError(f"{os.fsdecode(m.rootb)}: an interrupted `shard {header.get('op')}` must finish "
                             f"first: run `shard {header.get('op')} {os.fsdecode(m.rootb)}`")
    return header


def apply(root: RootArg | None = None, layout: Layout | None = None, *, plan: Plan | None = None,
          workers: int | None = None, progress: ProgressArg = False,
          journal_sync: bool = True, cluster: object = None) -> MigrationReport:
    """Move every file of the flat folder ``root`` into its bucket (in place, resumable).

    ``layout`` defaults to the recorded one (resume, already sharded) or ``Layout()``.
    Subdirectories are left alone and reported; a subdirectory named like a bucket makes
    the migration refuse before anything moves.  With ``plan`` (from :func:`plan`), ``root``
    and ``layout`` come from it and only its names move, after checking that the folder is
    still the one planned.  ``progress``: True or a callable taking a Snapshot.  Every
    argument is checked before anything on disk changes.  ``cluster`` (``"local:N"``,
    ``"tcp://HOST:8786"``, a ``distributed.Client``): the top buckets are moved by Dask workers
    (:mod:`manyfiles.shard._cluster`); the report then comes with per-worker figures.
    """
    _check_common(workers, progress, journal_sync)
    _check_layout(layout)
    if plan is not None:
        root, layout = _from_plan(plan, root, layout)
    _check_root(root)
    assert root is not None
    t0 = time.monotonic()
    with _engine(root, "apply", workers, journal_sync, cluster) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        recorded = read_descriptor(m.rootfd, m.rootb)
        if plan is not None:
            _check_plan(plan, m, recorded, journal)
        target = _apply_target(m, journal, recorded, layout)
        m.report = MigrationReport(op="apply", root=os.fsdecode(m.rootb), layout=target,
                                   resumed=journal is not None)
        with m.showing(progress):
            build_tree(m, target, fresh=journal is None, recorded=recorded,
                       only=plan.names if plan is not None else None)
        m.report.seconds = time.monotonic() - t0
        return m.result()


def _from_plan(plan: Plan, root: RootArg | None, layout: Layout | None) -> tuple[str, Layout]:
    """``apply(plan=...)``: the plan's root and layout (a root or layout also given must agree)."""
    if not isinstance(plan, Plan):
        raise UsageError(f"plan must come from manyfiles.shard.plan(), not {plan!r}")
    if root is not None and abs_root(root) != abs_root(plan.root):
        raise UsageError(f"the plan is for {plan.root}, not {os.fsdecode(os.fspath(root))}")
    if layout is not None and layout != plan.layout:
        raise UsageError(f"the plan uses {plan.layout.describe()}, not {layout.describe()}")
    return plan.root, plan.layout


def _apply_target(m: Migration, journal: Journal | None, recorded: Layout | None,
                  layout: Layout | None) -> Layout:
    """The layout apply builds: an interrupted apply's, else the recorded, the asked or the default one."""
    header = _adopt_journal(m, journal, "apply")
    if header is not None:
        target = layout_from(header["to"])
        assert target is not None
        if layout is not None and layout != target:
            raise UsageError(f"{os.fsdecode(m.rootb)}: the interrupted apply uses {target.describe()}; "
                             "rerun it with the same options (or none) to finish")
        return target
    if recorded is not None and layout is not None and recorded != layout:
        raise UsageError(f"{os.fsdecode(m.rootb)}: already sharded with {recorded.describe()}; "
                         f"use `shard reshard` to change it")
    return recorded or layout or Layout()


def revert(root: RootArg, *, workers: int | None = None, progress: ProgressArg = False,
           journal_sync: bool = True, cluster: object = None, dry_run: bool = False) -> MigrationReport:
    """Move every file of the sharded tree back to the root and remove the buckets (resumable).

    A folder that is not sharded (no descriptor, no interrupted migration) is nothing to do,
    like ``apply`` on a sharded one.  ``cluster``: as for :func:`apply`.  ``dry_run``: count
    what would move (``report.planned``) and move nothing (see :func:`preview`).
    """
    _check_root(root)
    _check_common(workers, progress, journal_sync)
    if dry_run:
        return preview(root, "revert")
    t0 = time.monotonic()
    with _engine(root, "revert", workers, journal_sync, cluster) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        header = _adopt_journal(m, journal, "revert")
        source = read_descriptor(m.rootfd, m.rootb) if header is None else layout_from(header["from"])
        assert header is None or source is not None
        m.report = MigrationReport(op="revert", root=os.fsdecode(m.rootb), layout=source,
                                   resumed=journal is not None)
        if source is None:
            m.report.nothing_to_do = True
        else:
            with m.showing(progress):
                flatten_tree(m, source, fresh=journal is None)
        m.report.seconds = time.monotonic() - t0
        return m.result()


def reshard(root: RootArg, layout: Layout | None = None, *, workers: int | None = None,
            progress: ProgressArg = False, journal_sync: bool = True,
            cluster: object = None, dry_run: bool = False) -> MigrationReport:
    """Change the layout of a sharded tree: revert then apply, as one resumable operation.

    The descriptor is the phase marker: old layout = still flattening, new or none = building.
    ``dry_run``: count what would move and move nothing (see :func:`preview`).
    """
    _check_root(root)
    _check_layout(layout)
    _check_common(workers, progress, journal_sync)
    if dry_run:
        return preview(root, "reshard", layout)
    t0 = time.monotonic()
    with _engine(root, "reshard", workers, journal_sync, cluster) as m:
        journal = Journal.open(m.rootfd, sync=journal_sync)
        source, target = _reshard_layouts(m, journal, layout)
        m.report = MigrationReport(op="reshard", root=os.fsdecode(m.rootb), layout=target,
                                   resumed=journal is not None)
        if source == target:
            m.report.nothing_to_do = True
            return m.report
        with m.showing(progress):
            reshard_tree(m, source, target, fresh=journal is None)
        m.report.seconds = time.monotonic() - t0
        return m.result()


def _reshard_layouts(m: Migration, journal: Journal | None, layout: Layout | None) -> tuple[Layout, Layout]:
    """(from, to): an interrupted reshard's, else the recorded layout and the asked one."""
    header = _adopt_journal(m, journal, "reshard")
    if header is not None:
        source, target = layout_from(header["from"]), layout_from(header["to"])
        assert source is not None and target is not None
        if layout is not None and layout != target:
            raise UsageError(f"{os.fsdecode(m.rootb)}: the interrupted reshard goes to "
                             f"{target.describe()}; rerun it with the same options (or none)")
        return source, target
    if layout is None:
        raise UsageError("reshard needs the new layout (--levels, --hash or --key)")
    source = read_descriptor(m.rootfd, m.rootb)
    if source is None:
        raise ManyfilesError(f"{os.fsdecode(m.rootb)}: not sharded; use `shard apply`")
    return source, layout


# -- dry runs ----------------------------------------------------------------------------------------


def preview(root: RootArg, op: str, layout: Layout | None = None) -> MigrationReport:
    """What ``revert`` or ``reshard`` (``op``) would do, from the descriptor, the journal and one
    count of the tree (C walker); nothing is written, no lock is taken.  The report has
    ``dry_run=True`` and ``planned`` (files that would move); an interrupted migration of the
    same op shows as ``resumed`` (its files are not counted: they are half here, half there).
    The same refusals as the real run are raised (not sharded for reshard, another op
    interrupted, no layout for a fresh reshard)."""
    from manyfiles.shard.sharded_dir import ShardedDir
    from manyfiles.shard.verify import read_state

    if op not in ("revert", "reshard"):
        raise UsageError(f"preview: op must be 'revert' or 'reshard', not {op!r}")
    t0 = time.monotonic()
    rootb, source, found = read_state(root)
    header = found[0][0] if found and found[0] and found[0][0].get("type") == "header" else None
    rep = MigrationReport(op=op, root=os.fsdecode(rootb), layout=source if op == "revert" else layout,
                          dry_run=True, resumed=header is not None)
    if header is not None:
        if header.get("op") != op:
            raise ManyfilesError(f"{rep.root}: an interrupted `shard {header.get('op')}` must finish first: "
                                 f"run `shard {header.get('op')} {rep.root}`")
        if op == "reshard" and rep.layout is None:
            rep.layout = layout_from(header.get("to"))
    elif source is None:
        if op == "reshard":
            raise ManyfilesError(f"{rep.root}: not sharded; use `shard apply`")
        rep.nothing_to_do = True
    elif op == "reshard" and layout is None:
        raise UsageError("reshard needs the new layout (--levels, --hash or --key)")
    elif source == layout:
        rep.nothing_to_do = True
    else:
        rep.planned = ShardedDir(rootb).count()
    rep.seconds = time.monotonic() - t0
    return rep


# -- plan ------------------------------------------------------------------------------------------


def plan(root: RootArg, layout: Layout | None = None, *, progress: ProgressArg = False) -> Plan:
    """What ``apply`` would do, computed from one listing; nothing is written.  ``progress``: True or
    a callable taking a Snapshot (``done`` = entries of the root listed so far, ours included)."""
    check_progress(progress)
    _check_root(root)
    _check_layout(layout)
    rootb = abs_root(root)
    fd = open_root(rootb)
    try:
        refuse_if_running(fd, rootb)
        recorded = read_descriptor(fd, rootb)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if recorded is not None and layout is not None and recorded != layout:
        raise UsageError(f"{os.fsdecode(rootb)}: already sharded with {recorded.describe()}")
    target = recorded or layout or Layout()
    try:
        with progress_for(progress, "shard plan", unit="entries") as shown:
            flat, buckets, skipped = scan_root(rootb, target, shown)
    except OSError as exc:
        raise ManyfilesError(f"{os.fsdecode(rootb)}: {describe_oserror(exc)}") from exc
    moves, per_bucket = [], {}
    for name in flat:
        rel = target.bucket_rel(name)
        moves.append((name, rel + b"/" + name))
        per_bucket[rel] = per_bucket.get(rel, 0) + 1
    return Plan(os.fsdecode(rootb), target, moves, per_bucket, [n for n in flat if target.is_bucket(n, 0)],
                skipped, [] if recorded is not None else sorted(buckets), recorded is not None,
                identity=(st.st_dev, st.st_ino), recorded=recorded)


__all__ = ["DESCRIPTOR", "MigrationReport", "Plan", "apply", "plan", "reshard", "revert"]
