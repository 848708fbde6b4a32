"""The Python removal engine: one task per directory on the shared worker pool.

fastrm runs in the C walker (:mod:`manyfiles.remove._walker`) wherever the C core is built;
this engine is the fallback without it (and gives the same results: the tests run both).

Every unlink(2) and rmdir(2) takes the *parent directory's* lock, so threads that unlink
in one shared directory queue behind each other (FxMark MWUM) while threads in separate
directories proceed in parallel (MWUL).  Hence:

* one task per directory, run by one worker: it lists the directory and unlinks every
  non-directory with ``unlinkat(dir_fd, name)`` -- no stat per file; the d_type says
  "directory", and when it is unknown (NFS, sshfs) an EISDIR from unlink says so;
* files before directories, deepest directories first: a directory's task submits its
  subdirectories only after its own files are gone; the pool runs tasks last-in
  first-out (depth-first), which keeps open fds near depth x workers;
* the rmdirs of a directory's children are batched and run by the one worker that
  finishes the last child, so no two workers ever take the same directory lock;
* rmdir failing with ENOTEMPTY (a concurrent writer, an NFS ``.nfsXXXX`` silly-rename
  that outlives an open file) cleans the directory again and retries with back-off;
* nothing follows a symlink: directories are opened with O_NOFOLLOW relative to their
  parent's fd, so a link to outside the tree is unlinked and its target survives;
* a failure (EACCES deep in a tree) is recorded and the rest is still removed; its
  ancestors are then left in place without reporting a second, derived error;
* interrupted (Ctrl-C), the pool lets running tasks finish and every directory fd is closed.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

from manyfiles import listing
from manyfiles._core import fsops as _fsops
from manyfiles._core.pool import Pool
from manyfiles.remove._report import RemoveReport
from manyfiles.remove._targets import Rules, Target
from manyfiles.trace import iotrace

DEFAULT_WORKERS = 8
# ENOTEMPTY retries, with full-jitter back-off from RETRY_BACKOFF doubling per attempt: a writer
# that raced us is beaten at once, an NFS silly-rename vanishes when its last opener closes it.
DEFAULT_RETRIES = 5
RETRY_BACKOFF = 0.05
# Directories bigger than this are unlinked in inode order, as GNU rm (gnulib fts)
# does on ext*: hash order touches inode-table blocks at random.
INODE_SORT_THRESHOLD = 10_000
FLUSH_EVERY = 4096  # files between counter/output updates inside one directory

OnRemoved = Callable[[list[str]], None]
NOT_PLANNED = "not what the plan saw here (replaced since); left alone"
NOT_CROSSED = "is a mount point; not crossed (see --cross-mounts)"


class _Dir:
    """A directory being removed: its fd stays open until its children are rmdir'ed."""

    __slots__ = ("blocked", "children_done", "dev", "expect", "fd", "name", "parent", "path", "pending",
                 "rel", "remove_all", "rmdir_self", "size")

    def __init__(self, parent: _Dir | None, name: str, path: str, rel: str, remove_all: bool) -> None:
        self.parent = parent
        self.name = name
        self.path = path
        self.rel = rel  # path relative to the argument, for '/' globs
        self.remove_all = remove_all  # everything inside goes (no glob filter any more)
        self.rmdir_self = remove_all
        self.fd = -1
        self.pending = 0  # subdirectories not yet finished
        self.children_done: list[tuple[str, str, str]] = []  # (name, path, rel) of emptied subdirectories
        self.blocked = False  # something inside stays: do not rmdir
        self.dev = parent.dev if parent is not None else -1  # st_dev of the argument's file system
        self.expect: tuple[int, int] | None = None  # (st_dev, st_ino) a plan saw here
        self.size = listing.DEFAULT_BUFSIZE // 2  # st_size of the directory, once opened


def _bufsize(st_size: int) -> int:
    # getdents64 records are up to ~2x an ext4 directory's on-disk bytes; clamp to 32 KiB..1 MiB
    return min(listing.DEFAULT_BUFSIZE, max(32 << 10, 2 * st_size))


def _entries(fd: int, *, resolve: bool, bufsize: int = listing.DEFAULT_BUFSIZE) -> list[listing.Entry]:
    """Every entry of the open directory ``fd`` (exactly the one opened, whatever its path is now)."""
    return list(listing.iter_entries(fd, resolve_unknown=resolve, bufsize=bufsize))


class Remover:
    """The per-directory state machine of one removal (one instance per call)."""

    def __init__(self, rules: Rules, report: RemoveReport, *, workers: int, retries: int,
                 on_removed: OnRemoved | None, check_identity: bool = False) -> None:
        self.rules = rules
        self.check_identity = check_identity  # executing a plan: each argument must be what it saw
        self.include, self.exclude = rules.matchers()
        self.dry_run = report.dry_run
        self.retries = retries
        self.on_removed = on_removed
        self.report = report
        self.found = 0
        self.lock = threading.Lock()  # counters, failures, parent bookkeeping
        self.open_dirs: set[_Dir] = set()  # directory fds to close if the run is interrupted
        self.anchors: list[_Dir] = []
        self.pool: Pool[_Dir] = Pool(self.process_safely, workers, name="fastrm", lifo=True)

    # -- running ------------------------------------------------------------------------

    def run(self, targets: list[Target], tick: Callable[[], None] | None) -> None:
        """Remove every target; returns when all is done (or re-raises an interrupt)."""
        try:
            tops = [top for t in targets if (top := self.start(t)) is not None]
            if tops:
                self.pool.run(reversed(tops), tick=tick)
        finally:
            # normally empty; after Ctrl-C the directories whose tasks never ran
            for node in list(self.open_dirs):
                self.close(node)
            for anchor in self.anchors:
                os.close(anchor.fd)

    def start(self, target: Target) -> _Dir | None:
        """One argument: a non-directory is removed at once; a directory becomes a task."""
        p = target.path
        parent_path, base = os.path.split(p) if p != "/" else ("/", ".")
        if self.exclude is not None and self.exclude.match(base):
            self.count(kept=1)
            return None
        try:
            anchor_fd = _fsops.open_dir(parent_path or ".", follow_symlinks=True)
        except OSError as exc:
            self.fail(parent_path or ".", exc)
            return None
        anchor = _Dir(None, parent_path, parent_path, "", True)
        anchor.fd = anchor_fd
        self.anchors.append(anchor)
        if not target.is_dir:
            if self.include is None or self.include.match(base):
                self.count(found=1)
                self.remove_file(anchor_fd, base, p)
            return None
        top = _Dir(anchor, base, p, "", self.include is None)
        top.rmdir_self = top.remove_all and not self.rules.keep_root and not target.mount_root
        top.dev = target.dev
        if self.check_identity:
            top.expect = (target.dev, target.ino)
        anchor.pending = 1
        return top

    # -- bookkeeping ------------------------------------------------------------------

    def fail(self, path: str, exc: OSError) -> None:
        with self.lock:
            self.report.add_failure(path, exc.strerror or str(exc), errno.errorcode.get(exc.errno or 0, ""))

    def count(self, files: int = 0, dirs: int = 0, found: int = 0, kept: int = 0,
              paths: list[str] | None = None) -> None:
        with self.lock:
            self.report.files += files
            self.report.dirs += dirs
            self.report.kept += kept
            self.found += found
            if paths and self.on_removed is not None:
                # under the lock: one writer at a time, batches never interleave
                self.on_removed(paths)

    def close(self, node: _Dir) -> None:
        self.open_dirs.discard(node)
        if node.fd >= 0:
            os.close(node.fd)
            node.fd = -1

    # -- one directory ----------------------------------------------------------------

    def process_safely(self, node: _Dir) -> None:
        try:
            self.process(node)
        except Exception as exc:  # a bug must not stop the pool: report it as a failure
            self.fail(node.path, OSError(errno.EIO, f"internal error: {exc or 'no message'}"))
            self.finish_chain(node, blocked=True)

    def open(self, node: _Dir) -> bool:
        """Open ``node`` relative to its parent; False when it is finished already."""
        parent = node.parent
        assert parent is not None
        try:
            node.fd = _fsops.open_dir(node.name, dir_fd=parent.fd)
        except FileNotFoundError:
            return False  # removed by someone else: fine
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and node.expect is None:
                # replaced by a symlink or file since it was listed: remove that, never follow
                if node.remove_all:
                    self.remove_file(parent.fd, node.name, node.path)
                return False
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                exc = OSError(errno.ESTALE, NOT_PLANNED)
            self.fail(node.path, exc)
            node.blocked = True
            return False
        self.open_dirs.add(node)
        st = os.fstat(node.fd)
        if node.expect is not None and (st.st_dev, st.st_ino) != node.expect:
            self.fail(node.path, OSError(errno.ESTALE, NOT_PLANNED))
            node.blocked = True
            self.close(node)
            return False
        if not self.rules.cross_mounts and st.st_dev != node.dev:
            self.fail(node.path, OSError(errno.EXDEV, NOT_CROSSED))
            node.blocked = True
            self.close(node)
            return False
        node.size = st.st_size
        return True

    def process(self, node: _Dir) -> None:
        if node.fd < 0 and not self.open(node):
            self.finish_chain(node, blocked=node.blocked)
            return
        prefix = node.path + "/" if not node.path.endswith("/") else node.path
        rel_prefix = node.rel + "/" if node.rel else ""
        try:
            entries = _entries(node.fd, resolve=self.dry_run, bufsize=_bufsize(node.size))
        except OSError as exc:
            self.fail(node.path, exc)
            self.finish_chain(node, blocked=True)
            return
        if len(entries) > INODE_SORT_THRESHOLD:
            entries.sort(key=lambda e: e.inode)
        self.count(found=len(entries))
        if node.remove_all and self.exclude is None and self.on_removed is None and not self.dry_run:
            subdirs = self.unlink_all(node, entries, prefix)
        else:
            subdirs = self.unlink_filtered(node, entries, prefix, rel_prefix)
        if not subdirs:
            self.finish_chain(node)
            return
        children = [_Dir(node, name, prefix + name, rel_prefix + name, take) for name, take in subdirs]
        node.pending = len(children)
        self.pool.submit(*reversed(children))

    def unlink_all(self, node: _Dir, entries: list[listing.Entry], prefix: str) -> list[tuple[str, bool]]:
        """The common case (no filter, no output, not a dry run): the tightest loop Python allows."""
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

    def unlink_filtered(self, node: _Dir, entries: list[listing.Entry], prefix: str,
                        rel_prefix: str) -> list[tuple[str, bool]]:
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
            if exclude is not None and exclude.match(name, rel_prefix + name):
                kept += 1
                node.blocked = True
                continue
            take = node.remove_all or (include is not None and include.match(name, rel_prefix + name))
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

    def finish_chain(self, node: _Dir | None, blocked: bool = False) -> None:
        """``node`` and all its subdirectories are done: rmdir its emptied children, walk up."""
        assert node is not None
        if blocked:
            node.blocked = True
        while node is not None:
            if node.fd >= 0:
                for name, path, rel in node.children_done:
                    if not self.rmdir(node.fd, name, path, rel):
                        node.blocked = True
                if node.parent is not None:  # an anchor's fd is closed by run()
                    self.close(node)
            parent = node.parent
            if parent is None:
                return
            with self.lock:
                if node.blocked:
                    parent.blocked = True
                elif node.rmdir_self:
                    parent.children_done.append((node.name, node.path, node.rel))
                parent.pending -= 1
                last = parent.pending == 0
            if not last:
                return
            node = parent

    def rmdir(self, dir_fd: int, name: str, path: str, rel: str) -> bool:
        """rmdir ``name``; on ENOTEMPTY (a writer raced us, an NFS silly-rename) clean it again and
        retry with back-off, ``retries`` times (the shared retry loop).  False if it stays."""
        if self.dry_run:
            self.count(dirs=1, paths=[path] if self.on_removed else None)
            return True
        # here, not at the top: _retry imports asyncio (~20 ms of fastrm's start-up), and the C
        # walker, fastrm's engine wherever the core is built, never gets here
        from manyfiles._core.retry import Retryable, RetryPolicy, retrying

        def retried(err: Exception) -> None:
            with self.lock:
                self.report.retries += 1

        try:
            retrying(lambda: _fsops.rmdir(name, dir_fd=dir_fd), RetryPolicy(self.retries + 1, RETRY_BACKOFF),
                     classify=_not_empty_retryable, on_retry=retried,
                     reset=lambda: self.clean_sync(dir_fd, name, path, rel))
        except FileNotFoundError:
            return True
        except Retryable as exc:  # still not empty after every retry: say what keeps appearing
            cause = exc.__cause__
            assert isinstance(cause, OSError)
            self.fail(path, OSError(cause.errno, _not_empty_reason(dir_fd, name)))
            return False
        except OSError as exc:
            self.fail(path, exc)
            return False
        self.count(dirs=1, paths=[path] if self.on_removed else None)
        return True

    def clean_sync(self, dir_fd: int, name: str, path: str, rel: str) -> None:
        """Empty directory ``name`` again, sequentially (the retry path; errors surface at rmdir)."""
        try:
            fd = _fsops.open_dir(name, dir_fd=dir_fd)
        except OSError:
            return
        try:
            removed: list[str] = []
            files = dirs = 0
            for e in _entries(fd, resolve=False):
                child_rel = rel + "/" + e.name if rel else e.name
                if self.exclude is not None and self.exclude.match(e.name, child_rel):
                    continue
                child = path + "/" + e.name
                try:
                    if e.type != "d" and _fsops.unlink_nondir(e.name, dir_fd=fd):
                        files += 1
                        removed.append(child)
                        continue
                    self.clean_sync(fd, e.name, child, child_rel)
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


def _not_empty_retryable(exc: Exception) -> Exception:
    """The retry classifier: only a directory that is not empty (yet) is worth another try."""
    from manyfiles._core.retry import Retryable

    if isinstance(exc, OSError) and exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
        return Retryable(exc)
    return exc


def _not_empty_reason(dir_fd: int, name: str) -> str:
    try:
        fd = _fsops.open_dir(name, dir_fd=dir_fd)
        try:
            left = sorted(e.name for e in _entries(fd, resolve=False))
        finally:
            os.close(fd)
    except OSError:
        return os.strerror(errno.ENOTEMPTY)
    nfs = [n for n in left if n.startswith(".nfs")]
    shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
    if nfs:
        return f"Directory not empty (NFS silly-renamed files still open: {', '.join(nfs[:3])})"
    return f"Directory not empty (new entries keep appearing: {shown})"


def path_writer(fd: int, sep: bytes) -> OnRemoved:
    """An ``on_removed`` that writes each path + ``sep`` to ``fd`` (what ``output=`` means)."""

    def write(paths: list[str]) -> None:
        data = b"".join(os.fsencode(p) + sep for p in paths)
        while data:
            data = data[os.write(fd, data):]

    return write


def raise_fd_limit() -> None:
    """Depth-first keeps few directories open, but a deep tree times many workers needs more."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass
