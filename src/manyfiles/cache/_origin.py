"""Where cached bytes come from: a local/NFS file or an S3 object.

An origin answers two questions: *which version is there now* (``stat``: a validator,
the size) and *give me these bytes of that version* (``fetch``).  Fetches are checked
against the version they were asked for, so a source that changes under a reader raises
:class:`~manyfiles.errors.ObjectChanged` instead of mixing two versions:

* files: the block is read from a descriptor opened on the validated inode, and the
  descriptor's (inode, size, mtime, ctime) is compared again after the read;
* S3: every GET carries ``If-Match: <etag>``; lengths and ``Content-Range`` are checked,
  and a whole-object GET is checked against the MD5 ETag when the ETag is one (single
  part upload, no SSE-KMS / SSE-C).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat as _stat
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from manyfiles import iotrace
from manyfiles._extras import require
from manyfiles._retry import RetryPolicy, retrying
from manyfiles.errors import (
    AccessDenied,
    CredentialsError,
    IntegrityError,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    TransferError,
    UsageError,
    from_oserror,
)

_MD5_ETAG = re.compile(rb"^[0-9a-f]{32}$")
T = TypeVar("T")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
CLIENT_POOL = 64
RETRY = RetryPolicy(attempts=4, base=float(os.environ.get("MANYFILES_RETRY_BASE", "0.1")))


def with_retries(fn: Callable[[], T]) -> T:
    """``fn()`` retried while it raises an error marked retryable (those of :func:`s3_error` are)."""
    return retrying(fn, RETRY, classify=lambda exc: exc)


def _trace(op: str, path: Any, offset: int, length: int, t0: int, result: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)


class FileOrigin:
    """A regular file on a local or network filesystem."""

    kind = "file"

    def __init__(self, path: str | bytes | os.PathLike) -> None:
        raw = os.fsencode(os.path.abspath(os.fspath(path)))
        self.path = raw
        self.source = b"file:" + raw
        self.display = os.fsdecode(raw)

    def stat(self) -> tuple[bytes, int]:
        """(validator, size) of the file now."""
        t0 = time.monotonic_ns()
        try:
            st = os.stat(self.path)
        except OSError as exc:
            _trace("stat", self.path, 0, 0, t0, exc.errno or -1)
            raise from_oserror(exc, self.display) from exc
        _trace("stat", self.path, 0, 0, t0, 0)
        return self._validator(st), st.st_size

    def _validator(self, st: os.stat_result) -> bytes:
        if not _stat.S_ISREG(st.st_mode):
            raise UsageError(f"{self.display}: not a regular file")
        # st_dev is left out on purpose: NFS and FUSE mounts get a new anonymous device
        # number at every mount, which would make every reboot a full miss.  ctime catches
        # what mtime alone misses: `cp -p`/`touch -r` in place, replacement by rename.
        return b"ino=%d;size=%d;mtime=%d;ctime=%d" % (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def fetcher(self, validator: bytes) -> _FileFetcher:
        return _FileFetcher(self, validator)


class _FileFetcher:
    """Reads blocks of one validated version of a file through one descriptor."""

    def __init__(self, origin: FileOrigin, validator: bytes) -> None:
        self.origin = origin
        self.validator = validator
        self._fd: int | None = None
        self._lock = threading.Lock()

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                try:
                    fd = os.open(self.origin.path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError as exc:
                    raise from_oserror(exc, self.origin.display) from exc
                if self._changed(fd):
                    os.close(fd)
                    raise ObjectChanged(f"{self.origin.display}: changed since it was opened")
                self._fd = fd
            return self._fd

    def _changed(self, fd: int) -> bool:
        return self.origin._validator(os.fstat(fd)) != self.validator

    def fetch(self, offset: int, length: int) -> bytes:
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

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


# -- S3 --------------------------------------------------------------------------------------------

_CLIENTS: dict[Any, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _new_lock_in_child() -> None:
    global _CLIENTS_LOCK
    _CLIENTS_LOCK = threading.Lock()     # a parent thread may have held it at fork time


os.register_at_fork(after_in_child=_new_lock_in_child)


def s3_client(settings) -> Any:
    """One boto3 client per settings and process (boto3 clients are thread-safe)."""
    key = (settings, os.getpid())
    client = _CLIENTS.get(key)
    if client is None:
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = settings.client(pool=CLIENT_POOL)
    return client


_CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"})


def s3_error(exc: BaseException, where: str) -> ManyfilesError:
    """The manyfiles error for a botocore/network error on ``where`` (one line, ``where: reason``)."""
    from manyfiles.s3.client import S3_FEATURE

    exceptions = require("s3", "botocore.exceptions", S3_FEATURE)
    ClientError, NoCredentialsError = exceptions.ClientError, exceptions.NoCredentialsError

    from manyfiles.s3.retry import classify

    if isinstance(exc, NoCredentialsError):
        return CredentialsError(f"{where}: no AWS credentials found")
    if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in _CREDENTIAL_CODES:
        return CredentialsError(f"{where}: credentials refused ({exc.response['Error']['Code']})")
    err = classify(exc)
    if isinstance(err, ObjectChanged):
        return ObjectChanged(f"{where}: object changed while being read")
    if err.status == 404:
        return NotFound(f"{where}: no such object")
    if err.status in (401, 403):
        return AccessDenied(f"{where}: access denied ({err})")
    if isinstance(err, IntegrityError):
        return IntegrityError(f"{where}: {err}", retryable=err.retryable)
    return TransferError(f"{where}: {err}", retryable=err.retryable, status=err.status)


def s3_failed(op: str, origin: S3Origin, offset: int, length: int, t0: int, exc: BaseException,
              status: int = 0) -> ManyfilesError:
    """Convert ``exc`` (see :func:`s3_error`), record the failed operation in the trace, return it."""
    err = s3_error(exc, origin.display)
    _trace(op, f"{origin.bucket}/{origin.key}", offset, length, t0, getattr(err, "status", 0) or status or -1)
    return err


class S3Origin:
    """One object of an S3 (or S3-compatible) endpoint."""

    kind = "s3"

    def __init__(self, bucket: str, key: str, settings) -> None:
        if not key or key.endswith("/"):
            raise UsageError(f"s3://{bucket}/{key}: not an object key")
        self.bucket, self.key, self.settings = bucket, key, settings
        self.display = f"s3://{bucket}/{key}"
        # The endpoint is part of the identity: the same bucket name on two servers is two sources.
        where = f"s3+{settings.endpoint_url}/" if settings.endpoint_url else "s3://"
        self.source = f"{where}{bucket}/{key}".encode()

    def client(self) -> Any:
        return s3_client(self.settings)

    def stat(self) -> tuple[bytes, int]:
        return with_retries(self._head)

    def _head(self) -> tuple[bytes, int]:
        t0 = time.monotonic_ns()
        try:
            head = self.client().head_object(Bucket=self.bucket, Key=self.key)
        except Exception as exc:
            raise s3_failed("s3.head", self, 0, 0, t0, exc) from exc
        _trace("s3.head", f"{self.bucket}/{self.key}", 0, 0, t0, 200)
        size = int(head["ContentLength"])
        return self.validator(head.get("ETag", ""), size), size

    def open_first(self, block_size: int) -> First:
        """Open a GET of the whole object and read its first block: what an open would learn
        with a HEAD (the version), plus the data, in one round trip.  The rest of the body is
        :attr:`First.stream` (None when the object fits in one block: it was checked whole)."""
        return with_retries(lambda: self._open_first(block_size))

    def _open_first(self, block_size: int) -> First:
        t0 = time.monotonic_ns()
        try:
            resp = self.client().get_object(Bucket=self.bucket, Key=self.key, ChecksumMode="ENABLED")
        except Exception as exc:
            raise s3_failed("s3.get", self, 0, 0, t0, exc) from exc
        size = int(resp["ContentLength"])
        etag = (resp.get("ETag") or "").strip('"')
        stream = ObjectStream(self, resp, etag, size, block_size, t0)
        try:
            first = stream.next_block()
            method = stream.finish() if size <= block_size else None
        except BaseException:
            stream.close()
            raise
        if method is None:
            return First(self.validator(etag, size), size, first, stream, None)
        stream.close()
        return First(self.validator(etag, size), size, first, None, method)

    @staticmethod
    def validator(etag: str | None, size: int) -> bytes:
        """``etag=<etag>;size=<n>``: the same whether learnt from a HEAD or from a listing."""
        return b"etag=%s;size=%d" % ((etag or "").strip('"').encode(), size)

    def fetcher(self, validator: bytes) -> _S3Fetcher:
        return _S3Fetcher(self, validator)


class _S3Fetcher:
    def __init__(self, origin: S3Origin, validator: bytes) -> None:
        self.origin = origin
        fields = dict(p.split(b"=", 1) for p in validator.split(b";"))
        self.etag = fields[b"etag"].decode()
        self.size = int(fields[b"size"])
        self.md5 = _MD5_ETAG.match(fields[b"etag"]) is not None

    def fetch(self, offset: int, length: int) -> bytes:
        return with_retries(lambda: self._get(offset, length))

    def _get(self, offset: int, length: int) -> bytes:
        o = self.origin
        whole = offset == 0 and length == self.size
        kw: dict[str, Any] = {"Bucket": o.bucket, "Key": o.key}
        if self.etag:
            kw["IfMatch"] = f'"{self.etag}"'
        if not whole:
            kw["Range"] = f"bytes={offset}-{offset + length - 1}"
        op = "s3.get" if whole else "s3.get_range"
        t0 = time.monotonic_ns()
        status = 0
        data = b""
        try:
            resp, status, data = _get_object(o.client(), **kw)
            self._check(resp, status, data, offset, length, whole)
        except Exception as exc:
            raise s3_failed(op, o, offset, len(data), t0, exc, status) from exc
        _trace(op, f"{o.bucket}/{o.key}", offset, len(data), t0, status)
        return data

    def _check(self, resp: dict, status: int, data: bytes, offset: int, length: int, whole: bool) -> None:
        if whole:
            if len(data) != length:
                raise TransferError(f"got {len(data)} of {length} bytes", retryable=True)
            if (self.md5 and not _encrypted(resp)
                    and hashlib.md5(data, usedforsecurity=False).hexdigest() != self.etag):
                raise IntegrityError("MD5 of the body does not match the ETag")
            return
        from manyfiles.s3.transfer import check_range

        check_range(status, resp.get("ContentRange"), offset, offset + length - 1, self.size)
        if len(data) != length:
            raise TransferError(f"got {len(data)} of {length} bytes", retryable=True)

    def open_stream(self, block_size: int) -> ObjectStream:
        """A GET of the whole object (pinned to the ETag), read block by block; see :class:`ObjectStream`."""
        o = self.origin
        kw: dict[str, Any] = {"Bucket": o.bucket, "Key": o.key, "ChecksumMode": "ENABLED"}
        if self.etag:
            kw["IfMatch"] = f'"{self.etag}"'
        t0 = time.monotonic_ns()
        try:
            resp = o.client().get_object(**kw)
        except Exception as exc:
            raise s3_failed("s3.get", o, 0, 0, t0, exc) from exc
        if int(resp["ContentLength"]) != self.size:
            resp["Body"].close()
            raise s3_failed("s3.get", o, 0, 0, t0, ObjectChanged(f"size changed ({self.size} -> "
                                                                 f"{resp['ContentLength']})"))
        return ObjectStream(o, resp, self.etag, self.size, block_size, t0)

    def close(self) -> None:
        pass


class First(NamedTuple):
    """What opening an object learnt: its version, its first block, and the rest of the GET."""

    validator: bytes
    size: int
    data: bytes
    stream: ObjectStream | None     # the open GET, past the first block (None: nothing left)
    checked: str | None             # when the whole object was in ``data``: how it was checked


class _Discard:
    """The target of a :class:`~manyfiles.s3.transfer.WholeBody` whose bytes are kept elsewhere
    (the stream hands them out itself): only the digest matters."""

    def append(self, data: Any) -> None:
        pass

    def read(self, offset: int, n: int) -> bytes:     # a sequential Digest never reads back
        raise IntegrityError("nothing to read back")


class ObjectStream:
    """One whole-object GET read in blocks, in order, and checked whole after the last one.

    The check is the one s3pull makes (:mod:`manyfiles.s3.integrity`): the object's S3
    checksum (CRC32/CRC32C/CRC64NVME/SHA, full or composite), else its ETag when it is an MD5
    (single-part upload, no SSE-KMS / SSE-C), else its multipart ETag (part sizes from one
    ``HEAD ?partNumber=1``); "size-only" when none applies.  Not thread-safe: one consumer.
    """

    def __init__(self, origin: S3Origin, resp: dict, etag: str, size: int, block_size: int, t0: int) -> None:
        self.origin, self.etag, self.size, self.block_size = origin, etag, size, block_size
        self._resp, self._body, self._t0 = resp, resp["Body"], t0
        self._whole: Any = None
        self.pos = 0

    def _hasher(self) -> Any:
        if self._whole is None:
            from manyfiles.s3.integrity import part_layout
            from manyfiles.s3.transfer import Job, WholeBody, head_part_boto3, needs_layout

            o = self.origin
            job = Job(o.key, o.key, self.size, self.etag or None)
            layout = None
            if needs_layout(job, True):
                try:
                    layout = part_layout(self.size, self.etag,
                                         lambda n: head_part_boto3(o.client(), o.bucket, o.key, n))
                except Exception:       # no part layout: the ETag cannot be checked (size-only)
                    layout = None
            self._whole = WholeBody(job, _Discard(), self._resp["ResponseMetadata"]["HTTPHeaders"],
                                    verify=True, layout=layout)
        return self._whole

    def next_block(self) -> bytes:
        """The next block (``block_size`` bytes, or the rest); hashed for the final check."""
        want = min(self.block_size, self.size - self.pos)
        try:
            data = _read_exact(self._body, want)
            if len(data) != want:
                raise TransferError(f"got {self.pos + len(data)} of {self.size} bytes", retryable=True)
            self._hasher().write(data)
        except Exception as exc:
            raise s3_failed("s3.get", self.origin, 0, self.pos, self._t0, exc) from exc
        self.pos += want
        return data

    def finish(self) -> str:
        """After the last block: nothing more, and the whole-object check passes; returns its method
        ("md5", "crc32", ..., "size-only").  Raises IntegrityError if it fails (retryable: bytes
        flipped on the way are worth one more GET)."""
        o = self.origin
        try:
            if self._body.read(1):
                raise ObjectChanged(f"longer than {self.size} bytes")
            method = self._hasher().finish(self.size).claim.method
        except IntegrityError as exc:
            _trace("s3.get", f"{o.bucket}/{o.key}", 0, self.pos, self._t0, -1)
            raise IntegrityError(f"{o.display}: {exc}", retryable=True) from exc
        except Exception as exc:
            raise s3_failed("s3.get", o, 0, self.pos, self._t0, exc) from exc
        _trace("s3.get", f"{o.bucket}/{o.key}", 0, self.pos, self._t0, 200)
        return method

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()


def _read_exact(body: Any, n: int) -> bytes:
    data = body.read(n)
    if len(data) < n:
        parts = [data]
        got = len(data)
        while got < n:
            more = body.read(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        data = b"".join(parts)
    return data


def _get_object(client: Any, **kw: Any) -> tuple[dict, int, bytes]:
    """One GET, body read whole: (response, HTTP status, body)."""
    resp = client.get_object(**kw)
    body = resp["Body"]
    try:
        data = body.read()
    finally:
        body.close()
    return resp, resp["ResponseMetadata"]["HTTPStatusCode"], data


def _encrypted(resp: dict) -> bool:
    """SSE-KMS and SSE-C objects have ETags that are not the MD5 of their body."""
    sse = str(resp.get("ServerSideEncryption", ""))
    return bool(resp.get("SSECustomerAlgorithm")) or sse.startswith("aws:kms")


def parse_source(src: Any, settings=None) -> FileOrigin | S3Origin:
    """``s3://bucket/key`` -> S3Origin; anything else is a path."""
    if isinstance(src, (FileOrigin, S3Origin)):
        return src
    if isinstance(src, str) and src.startswith("s3://"):
        from manyfiles.s3.client import ClientSettings

        bucket, _, key = src[5:].partition("/")
        if not bucket:
            raise UsageError(f"{src}: missing bucket name")
        return S3Origin(bucket, key, (settings or ClientSettings()).resolved())
    if isinstance(src, str) and _SCHEME.match(src):
        raise UsageError(f"{src}: only local paths and s3:// URLs are supported")
    return FileOrigin(src)
