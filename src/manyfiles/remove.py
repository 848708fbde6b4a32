"""Parallel deletion planned around the per-directory unlink lock (fastrm).

Every unlink(2) and rmdir(2) takes the *parent directory's* lock, so threads that
unlink in one shared directory queue behind each other (FxMark MWUM) while threads
in separate directories proceed in parallel (MWUL).  The plan follows from that:

* one task per directory, run by one worker: it lists the directory with the fastls
  core and unlinks every non-directory with ``unlinkat(dir_fd, name)`` -- no stat per
  file; the d_type from getdents says "directory", and when it is unknown (NFS,
  sshfs) an EISDIR from unlink says so;
* files before directories, deepest directories first: a directory's task pushes its
  subdirectories only after its own files are gone, and a directory is removed only
  once every subdirectory has finished;
* the rmdirs of a directory's children are batched and run by the one worker that
  finishes the last child, so no two workers ever take the same directory lock;
* rmdir failing with ENOTEMPTY (a concurrent writer, an NFS ``.nfsXXXX`` silly-rename
  that outlives an open file) cleans the directory again and retries with back-off;
* nothing follows a symlink: directories are opened with O_NOFOLLOW relative to their
  parent's fd, so a link to outside the tree is unlinked and its target survives;
* a failure (EACCES deep in a tree) is recorded and the rest is still removed; its
  ancestors are then left in place without reporting a second, derived error.

Tasks are scheduled last-in-first-out (depth-first), which keeps the number of open
directory fds near depth x workers instead of the width of the tree.

Example:
    >>> import manyfiles as mf
    >>> report = mf.remove_tree("/scratch/run-42", workers=8)     # doctest: +SKIP
    >>> report.files, report.dirs, report.failures                # doctest: +SKIP
    (1000000, 65793, [])
    >>> mf.purge("/scratch/cache", "*.tmp").files                 # doctest: +SKIP
    1204
"""

from __future__ import annotations

import errno
import fnmatch
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from manyfiles import _fsops, iotrace, listing
from manyfiles.errors import PartialFailure, UsageError

__all__ = ["RemoveFailure", "RemoveProgress", "RemoveReport", "purge", "remove_tree"]

PathArg = str | bytes | os.PathLike

DEFAULT_WORKERS = 8
# Directories bigger than this are unlinked in inode order, as GNU rm (gnulib fts)
# does on ext*: hash order touches inode-table blocks at random.
INODE_SORT_THRESHOLD = 10_000
# ENOTEMPTY retries: first one at once (a writer that raced us), then back-off for
# NFS silly-renames, which vanish only when the last opener closes the file.
DEFAULT_RETRIES = 5
RETRY_BACKOFF = 0.05
FLUSH_EVERY = 4096  # files between counter/output updates inside one directory


@dataclass(frozen=True)
class RemoveFailure:
    """One entry that could not be removed."""

    path: str
    errno: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class RemoveReport:
    """What a removal did.  ``bytes`` is None: sizes are unknown because nothing is stat'ed."""

    files: int = 0
    dirs: int = 0
    kept: int = 0
    retries: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    bytes: int | None = None
    failures: list[RemoveFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def files_per_second(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0

    def raise_for_failures(self) -> None:
        """Raise :class:`PartialFailure` if anything could not be removed."""
        if self.failures:
            raise PartialFailure(f"{len(self.failures)} entries could not be removed", self.failures)

    def __str__(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        text = f"{verb} {self.files:,} files and {self.dirs:,} directories in {self.seconds:.2f} s"
        if self.failures:
            text += f"; {len(self.failures):,} failed"
        return text


@dataclass(frozen=True)
class RemoveProgress:
    """Snapshot passed to a progress callback: ``found`` grows while the walk goes on."""

    files: int
    dirs: int
    found: int
    failures: int
    seconds: float


class _Dir:
    """A directory being removed: its fd stays open until its children are rmdir'ed."""

    __slots__ = (
        "blocked",
        "children_done",
        "dev",
        "fd",
        "name",
        "parent",
        "path",
        "pending",
        "rel",
        "remove_all",
        "rmdir_self",
        "size",
    )

    def __init__(self, parent: _Dir | None, name: str, path: str, rel: str, remove_all: bool) -> None:
        self.parent = parent
        self.name = name
        self.path = path
        self.rel = rel  # path relative to the argument, for '/' globs
        self.remove_all = remove_all  # everything inside goes (no glob filter any more)
        self.rmdir_self = remove_all
        self.fd = -1
        self.pending = 0  # subdirectories not yet finished
        self.children_done: list[tuple[str, str]] = []  # (name, path) of emptied subdirectories
        self.blocked = False  # something inside stays: do not rmdir
        self.dev = parent.dev if parent is not None else -1  # st_dev of the argument's file system
        self.size = listing.DEFAULT_BUFSIZE // 2  # st_size of the directory, once opened


def _matcher(patterns: Sequence[str] | None) -> tuple[Callable[[str], Any] | None, bool]:
    """Compile glob patterns into one regex; second value: does any pattern need the relative path."""
    if not patterns:
        return None, False
    regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns), re.DOTALL)
    return regex.match, any("/" in p for p in patterns)


def _as_str(path: PathArg) -> str:
    return os.fsdecode(os.fspath(path))


def _fd_path(fd: int) -> str:
    # listing's public functions take a path; /proc/self/fd/N names exactly the directory
    # we opened with O_NOFOLLOW, so a rename/symlink swap of the path cannot redirect it.
    return f"/proc/self/fd/{fd}" if _HAVE_PROC_FD else fd  # type: ignore[return-value]


_HAVE_PROC_FD = os.path.isdir("/proc/self/fd")
_use_fd_core = getattr(listing, "_dents", None) is not None


def _entries(fd: int, path: str, resolve: bool, bufsize: int) -> list[listing.Entry]:
    """All entries of the open directory ``fd``, through the fastls C core when it is built.

    The core reads from our fd directly (no second open of ``/proc/self/fd/N``, a procfs
    path walk per directory); ``bufsize`` follows the directory's size, since most
    directories of a tree are small and a 1 MiB buffer per call is wasted there.
    """
    global _use_fd_core
    if _use_fd_core:
        try:
            out: list[listing.Entry] = []
            while True:
                batches = listing._batches_list()
                batch = listing._dents.entries_batch(
                    fd, bufsize, False, resolve=resolve, path=path, batches=batches
                )
                listing._trace_batches(path, batches)
                if batch is None:
                    return out
                out.extend(batch)
        except (AttributeError, TypeError):  # the core's private signature changed: public path
            _use_fd_core = False
            os.lseek(fd, 0, os.SEEK_SET)
    return list(listing.iter_entries(_fd_path(fd), resolve_unknown=resolve))


def _bufsize(st_size: int) -> int:
    # getdents64 records are up to ~2x an ext4 directory's on-disk bytes; clamp to 32 KiB..1 MiB
    return min(listing.DEFAULT_BUFSIZE, max(32 << 10, 2 * st_size))


def _raise_fd_limit() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass


class _Remover:
    """The worker pool and the per-directory state machine (one instance per call)."""

    def __init__(
        self,
        *,
        workers: int,
        dry_run: bool,
        include: Sequence[str] | None,
        exclude: Sequence[str] | None,
        cross_mounts: bool,
        retries: int,
        on_removed: Callable[[list[str]], None] | None,
    ) -> None:
        self.workers = max(1, int(workers))
        self.dry_run = dry_run
        self.include, self.include_rel = _matcher(include)
        self.exclude, self.exclude_rel = _matcher(exclude)
        self.cross_mounts = cross_mounts
        self.retries = retries
        self.on_removed = on_removed
        self.report = RemoveReport(dry_run=dry_run)
        self.found = 0
        self.lock = threading.Lock()  # counters, failures, parent bookkeeping
        self.cv = threading.Condition(threading.Lock())
        self.tasks: list[_Dir] = []  # LIFO: depth-first keeps few fds open
        self.outstanding = 0
        self.cancelled = False
        self.done = threading.Event()  # the caller waits on this, not on cv (no stolen wake-ups)

    # -- bookkeeping ------------------------------------------------------------------

    def fail(self, path: str, exc: OSError) -> None:
        reason = exc.strerror or str(exc)
        with self.lock:
            self.report.failures.append(RemoveFailure(path, exc.errno or 0, reason))

    def count(
        self, files: int = 0, dirs: int = 0, found: int = 0, kept: int = 0, paths: list[str] | None = None
    ) -> None:
        with self.lock:
            self.report.files += files
            self.report.dirs += dirs
            self.report.kept += kept
            self.found += found
            if paths and self.on_removed is not None:
                # under the lock: one writer at a time, batches never interleave
                self.on_removed(paths)

    def push(self, nodes: list[_Dir]) -> None:
        with self.cv:
            self.tasks.extend(reversed(nodes))
            self.outstanding += len(nodes)
            self.cv.notify(len(nodes))

    # -- the pool ---------------------------------------------------------------------

    def run(self, progress: Callable[[RemoveProgress], None] | None, t0: float) -> None:
        threads = [
            threading.Thread(target=self.worker, name=f"fastrm-{i}", daemon=True) for i in range(self.workers)
        ]
        for t in threads:
            t.start()
        try:
            while not self.done.wait(0.2):
                if progress is not None:
                    progress(self.snapshot(t0))
        except BaseException:  # Ctrl-C in a notebook: stop cleanly, leak no fds
            with self.cv:
                self.cancelled = True
                self.cv.notify_all()
            for t in threads:
                t.join()
            for node in self.tasks:
                parent = node.parent
                while parent is not None and parent.parent is not None and parent.fd >= 0:
                    os.close(parent.fd)
                    parent.fd = -1
                    parent = parent.parent
            raise
        for t in threads:
            t.join()

    def snapshot(self, t0: float) -> RemoveProgress:
        r = self.report
        return RemoveProgress(r.files, r.dirs, self.found, len(r.failures), time.monotonic() - t0)

    def worker(self) -> None:
        while True:
            with self.cv:
                while not self.tasks and self.outstanding and not self.cancelled:
                    self.cv.wait()
                if self.cancelled or not self.outstanding:
                    self.cv.notify_all()
                    return
                node = self.tasks.pop()
            try:
                self.process(node)
            except Exception as exc:  # a bug must not hang the pool: report it as a failure
                self.fail(node.path, OSError(errno.EIO, f"internal error: {exc!r}"))
                self.finish_chain(node, blocked=True)
            finally:
                with self.cv:
                    self.outstanding -= 1
                    if not self.outstanding:
                        self.done.set()
                        self.cv.notify_all()

    # -- one directory ----------------------------------------------------------------

    def open(self, node: _Dir) -> bool:
        """Open ``node`` relative to its parent; False when it is finished already."""
        parent = node.parent
        assert parent is not None
        try:
            node.fd = _fsops.open_dir(node.name, dir_fd=parent.fd)
        except FileNotFoundError:
            return False  # removed by someone else: fine
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                # replaced by a symlink or file since it was listed: remove that, never follow
                if node.remove_all:
                    self.remove_file(parent.fd, node.name, node.path)
                return False
            self.fail(node.path, exc)
            node.blocked = True
            return False
        st = os.fstat(node.fd)
        if not self.cross_mounts and st.st_dev != node.dev:
            self.fail(node.path, OSError(errno.EXDEV, "is a mount point; not crossed (see --cross-mounts)"))
            node.blocked = True
            os.close(node.fd)
            node.fd = -1
            return False
        node.size = st.st_size
        return True

    def process(self, node: _Dir) -> None:
        if node.fd < 0 and not self.open(node):
            self.finish_chain(node, blocked=node.blocked)
            return
        fd = node.fd
        prefix = node.path + "/" if not node.path.endswith("/") else node.path
        rel_prefix = node.rel + "/" if node.rel else ""
        plain = node.remove_all and self.exclude is None and self.on_removed is None and not self.dry_run
        # traced runs take the Python loop, which logs every unlink
        in_c = plain and _use_fd_core and iotrace.TRACER is None
        try:
            if in_c:
                subdirs = self.unlink_all_c(node, prefix)
            else:
                entries = _entries(fd, node.path, self.dry_run, _bufsize(node.size))
        except OSError as exc:
            self.fail(node.path, exc)
            self.finish_chain(node, blocked=True)
            return
        if not in_c:
            if len(entries) > INODE_SORT_THRESHOLD:
                entries.sort(key=lambda e: e.inode)
            self.count(found=len(entries))
            if plain:
                subdirs = self.unlink_all(node, entries, prefix)
            else:
                subdirs = self.unlink_filtered(node, entries, prefix, rel_prefix)
        if not subdirs:
            self.finish_chain(node)
            return
        children = [_Dir(node, name, prefix + name, rel_prefix + name, take) for name, take in subdirs]
        node.pending = len(children)
        self.push(children)

    def unlink_all_c(self, node: _Dir, prefix: str) -> list[tuple[str, bool]]:
        """The plain removal in the C core: it unlinks every non-directory with the GIL
        released (so workers in different directories really run in parallel) and hands
        back only the subdirectories and the failures, never a name per removed file."""
        unlink_files = listing._dents.unlink_files
        subdirs: list[tuple[str, bool]] = []
        at_end = False
        while not at_end:  # FLUSH_EVERY unlinks per call: progress keeps moving in big directories
            removed, at_end, dirs, failures = unlink_files(
                node.fd, _bufsize(node.size), FLUSH_EVERY, node.path
            )
            self.count(files=removed, found=removed + len(dirs) + len(failures))
            subdirs.extend((name, True) for name in dirs)
            for name, err in failures:
                exc = OSError(err, os.strerror(err), prefix + name)
                if self.unlink_failed(exc, node, name, prefix):
                    subdirs.append((name, True))
        return subdirs

    def unlink_all(self, node: _Dir, entries: list[listing.Entry], prefix: str) -> list[tuple[str, bool]]:
        """The common case (no filter, no output, not a dry run): the tightest loop we can write."""
        unlink = os.unlink if iotrace.TRACER is None else _fsops.unlink
        fd = node.fd
        subdirs: list[tuple[str, bool]] = []
        for start in range(0, len(entries), FLUSH_EVERY):  # big directories: keep progress moving
            files = 0
            for e in entries[start : start + FLUSH_EVERY]:
                if e.type == "d":
                    subdirs.append((e.name, True))
                    continue
                try:
                    unlink(e.name, dir_fd=fd)  # DT_UNKNOWN: EISDIR below says "directory"
                    files += 1
                except OSError as exc:
                    if self.unlink_failed(exc, node, e.name, prefix):
                        subdirs.append((e.name, True))
            self.count(files=files)
        return subdirs

    def unlink_failed(self, exc: OSError, node: _Dir, name: str, prefix: str) -> bool:
        """Handle a failed unlink; True if ``name`` turned out to be a directory (recurse)."""
        if isinstance(exc, IsADirectoryError):
            return True
        if isinstance(exc, FileNotFoundError):
            return False
        if exc.errno == errno.EPERM and _fsops.is_dir_nofollow(name, dir_fd=node.fd):
            return True
        self.fail(prefix + name, exc)
        node.blocked = True
        return False

    def unlink_filtered(
        self, node: _Dir, entries: list[listing.Entry], prefix: str, rel_prefix: str
    ) -> list[tuple[str, bool]]:
        """Globs, excludes, --output and dry runs: decide per entry, then unlink."""
        unlink = os.unlink if iotrace.TRACER is None else _fsops.unlink
        include, exclude = self.include, self.exclude
        fd = node.fd
        subdirs: list[tuple[str, bool]] = []
        removed: list[str] = []
        files = kept = 0
        for e in entries:
            if files >= FLUSH_EVERY:  # big directories: keep progress and --output moving
                self.count(files=files, kept=kept, paths=removed)
                files = kept = 0
                removed = []
            name = e.name
            if exclude is not None and exclude(rel_prefix + name if self.exclude_rel else name):
                kept += 1
                node.blocked = True
                continue
            take = node.remove_all or (
                include is not None and include(rel_prefix + name if self.include_rel else name) is not None
            )
            if e.type == "d":
                subdirs.append((name, take))
                continue
            if not take:
                # a directory that does not match is still searched; with DT_UNKNOWN only a
                # stat can tell (filter mode only: a plain removal never stats)
                if e.type == "?" and _fsops.is_dir_nofollow(name, dir_fd=fd):
                    subdirs.append((name, False))
                continue
            if not self.dry_run:
                try:
                    unlink(name, dir_fd=fd)  # DT_UNKNOWN: EISDIR below says "directory"
                except OSError as exc:
                    if self.unlink_failed(exc, node, name, prefix):
                        subdirs.append((name, take))
                    continue
            files += 1
            if self.on_removed is not None:
                removed.append(prefix + name)
        self.count(files=files, kept=kept, paths=removed)
        return subdirs

    def remove_file(self, dir_fd: int, name: str, path: str) -> None:
        if self.dry_run:
            self.count(files=1, paths=[path] if self.on_removed else None)
            return
        try:
            _fsops.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.fail(path, exc)
            return
        self.count(files=1, paths=[path] if self.on_removed else None)

    # -- finishing: rmdir children in one batch, then tell the parent --------------------

    def finish_chain(self, node: _Dir, blocked: bool = False) -> None:
        """``node`` and all its subdirectories are done: rmdir its emptied children, walk up."""
        if blocked:
            node.blocked = True
        while node is not None:
            if node.fd >= 0:
                for name, path in node.children_done:
                    if not self.rmdir(node.fd, name, path):
                        node.blocked = True
                if node.parent is not None:  # the anchor's fd belongs to remove_tree
                    os.close(node.fd)
                    node.fd = -1
            parent = node.parent
            if parent is None:
                return
            with self.lock:
                if node.blocked:
                    parent.blocked = True
                elif node.rmdir_self:
                    parent.children_done.append((node.name, node.path))
                parent.pending -= 1
                last = parent.pending == 0
            if not last:
                return
            node = parent

    def rmdir(self, dir_fd: int, name: str, path: str) -> bool:
        if self.dry_run:
            self.count(dirs=1, paths=[path] if self.on_removed else None)
            return True
        for attempt in range(self.retries + 1):
            try:
                _fsops.rmdir(name, dir_fd=dir_fd)
            except FileNotFoundError:
                return True
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or attempt == self.retries:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                        exc = OSError(exc.errno, _not_empty_reason(dir_fd, name))
                    self.fail(path, exc)
                    return False
                with self.lock:
                    self.report.retries += 1
                if attempt:
                    time.sleep(RETRY_BACKOFF * (2 ** (attempt - 1)))
                self.clean_sync(dir_fd, name, path)
                continue
            self.count(dirs=1, paths=[path] if self.on_removed else None)
            return True
        return False

    def clean_sync(self, dir_fd: int, name: str, path: str) -> None:
        """Empty directory ``name`` again, sequentially (the retry path; errors surface at rmdir)."""
        try:
            fd = _fsops.open_dir(name, dir_fd=dir_fd)
        except OSError:
            return
        try:
            removed: list[str] = []
            files = dirs = 0
            for e in _entries(fd, path, False, listing.DEFAULT_BUFSIZE):
                if self.exclude is not None and self.exclude(e.name):
                    continue
                child = path + "/" + e.name
                try:
                    if e.type != "d" and _fsops.unlink_nondir(e.name, dir_fd=fd):
                        files += 1
                        removed.append(child)
                        continue
                    self.clean_sync(fd, e.name, child)
                    _fsops.rmdir(e.name, dir_fd=fd)
                    dirs += 1
                    removed.append(child)
                except OSError:
                    continue
            self.count(files=files, dirs=dirs, found=files + dirs, paths=removed if self.on_removed else None)
        except OSError:
            pass
        finally:
            os.close(fd)


def _not_empty_reason(dir_fd: int, name: str) -> str:
    try:
        fd = _fsops.open_dir(name, dir_fd=dir_fd)
        try:
            left = sorted(e.name for e in _entries(fd, name, False, listing.DEFAULT_BUFSIZE))
        finally:
            os.close(fd)
    except OSError:
        return os.strerror(errno.ENOTEMPTY)
    nfs = [n for n in left if n.startswith(".nfs")]
    shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
    if nfs:
        return f"Directory not empty (NFS silly-renamed files still open: {', '.join(nfs[:3])})"
    return f"Directory not empty (new entries keep appearing: {shown})"


def _strip(path: str) -> str:
    stripped = path.rstrip("/")
    return stripped or "/"


def _check_paths(paths: Sequence[str], force_root: bool) -> list[tuple[str, bool]]:
    """Refuse dangerous arguments before anything is removed; (path, is_mount_root) pairs."""
    checked = []
    for path in paths:
        p = _strip(path)
        if os.path.basename(p) in (".", ".."):
            raise UsageError(f"{path}: refusing to remove '.' or '..'")
        if os.path.realpath(p) == "/" and not os.path.islink(p):
            raise UsageError(f"{path}: refusing to remove the root directory")
        mount_root = os.path.isdir(p) and not os.path.islink(p) and os.path.ismount(p)
        if mount_root and not force_root:
            raise UsageError(
                f"{path}: is a mount root; refusing without --force-root "
                "(which empties it and keeps the mount point)"
            )
        checked.append((p, mount_root))
    return checked


def remove_tree(
    path: PathArg | Iterable[PathArg],
    *,
    workers: int = DEFAULT_WORKERS,
    dry_run: bool = False,
    include: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    keep_root: bool | None = None,
    force_root: bool = False,
    cross_mounts: bool = False,
    missing_ok: bool = False,
    retries: int = DEFAULT_RETRIES,
    progress: bool | Callable[[RemoveProgress], None] = False,
    on_removed: Callable[[list[str]], None] | None = None,
) -> RemoveReport:
    """Remove ``path`` (or several) and everything below it; return a :class:`RemoveReport`.

    Args:
        path: a file, symlink (removed, never followed, even as ``link/``) or directory;
            or an iterable of them, removed by one shared pool.
        workers: threads; each works on one directory at a time (the GIL is released in
            unlink/rmdir, and that is where the time goes).
        dry_run: list and count what would be removed; remove nothing.
        include: glob patterns; when given, only matching entries are removed (a matching
            directory with all its content) and the argument directories stay.  A pattern
            with ``/`` matches the path relative to the argument, otherwise the name.
        exclude: glob patterns of entries to keep (a kept directory is not entered).
        keep_root: keep the argument directories themselves (default: only with ``include``).
        force_root: allow a mount root: its content is removed, the mount point stays.
            ``/`` is always refused.
        cross_mounts: descend into file systems mounted inside the tree (off: reported).
        missing_ok: an argument that does not exist is not a failure (``rm -f``).
        retries: how often an rmdir that meets new entries (ENOTEMPTY) is cleaned and retried.
        progress: True for a rich progress bar (terminal or notebook), or a callable
            receiving :class:`RemoveProgress` about 5 times a second.
        on_removed: called with batches of removed paths (one caller at a time).

    Failures (permission denied, ...) are collected in ``report.failures``; nothing is
    raised for them.  Refused arguments raise :class:`~manyfiles.errors.UsageError`.
    """
    paths = [_as_str(path)] if isinstance(path, (str, bytes, os.PathLike)) else [_as_str(p) for p in path]
    if include is not None and not include:
        include = None
    if keep_root is None:
        keep_root = include is not None
    checked = _check_paths(paths, force_root)
    _raise_fd_limit()
    rm = _Remover(
        workers=workers,
        dry_run=dry_run,
        include=include,
        exclude=exclude,
        cross_mounts=cross_mounts,
        retries=retries,
        on_removed=on_removed,
    )
    t0 = time.monotonic()
    anchors: list[_Dir] = []
    tops: list[_Dir] = []
    for p, mount_root in checked:
        top = _start(rm, p, mount_root, keep_root, missing_ok, anchors)
        if top is not None:
            tops.append(top)
    with _progress_sink(progress) as sink:
        try:
            if tops:
                rm.push(tops)
                rm.run(sink, t0)
        finally:
            for a in anchors:
                os.close(a.fd)
        rm.report.seconds = time.monotonic() - t0
        if sink is not None:
            sink(rm.snapshot(t0))
    return rm.report


def _start(
    rm: _Remover, p: str, mount_root: bool, keep_root: bool, missing_ok: bool, anchors: list[_Dir]
) -> _Dir | None:
    """Set up one argument: a non-directory is removed at once; a directory becomes a task."""
    import stat

    parent_path, base = os.path.split(p)
    if p == "/":
        parent_path, base = "/", "."
    try:
        st = os.lstat(p)
    except OSError as exc:
        if not (missing_ok and exc.errno == errno.ENOENT):
            rm.fail(p, exc)
        return None
    if rm.exclude is not None and rm.exclude(base):
        rm.count(kept=1)
        return None
    try:
        anchor_fd = os.open(parent_path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        rm.fail(parent_path or ".", exc)
        return None
    anchor = _Dir(None, parent_path, parent_path, "", True)
    anchor.fd = anchor_fd
    anchors.append(anchor)
    if not stat.S_ISDIR(st.st_mode):
        if rm.include is None or rm.include(base):
            rm.count(found=1)
            rm.remove_file(anchor_fd, base, p)
        return None
    top = _Dir(anchor, base, p, "", rm.include is None)
    top.rmdir_self = top.remove_all and not keep_root and not mount_root
    top.dev = st.st_dev
    anchor.pending = 1
    return top


class _progress_sink:
    """Context manager yielding the progress callable: a rich bar, the user's callable, or None."""

    def __init__(self, progress: bool | Callable[[RemoveProgress], None]) -> None:
        self.progress = progress
        self.bar: Any = None

    def __enter__(self) -> Callable[[RemoveProgress], None] | None:
        if callable(self.progress):
            return self.progress
        if not self.progress:
            return None
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("removing"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:>10} files/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self.bar.start()
        task = self.bar.add_task("rm", total=None, rate="")

        def update(p: RemoveProgress) -> None:
            done = p.files + p.dirs
            rate = f"{p.files / p.seconds:,.0f}" if p.seconds > 0 else ""
            # the total grows while the walk discovers entries; the ETA is a lower bound
            self.bar.update(task, completed=done, total=max(p.found, done) or None, rate=rate)

        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def purge(
    directory: PathArg,
    pattern: str | Sequence[str],
    *,
    workers: int = DEFAULT_WORKERS,
    dry_run: bool = False,
    exclude: Sequence[str] | None = None,
    progress: bool | Callable[[RemoveProgress], None] = False,
    on_removed: Callable[[list[str]], None] | None = None,
) -> RemoveReport:
    """Remove every entry under ``directory`` whose name matches ``pattern`` (glob, or a list).

    ``directory`` itself stays; a matching directory goes with all its content.
    Same report and failure handling as :func:`remove_tree`.

    Example:
        >>> mf.purge("/scratch/ckpt", ["*.tmp", "core.*"]).files     # doctest: +SKIP
        42
    """
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    if not patterns:
        raise UsageError("purge: no pattern given")
    return remove_tree(
        directory,
        workers=workers,
        dry_run=dry_run,
        include=patterns,
        exclude=exclude,
        keep_root=True,
        progress=progress,
        on_removed=on_removed,
    )
