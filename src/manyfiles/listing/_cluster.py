"""Counting and listing a tree on a Dask cluster (``fastls -r --cluster``): subtrees as shards.

The cluster twins of :func:`manyfiles.listing.count_tree` / :func:`~manyfiles.listing.write_tree`
(:func:`count_tree`, :func:`write_tree`: they return a ``ClusterReport`` of a :class:`TreeReport`);
``fastls.run(request, fd, cluster=...)`` runs a ``fastls -r`` request through them.

The work unit is a subtree counted (or written) by the C tree walker of one worker,
``listing.count_tree`` / ``listing.write_tree``: native threads, no Python object per entry.
What makes the subtrees is splitting, done on the workers too:

* the first shard lists the top levels of the tree (directory names only) until it has
  ``want`` subtrees (a few per worker thread), counts the entries of those upper directories
  itself, and hands the subtrees back as new shards;
* a subtree that turns out bigger than ``subtree_budget`` entries (the walker's progress
  callback says so) is abandoned and split one level: its own entries are counted, its
  subdirectories become new shards, so one huge branch spreads over the cluster as well;
* a directory with more than ``slice_dirs`` subdirectories is not sent back name by name but
  as slices (its subdirectories whose name hashes to residue ``r`` modulo ``m``), each
  re-listed by the worker that runs it: no result carries 10^6 names;
* a huge flat directory is listed by one worker (getdents on one directory is sequential):
  what it holds is counted, or written to the shard's part file, never returned.

Listing output (absolute paths: workers do not share the client's working directory) goes to
``OUT_DIR/part-<shard hash>``, written under a temp name and renamed
when the shard ends, so a shard re-run after its worker died rewrites the same part: nothing is
lost or listed twice.  ``OUT_DIR`` must be reachable by the client and every worker (the
shared filesystem the tree is on, or anything on a one-machine cluster).

Errors: an unreadable directory is a failure with its path (the walk goes on); an unreadable
root stops the job (NotFound, AccessDenied), as for a local walk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import math
import os
import secrets
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from manyfiles import listing
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.progress import ProgressArg
from manyfiles._core.report import Failure, Report
from manyfiles.errors import NotFound, UsageError, from_oserror
from manyfiles.listing import NO_FILTER, Filter
from manyfiles.scale.executor import ClusterArg, ClusterReport, Job, Publish, ShardResult, run_job

SUBTREE_BUDGET = 2_000_000      # entries one walker call may count before its subtree is split
SUBTREES_PER_THREAD = 8         # subtrees the first shard looks for, per worker thread
DIRS_PER_SHARD = 2_000          # directories handed back per new shard, at most
SLICE_DIRS = 50_000             # subdirectories of one directory per slice
PLAN_DEPTH = 4                  # levels the first shard lists at most to find its subtrees
PART_PREFIX = "part-"
_DIRS_ONLY = Filter(types="d")


class Dir(NamedTuple):
    """A subtree: its path relative to the root (``b""`` = the root) and its depth."""

    rel: bytes
    depth: int


class SubdirSlice(NamedTuple):
    """The subdirectories of ``parent`` whose name hashes (crc32) to ``residue`` modulo ``mod``."""

    parent: bytes
    depth: int
    mod: int
    residue: int


class Split(NamedTuple):
    """List ``rel`` and the levels below it until there are ``want`` subtrees (``want=1``: one
    level); count the entries of the directories listed, hand the subtrees back."""

    rel: bytes
    depth: int
    want: int


@dataclass(kw_only=True)
class TreeReport(Report):
    """A tree counted or listed on a cluster: entries, directories listed, unreadable directories
    as failures, the part files written (listing only) and the subtrees split for being big."""

    entries: int = 0
    directories: int = 0
    splits: int = 0
    parts: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return f"{self.entries:,} entries in {self.directories:,} directories in {self.seconds:.2f} s"


class _OverBudget(Exception):
    """Raised from the walker's progress callback: this subtree is too big for one call."""


@dataclass(frozen=True)
class TreeJob(Job):
    """Count (``out_dir=None``) or list a tree; see the module docstring."""

    root: bytes                       # absolute: workers do not share the client's cwd
    shown: bytes                      # the root as the user spelled it (in error messages)
    out_dir: str | None = None
    sep: bytes = b"\n"
    json: bool = False
    max_depth: int | None = None
    filter: Filter = NO_FILTER
    threads: int = listing.DEFAULT_THREADS
    subtree_budget: int = SUBTREE_BUDGET
    dirs_per_shard: int = DIRS_PER_SHARD
    slice_dirs: int = SLICE_DIRS
    subtrees_per_thread: int = SUBTREES_PER_THREAD
    want: int = SUBTREES_PER_THREAD   # subtrees the first shard looks for (set by sized_for)
    name = "fastls"
    unit = "entries"

    def shards(self) -> Iterator[tuple]:
        yield (Split(b"", 0, self.want),)

    def sized_for(self, workers: int) -> TreeJob:
        return dataclasses.replace(self, want=self.subtrees_per_thread * max(1, workers))

    def priority(self, shard: tuple) -> int:
        return -max(item.depth for item in shard)     # deepest first: the frontier stays small

    def new_report(self) -> TreeReport:
        return TreeReport()

    def run(self, shard: tuple, publish: Publish) -> ShardResult:
        return _Shard(self, publish).run(shard)

    def finish(self, report: ClusterReport) -> None:
        """Every shard is done: the temp parts that lost attempts (their worker died, or their
        lease lapsed before they could clean up) left in ``out_dir`` go."""
        if self.out_dir is None:
            return
        for name in os.listdir(self.out_dir):
            if name.startswith("." + PART_PREFIX) and name.endswith(".tmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.out_dir, name))


class _Shard:
    """One shard: its items one after another, each a walker call or a split."""

    def __init__(self, job: TreeJob, publish: Publish) -> None:
        self.job = job
        self.publish = publish
        self.report = TreeReport()
        self.found: list[Dir | SubdirSlice] = []
        self.out: _Part | None = None

    def run(self, items: tuple) -> ShardResult:
        if self.job.out_dir is not None:
            self.out = _Part(self.job.out_dir, _shard_name(items))
        try:
            subtrees: list[Dir] = []
            for item in items:
                if isinstance(item, Split):
                    self.split(item)
                elif isinstance(item, SubdirSlice):
                    subtrees += self.slice(item)
                else:
                    subtrees.append(item)
            for group in _siblings(subtrees):
                self.subtrees(group)
            if self.out is not None:
                self.report.parts.append(self.out.commit())
        finally:
            if self.out is not None:
                self.out.abort()
        return ShardResult(report=self.report, items=self.report.entries, more=self._more())

    # -- subtrees in one walker call ---------------------------------------------------------------

    def subtrees(self, group: list[Dir]) -> None:
        """Count (or write) sibling subtrees: one walker call, or one each when writing."""
        job = self.job
        group = [d for d in group if job.max_depth is None or d.depth <= job.max_depth]
        if len(group) > 1 and self.out is None:
            # their parent, entering only them and reporting from depth 1: one call, one set of
            # threads (a call per subtree costs ~1 ms of thread start-up: 256 of them doubled a 1M count)
            parent = os.path.dirname(group[0].rel)
            descend = [[_literal(os.path.basename(d.rel)) for d in group]]
            self.walk(group, _join(job.root, parent), group[0].depth - 1,
                      {"min_depth": 1, "descend": descend})
        else:
            for d in group:
                self.walk([d], _join(job.root, d.rel), d.depth, {})

    def walk(self, group: list[Dir], path: bytes, depth: int, extra: dict[str, Any]) -> None:
        """One walker call from ``path`` (at ``depth``) covering ``group``; over budget, each is split."""
        job, rep = self.job, self.report
        base = rep.entries
        mark = self.out.tell() if self.out is not None else 0

        def progress(n: int) -> None:
            self.publish(base + n, 0, len(rep.failures))
            if n > job.subtree_budget:
                raise _OverBudget

        options = {"threads": job.threads, "filter": job.filter, "on_entries": progress,
                   "max_depth": None if job.max_depth is None else job.max_depth - depth, **extra}
        try:
            if self.out is None:
                tally = listing.count_tree(path, **options)
            else:
                tally = listing.write_tree(path, self.out.fd, json=job.json, sep=job.sep, **options)
        except _OverBudget:
            if self.out is not None:
                self.out.truncate(mark)
            rep.splits += 1
            for d in group:
                self.split(Split(d.rel, d.depth, 1))
            return
        except OSError as exc:
            if extra:                         # the parent: each subtree on its own says which failed
                for d in group:
                    self.walk([d], _join(job.root, d.rel), d.depth, {})
                return
            self._unreadable(group[0], exc)
            return
        rep.entries += tally.entries
        rep.directories += tally.directories - (1 if extra else 0)     # the parent was listed, not ours
        for failed, exc in tally.failures:
            rep.failures.append(Failure.from_oserror(self._shown(failed), exc))
        self.publish(rep.entries, 0, len(rep.failures))
        checkpoint("tree")

    def _shown(self, path: bytes) -> bytes:
        """A path the walker reports (absolute) as the user would see it (under their spelling)."""
        return self.job.shown + path[len(self.job.root):] if path.startswith(self.job.root) else path

    def _unreadable(self, d: Dir, exc: OSError) -> None:
        if d.depth == 0:
            raise from_oserror(exc, self.job.shown) from exc
        self.report.failures.append(Failure.from_oserror(_join(self.job.shown, d.rel), exc))

    # -- splitting -----------------------------------------------------------------------------------

    def split(self, s: Split) -> None:
        """List ``s.rel`` and, breadth first, the levels below, until ``s.want`` subtrees are found."""
        job = self.job
        level = [Dir(s.rel, s.depth)]
        for _ in range(PLAN_DEPTH):
            deeper: list[Dir] = []
            for d in level:
                deeper += self.one_level(d)
            level = deeper
            if len(level) >= s.want or not level or len(level) > job.slice_dirs:
                break
        self.found += level

    def one_level(self, d: Dir) -> list[Dir]:
        """Count (or write) the entries of ``d`` itself; return its subdirectories."""
        job, rep = self.job, self.report
        if job.max_depth is not None and d.depth > job.max_depth:
            return []
        path = _join(job.root, d.rel)
        try:
            if self.out is None:
                n = listing.count(path, filter=job.filter)
            else:       # the walker formats this directory's lines, as for a whole subtree
                n = listing.write_tree(path, self.out.fd, json=job.json, sep=job.sep, max_depth=0, threads=1,
                                       filter=job.filter).entries
            if job.max_depth is not None and d.depth >= job.max_depth:
                names = []
            else:
                names = listing.listdir(path, filter=_DIRS_ONLY)
        except OSError as exc:
            self._unreadable(d, exc)
            return []
        rep.entries += n
        rep.directories += 1
        self.publish(rep.entries, 0, len(rep.failures))
        if len(names) > job.slice_dirs:
            mod = math.ceil(len(names) / job.slice_dirs)
            self.found += [SubdirSlice(d.rel, d.depth, mod, r) for r in range(mod)]
            return []
        return [Dir(os.path.join(d.rel, name), d.depth + 1) for name in names]

    def slice(self, s: SubdirSlice) -> list[Dir]:
        try:
            names = listing.listdir(_join(self.job.root, s.parent), filter=_DIRS_ONLY)
        except OSError as exc:
            self._unreadable(Dir(s.parent, s.depth), exc)
            return []
        mine = [n for n in names if zlib.crc32(n) % s.mod == s.residue]
        return [Dir(os.path.join(s.parent, n), s.depth + 1) for n in mine]

    def _more(self) -> list[tuple]:
        found = self.found
        if not found:
            return []
        size = max(1, min(self.job.dirs_per_shard, math.ceil(len(found) / max(1, self.job.want))))
        return [tuple(found[i:i + size]) for i in range(0, len(found), size)]


def _siblings(subtrees: list[Dir]) -> Iterator[list[Dir]]:
    """Runs of subtrees with the same parent (the order they were found keeps siblings together)."""
    run: list[Dir] = []
    for d in subtrees:
        if run and (os.path.dirname(d.rel) != os.path.dirname(run[0].rel) or not d.rel):
            yield run
            run = []
        run.append(d)
    if run:
        yield run


def _literal(name: bytes) -> str:
    """A glob matching exactly ``name`` (fnmatch rules: a metacharacter in brackets is literal)."""
    text = os.fsdecode(name)
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def _join(root: bytes, rel: bytes) -> bytes:
    return os.path.join(root, rel) if rel else root


def _shard_name(items: tuple) -> str:
    """The same shard always writes the same part (a re-run replaces it)."""
    return hashlib.sha1(repr(items).encode()).hexdigest()[:20]


class _Part:
    """A shard's output file, renamed into place when the shard is done."""

    def __init__(self, out_dir: str, name: str) -> None:
        self.final = os.path.join(out_dir, PART_PREFIX + name)
        self.tmp = os.path.join(out_dir, f".{PART_PREFIX}{name}.{secrets.token_hex(4)}.tmp")
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def tell(self) -> int:
        return os.lseek(self.fd, 0, os.SEEK_CUR)

    def truncate(self, size: int) -> None:
        """Forget what an abandoned walker call wrote."""
        os.ftruncate(self.fd, size)
        os.lseek(self.fd, size, os.SEEK_SET)

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

def make_job(root: str | bytes | os.PathLike, **options: Any) -> TreeJob:
    """The job of :func:`count_tree` / :func:`write_tree` (options: TreeJob's fields), for an executor."""
    shown = os.fsencode(root)
    if not shown:     # names nothing, not the current directory: a missing path (docs/cli.md)
        raise NotFound(f"'': {os.strerror(errno.ENOENT)}")
    return TreeJob(root=os.path.abspath(shown), shown=shown, **options)


def count_tree(root: str | bytes | os.PathLike, *, cluster: ClusterArg, max_depth: int | None = None,
               filter: Filter = NO_FILTER, threads: int = listing.DEFAULT_THREADS,
               progress: ProgressArg = False, **tuning: Any) -> ClusterReport:
    """Count the entries under ``root`` on ``cluster`` (``result``: a :class:`TreeReport`).

    Example:
        >>> r = count_tree("/nfs/data", cluster="tcp://scheduler:8786")   # doctest: +SKIP
        >>> r.entries, r.directories, r.failures
    """
    job = make_job(root, max_depth=max_depth, filter=filter, threads=threads, **tuning)
    return run_job(job, cluster, progress=progress)


def write_tree(root: str | bytes | os.PathLike, out_dir: str | os.PathLike, *, cluster: ClusterArg,
               sep: bytes = b"\n", json: bool = False, max_depth: int | None = None,
               filter: Filter = NO_FILTER, threads: int = listing.DEFAULT_THREADS,
               progress: ProgressArg = False, **tuning: Any) -> ClusterReport:
    """List every path under ``root`` (``/abs/root/a/b`` + ``sep``, or ``fastls --json`` lines) into
    part files in ``out_dir``; ``result.parts`` names them and :func:`copy_parts` streams them to a
    file descriptor.  Paths are absolute: the workers do not share the caller's working directory.
    ``out_dir`` must exist and be visible to the client and every worker.
    """
    out = os.path.abspath(os.fspath(out_dir))
    if not os.path.isdir(out):
        raise UsageError(f"{os.fspath(out_dir)}: not a directory (the listing's part files go there)")
    job = make_job(root, out_dir=out, sep=sep, json=json, max_depth=max_depth, filter=filter, threads=threads,
               **tuning)
    return run_job(job, cluster, progress=progress)


def copy_parts(parts: list[str], out_fd: int, *, remove: bool = True) -> int:
    """Copy part files to ``out_fd`` (``os.sendfile`` where it can); returns the bytes copied."""
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


__all__ = ["Dir", "Split", "SubdirSlice", "TreeJob", "TreeReport", "copy_parts", "count_tree", "make_job",
           "write_tree"]
