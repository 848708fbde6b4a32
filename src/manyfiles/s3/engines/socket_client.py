"""A blocking S3 client on raw sockets for threads: recv_into and pwrite, no botocore per request.

Used by the ``lean`` and ``ranged`` pools.  Large bodies are bound by copies and the GIL, not
by requests: botocore/urllib3 read a body through several Python layers and buffers, while
here each thread ``recv_into``s a reusable 1 MiB buffer and ``pwrite``s it at its offset in
the temp file; both calls release the GIL, so several threads really do move bytes in
parallel.  One keep-alive connection per thread (thread-local), reopened after any error.
Endpoint, proxy, TLS and credentials come resolved from botocore (:mod:`manyfiles.s3.sigv4`);
this module only signs and moves bytes.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable

from manyfiles.s3.http1 import (
    ClockSkewed,
    RegionRedirect,
    http_error,
    parse_head,
    request_head,
    request_target,
)
from manyfiles.s3.retry import TransferError, answered, cause_of, classify, network_error, tls_refusal
from manyfiles.s3.sigv4 import Endpoint, Route, uri_path
from manyfiles.s3.transfer import CHUNK, Fetched, Job, WholeBody, check_range
from manyfiles.trace import iotrace

_MAX_HEAD = 64 << 10


class _Closed(TransferError):
    """The server closed the connection before answering (an idle keep-alive, usually)."""


class _LocalError(Exception):
    """A local write failed (ENOSPC, EIO...): not a network error, not worth a retry."""


class SocketClient:
    """Hand-signed requests for one bucket on thread-local keep-alive connections (see :class:`Route`).

    ``timeout``: the read timeout (seconds without a byte while one is awaited);
    ``connect_timeout``: the seconds a connection may take (default: ``timeout``)."""

    def __init__(self, route: Route, timeout: float, *, checksum_mode: bool = True,
                 connect_timeout: float | None = None) -> None:
        self.route, self.timeout = route, timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.checksum_mode = checksum_mode
        self._answered = False      # (a cache of the registry of retry.answered)
        self._local = threading.local()
        self._newest: socket.socket | None = None   # for abort() (a client of one open() only)
        self._aborted = False
        self._open: weakref.WeakSet = weakref.WeakSet()     # every thread's connection, for interrupt()
        self._interrupts = 0

    @property
    def ep(self) -> Endpoint:
        return self.route.ep

    # -- connection ---------------------------------------------------------------------
    def _conn(self, ep: Endpoint) -> socket.socket:
        sock = getattr(self._local, "sock", None)
        if sock is not None and self._local.ep is not ep:   # the route moved (region redirect)
            self._drop()
            sock = None
        if sock is None:
            ssl_ctx = self.route.ssl_ctx if ep.scheme == "https" else None
            target = ep.proxy or (ep.connect_host, ep.port)
            try:
                sock = socket.create_connection(target, timeout=self.connect_timeout)
            except OSError as exc:
                err = network_error(exc, ep.name, waited=f"connecting, {self.connect_timeout:g} s")
                if err is None:
                    raise
                raise err from exc
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ep.proxy and ssl_ctx is not None:
                _tunnel(sock, ep)
            if ssl_ctx is not None:
                sock = ssl_ctx.wrap_socket(sock, server_hostname=ep.connect_host)
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
            self._local.ep = ep
            self._newest = sock
            self._open.add(sock)
            if self._aborted:       # abort() ran while this connection was being made
                _shut(sock)
        return sock

    def abort(self) -> None:
        """From another thread: the request :meth:`open` is sending or waiting on fails at once
        (its socket is shut down, as is any connection it makes after this)."""
        self._aborted = True
        sock = self._newest
        if sock is not None:
            _shut(sock)

    def interrupt(self) -> None:
        """From another thread: every request of this client in flight now fails at once (their
        connections are shut down; later requests make new ones).  A run that stopped uses it, so
        that no thread of it waits for a read timeout."""
        self._interrupts += 1
        for sock in list(self._open):
            _shut(sock)

    def _buffer(self) -> bytearray:
        """This thread's receive buffer, made on first need: a body that came whole with its
        response head never needs one (1 MiB zeroed per thread was 3.6% of a small pull's CPU)."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = bytearray(CHUNK)
        return buf

    def _drop(self) -> None:
        sock = getattr(self._local, "sock", None)
        self._local.sock = None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _exchange(self, method: str, path: str, extra: list, query: str = ""):
        """Send one request and read the response head: (sock, status, headers, rest of buffer).

        A region redirect is followed once: the route moves, the request is signed again."""
        for redirected in (False, True):
            sock, status, headers, rest = self._send(method, path, extra, query)
            if status in (301, 307, 400) and not redirected:
                err = self._error(sock, status, headers, rest, method)
                if isinstance(err, RegionRedirect):
                    self.route.relocate(err.region)
                    continue
                raise err
            break
        return sock, status, headers, rest

    def _send(self, method: str, path: str, extra: list, query: str):
        ep = self.route.ep
        signed = self.route.signer.headers(ep.host, path, extra, query=query, method=method)
        self._local.signed = signed
        request = request_head(method, request_target(ep, path, query), signed)
        reused = getattr(self._local, "sock", None) is not None
        interrupts = self._interrupts
        sock = self._conn(ep)
        try:
            sock.sendall(request)
            head, rest = self._read_head(sock)
        except (_Closed, ConnectionError):
            if not reused or interrupts != self._interrupts:
                raise
            # the server closed an idle keep-alive connection: not a failure, just reconnect
            self._drop()
            sock = self._conn(ep)
            sock.sendall(request)
            head, rest = self._read_head(sock)
        status, headers = parse_head(head)
        if not self._answered:
            self._answered = True
            answered(ep.name)
        return sock, status, headers, rest

    def _error(self, sock, status: int, headers: dict, rest: bytes, method: str) -> TransferError:
        length = int(headers.get("content-length", "-1"))
        body = rest
        want = min(length, 1 << 16) if length >= 0 and method != "HEAD" else 0
        if length < 0 and method != "HEAD":
            want = 1 << 16
            sock.settimeout(min(self.timeout, 5.0))
        while len(body) < want:     # the error document, for its <Code>
            more = sock.recv(want - len(body))
            if not more:
                break
            body += more
        self._drop()
        err = http_error(status, bytes(body[:want] if want else b""), headers, self._local.signed)
        if isinstance(err, ClockSkewed):
            self.route.signer.correct_clock(err.server_date)
        return err

    def close(self) -> None:
        self._drop()

    def request_body(self, method: str, path: str, query: str = "", extra: list = ()) -> bytes:
        """A small request (a listing page): the whole body of a 200 answer; raises TransferError."""
        sock, status, headers, rest = self._exchange(method, path, list(extra), query)
        if status != 200:
            raise self._error(sock, status, headers, rest, method)
        length = int(headers.get("content-length", "-1"))
        body = bytearray(rest)
        if length < 0 and headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked(sock, body)
        while len(body) < length:
            more = sock.recv(min(1 << 20, length - len(body)))
            if not more:
                raise TransferError(f"truncated body: got {len(body)} of {length} bytes", retryable=True)
            body += more
        if headers.get("connection", "").lower() == "close" or length < 0:
            self._drop()
        return bytes(body[:length]) if length >= 0 else bytes(body)

    def _read_chunked(self, sock, buf: bytearray) -> bytes:
        out = bytearray()
        while True:
            while b"\r\n" not in buf:
                more = sock.recv(65536)
                if not more:
                    raise TransferError("truncated chunked body", retryable=True)
                buf += more
            line, _, rest = bytes(buf).partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            buf = bytearray(rest)
            while len(buf) < size + 2:
                more = sock.recv(65536)
                if not more:
                    raise TransferError("truncated chunked body", retryable=True)
                buf += more
            if size == 0:
                return bytes(out)
            out += buf[:size]
            buf = buf[size + 2:]

    # -- HEAD -----------------------------------------------------------------------------
    def head(self, bucket: str, job: Job, part_number: int | None = None) -> dict[str, str]:
        """The object's headers (``?partNumber=n``: that part's), checksum mode on."""
        path = uri_path(self.ep.path_prefix, job.key)
        query = f"partNumber={part_number}" if part_number else ""
        extra = [("x-amz-checksum-mode", "ENABLED")] if self.checksum_mode else []
        if job.etag and not part_number:
            extra.append(("if-match", f'"{job.etag}"'))
        try:
            sock, status, headers, rest = self._exchange("HEAD", path, extra, query)
            if status not in (200, 206):
                raise self._error(sock, status, headers, rest, "HEAD")
            if headers.get("connection", "").lower() == "close":
                self._drop()
        except BaseException as exc:
            self._drop()
            err = self._classify(exc)
            raise err from cause_of(err, exc)
        return headers

    # -- a response read at the caller's pace ---------------------------------------------
    def open(self, method: str, path: str, extra: list, query: str = "",
             on_client: Callable[[SocketClient], None] | None = None) -> Response:
        """Send one request on a connection of its own and return the response, body unread
        (a stream read block by block, possibly by another thread); raises TransferError for a
        non-2xx answer.  The connection is closed with the response.  ``on_client`` is given the
        client that sends the request, before it does: its :meth:`abort` ends the wait for the
        answer from another thread."""
        own = SocketClient(self.route, self.timeout, checksum_mode=self.checksum_mode,
                           connect_timeout=self.connect_timeout)
        own._answered = self._answered
        own._open = self._open          # its connection is this client's to interrupt()
        if on_client is not None:
            on_client(own)
        try:
            sock, status, headers, rest = own._exchange(method, path, list(extra), query)
            if status not in (200, 206):
                raise own._error(sock, status, headers, rest, method)
        except BaseException as exc:
            own._drop()
            err = own._classify(exc)
            raise err from cause_of(err, exc)
        flags = own._local.flags
        own._local.sock = None      # the response owns the socket now
        return Response(sock, flags, status, headers, rest, method == "HEAD", client=own)

    # -- one GET --------------------------------------------------------------------------
    def get(self, bucket: str, job: Job, target, start: int | None = None, end: int | None = None, *,
            verify: bool = True, layout: tuple[int, ...] | None = None, feed=None,
            on_bytes=None) -> Fetched | int:
        """GET the object (or bytes ``start..end``) into ``target``; raises TransferError.

        Whole objects are checked by a :class:`WholeBody` (returns :class:`Fetched`); a range is
        written at its offset and hashed into ``feed`` (when it is next in its check unit) as it
        is written (returns the bytes written).
        """
        ranged = start is not None
        if ranged:
            extra = [("range", f"bytes={start}-{end}")]
        else:
            extra = [("x-amz-checksum-mode", "ENABLED")] if self.checksum_mode else []
        if job.etag:
            extra.append(("if-match", f'"{job.etag}"'))
        path = uri_path(self.ep.path_prefix, job.key)
        t0 = time.monotonic_ns()
        status = 0
        n = 0
        try:
            sock, status, headers, rest = self._exchange("GET", path, extra)
            if status not in (200, 206):
                raise self._error(sock, status, headers, rest, "GET")
            length = int(headers.get("content-length", "-1"))
            if length < 0:
                raise TransferError("response without Content-Length", retryable=True, status=status)
            if ranged:
                check_range(status, headers.get("content-range"), start, end, job.size)
                if length != end - start + 1:
                    raise TransferError(f"part length {length}, asked {end - start + 1}", retryable=True)
                write = _RangeWriter(target, start, feed)
            else:
                write = WholeBody(job, target, headers, verify=verify, layout=layout)
            if rest:
                rest = rest[:length]
                _write(write, rest)
                n = len(rest)
                if on_bytes is not None:
                    on_bytes(n)
            if n < length:
                buf = self._buffer()
                view = memoryview(buf)
            flags = self._local.flags
            while n < length:
                got = sock.recv_into(view, min(len(buf), length - n), flags)
                if not got:
                    raise TransferError(f"truncated body: got {n} of {length} bytes", retryable=True,
                                        status=status)
                _write(write, view[:got])
                n += got
                if on_bytes is not None:
                    on_bytes(got)
            if headers.get("connection", "").lower() == "close":
                self._drop()
            result = n if ranged else write.finish(length)
        except BaseException as exc:
            self._drop()
            err = self._classify(exc, answered=status != 0)
            _trace(bucket, job.key, ranged, start or 0, n, t0, err.status or status or -1)
            raise err from cause_of(err, exc)
        _trace(bucket, job.key, ranged, start or 0, n, t0, status)
        return result

    def _classify(self, exc: BaseException, answered: bool = False) -> TransferError:
        """The TransferError of a request that failed (``answered``: its response had begun)."""
        if isinstance(exc, _LocalError):
            return classify(exc.__cause__)
        if isinstance(exc, TransferError):
            return exc
        refused = tls_refusal(exc)
        if refused is not None:
            return refused
        where = self.route.ep.name
        waited = f"no data for {self.timeout:g} s" if answered else f"no answer in {self.timeout:g} s"
        if isinstance(exc, BlockingIOError):    # SO_RCVTIMEO / SO_SNDTIMEO ran out
            exc = TimeoutError(exc.errno, "timed out")
        err = network_error(exc, where, answered=answered, waited=waited)
        if err is not None:
            return err
        if isinstance(exc, OSError):   # any other socket error: worth another connection
            return TransferError(f"{where}: {exc.strerror or exc}", retryable=True)
        return classify(exc)

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


class Response:
    """One response whose body is read by the caller (:meth:`SocketClient.open`): ``status``,
    ``headers`` (lower-case names), ``length`` (Content-Length, -1 if none), :meth:`readinto` /
    :meth:`read` until the body ends, then :meth:`close`.  Short bodies and socket errors raise
    retryable TransferErrors."""

    def __init__(self, sock, flags: int, status: int, headers: dict[str, str], rest: bytes,
                 head_only: bool = False, *, client: SocketClient) -> None:
        self.sock, self.flags, self.status, self.headers = sock, flags, status, headers
        self._client = client
        self.length = int(headers.get("content-length", "-1")) if not head_only else 0
        if self.length < 0:
            self.close()
            raise TransferError("response without Content-Length", retryable=True, status=status)
        self._rest = memoryview(rest)[: self.length]
        self.remaining = self.length

    def readinto(self, view) -> int:
        """Fill ``view`` with up to ``len(view)`` bytes of the body (fewer only at its end); 0 at the end."""
        want = min(len(view), self.remaining)
        n = 0
        try:
            if self._rest and want:
                n = min(want, len(self._rest))
                view[:n] = self._rest[:n]
                self._rest = self._rest[n:]
            while n < want:
                sock = self.sock
                if sock is None:
                    raise TransferError("the response was closed", retryable=True, status=self.status)
                got = sock.recv_into(view[n:want], want - n, self.flags)
                if not got:
                    raise TransferError(f"truncated body: got {self.length - self.remaining + n} of "
                                        f"{self.length} bytes", retryable=True, status=self.status)
                n += got
        except BaseException as exc:
            self.close()
            err = self._client._classify(exc, answered=True)
            raise err from cause_of(err, exc)
        self.remaining -= n
        return n

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body (fewer only at its end; b"" at the end)."""
        buf = bytearray(min(n, self.remaining))
        got = self.readinto(memoryview(buf))
        return bytes(buf) if got == len(buf) else bytes(buf[:got])

    def close(self) -> None:
        """Close the connection; a thread blocked reading the body (a stalled server) returns at
        once: the socket is shut down first, since closing it alone leaves that ``recv`` waiting
        for data or the read timeout."""
        sock, self.sock = self.sock, None
        if sock is not None:
            _shut(sock)
            with contextlib.suppress(OSError):
                sock.close()


def _shut(sock: socket.socket) -> None:
    """Shut ``sock`` down: a thread blocked in its ``recv`` returns at once (closing it alone
    leaves that ``recv`` waiting for data or the read timeout)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _RangeWriter:
    """Writes a range at its offset; feeds the check unit's hasher when this range is next in it."""

    __slots__ = ("feed", "pos", "target")

    def __init__(self, target, start: int, feed) -> None:
        self.target, self.pos, self.feed = target, start, feed

    def write(self, data) -> None:
        self.target.write_at(self.pos, data)     # complete, or raises
        if self.feed is not None:
            self.feed.update(data)
        self.pos += len(data)


def _write(writer, data) -> None:
    try:
        writer.write(data)
    except OSError as exc:
        raise _LocalError() from exc


def _tunnel(sock: socket.socket, ep: Endpoint) -> None:
    """HTTP CONNECT through the proxy (HTTPS_PROXY) before TLS."""
    sock.sendall(f"CONNECT {ep.connect_host}:{ep.port} HTTP/1.1\r\nHost: {ep.connect_host}:{ep.port}\r\n\r\n"
                 .encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise TransferError("proxy closed the connection during CONNECT", retryable=True)
        data += chunk
    status, _ = parse_head(data[: data.index(b"\r\n\r\n") + 4])
    if status != 200:
        raise TransferError(f"proxy refused CONNECT (HTTP {status})", retryable=False, status=status)


def _trace(bucket: str, key: str, ranged: bool, offset: int, n: int, t0: int, status: int) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record("s3.get_range" if ranged else "s3.get", f"{bucket}/{key}", offset, n, t0,
                  time.monotonic_ns() - t0, status)
