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

import hashlib
import os
import re
import stat as _stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

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

    def fetch_first(self, block_size: int) -> tuple[bytes, int, bytes] | None:
        """(validator, size, first block) from one ranged GET: what an open would learn with a
        HEAD, plus the data, in one round trip.  None for an empty object (nothing to range)."""
        return with_retries(lambda: self._get_first(block_size))

    def _get_first(self, block_size: int) -> tuple[bytes, int, bytes] | None:
        t0 = time.monotonic_ns()
        data = b""
        status = 0
        try:
            resp, status, data = _get_object(self.client(), Bucket=self.bucket, Key=self.key,
                                             Range=f"bytes=0-{block_size - 1}")
            if status == 206:
                size = int(str(resp.get("ContentRange", "")).rpartition("/")[2])
            else:
                size = int(resp["ContentLength"])
            if len(data) != min(size, block_size):
                raise TransferError(f"got {len(data)} of {min(size, block_size)} bytes", retryable=True)
            etag = (resp.get("ETag") or "").strip('"')
            if (size == len(data) and _MD5_ETAG.match(etag.encode()) and not _encrypted(resp)
                    and hashlib.md5(data, usedforsecurity=False).hexdigest() != etag):
                raise IntegrityError("MD5 of the body does not match the ETag")
        except Exception as exc:
            if getattr(exc, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                return None
            raise s3_failed("s3.get_range", self, 0, len(data), t0, exc, status) from exc
        _trace("s3.get_range", f"{self.bucket}/{self.key}", 0, len(data), t0, status)
        return self.validator(etag, size), size, data

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

    def stream_blocks(self, block_size: int) -> Iterator[bytes]:
        """The whole object in ``block_size`` pieces from one GET; the MD5 (when the ETag is
        one) and the length are checked before the generator finishes, so a consumer that
        keeps what it got only after the last ``next()`` keeps nothing unchecked."""
        o = self.origin
        kw: dict[str, Any] = {"Bucket": o.bucket, "Key": o.key}
        if self.etag:
            kw["IfMatch"] = f'"{self.etag}"'
        t0 = time.monotonic_ns()
        got = 0
        md5 = hashlib.md5(usedforsecurity=False)
        try:
            resp = o.client().get_object(**kw)
            check_md5 = self.md5 and not _encrypted(resp)
            body = resp["Body"]
            try:
                while got < self.size:
                    piece = body.read(min(block_size, self.size - got))
                    while piece and len(piece) < min(block_size, self.size - got):
                        more = body.read(min(block_size, self.size - got) - len(piece))
                        if not more:
                            break
                        piece += more
                    if not piece:
                        raise TransferError(f"got {got} of {self.size} bytes", retryable=True)
                    got += len(piece)
                    if check_md5:
                        md5.update(piece)
                    yield piece
                if body.read(1):
                    raise ObjectChanged(f"longer than {self.size} bytes")
            finally:
                body.close()
            if check_md5 and md5.hexdigest() != self.etag:
                raise IntegrityError("MD5 of the body does not match the ETag")
        except Exception as exc:
            raise s3_failed("s3.get", o, 0, got, t0, exc) from exc
        _trace("s3.get", f"{o.bucket}/{o.key}", 0, got, t0, 200)

    def close(self) -> None:
        pass


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
