"""``s3pull verify DEST``: re-hash every file a pull installed against the check it passed.

The state file (``DEST/.s3pull/state.jsonl``) records, for every installed object, its path,
size and the check its bytes passed when they were written (MD5, multipart MD5, CRC,
SHA; see :mod:`manyfiles.s3.integrity`).  :func:`verify` reads each file back and checks it
again: a file that is gone, changed size, became a symlink, or whose bytes no longer match is
a failure.  Nothing is written (the state file included); nothing is fetched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as _stat
import threading
import time

from manyfiles._core.pool import Pool
from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles.errors import IntegrityError, NotFound, UsageError
from manyfiles.s3.integrity import SIZE_ONLY, Claim, rehash_file
from manyfiles.s3.keys import STATE_DIR
from manyfiles.s3.report import VerifyReport
from manyfiles.s3.state import State

DEFAULT_WORKERS = 4     # hashing releases the GIL; a few threads keep a disk or an NFS mount busy


class _Bad(Exception):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code


def verify(dest: str | os.PathLike, *, workers: int = DEFAULT_WORKERS,
           progress: ProgressArg = False) -> VerifyReport:
    """Re-hash every file recorded in ``DEST/.s3pull/state.jsonl``; returns a :class:`VerifyReport`.

    Failures (``report.failures``, ``Failure(path=key, code, reason)``): ``missing``,
    ``changed`` (size, type, or a symlink on the way), ``integrity`` (bytes differ from the
    recorded check), ``weak-check`` (recorded with a size-only check its object did not allow),
    or an errno name (``EACCES``, ``EIO``...).  Records without a content check (``size-only``:
    SSE-KMS/SSE-C objects without a checksum, ``--no-checksum``) are compared by size.
    ``progress``: True or a callable taking a :class:`~manyfiles._core.progress.Snapshot` (files, bytes).

    Example:
        >>> report = verify("/data/images")          # doctest: +SKIP
        >>> report.ok, report.verified
        (True, {'md5': 1200, 'multipart-md5': 3})
    """
    check_progress(progress)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise UsageError(f"workers must be a positive integer, not {workers!r}")
    root = os.path.abspath(dest)
    state = State(root)
    try:
        state.open(create=False)
        if state.fd is None or not state.done:
            raise NotFound(f"{os.fspath(dest)}: nothing to verify (no {STATE_DIR}/state.jsonl records here)")
    finally:
        state.release()
    records = list(state.done.values())
    real_root = os.path.realpath(root)
    report = VerifyReport(dest=root, checked=len(records))
    lock = threading.Lock()
    t0 = time.monotonic()
    with progress_for(progress, "s3pull verify", unit="files", total=len(records),
                      bytes_total=sum(r["s"] for r in records)) as p:

        def check(rec: dict) -> None:
            try:
                method = _check_file(real_root, rec)
            except _Bad as bad:
                with lock:
                    report.add_failure(rec["k"], str(bad), bad.code)
                p.add(1, failures=1)
                return
            with lock:
                report.verified[method] = report.verified.get(method, 0) + 1
                report.bytes += rec["s"]
            p.add(1, bytes=rec["s"])

        try:
            Pool(check, workers, name="s3pull-verify").run(records, tick=p.tick)
        finally:
            report.seconds = time.monotonic() - t0
    report.failures.sort(key=lambda f: f.path)
    return report


def _check_file(real_root: str, rec: dict) -> str:
    """The check method ``rec``'s file passed; raises _Bad."""
    rel = rec.get("r")
    if not rel:
        raise _Bad("unknown-path", "the state record has no path (written by an older s3pull); "
                                   "run the pull again to record it")
    path = os.path.join(real_root, rel)
    parent = os.path.realpath(os.path.dirname(path))
    if parent != real_root and not parent.startswith(real_root + os.sep):
        raise _Bad("changed", "a symlink on the way leads outside DEST")
    size = rec["s"]
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _Bad("missing", "no such file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _Bad("changed", "is a symlink now") from None
        raise _Bad(errno.errorcode.get(exc.errno or 0, "OSError"), exc.strerror or str(exc)) from None
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise _Bad("changed", "not a regular file any more")
        if st.st_size != size:
            raise _Bad("changed", f"{st.st_size:,} bytes, {size:,} recorded")
        # a size-only record the object did not allow (an older s3pull could not learn a multipart
        # layout): its bytes are searched for the part sizes; anything else weak is a failure
        claim = Claim.from_record(rec).strengthened(rec.get("e"))
        if claim.weak:
            raise _Bad("weak-check", "recorded with a size-only check, weaker than its object allows; "
                                     "run the pull again to fetch it")
        if claim.method == SIZE_ONLY:
            return SIZE_ONLY
        try:
            return rehash_file(fd, size, claim).kind
        except IntegrityError as exc:
            code = "weak-check" if claim.pending else "integrity"
            raise _Bad(code, str(exc)) from None
        except OSError as exc:
            raise _Bad(errno.errorcode.get(exc.errno or 0, "OSError"), exc.strerror or str(exc)) from None
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


__all__ = ["DEFAULT_WORKERS", "verify"]
