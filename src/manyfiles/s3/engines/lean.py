"""A blocking, lean GetObject client for threads: sockets, recv_into and pwrite.

Used by the ``ranged`` pool.  Large bodies are bound by copies and the GIL, not
by requests: botocore/urllib3 read a body through several Python layers and
buffers, while here each thread ``recv_into``s a reusable 1 MiB buffer and
``pwrite``s it at its offset in the temp file; both calls release the GIL, so
several threads really do move bytes in parallel.  One keep-alive connection per
thread (thread-local), reopened after any error.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time

from manyfiles import iotrace
from manyfiles.s3.engines.http import _Checksum, _http_error, _parse_head
from manyfiles.s3.retry import TransferError, classify
from manyfiles.s3.sigv4 import Endpoint, Signer, uri_path
from manyfiles.s3.transfer import CHUNK, Job, Verifier, check_range

_MAX_HEAD = 64 << 10


class _Closed(TransferError):
    """The server closed the connection before answering (an idle keep-alive, usually)."""


class _LocalError(Exception):
    """A local write failed (ENOSPC, EIO...): not a network error, not worth a retry."""


class LeanClient:
    def __init__(self, ep: Endpoint, signer: Signer, timeout: float) -> None:
        self.ep, self.signer, self.timeout = ep, signer, timeout
        self.ssl_ctx = ssl.create_default_context() if ep.scheme == "https" else None
        self._local = threading.local()

    # -- connection ---------------------------------------------------------------------
    def _conn(self) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is None:
            host = self.ep.host.rsplit(":", 1)[0] if self.ep.host.count(":") == 1 else self.ep.host
            sock = socket.create_connection((host, self.ep.port), timeout=self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_ctx is not None:
                sock = self.ssl_ctx.wrap_socket(sock, server_hostname=host)
                self._local.flags = 0
            else:
                # Blocking mode with kernel timeouts, so that MSG_WAITALL fills the whole buffer in
                # one recv: 16x fewer syscalls and GIL hand-offs than recv()'s ~64 KiB pieces.
                sock.settimeout(None)
                tv = struct.pack("ll", int(self.timeout), int((self.timeout % 1) * 1e6))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                self._local.flags = socket.MSG_WAITALL
            self._local.sock = sock
            self._local.buf = bytearray(CHUNK)
        return sock

    def _drop(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    # -- one GET --------------------------------------------------------------------------
    def get(self, bucket: str, job: Job, target, start: int | None = None, end: int | None = None, *,
            verify_md5: bool = True, on_bytes=None) -> int:
        """GET the object (or bytes ``start..end``) into ``target``; raises TransferError."""
        ranged = start is not None
        extra = []
        if ranged:
            extra.append(("range", f"bytes={start}-{end}"))
        else:
            extra.append(("x-amz-checksum-mode", "ENABLED"))
        if job.etag:
            extra.append(("if-match", f'"{job.etag}"'))
        path = uri_path(self.ep.path_prefix, job.key)
        hdrs = self.signer.headers(self.ep.host, path, extra)
        lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in hdrs)]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
        t0 = time.monotonic_ns()
        status = 0
        n = 0
        ver = None if ranged else Verifier(job, verify_md5)
        try:
            reused = getattr(self._local, "sock", None) is not None
            sock = self._conn()
            try:
                sock.sendall(request)
                head, rest = self._read_head(sock)
            except (_Closed, ConnectionError):
                if not reused:
                    raise
                # the server closed an idle keep-alive connection: not a failure, just reconnect
                self._drop()
                sock = self._conn()
                sock.sendall(request)
                head, rest = self._read_head(sock)
            status, headers = _parse_head(head)
            length = int(headers.get("content-length", "-1"))
            if status not in (200, 206):
                body = rest
                want = min(length, 1 << 16) if length >= 0 else 0
                while len(body) < want:     # the error document, for its <Code>
                    more = sock.recv(want - len(body))
                    if not more:
                        break
                    body += more
                self._drop()
                raise _http_error(status, bytes(body[:want] if want else body))
            if length < 0:
                raise TransferError("response without Content-Length", retryable=True, status=status)
            if ranged:
                check_range(status, headers.get("content-range"), start, end, job.size)
                if length != end - start + 1:
                    raise TransferError(f"part length {length}, asked {end - start + 1}", retryable=True)
            csum = None if ranged else _Checksum(headers if ver.md5 is None else {})
            pos = start or 0
            if rest:
                rest = rest[:length]
                n = self._write(target, ranged, pos, rest, ver, csum)
                pos += n
                if on_bytes is not None:
                    on_bytes(n)
            buf = self._local.buf
            view = memoryview(buf)
            flags = self._local.flags
            while n < length:
                got = sock.recv_into(view, min(len(buf), length - n), flags)
                if not got:
                    raise TransferError(f"truncated body: got {n} of {length} bytes", retryable=True,
                                        status=status)
                self._write(target, ranged, pos, view[:got], ver, csum)
                pos += got
                n += got
                if on_bytes is not None:
                    on_bytes(got)
            if headers.get("connection", "").lower() == "close":
                self._drop()
            if ver is not None:
                ver.check(length)
            if csum is not None:
                csum.check()
        except BaseException as exc:
            self._drop()
            if isinstance(exc, _LocalError):
                err = classify(exc.__cause__)
            elif isinstance(exc, (socket.timeout, BlockingIOError)):
                err = TransferError("timed out", retryable=True)
            elif isinstance(exc, OSError):   # any socket error: worth another connection
                err = TransferError(f"{type(exc).__name__}: {exc.strerror or exc}", retryable=True)
            else:
                err = classify(exc)
            _trace(bucket, job.key, ranged, start or 0, n, t0, err.status or status or -1)
            raise err from exc
        _trace(bucket, job.key, ranged, start or 0, n, t0, status)
        if not ranged and job.size is None:
            job.size = n
        return n

    @staticmethod
    def _write(target, ranged: bool, pos: int, data, ver, csum) -> int:
        try:
            if ranged:
                target.write_at(pos, data)
            else:
                target.append(data)
        except OSError as exc:
            raise _LocalError() from exc
        if not ranged:
            ver.update(data)
            csum.update(data)
        return len(data)

    def _read_head(self, sock: socket.socket) -> tuple[bytes, bytes]:
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                if not data:
                    raise _Closed("connection closed before the response head", retryable=True)
                raise TransferError("connection closed inside the response head", retryable=True)
            data += chunk
            i = data.find(b"\r\n\r\n")
            if i >= 0:
                return data[: i + 4], data[i + 4:]
            if len(data) > _MAX_HEAD:
                raise TransferError("response head too large", retryable=True)


def _trace(bucket: str, key: str, ranged: bool, offset: int, n: int, t0: int, status: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record("s3.get_range" if ranged else "s3.get", f"{bucket}/{key}", offset, n, t0,
                  time.monotonic_ns() - t0, status)
