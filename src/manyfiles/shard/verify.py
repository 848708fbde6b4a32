"""Read-only checks of a sharded folder: verify (every file where its name says) and status."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from manyfiles import listing
from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles._core.report import Report
from manyfiles.errors import ManyfilesError, UsageError, describe_oserror
from manyfiles.shard.journal import lock_holder, read_records, refuse_if_running
from manyfiles.shard.layout import RESERVED_PREFIX, Layout
from manyfiles.shard.scan import RootArg, abs_root, open_root
from manyfiles.shard.sharded_dir import (
    DESCRIPTOR,
    STORED_FILES,
    TMP_PREFIX,
    bucket_walk,
    estimate_files,
    read_descriptor,
)


@dataclass(kw_only=True)
class VerifyReport(Report):
    """What ``verify`` found.  Every problem is also a :class:`~manyfiles._core.report.Failure`
    (code ``flat``, ``misplaced``, ``duplicate``, ``temp``, ``in-progress`` or ``count``);
    ``foreign`` directories are left alone and are not problems."""

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

    def summary(self) -> str:
        verdict = "ok" if self.ok else "FAILED"
        return f"{verdict}: {self.files:,} files in {self.buckets:,} buckets ({self.layout.describe()})"

    def _problems(self) -> None:
        """Turn the findings into failures (one per item) once the walk is done."""
        where = os.fsencode(self.root)

        def add(rel: bytes, reason: str, code: str) -> None:
            self.add_failure(os.path.join(where, rel) if rel else where, reason, code)

        for name in self.flat:
            add(name, "file still at the top level", "flat")
        for rel, should in self.misplaced:
            add(rel, f"misplaced, belongs at {os.fsdecode(should)}", "misplaced")
        for name in self.duplicates:
            add(name, "name present more than once", "duplicate")
        for rel in self.temp_files:
            add(rel, "temporary file of an interrupted write", "temp")
        if self.in_progress:
            add(b"", f"an interrupted `shard {self.in_progress}`: rerun it to finish", "in-progress")
        if self.expected is not None and self.expected != self.files:
            add(b"", f"{self.files:,} files found, {self.expected:,} expected", "count")


def read_state(root: RootArg) -> tuple[bytes, Layout | None, tuple[list[dict[str, Any]], int] | None]:
    """``(absolute root, recorded layout or None, journal records or None)``, read without a lock;
    refused (ManyfilesError) while a shard command runs on ``root``."""
    rootb = abs_root(root)
    fd = open_root(rootb)
    try:
        refuse_if_running(fd, rootb)
        return rootb, read_descriptor(fd, rootb), read_records(fd)
    finally:
        os.close(fd)


def verify(root: RootArg, *, expected: int | None = None, progress: ProgressArg = False) -> VerifyReport:
    """Check that every file is where its name says, with no strays, temp files or duplicates."""
    check_progress(progress)
    if expected is not None and (isinstance(expected, bool) or not isinstance(expected, int)):
        raise UsageError(f"expected must be a file count or None, not {expected!r}")
    rootb, layout, journal = read_state(root)
    if layout is None:
        raise ManyfilesError(f"{os.fsdecode(rootb)}: not sharded (no {DESCRIPTOR.decode()})")
    rep = VerifyReport(root=os.fsdecode(rootb), layout=layout, expected=expected)
    if journal is not None and journal[0]:
        rep.in_progress = str(journal[0][0].get("op"))
    with progress_for(progress, "shard verify", unit="files", total=expected) as p:
        _walk(rootb, layout, rep, p.add)
    rep._problems()
    return rep


def _walk(rootb: bytes, layout: Layout, rep: VerifyReport, seen_files: Any) -> None:
    """One walk of the root and its buckets (the C walker enters bucket directories only: a
    foreign directory is seen in its parent's listing, never listed itself)."""
    depth = len(layout.levels)
    exact = layout.bucket_globs() is not None  # else is_bucket() decides below
    seen: set[bytes] = set()
    dup: set[bytes] = set()

    def saw(name: bytes) -> None:
        if name in seen:
            dup.add(name)
        seen.add(name)

    for d in listing.walk(rootb, **bucket_walk(layout)):
        rel = d.path[len(rootb):].lstrip(b"/")
        parts = rel.split(b"/") if rel else []
        if parts and not exact and not all(layout.is_bucket(p, i) for i, p in enumerate(parts)):
            continue
        if d.error is not None:
            raise ManyfilesError(f"{os.fsdecode(d.path)}: {describe_oserror(d.error)}")
        if d.depth == depth:
            rep.buckets += 1
        before = rep.files
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
        seen_files(rep.files - before)
    rep.duplicates = sorted(dup)


@dataclass
class Status:
    """Layout, unfinished migration (if any), flat files left and an estimated file count."""

    root: str
    layout: Layout | None
    flat_files: int
    estimate: int
    journal: dict[str, Any] | None      # header of an unfinished migration
    done: int                           # files moved so far by that migration (see status())
    running_pid: int | None


def status(root: RootArg) -> Status:
    """Layout, unfinished migration (if any), flat files left and an estimated file count.

    ``done``, for a running or interrupted migration: the files that left the top level since an
    ``apply`` started, or reached it since a ``revert`` started -- counted on disk, so exact at any
    moment (a stop in the middle of a bucket included) unless other programs add or remove flat
    files meanwhile.  A ``reshard`` (and a journal written before this count) sums the buckets
    its journal records as finished.
    """
    rootb = abs_root(root)
    fd = open_root(rootb)
    try:
        layout = read_descriptor(fd, rootb)
        found = read_records(fd)
        pid = lock_holder(fd)
    finally:
        os.close(fd)
    flat = listing.count(rootb, filter=STORED_FILES)  # in C: no object per flat file
    header, done = None, 0
    if found is not None and found[0] and found[0][0].get("type") == "header":
        header = found[0][0]
        at_start = header.get("flat")
        if header.get("op") == "apply" and isinstance(at_start, int):
            done = max(0, at_start - flat)
        elif header.get("op") == "revert" and isinstance(at_start, int):
            done = max(0, flat - at_start)
        else:
            done = sum(r.get("files", 0) for r in found[0] if r.get("type") == "done")
    estimate = 0 if layout is None else estimate_files(rootb, layout)
    return Status(os.fsdecode(rootb), layout, flat, estimate, header, done, pid)


def iter_journal(root: RootArg) -> Iterator[dict[str, Any]]:
    """Records of an unfinished migration's journal (for debugging and `shard status -v`)."""
    rootb = abs_root(root)
    fd = open_root(rootb)
    try:
        found = read_records(fd)
    finally:
        os.close(fd)
    yield from (found[0] if found else [])
