"""Load I/O traces: a parent's file plus the ``FILE.worker-<pid>`` files of its worker processes."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from manyfiles.errors import ManyfilesError, WrongKind, from_oserror, shown
from manyfiles.trace.format import WORKER_SUFFIX, RawTrace, read_file


class Record(NamedTuple):
    """One I/O operation as read back from a trace."""

    pid: int
    tid: int
    op: str
    path: bytes
    offset: int
    length: int
    start_ns: int
    dur_ns: int
    result: int


@dataclass
class TraceSet:
    """Every file of one or more traced runs, merged (CLOCK_MONOTONIC is shared by all processes)."""

    files: list[RawTrace]
    notes: list[str] = field(default_factory=list)   # files skipped, kills detected, ...

    def __len__(self) -> int:
        return sum(len(b) for f in self.files for b in f.blocks)

    @property
    def dropped(self) -> int:
        """Records the writers could not keep (buffer full or write error)."""
        return sum(f.blocks[-1].dropped for f in self.files if f.blocks)

    def records(self) -> Iterator[Record]:
        """Every record, file by file, in the order they were flushed (not sorted by time)."""
        for f in self.files:
            pid = int(f.header.get("pid", 0))
            for b in f.blocks:
                columns = (b.ops, b.tids, b.paths, b.offset, b.length, b.start_ns, b.dur_ns, b.result)
                for op, tid, path, offset, length, start, dur, result in zip(*columns, strict=True):
                    yield Record(pid, tid, op, path, offset, length, start, dur, result)

    def thread_names(self) -> dict[tuple[int, int], str]:
        """``(pid, tid) -> thread name`` for every thread that recorded something."""
        names: dict[tuple[int, int], str] = {}
        for f in self.files:
            pid = int(f.header.get("pid", 0))
            for b in f.blocks:
                for tid, name in b.threads.items():
                    names[(pid, tid)] = name
        return names


def worker_files(path: str | os.PathLike) -> list[str]:
    """The ``FILE.worker-<pid>`` files written next to ``path`` by instrumented worker processes."""
    pattern = glob.escape(os.fspath(path)) + WORKER_SUFFIX + "*"
    return sorted(glob.glob(pattern), key=lambda p: (len(p), p))


def load(paths: Iterable[str | os.PathLike], *, workers: bool = True) -> TraceSet:
    """Read trace files (and, with ``workers``, each one's worker files); one-line errors for bad input."""
    files: list[RawTrace] = []
    notes: list[str] = []
    seen: set[str] = set()
    for given in paths:
        main = _read(given)
        if os.path.abspath(main.path) in seen:
            continue
        seen.add(os.path.abspath(main.path))
        files.append(main)
        if not workers or main.header.get("role") == "worker":
            continue
        run_id = main.header.get("run_id")
        for wpath in worker_files(given):
            if os.path.abspath(wpath) in seen:
                continue
            seen.add(os.path.abspath(wpath))
            try:
                w = read_file(wpath)
            except (OSError, ValueError, WrongKind) as exc:
                notes.append(f"{shown(wpath)}: skipped: {exc}")
                continue
            if run_id and w.header.get("run_id") != run_id:
                notes.append(f"{wpath}: skipped: written by another run")
                continue
            files.append(w)
    for f in files:
        if not f.complete:
            notes.append(f"{f.path}: ended without a clean close (process killed?); "
                         f"records up to its last flush kept" + (f", {f.torn_bytes} torn bytes ignored"
                                                                  if f.torn_bytes else ""))
    return TraceSet(files, notes)


def _read(path: str | os.PathLike) -> RawTrace:
    try:
        return read_file(path)
    except OSError as exc:
        raise from_oserror(exc, os.fsdecode(path)) from exc
    except ValueError as exc:
        raise ManyfilesError(f"{shown(os.fsdecode(path))}: {exc}") from exc
