"""The execute step of a push: every file checked end to end, never a partial object visible.

Small files (up to ``multipart_threshold``) are read whole and sent as one PUT; larger ones as a
multipart upload whose parts run on the same pool.  Every body goes with a checksum of the bytes
read (CRC64NVME, or CRC32C, with awscrt; else Content-MD5), which the server checks before it
stores anything; the answer is checked too: a single PUT's ETag must be the MD5 of what was read
(when the server's ETag is an MD5), a part's echoed checksum ours, and a multipart object's
full-object checksum (from CompleteMultipartUpload, else a HEAD) the combination of its parts'.
A file whose size, mtime or inode changed while it was read is read again (``reread`` times),
then reported, never uploaded as is.  Bodies are read into memory under a byte budget (the
bytes hashed are the bytes sent); large parts are sent as soon as read.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import stat as _stat
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from manyfiles._core.checkpoints import reached
from manyfiles.errors import IntegrityError, ManyfilesError, TransferError
from manyfiles.push._journal import Journal
from manyfiles.push._list import LocalFile
from manyfiles.s3.engines.loop import PutLoop
from manyfiles.s3.http1 import INLINE_BODY
from manyfiles.s3.integrity import combiner, new_hash
from manyfiles.s3.retry import failure_code, stopping_error
from manyfiles.s3.store import Part, PutResult, S3Store

_MD5_ETAG = re.compile(r"^[0-9a-f]{32}$")
_OPEN = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
MiB = 1 << 20


class Changed(ManyfilesError):
    """The file changed while it was read (size, mtime or inode)."""

    code = "changed"


class Wrong(IntegrityError):
    """The server answered for other bytes than those sent (the object was removed): sent again."""

    code = "wrong"


@dataclass(frozen=True)
class Route:
    """How one file goes: ``put`` (one PUT) or ``multipart`` with ``parts`` parts of ``part_size``."""

    how: str
    parts: int = 1
    part_size: int = 0


def route(size: int, threshold: int, part_size: int) -> Route:
    """The plan of one file by its size: one PUT up to ``threshold``, else parts of ``part_size``
    (grown so that no upload needs more than S3's 10,000 parts)."""
    if size <= threshold:
        return Route("put")
    psize = max(part_size, -(-size // 10_000))
    return Route("multipart", -(-size // psize), psize)


class Budget:
    """Bytes of bodies in memory at once: a reader waits until its body fits (one body larger than
    the budget goes alone)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, n: int):
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
        try:
            yield
        finally:
            with self._cond:
                self.used -= n
                self._cond.notify_all()


def _b64(h) -> str:
    return base64.b64encode(h.digest()).decode()


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ino, a.st_dev) == (b.st_size, b.st_mtime_ns, b.st_ino, b.st_dev)


def _read(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset``; a short read (the file shrank) raises Changed."""
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            raise Changed("the file shrank while it was read")
        data += more
    return data


class _Body(NamedTuple):
    """A small file's body as read: its checksum header (or Content-MD5), its MD5, its fstat."""

    data: bytes
    checksum: tuple[str, str] | None
    content_md5: bytes | None
    md5: bytes
    st: os.stat_result


class _Small:
    """A small file on the loop, and its body once read."""

    __slots__ = ("body", "file")

    def __init__(self, file: LocalFile) -> None:
        self.file, self.body = file, None


def _wrong(result: PutResult, body: _Body) -> str | None:
    """Why a PUT's answer is not for the bytes sent, or None."""
    etag = (result.etag or "").lower()
    if _MD5_ETAG.match(etag) and etag != body.md5.hex():
        return "the server's ETag is not the MD5 of the bytes sent"
    checksum = body.checksum
    if checksum is not None and result.checksums.get(checksum[0], checksum[1]) != checksum[1]:
        return f"the server's {checksum[0]} is not the one sent"
    return None


class Pusher:
    """Runs the uploads of one push on ``jobs`` threads (see the module docstring).  ``record(kind,
    file, **info)`` is called (any thread) for every outcome: ``done``, ``failed``, ``retry``."""

    def __init__(self, store: S3Store, journal: Journal | None, *, jobs: int, threshold: int, part_size: int,
                 algorithm: str, reread: int, budget: int, follow_symlinks: bool,
                 record: Callable[..., None], cancel: threading.Event) -> None:
        self.store, self.journal = store, journal
        self.threshold, self.part_size, self.algorithm = threshold, part_size, algorithm
        self.reread, self.follow = reread, follow_symlinks
        # an answer for other bytes than those sent (a lying ETag or checksum) is met like a request
        # the server failed: sent again as often as the retry policy tries one (at least ``reread``)
        self.wrong_tries = max(reread, store.retry.attempts)
        self.budget = Budget(budget)
        self._record, self.cancel = record, cancel
        # multipart uploads open at once (each holds an fd and a server-side upload): taken by the
        # producer before it queues a large file, given back with the file's outcome
        self._uploads = threading.Semaphore(max(4, jobs // 4))
        self._holding: Counter[tuple[bytes, str]] = Counter()
        self._holding_lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="s3push")
        self.stop: BaseException | None = None    # the error that stops the run
        self.touched: set[str] = set()            # the upload ids this run began or resumed
        self._inflight = threading.BoundedSemaphore(4 * jobs)
        self._idle = threading.Condition()
        self._pending = 0
        # files of at most INLINE_BODY bytes (one send with the request's head) go through one
        # thread and ``jobs`` keep-alive connections (PutLoop), where the endpoint is plain HTTP:
        # on the pool, every small PUT cost tens of GIL hand-offs between its threads
        self._jobs = jobs
        self._loop: PutLoop | None = None
        self._looping = PutLoop.speaks(store.route)

    # -- the pool -------------------------------------------------------------------------------
    def _submit(self, fn: Callable[..., Any], *args: Any, bounded: bool = False) -> None:
        with self._idle:
            self._pending += 1

        def task() -> None:
            try:
                if not self.cancel.is_set():
                    fn(*args)
            except BaseException as exc:
                self._stop(exc)
            finally:
                if bounded:
                    self._inflight.release()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

        self.pool.submit(task)

    def _stop(self, exc: BaseException) -> None:
        if self.stop is None:
            self.stop = exc
        self.cancel.set()

    def push(self, file: LocalFile) -> None:
        """Queue one file (blocks while 4 x jobs files, or jobs / 4 multipart uploads, are in
        flight: the listing keeps the uploads' pace)."""
        if self._looping and file.size <= min(INLINE_BODY, self.threshold):
            if not self._acquire(self._inflight):
                return
            with self._idle:
                self._pending += 1
            if self._loop is None:
                self._loop = PutLoop(self.store, self._jobs, self.cancel, self._loop_read, self._loop_settled)
            self._loop.submit(_Small(file))
            return
        if route(file.size, self.threshold, self.part_size).how == "multipart":
            if not self._acquire(self._uploads):
                return
            with self._holding_lock:
                self._holding[file.path, file.key] += 1
        if not self._acquire(self._inflight):
            return
        self._submit(self._file, file, 0, bounded=True)

    def _acquire(self, sem: threading.Semaphore) -> bool:
        while not sem.acquire(timeout=0.5):
            if self.cancel.is_set():
                return False
        return True

    def record(self, kind: str, file: LocalFile, **info: Any) -> None:
        """Report an outcome; a file's last one gives back its multipart slot."""
        if kind in ("done", "failed"):
            with self._holding_lock:
                held = self._holding[file.path, file.key] > 0
                if held:
                    self._holding[file.path, file.key] -= 1
            if held:
                self._uploads.release()
        self._record(kind, file, **info)

    def wait(self, tick: Callable[[], None] = lambda: None) -> None:
        """Until every queued file and part is finished (``tick`` about every 0.2 s)."""
        while True:
            with self._idle:
                if not self._pending:
                    break
                self._idle.wait(0.2)
            tick()          # (outside the lock: the workers finishing need it)
        if self._loop is not None:
            self._loop.close()
        self.pool.shutdown(wait=True)

    # -- one file ---------------------------------------------------------------------------------
    def _file(self, file: LocalFile, attempt: int) -> None:
        try:
            how = route(file.size, self.threshold, self.part_size)
            if how.how == "put":
                self._put(file)
            else:
                self._multipart(file, how, attempt)
        except BaseException as exc:
            self._settle(file, attempt, exc)

    def _settle(self, file: LocalFile, attempt: int, exc: BaseException) -> None:
        """A file's attempt ended with ``exc``: again, or reported (any other error stops the run: raised)."""
        if isinstance(exc, Changed):
            self._changed(file, attempt, str(exc))
        elif isinstance(exc, Wrong):
            self._changed(file, attempt, str(exc), "wrong")
        elif isinstance(exc, TransferError):
            self._failed(file, exc)
        elif isinstance(exc, OSError):
            self.record("failed", file, reason=exc.strerror or str(exc), code=_errno(exc))
        else:
            raise exc

    def _changed(self, file: LocalFile, attempt: int, why: str, code: str = "changed") -> None:
        """The file changed while read (or the server kept other bytes: ``wrong``): again, or report."""
        if attempt + 1 < (self.reread if code == "changed" else self.wrong_tries):
            self.record("retry", file, reason=why)
            self._submit(self._file, self._relisted(file), attempt + 1)
        elif code == "changed":
            self.record("failed", file, reason=f"changed while it was read ({why}); not uploaded", code=code)
        else:
            self.record("failed", file, reason=why, code=code)

    def _relisted(self, file: LocalFile) -> LocalFile:
        """The file as it is now (its new size and mtime; the same inode is still required)."""
        try:
            st = os.stat(file.path, follow_symlinks=self.follow)
        except OSError:
            return file
        if (st.st_dev, st.st_ino) != (file.dev, file.ino):
            return file
        return file._replace(size=st.st_size, mtime_ns=st.st_mtime_ns)

    def _failed(self, file: LocalFile, exc: TransferError) -> None:
        stop = stopping_error(exc, f"s3://{self.store.bucket}")
        if stop is not None:
            stop.__cause__ = exc
            self._stop(stop)
            return
        self.record("failed", file, reason=str(exc), code=failure_code(exc))

    def _open(self, file: LocalFile) -> tuple[int, os.stat_result]:
        fd = os.open(file.path, _OPEN & ~os.O_NOFOLLOW if self.follow else _OPEN)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (file.dev, file.ino) or not _stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise Changed("it is not the file listed any more")
        return fd, st

    def _checksum(self, data) -> tuple[tuple[str, str] | None, bytes | None]:
        """(checksum header, Content-MD5) for a body: our algorithm, or MD5 alone."""
        if self.algorithm == "md5":
            return None, hashlib.md5(data, usedforsecurity=False).digest()
        h = new_hash(self.algorithm, len(data))
        h.update(data)
        return (self.algorithm, _b64(h)), None

    # -- one PUT ----------------------------------------------------------------------------------
    def _put(self, file: LocalFile) -> None:
        fd, st = self._open(file)
        if st.st_size > self.threshold:     # grew past the threshold since it was listed
            os.close(fd)
            grown = file._replace(size=st.st_size)
            self._multipart(grown, route(st.st_size, self.threshold, self.part_size), 0)
            return
        try:
            with self.budget.hold(st.st_size):
                body = self._body(file, fd, st)
                result = self.store.put(file.key, body.data, checksum=body.checksum,
                                        content_md5=body.content_md5)
        finally:
            os.close(fd)
        wrong = _wrong(result, body)
        if wrong is not None and not self._stored(file, body):
            self._remove(file)
            raise Wrong(f"{wrong}; the object was removed")
        self._put_done(file, st)

    def _put_done(self, file: LocalFile, st: os.stat_result) -> None:
        reached("push-put", (file.path,))
        self._done(file, st, "put", 1)

    def _stored(self, file: LocalFile, body: _Body) -> bool:
        """Whether the object is the body sent, as one HEAD says (asked when a PUT's answer named
        other bytes: more likely the answer's fault than the object's)."""
        return self.store.holds(file.key, body.data, checksum=body.checksum, content_md5=body.md5) is not None

    def _body(self, file: LocalFile, fd: int, st: os.stat_result) -> _Body:
        """The whole file as read from ``fd`` (``st``: its fstat when opened), checked unchanged."""
        data = _read(fd, 0, st.st_size)
        reached("push-read", (file.path,))
        if os.pread(fd, 1, st.st_size):
            raise Changed("the file grew while it was read")
        if not _same(st, os.fstat(fd)):
            raise Changed("size or mtime changed while it was read")
        checksum, content_md5 = self._checksum(data)
        md5 = content_md5 or hashlib.md5(data, usedforsecurity=False).digest()
        return _Body(data, checksum, content_md5, md5, st)

    def _remove(self, file: LocalFile) -> None:
        """The object holds other bytes than ours: it must not stay (0 wrong bytes in the bucket)."""
        with contextlib.suppress(TransferError):
            self.store.delete(file.key)

    # -- small PUTs on the loop (on its thread) ----------------------------------------------------
    def _loop_read(self, small: _Small) -> tuple | None:
        """The PUT of a small file (:class:`PutLoop`'s ``prepare``), or None: it went to the pool,
        or its outcome is known."""
        file = small.file
        try:
            if self.cancel.is_set():
                self._loop_left()
                return None
            fd, st = self._open(file)
            try:
                if st.st_size > min(INLINE_BODY, self.threshold):   # grew since it was listed: the pool's
                    self._submit(self._file, file, 0)
                    self._loop_left()
                    return None
                small.body = body = self._body(file, fd, st)
            finally:
                os.close(fd)
        except BaseException as exc:
            self._loop_settled(small, None, exc)
            return None
        return file.key, body.data, body.checksum, body.content_md5

    def _loop_settled(self, small: _Small, result: PutResult | None, error: BaseException | None) -> None:
        """A small file's outcome (:class:`PutLoop`'s ``settle``): as the pool's ``_file`` ends."""
        file = small.file
        try:
            if error is not None:
                self._settle(file, 0, error)
            elif result is not None:
                wrong = _wrong(result, small.body)
                if wrong is not None:       # (the DELETE and the file's next try: on the pool)
                    self._submit(self._wrong_put, file, wrong, small.body)
                else:
                    self._put_done(file, small.body.st)
        except BaseException as exc:
            self._stop(exc)
        finally:
            self._loop_left()

    def _wrong_put(self, file: LocalFile, wrong: str, body: _Body) -> None:
        """A small file's PUT answered for other bytes (on the pool): what was stored decides."""
        if self._stored(file, body):
            self._put_done(file, body.st)
            return
        self._remove(file)
        self._changed(file, 0, f"{wrong}; the object was removed", "wrong")

    def _loop_left(self) -> None:
        self._inflight.release()
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def _done(self, file: LocalFile, st: os.stat_result, how: str, parts: int, resumed: int = 0) -> None:
        if self.journal is not None:
            self.journal.append(t="done", key=file.key, path=os.fsdecode(file.path), size=st.st_size,
                                mtime=st.st_mtime_ns, ino=st.st_ino)
        self.record("done", file._replace(size=st.st_size), how=how, parts=parts, resumed=resumed)

    # -- one multipart upload ---------------------------------------------------------------------
    def _multipart(self, file: LocalFile, how: Any, attempt: int) -> None:
        fd, st = self._open(file)
        if st.st_size != file.size:       # grew or shrank since listed: plan again
            os.close(fd)
            file = file._replace(size=st.st_size, mtime_ns=st.st_mtime_ns)
            how = route(st.st_size, self.threshold, self.part_size)
            if how.how == "put":
                self._put(file)
                return
            fd, st = self._open(file)
        try:
            upload = _Upload(self, file, fd, st, how, attempt)
            upload.begin()
        except BaseException:
            os.close(fd)
            raise


class _Upload:
    """One multipart upload in flight: its parts run on the pool; the last one to finish completes it."""

    def __init__(self, pusher: Pusher, file: LocalFile, fd: int, st: os.stat_result, how: Any,
                 attempt: int) -> None:
        self.p, self.file, self.fd, self.st, self.how, self.attempt = pusher, file, fd, st, how, attempt
        self.alg = pusher.algorithm
        self.parts: dict[int, Part] = {}
        self.sizes = {n: min(how.part_size, st.st_size - (n - 1) * how.part_size)
                      for n in range(1, how.parts + 1)}
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.left = 0
        self.uid = ""
        self.resumed = 0

    def _identity(self) -> tuple:
        return (os.fsdecode(self.file.path), self.st.st_size, self.st.st_mtime_ns, self.st.st_ino,
                self.how.part_size, self.alg)

    def _resume(self) -> bool:
        """Take over the upload a killed run of this file left, keeping its checked parts."""
        journal, store = self.p.journal, self.p.store
        if journal is None:
            return False
        for uid, rec in list(journal.uploads.items()):
            if rec["key"] != self.file.key:
                continue
            fields = (rec["path"], rec["size"], rec["mtime"], rec["ino"], rec["psize"], rec["alg"])
            if fields != self._identity():
                continue
            try:
                listed = {p.number: p for p in store.list_parts(self.file.key, uid)}
            except TransferError as exc:
                if failure_code(exc) == "NoSuchUpload":
                    journal.append(t="end", uid=uid)
                    continue
                raise
            for n, sent in rec["parts"].items():
                n = int(n)
                got = listed.get(n)
                if got is None or got.etag != sent["etag"] or got.size != sent["size"] or \
                        sent["size"] != self.sizes.get(n):
                    continue
                if got.checksum is not None and got.checksum[1] != sent["sum"]:
                    continue
                checksum = None if self.alg == "md5" else (self.alg, sent["sum"])
                self.parts[n] = Part(n, sent["etag"], sent["size"], checksum)
            self.uid = uid
            self.p.touched.add(uid)
            self.resumed = len(self.parts)
            return True
        return False

    def begin(self) -> None:
        store = self.p.store
        if not self._resume():
            alg = None if self.alg == "md5" else self.alg
            retried: list[TransferError] = []
            if self.p.journal is not None:
                self.p.journal.append(t="intent", key=self.file.key)
            created = False
            try:
                self.uid = store.with_options(on_retry=retried.append).create_multipart(
                    self.file.key, checksum_algorithm=alg, full_object=True)
                created = True
            finally:
                # an upload whose answer was lost may exist (a create tried again, or one that failed
                # at last): the end of the run aborts the key's uploads the journal does not know
                if (retried or not created) and self.p.journal is not None:
                    self.p.journal.append(t="intent", key=self.file.key)
            reached("push-created", (self.file.path,))     # (the upload exists; the journal does not know it)
            if self.p.journal is not None:
                self.p.journal.start(self.file.key, self.uid, self.file.path, self.st.st_size,
                                     self.st.st_mtime_ns, self.st.st_ino, self.how.part_size, self.alg)
            self.p.touched.add(self.uid)
        todo = [n for n in self.sizes if n not in self.parts]
        self.left = len(todo)
        if not todo:
            self._complete()
            return
        for n in todo:
            self.p._submit(self._part, n)

    def _part(self, n: int) -> None:
        try:
            if self.error is None and not self.p.cancel.is_set():
                size = self.sizes[n]
                with self.p.budget.hold(size):
                    data = _read(self.fd, (n - 1) * self.how.part_size, size)
                    reached("push-read", (self.file.path,))
                    checksum, content_md5 = self.p._checksum(data)
                    for again in range(self.p.wrong_tries):
                        part = self.p.store.upload_part(self.file.key, self.uid, n, data, checksum=checksum,
                                                        content_md5=content_md5)
                        etag = part.etag.lower()
                        if content_md5 is None or etag == content_md5.hex() or not _MD5_ETAG.match(etag):
                            break
                        # an answer for other bytes: the part is sent again (it replaces the last one)
                        if again + 1 == self.p.wrong_tries:
                            raise IntegrityError(f"part {n}: the server's ETag is not the MD5 of the "
                                                 "bytes sent")
                part = Part(n, part.etag, size, checksum)
                if self.p.journal is not None:
                    self.p.journal.append(t="part", uid=self.uid, n=n, etag=part.etag, size=size,
                                          sum=checksum[1] if checksum else content_md5.hex())
                with self.lock:
                    self.parts[n] = part
                reached("push-part", (self.file.path, n))
        except BaseException as exc:
            with self.lock:
                if self.error is None:
                    self.error = exc
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self._complete()

    def _complete(self) -> None:
        p = self.p
        try:
            if self.error is not None:
                raise self.error
            if p.cancel.is_set():
                return          # stopped: the upload stays in the journal for the rerun
            if not _same(self.st, os.fstat(self.fd)):
                self._abort()
                raise Changed("size or mtime changed while it was read")
            parts = [self.parts[n] for n in sorted(self.parts)]
            whole = self._whole(parts)
            result, parts = self._send_complete(parts, whole)
            if p.journal is not None:
                p.journal.append(t="end", uid=self.uid)
            self._check(result, whole, parts)
            p._done(self.file, self.st, "multipart", len(parts), self.resumed)
        except Changed as exc:
            p._changed(self.file, self.attempt, str(exc))
        except Wrong as exc:
            p._changed(self.file, self.attempt, str(exc), "wrong")
        except IntegrityError as exc:
            self._abort()
            p._failed(self.file, exc)
        except TransferError as exc:
            p._failed(self.file, exc)      # the upload is kept (journal): a rerun resumes it
        except OSError as exc:
            p.record("failed", self.file, reason=exc.strerror or str(exc), code=_errno(exc))
        finally:
            os.close(self.fd)

    def _send_complete(self, parts: list[Part], whole: tuple[str, str] | None) -> tuple[Any, list[Part]]:
        """CompleteMultipartUpload: (its answer, or None when the upload is gone, which an earlier
        attempt may have completed: the check after says; the parts it was sent with).  Refused
        with InvalidPart (an ETag we hold is not the part's: an UploadPart's answer lied about it),
        it is sent once more with the ETags ListParts gives, if every part is listed with our size
        and the checksum of our bytes."""
        store, key = self.p.store, self.file.key
        for again in (False, True):
            try:
                return store.complete_multipart(key, self.uid, parts, checksum=whole), parts
            except TransferError as exc:
                code = failure_code(exc)
                if code == "NoSuchUpload":
                    return None, parts
                if code != "InvalidPart" or again:
                    raise
                listed = self._listed_as_sent(parts)
                if listed is None:
                    raise
                parts = listed
        raise AssertionError("unreachable")

    def _listed_as_sent(self, parts: list[Part]) -> list[Part] | None:
        """``parts`` with the ETags ListParts gives them (journaled), or None if any part is not
        listed with our size and our checksum (the server's own, of the bytes it stored)."""
        listed = {q.number: q for q in self.p.store.list_parts(self.file.key, self.uid)}
        out = []
        for sent in parts:
            got = listed.get(sent.number)
            if got is None or got.size != sent.size or got.checksum is None or sent.checksum is None \
                    or got.checksum[1] != sent.checksum[1]:
                return None
            out.append(replace(sent, etag=got.etag))
        if self.p.journal is not None:
            for q in out:
                self.p.journal.append(t="part", uid=self.uid, n=q.number, etag=q.etag, size=q.size,
                                      sum=q.checksum[1])
        return out

    def _whole(self, parts: list[Part]) -> tuple[str, str] | None:
        """The full-object checksum from the parts' (CRCs combine), or None (MD5 uploads)."""
        if self.alg == "md5":
            return None
        combine = combiner(self.alg)
        if combine is None:
            return None
        nbytes = 8 if self.alg == "crc64nvme" else 4
        value = 0
        for i, part in enumerate(parts):
            crc = int.from_bytes(base64.b64decode(part.checksum[1]), "big")
            value = crc if i == 0 else combine(value, crc, part.size)
        return self.alg, base64.b64encode(value.to_bytes(nbytes, "big")).decode()

    def _check(self, result: Any, whole: tuple[str, str] | None, parts: list[Part]) -> None:
        """The object S3 made is ours: its checksum (said by Complete, else by a HEAD) is the
        combination of the parts', or its ETag the multipart MD5 of the parts' MD5s."""
        store, key, n = self.p.store, self.file.key, len(parts)
        said = dict(result.checksums) if result is not None else {}
        etag = result.etag if result is not None else None
        if (whole is not None and whole[0] not in said) or etag is None:
            head = store.head_headers(key)
            etag = (head.get("etag") or "").strip('"')
            said.update({a[len("x-amz-checksum-"):]: v for a, v in head.items()
                         if a.startswith("x-amz-checksum-") and a != "x-amz-checksum-type"})
        wrong = None
        if whole is not None and whole[0] in said and said[whole[0]].partition("-")[0] != whole[1]:
            wrong = f"the object's {whole[0]} is not the one of the parts sent"
        elif whole is None and etag and all(_MD5_ETAG.match(q.etag.lower()) for q in parts):
            digests = b"".join(bytes.fromhex(q.etag) for q in parts)
            want = hashlib.md5(digests, usedforsecurity=False).hexdigest()
            if etag.lower() != f"{want}-{n}":
                wrong = "the object's ETag is not the multipart MD5 of the parts sent"
        if etag and "-" in etag and not etag.endswith(f"-{n}"):
            wrong = f"the object has {etag.rpartition('-')[2]} parts, not {n}"
        elif result is None and not (etag or "").endswith(f"-{n}") and not (whole and whole[0] in said):
            # Complete said NoSuchUpload and nothing proves the object under the key is this upload's
            raise IntegrityError("the upload is gone and the object under the key is not its result")
        if wrong is not None:
            with contextlib.suppress(TransferError):
                store.delete(key)
            raise Wrong(f"{wrong}; the object was removed")

    def _abort(self) -> None:
        try:
            self.p.store.abort_multipart(self.file.key, self.uid)
        except TransferError:
            return          # (still in the journal: the next run aborts it)
        if self.p.journal is not None:
            self.p.journal.append(t="end", uid=self.uid)


def abort_unneeded(store: S3Store, journal: Journal, keep: Iterable[str]) -> int:
    """Abort the uploads the journal holds whose file was not taken over by this run, and the
    uploads a CreateMultipartUpload made without its answer reaching the journal (a kill right after
    it, or a retried create): for each such key, its uploads that the journal does not know.
    Returns how many were aborted."""
    keep = set(keep)
    n = 0
    for uid, rec in list(journal.uploads.items()):
        if uid in keep:
            continue
        try:
            store.abort_multipart(rec["key"], uid)
        except TransferError:
            continue        # (an abort that failed stays in the journal: the next run tries again)
        journal.append(t="end", uid=uid)
        n += 1
    for key in sorted(journal.intents):
        cleared = True
        for upload in list(store.list_multipart_uploads(key)):
            if upload.key == key and upload.upload_id not in journal.uploads:
                try:
                    store.abort_multipart(key, upload.upload_id)
                except TransferError:
                    cleared = False
                    continue
                n += 1
        if cleared:
            journal.append(t="cleared", key=key)
    return n


def _errno(exc: OSError) -> str:
    import errno

    return errno.errorcode.get(exc.errno or 0, "OSError")
