"""Where cached bytes come from: a local/NFS file or an S3 object.

An origin answers three questions: *which version is there now* (:meth:`stat`: a
:class:`Head`), *the whole object, checked* (:meth:`open_whole`: a :class:`WholeRead`, whose
last bytes come only after every byte passed the object's check) and *these bytes of that
version* (:meth:`fetch`: a :class:`Piece`, with whether a check of the origin's covered it).
Reads are pinned to the version they were asked for, so a source that changes under a reader
raises :class:`~manyfiles.errors.ObjectChanged` instead of mixing two versions:

* files: read through a descriptor opened on the validated inode, whose (inode, size, mtime,
  ctime) is compared again after each read; a file has no checksum to pass, its pieces are as
  good as a whole read of it (``checked``), and its version is its stat (``size-only``);
* S3: everything goes through the object layer (:mod:`manyfiles.s3.objects`): HEAD, ranged and
  whole GETs pinned with ``If-Match``, the object's claim (S3 checksum, MD5 or multipart ETag),
  per-part checksums where the store has them, s3pull's retry policy and error mapping, fresh
  credentials per call.  This module makes no request of its own.
"""

from __future__ import annotations

import base64
import os
import re
import stat as _stat
import threading
import time
import zlib
from typing import Any, NamedTuple

from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import ObjectChanged, UsageError, from_oserror
from manyfiles.trace import iotrace

SIZE_ONLY = "size-only"        # the whole-object check of an object with nothing to check against
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
READ_CHUNK = 4 << 20


def _trace(op: str, path: Any, offset: int, length: int, t0: int, result: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)


def crc_claim(crc: int) -> dict:
    """The claim record (as :meth:`manyfiles.s3.integrity.Claim.to_record`) of a CRC-32 computed
    on the way: what protects a whole file at rest when the origin gave nothing to check."""
    return {"m": "crc32", "c": base64.b64encode(crc.to_bytes(4, "big")).decode()}


class Head(NamedTuple):
    """What a validation learnt: the version (``validator``), its size, and for S3 the object
    layer's :class:`~manyfiles.s3.objects.ObjectHead` (its claim, its parts), when known."""

    validator: bytes
    size: int
    info: Any = None


class Piece(NamedTuple):
    """Bytes of a range, and whether a check of the origin's covered them (a part checksum, a
    local file's read); unchecked pieces are verified only when their object is checked whole."""

    data: bytes
    checked: bool


# -- local and network files -----------------------------------------------------------------------

class FileOrigin:
    """A regular file on a local or network filesystem."""

    kind = "file"

    def __init__(self, path: str | bytes | os.PathLike) -> None:
        raw = os.fsencode(os.path.abspath(os.fspath(path)))
        self.path = raw
        self.source = b"file:" + raw
        self.display = os.fsdecode(raw)

    def stat(self) -> Head:
        """The file's version now."""
        t0 = time.monotonic_ns()
        try:
            st = os.stat(self.path)
        except OSError as exc:
            _trace("stat", self.path, 0, 0, t0, exc.errno or -1)
            raise from_oserror(exc, self.display) from exc
        _trace("stat", self.path, 0, 0, t0, 0)
        return Head(self.validator_of(st), st.st_size)

    def validator_of(self, st: os.stat_result) -> bytes:
        if not _stat.S_ISREG(st.st_mode):
            raise UsageError(f"{self.display}: not a regular file")
        return file_validator(st)

    def reader(self, head: Head | None) -> _FileReader:
        """Reads of one version through one descriptor (``head`` None: the version there now)."""
        return _FileReader(self, head)

    def open_whole(self, head: Head | None) -> WholeRead:
        return _FileWhole(self.reader(head))


def file_validator(st: os.stat_result) -> bytes:
    """The version of a file as its ``stat`` gives it.  ``st_dev`` is left out on purpose: NFS and
    FUSE mounts get a new anonymous device number at every mount, which would make every reboot a
    full miss.  ctime catches what mtime alone misses: ``cp -p``/``touch -r`` in place,
    replacement by rename."""
    return b"ino=%d;size=%d;mtime=%d;ctime=%d" % (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class _FileReader:
    """Reads blocks of one validated version of a file through one descriptor."""

    def __init__(self, origin: FileOrigin, head: Head | None) -> None:
        self.origin = origin
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.head = head if head is not None else Head(b"", 0)
        if head is None:
            fd = self._open()
            st = os.fstat(fd)
            self.head = Head(origin.validator_of(st), st.st_size)

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                try:
                    fd = os.open(self.origin.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise from_oserror(exc, self.origin.display) from exc
                if self.head.validator and self._changed(fd):
                    os.close(fd)
                    raise ObjectChanged(f"{self.origin.display}: changed since it was opened")
                self._fd = fd
            return self._fd

    def _changed(self, fd: int) -> bool:
        return self.origin.validator_of(os.fstat(fd)) != self.head.validator

    def fetch(self, offset: int, length: int) -> Piece:
        return Piece(self.read(offset, length), True)

    def read(self, offset: int, length: int) -> bytes:
        fd = self._open()
        t0 = time.monotonic_ns()
        chunks = []
        got = 0
        try:
            while got < length:
                chunk = os.pread(fd, length - got, offset + got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except OSError as exc:
            _trace("read", self.origin.path, offset, got, t0, exc.errno or -1)
            raise from_oserror(exc, self.origin.display) from exc
        _trace("read", self.origin.path, offset, got, t0, 0)
        if got != length or self._changed(fd):
            raise ObjectChanged(f"{self.origin.display}: changed while being read")
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def readinto(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` with the bytes at ``offset`` (no copy through a bytes object)."""
        fd = self._open()
        t0 = time.monotonic_ns()
        got = 0
        try:
            while got < len(view):
                n = os.preadv(fd, [view[got:]], offset + got)
                if not n:
                    break
                got += n
        except OSError as exc:
            _trace("read", self.origin.path, offset, got, t0, exc.errno or -1)
            raise from_oserror(exc, self.origin.display) from exc
        _trace("read", self.origin.path, offset, got, t0, 0)
        if got != len(view) or self._changed(fd):
            raise ObjectChanged(f"{self.origin.display}: changed while being read")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class WholeRead:
    """One read of a whole object in order (the interface of both origins).

    ``read(n)`` returns ``n`` bytes, fewer only at the end, and the bytes that reach the end only
    after every byte passed the object's check (IntegrityError otherwise).  Then ``method`` is
    the check that passed ("md5", "crc64nvme", ..., "size-only") and ``claim`` the record a
    whole file is re-hashed against at rest (the object's claim; a CRC-32 computed on the way
    when the origin gave nothing to check).
    """

    head: Head
    pos: int = 0
    method: str | None = None
    claim: dict | None = None

    @property
    def size(self) -> int:
        return self.head.size

    def read(self, n: int) -> bytes:
        raise NotImplementedError

    def readinto(self, buf: Any) -> int:
        """As :meth:`read`, into ``buf`` (``len(buf)`` bytes, fewer only at the end): no copy."""
        raise NotImplementedError

    def rehome(self, origin: Any) -> None:
        """Go on reading through ``origin`` (the same object; its client's retry policy)."""

    def interrupt(self) -> None:
        """From another thread: a read blocked on the origin fails at once (nothing more is read).
        A no-op where a read cannot block for long (a local file: closing its descriptor under a
        read in progress could hand that read another file's descriptor number)."""

    def close(self) -> None:
        pass

    def __enter__(self) -> WholeRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FileWhole(WholeRead):
    def __init__(self, reader: _FileReader) -> None:
        self._reader = reader
        self.head = reader.head
        self._crc = 0

    def read(self, n: int) -> bytes:
        want = min(n, self.size - self.pos)
        data = self._reader.read(self.pos, want) if want > 0 else b""
        self._crc = zlib.crc32(data, self._crc)
        self.pos += len(data)
        if self.pos == self.size and self.method is None:
            self.method, self.claim = SIZE_ONLY, crc_claim(self._crc)
        return data

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")[: max(0, self.size - self.pos)]
        if len(view):
            self._reader.readinto(self.pos, view)
        self._crc = zlib.crc32(view, self._crc)
        self.pos += len(view)
        if self.pos == self.size and self.method is None:
            self.method, self.claim = SIZE_ONLY, crc_claim(self._crc)
        return len(view)

    def close(self) -> None:
        self._reader.close()


# -- S3 --------------------------------------------------------------------------------------------

class S3Origin:
    """One object of an S3 (or S3-compatible) endpoint, reached through the object layer."""

    kind = "s3"

    def __init__(self, bucket: str, key: str, settings: Any, retry: RetryPolicy | None = None,
                 client: Any = None) -> None:
        if not key or key.endswith("/"):
            raise UsageError(f"s3://{bucket}/{key}: not an object key")
        self.bucket, self.key, self.settings = bucket, key, settings
        self.display = f"s3://{bucket}/{key}"
        # The endpoint is part of the identity: the same bucket name on two servers is two sources.
        where = f"s3+{settings.endpoint_url}/" if settings.endpoint_url else "s3://"
        self.source = f"{where}{bucket}/{key}".encode()
        if client is None:
            from manyfiles.s3.objects import ObjectClient

            client = ObjectClient(settings, retry=retry)
        self.client = client

    @staticmethod
    def validator(etag: str | None, size: int) -> bytes:
        """``etag=<etag>;size=<n>``: the same whether learnt from a HEAD, a GET or a listing."""
        return b"etag=%s;size=%d" % ((etag or "").strip('"').encode(), size)

    @staticmethod
    def etag_of(validator: bytes) -> str | None:
        fields = dict(p.split(b"=", 1) for p in validator.split(b";"))
        return fields[b"etag"].decode() or None

    def _head_of(self, info: Any) -> Head:
        return Head(self.validator(info.etag, info.size), info.size, info)

    def stat(self, known: Head | None = None) -> Head:
        """HEAD the object (``known``: pinned to that version, whose claim and parts it learns).
        The store records the request in the I/O trace (``s3.head``), once."""
        try:
            if known is None:
                info = self.client.head(self.bucket, self.key)
            else:
                info = self.client.head(self.bucket, self.key, etag=self.etag_of(known.validator),
                                        size=known.size)
        except Exception as exc:
            raise self.error(exc) from exc
        return self._head_of(info)

    def open_whole(self, head: Head | None) -> WholeRead:
        """One GET of the whole object (pinned to ``head``'s version when given)."""
        try:
            if head is None:
                stream = self.client.stream(self.bucket, self.key)
            else:
                stream = self.client.stream(self.bucket, self.key, if_match=self.etag_of(head.validator),
                                            size=head.size)
        except Exception as exc:
            raise self.error(exc) from exc
        return _S3Whole(self, stream)

    def reader(self, head: Head) -> _S3Reader:
        return _S3Reader(self, head)

    def error(self, exc: BaseException) -> Exception:
        """The one-line error of a failed request (``s3://bucket/key: reason``)."""
        from manyfiles.errors import ManyfilesError
        from manyfiles.s3.objects import object_error

        if isinstance(exc, ManyfilesError) and str(exc).startswith(self.display + ": "):
            return exc
        return object_error(self.display, exc)


class _S3Whole(WholeRead):
    def __init__(self, origin: S3Origin, stream: Any) -> None:
        self._origin, self._stream = origin, stream
        self.head = origin._head_of(stream.head)
        claim = stream.head.claim
        self._crc: int | None = 0 if claim.method == SIZE_ONLY else None

    def read(self, n: int) -> bytes:
        try:
            data = self._stream.read(n)
        except Exception as exc:
            raise self._origin.error(exc) from exc
        self._after(data)
        return data

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        try:
            n = self._stream.readinto(view)
        except Exception as exc:
            raise self._origin.error(exc) from exc
        self._after(view[:n])
        return n

    def readinto_file(self, fd: int, n: int) -> Any:
        """The next ``n`` bytes landed in ``fd`` at their offset, a view of the file's pages holding
        them (:meth:`manyfiles.s3.store.ObjectStream.readinto_file`); None: use :meth:`readinto`."""
        try:
            view = self._stream.readinto_file(fd, n)
        except Exception as exc:
            raise self._origin.error(exc) from exc
        if view is not None:
            self._after(view)
        return view

    def _after(self, data: Any) -> None:
        if self._crc is not None:
            self._crc = zlib.crc32(data, self._crc)
        self.pos += len(data)
        if self.pos == self.size and self.method is None:
            if self.size == 0:
                self._stream.read(1)      # an empty object: its check
            claim = self._stream.claim
            self.method = claim.method
            self.claim = crc_claim(self._crc) if self._crc is not None else claim.to_record()

    def rehome(self, origin: S3Origin) -> None:
        self._origin = origin
        self._stream.store = origin.client.store(origin.bucket)    # its retry policy for the resumes

    def interrupt(self) -> None:
        self._stream.close()        # ObjectStream.close: from any thread, ends a stalled read

    def close(self) -> None:
        self._stream.close()


class _S3Reader:
    """Ranged reads of one version: ranges that are exactly a part of an object with per-part
    checksums are checked against the part's (``checked``); others are not (the cache checks the
    object whole later)."""

    def __init__(self, origin: S3Origin, head: Head) -> None:
        self.origin, self.head = origin, head
        self._etag = origin.etag_of(head.validator)
        self._lock = threading.Lock()

    def info(self) -> Any:
        """The object layer's head of this version (claim, parts): one pinned HEAD, once."""
        if self.head.info is None:
            with self._lock:
                if self.head.info is None:
                    self.head = self.origin.stat(self.head)
        return self.head.info

    def part_spans(self, max_part: int) -> tuple[int, ...] | None:
        """The part sizes when ranges of whole parts can be checked on their own (composite
        checksums, parts at most ``max_part`` bytes, a store that answers part GETs), else None."""
        info = self.info()
        claim = info.claim
        if not (claim.composite and claim.parts and max(claim.parts) <= max_part):
            return None
        if not self.origin.client.part_gets:
            return None
        return claim.parts

    def fetch(self, offset: int, length: int, *, part: bool = False) -> Piece:
        """Bytes ``offset..offset+length-1``; ``part``: the range is one whole part (checked against
        its own checksum when the store gives one)."""
        try:
            o = self.origin
            got = o.client.get_range(o.bucket, o.key, offset, offset + length - 1, if_match=self._etag,
                                     size=self.head.size, head=self.info() if part else None)
        except Exception as exc:
            raise self.origin.error(exc) from exc
        return Piece(got.data, got.claim is not None)

    def close(self) -> None:
        pass


def parse_source(src: Any, settings: Any = None, retry: RetryPolicy | None = None,
                 client: Any = None, *, resolved: bool = False) -> FileOrigin | S3Origin:
    """``s3://bucket/key`` -> S3Origin; anything else is a path.  ``resolved``: ``settings`` were
    resolved by the caller just now (not again: a cache hit pays for one resolution)."""
    if isinstance(src, (FileOrigin, S3Origin)):
        return src
    if isinstance(src, str) and src.startswith("s3://"):
        from manyfiles.s3.client import ClientSettings

        bucket, _, key = src[5:].partition("/")
        if not bucket:
            raise UsageError(f"{src}: missing bucket name")
        if not resolved:
            settings = (settings or ClientSettings()).resolved()
        return S3Origin(bucket, key, settings, retry, client)
    if isinstance(src, str) and _SCHEME.match(src):
        raise UsageError(f"{src}: only local paths and s3:// URLs are supported")
    return FileOrigin(src)
