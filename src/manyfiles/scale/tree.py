"""Counting and listing a tree on a cluster (``fastls -r --cluster``): subtrees as shards.

A shard is a handful of directories (paths relative to the root).  Its worker lists them
with the fastls core, several at a time (``threads``), depth-first, and keeps descending
until it has listed ``entries_per_shard`` entries; the directories it found but did not
enter go back to the client as new shards (at most ``dirs_per_shard`` each), so the tree
spreads over the cluster as it is discovered, like dwalk's work queues.

* A directory with more than ``slice_dirs`` subdirectories is not sent back name by name:
  its subdirectories become ``slice_dirs``-sized slices (those whose name hashes to residue
  ``r`` modulo ``m``), each re-listed by the worker that runs it.  No result carries 10^6 names.
* A huge flat directory is listed by one worker (getdents on one directory is sequential);
  what it lists is counted, or written to that shard's part file, never returned.
* Listing output goes to ``OUT_DIR/part-<shard hash>``, written under a temp name and renamed
  when the shard ends: a shard re-run after its worker died rewrites the same part, so
  nothing is lost or listed twice.  ``OUT_DIR`` must be reachable by the client and every
  worker (the shared filesystem the tree is on, or anything on a one-machine cluster).

Errors: an unreadable directory is a failure with its path (the walk goes on); an unreadable
root stops the job (NotFound, AccessDenied), as for a local walk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import secrets
import threading
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, NamedTuple

from manyfiles import listing
from manyfiles._pool import Pool
from manyfiles._progress import ProgressArg
from manyfiles._report import Failure, Report
from manyfiles.errors import UsageError, from_oserror
from manyfiles.listing import NO_FILTER, Filter
from manyfiles.scale.executor import ClusterArg, ClusterReport, Job, Publish, ShardResult, run_job

ENTRIES_PER_SHARD = 200_000     # ~0.1-0.5 s of listing on a local disk; more on NFS
DIRS_PER_SHARD = 2_000          # directories handed back per new shard
SLICE_DIRS = 50_000             # subdirectories of one directory per slice
PART_PREFIX = "part-"
_TYPE = attrgetter("type")


class Dir(NamedTuple):
    """A directory to list: path relative to the root (``b""`` = the root) and its depth."""

    rel: bytes
    depth: int


class SubdirSlice(NamedTuple):
    """The subdirectories of ``parent`` whose name hashes (crc32) to ``residue`` modulo ``mod``."""

    parent: bytes
    depth: int
    mod: int
    residue: int


@dataclass(kw_only=True)
class TreeReport(Report):
    """A tree counted or listed on a cluster: entries (by type letter), directories listed,
    unreadable directories as failures, and the part files written (listing only)."""

    entries: int = 0
    directories: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    parts: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.entries:,} entries in {self.directories:,} directories in {self.seconds:.2f} s"


@dataclass(frozen=True)
class TreeJob(Job):
    """Count (``out_dir=None``) or list a tree; see the module docstring."""

    root: bytes                       # absolute: workers do not share the client's cwd
    shown: bytes                      # the root as the user spelled it (printed paths start with it)
    out_dir: str | None = None
    sep: bytes = b"\n"
    max_depth: int | None = None
    filter: Filter = NO_FILTER
    threads: int = 8
    entries_per_shard: int = ENTRIES_PER_SHARD
    dirs_per_shard: int = DIRS_PER_SHARD
    slice_dirs: int = SLICE_DIRS
    split: int = 8                    # new shards per handful of leftovers: ~ the cluster's threads
    name = "fastls"
    unit = "entries"

    def shards(self) -> Iterator[tuple]:
        yield (Dir(b"", 0),)

    def priority(self, shard: tuple) -> int:
        return -max(item.depth for item in shard)     # deepest first: the frontier stays small

    def new_report(self) -> TreeReport:
        return TreeReport()

    def sized_for(self, workers: int) -> TreeJob:
        return dataclasses.replace(self, split=2 * workers)

    def run(self, shard: tuple, publish: Publish) -> ShardResult:
        return _ShardWalk(self, publish).run(shard)


class _ShardWalk:
    """One shard: a LIFO pool of directory visits on ``job.threads`` threads, within a budget."""

    def __init__(self, job: TreeJob, publish: Publish) -> None:
        self.job = job
        self.publish = publish
        self.report = TreeReport()
        self.lock = threading.Lock()
        self.listed = 0
        self.leftover: list[Dir | SubdirSlice] = []
        self.out: _Part | None = None
        self.pool: Pool = Pool(self.visit, job.threads, name="mf-tree", lifo=True)

    def run(self, items: tuple) -> ShardResult:
        job = self.job
        if job.out_dir is not None:
            self.out = _Part(job.out_dir, _shard_name(items))
        try:
            self.pool.run(items)
            if self.out is not None:
                self.report.parts.append(self.out.commit())
        finally:
            if self.out is not None:
                self.out.abort()
        return ShardResult(report=self.report, items=self.report.entries, more=self._more())

    def _more(self) -> list[tuple]:
        left = self.leftover
        if not left:
            return []
        size = max(1, min(self.job.dirs_per_shard, math.ceil(len(left) / max(1, self.job.split))))
        return [tuple(left[i:i + size]) for i in range(0, len(left), size)]

    def push(self, items: list[Dir] | list[SubdirSlice]) -> None:
        """Directories found: this shard lists them while under budget, else they go back."""
        with self.lock:
            if self.listed >= self.job.entries_per_shard:
                self.leftover.extend(items)
                return
        self.pool.submit(*items)      # one wake-up for the lot

    def visit(self, item: Dir | SubdirSlice) -> None:
        if isinstance(item, SubdirSlice):
            self._visit_slice(item)
            return
        job = self.job
        path = _join(job.root, item.rel)
        try:
            entries = list(listing.iter_entries(path, resolve_unknown=True))
        except OSError as exc:
            if item.depth == 0:
                raise from_oserror(exc, job.shown) from exc
            with self.lock:
                self.report.failures.append(Failure.from_oserror(_join(job.shown, item.rel), exc))
            return
        shown = [e for e in entries if job.filter.matches(e.name, e.type)] if job.filter else entries
        if self.out is not None and shown:
            base = os.path.join(job.shown, item.rel, b"")
            sep = job.sep
            self.out.write(base + (sep + base).join([e.name for e in shown]) + sep)
        types = Counter(map(_TYPE, shown))
        with self.lock:
            r = self.report
            r.directories += 1
            r.entries += len(shown)
            for letter, n in types.items():
                r.by_type[letter] = r.by_type.get(letter, 0) + n
            self.listed += len(entries)
            done, failed = r.entries, len(r.failures)
        self.publish(done, 0, failed)
        if job.max_depth is not None and item.depth >= job.max_depth:
            return
        subdirs = [e.name for e in entries if e.type == "d"]
        if len(subdirs) > job.slice_dirs:
            mod = math.ceil(len(subdirs) / job.slice_dirs)
            self.push([SubdirSlice(item.rel, item.depth, mod, residue) for residue in range(mod)])
        elif subdirs:
            join, rel, depth = os.path.join, item.rel, item.depth + 1
            self.push([Dir(join(rel, name), depth) for name in subdirs])

    def _visit_slice(self, s: SubdirSlice) -> None:
        try:
            entries = listing.iter_entries(_join(self.job.root, s.parent), resolve_unknown=True)
            names = [e.name for e in entries if e.type == "d" and zlib.crc32(e.name) % s.mod == s.residue]
        except OSError as exc:
            with self.lock:
                self.report.failures.append(Failure.from_oserror(_join(self.job.shown, s.parent), exc))
            return
        self.push([Dir(os.path.join(s.parent, name), s.depth + 1) for name in names])


def _join(root: bytes, rel: bytes) -> bytes:
    return os.path.join(root, rel) if rel else root


def _shard_name(items: tuple) -> str:
    """The same shard always writes the same part (a re-run replaces it)."""
    return hashlib.sha1(repr(items).encode()).hexdigest()[:20]


class _Part:
    """A shard's output file: appended from several threads, renamed into place at the end."""

    def __init__(self, out_dir: str, name: str) -> None:
        self.final = os.path.join(out_dir, PART_PREFIX + name)
        self.tmp = os.path.join(out_dir, f".{PART_PREFIX}{name}.{secrets.token_hex(4)}.tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.lock = threading.Lock()

    def write(self, data: bytes) -> None:
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]

    def commit(self) -> str:
        os.close(self.fd)
        self.fd = -1
        os.replace(self.tmp, self.final)
        return self.final

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)


# -- the public calls ---------------------------------------------------------------------------------

def _job(root: str | bytes | os.PathLike, **options: Any) -> TreeJob:
    shown = os.fsencode(root)
    if not shown:
        raise UsageError("an empty path is not a directory")
    return TreeJob(root=os.path.abspath(shown), shown=shown, **options)


def count_tree(root: str | bytes | os.PathLike, *, cluster: ClusterArg, max_depth: int | None = None,
               filter: Filter = NO_FILTER, threads: int = 8, progress: ProgressArg = False,
               **tuning: Any) -> ClusterReport:
    """Count the entries under ``root`` on ``cluster`` (``result``: a :class:`TreeReport`).

    Example:
        >>> r = count_tree("/nfs/data", cluster="tcp://scheduler:8786")   # doctest: +SKIP
        >>> r.entries, r.directories, r.failures
    """
    job = _job(root, max_depth=max_depth, filter=filter, threads=threads, **tuning)
    return run_job(job, cluster, progress=progress)


def write_tree(root: str | bytes | os.PathLike, out_dir: str | os.PathLike, *, cluster: ClusterArg,
               sep: bytes = b"\n", max_depth: int | None = None, filter: Filter = NO_FILTER, threads: int = 8,
               progress: ProgressArg = False, **tuning: Any) -> ClusterReport:
    """List every path under ``root`` (``root/a/b``, ``sep``-terminated) into part files in ``out_dir``.

    ``result.parts`` names them; :func:`copy_parts` streams them to a file descriptor.
    ``out_dir`` must exist and be visible to the client and every worker.
    """
    out = os.path.abspath(os.fspath(out_dir))
    if not os.path.isdir(out):
        raise UsageError(f"{os.fspath(out_dir)}: not a directory (the listing's part files go there)")
    job = _job(root, out_dir=out, sep=sep, max_depth=max_depth, filter=filter, threads=threads, **tuning)
    return run_job(job, cluster, progress=progress)


def copy_parts(parts: list[str], out_fd: int, *, remove: bool = True) -> int:
    """Copy part files to ``out_fd`` (one ``os.sendfile``/copy loop each); returns the bytes copied."""
    total = 0
    for path in parts:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            total += _copy_fd(f.fileno(), out_fd, size)
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return total


def _copy_fd(src: int, dst: int, size: int) -> int:
    sent = 0
    try:
        while sent < size:
            n = os.sendfile(dst, src, sent, size - sent)
            if n == 0:
                break
            sent += n
        return sent
    except OSError as exc:
        if exc.errno not in (22, 38):          # EINVAL/ENOSYS: this pair of fds cannot sendfile
            raise
    os.lseek(src, sent, os.SEEK_SET)
    while chunk := os.read(src, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
        sent += len(chunk)
    return sent


__all__ = ["Dir", "SubdirSlice", "TreeJob", "TreeReport", "copy_parts", "count_tree", "write_tree"]
