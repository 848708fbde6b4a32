"""The two I/O shells of the HTTP/1.1 core (:mod:`manyfiles.s3.http1`): blocking sockets for threads,
asyncio streams for a loop.  They only move bytes; what a request means is decided by the core and
by the store above them (:mod:`manyfiles.s3.store`).

:class:`Transport` (threads): one keep-alive connection per thread (thread-local), reopened after
any error.  Large bodies are bound by copies and the GIL, not by requests: each thread
``recv_into``s a reusable 1 MiB buffer and hands it to the body's writer (``pwrite`` at its offset
in a temp file); both calls release the GIL, so several threads really do move bytes in parallel.
On plain HTTP the socket is blocking with kernel timeouts, so that ``MSG_WAITALL`` fills the whole
buffer in one ``recv``.

:class:`AsyncConnection` (a loop): one keep-alive connection per worker coroutine, the same methods
in the same order (``request``, ``fetch``), awaited.

Both: ``request`` (a small answer read whole: a listing page, a HEAD, a PUT's answer) and ``fetch``
(the body handed to a writer as it arrives).  :class:`Transport` also has ``open`` (a response
read at the caller's pace, on its own connection) and ``interrupt`` (every request in flight fails
at once: a run that stopped).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import struct
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from manyfiles.errors import TransferError
from manyfiles.s3 import http1
from manyfiles.s3.config import Endpoint, Route
from manyfiles.s3.http1 import ErrorBody, FileBody, Headers, Send
from manyfiles.s3.retry import cause_of, classify

if TYPE_CHECKING:
    import asyncio

CHUNK = 1 << 20      # the receive buffer of a thread, and the largest block of a body handed on
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class Answer(NamedTuple):
    """A whole answer: status, headers (lower-case names), body."""

    status: int
    headers: Headers
    body: bytes


class BodyWriteError(Exception):
    """A body's writer failed (ENOSPC, EIO...: its ``__cause__``): not a network error, not
    worth another connection."""


# Begins a fetched body: (status, headers, Content-Length) -> its writer (``write(view)``); raises to refuse
# the answer (a Content-Range that is not the one asked, a size the listing contradicts).
BodyStart = Callable[[int, Headers, int], Any]


def lookup_name(name: str) -> bytes | str:
    """A host name for getaddrinfo: an ASCII one as bytes (a str goes through the idna codec, whose
    import, stringprep included, is ~3 ms of start-up)."""
    return name.encode() if name.isascii() else name


def _shut(sock: socket.socket) -> None:
    """Shut ``sock`` down: a thread blocked in its ``recv`` returns at once (closing it alone
    leaves that ``recv`` waiting for data or the read timeout)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Closed(TransferError):
    """The server closed the connection before answering (an idle keep-alive, usually)."""


def written(writer: Any, data: Any) -> None:
    """``writer.write(data)``; a failure to write is a :class:`BodyWriteError` (the file's error, not
    the network's)."""
    try:
        writer.write(data)
    except OSError as exc:
        raise BodyWriteError() from exc


def request_failure(exc: BaseException, endpoint: str, timeout: float,
                    answered: bool = False) -> TransferError:
    """The TransferError of a request that failed with ``exc`` (every shell's): a body that could not
    be written is its file's error (ENOSPC...), anything else the request's (``answered``: its
    response had begun)."""
    if isinstance(exc, BodyWriteError) and exc.__cause__ is not None:
        return classify(exc.__cause__)
    return http1.request_error(exc, endpoint, timeout, answered)


def pwrite_all(fd: int, data: Any, offset: int) -> None:
    """pwrite every byte of ``data`` at ``offset``: a short write is continued, and a write that
    makes no progress is ENOSPC (never a hole that a later write could hide)."""
    view = memoryview(data)
    while len(view):
        done = os.pwrite(fd, view, offset)
        if done <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[done:]
        offset += done


def _drain(pipe: int, fd: int, n: int, offset: int) -> None:
    """Move ``n`` bytes from ``pipe`` into ``fd`` at ``offset`` (a failure is the writer's: ENOSPC...)."""
    try:
        while n:
            moved = os.splice(pipe, fd, n, offset_dst=offset)
            if moved <= 0:          # no progress: the disk is full (never a hole)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            n -= moved
            offset += moved
    except OSError as exc:
        raise BodyWriteError() from exc


class Splicer:
    """Moves body bytes socket -> pipe -> file in the kernel (``splice``): one copy, into the file's
    pages, where ``recv_into`` + ``pwrite`` make two (one into our buffer, one out of it).  Its own
    pipe, closed by :meth:`close` or once the splicer is dropped (never by another thread while
    a splice may use it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._out, self._in = os.pipe2(os.O_CLOEXEC)
        self.close = weakref.finalize(self, _close_pipe, self._out, self._in)
        with contextlib.suppress(OSError):      # a larger pipe: fewer splices (the default is 64 KiB)
            fcntl.fcntl(self._in, _F_SETPIPE_SZ, CHUNK)

    def move(self, sock: int, offset: int, want: int) -> int:
        """Up to ``want`` bytes from the socket ``sock`` into the file at ``offset`` (as many as have
        come: at least one; 0 once the peer closed).  A failure to write is a BodyWriteError."""
        got = os.splice(sock, self._in, want)       # blocks: the socket's SO_RCVTIMEO applies
        if got:
            _drain(self._out, self.fd, got, offset)
        return got


def _close_pipe(*ends: int) -> None:
    for end in ends:
        with contextlib.suppress(OSError):
            os.close(end)


# -- threads ---------------------------------------------------------------------------------------

_TRANSPORTS: weakref.WeakSet = weakref.WeakSet()    # every Transport of the process, for a fork


def body_start(status: int, headers: Headers, rest: bytes, begin: BodyStart,
               on_bytes: Callable[[int], None] | None) -> tuple[int, Any, int]:
    """After a GET's headers (both shells): its length (an answer without Content-Length is refused,
    retryable), the writer ``begin`` returns, and how many bytes of the body came with the headers
    (written to it)."""
    length = http1.content_length(headers)
    if length < 0:
        raise TransferError("response without Content-Length", retryable=True, status=status)
    writer = begin(status, headers, length)
    n = 0
    if rest:
        rest = rest[:length]
        written(writer, rest)
        n = len(rest)
        if on_bytes is not None:
            on_bytes(n)
    return length, writer, n


def _forget_connections_in_child() -> None:
    """A forked child's transports hold its parent's connections (the forking thread's): forget them
    (never close them: the parent still uses those sockets)."""
    for transport in list(_TRANSPORTS):
        transport._local = threading.local()
        transport._open = weakref.WeakSet()
        transport._newest = None


os.register_at_fork(after_in_child=_forget_connections_in_child)


class Transport:
    """Requests on thread-local keep-alive connections to one bucket's :class:`~manyfiles.s3.config.Route`.

    ``timeout``: the read timeout (seconds without a byte while one is awaited);
    ``connect_timeout``: the seconds a connection may take (default: ``timeout``)."""

    def __init__(self, route: Route, timeout: float, *, connect_timeout: float | None = None) -> None:
        self.route, self.timeout = route, timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self._local = threading.local()
        self._newest: socket.socket | None = None   # for abort() (a transport of one open() only)
        self._aborted = False
        self._open: weakref.WeakSet = weakref.WeakSet()     # every thread's connection, for interrupt()
        self._interrupts = 0
        _TRANSPORTS.add(self)

    @property
    def ep(self) -> Endpoint:
        return self.route.ep

    # -- requests ---------------------------------------------------------------------------------
    def request(self, method: str, path: str, query: str = "", extra: list[tuple[str, str]] = (), *,
                body: bytes | memoryview | FileBody | None = None, ok: tuple[int, ...] = (200,)) -> Answer:
        """One request whose answer is read whole; raises TransferError (any status not in ``ok``)."""
        try:
            status, headers, rest = self._drive(http1.exchange(self.route, method, path, list(extra), query,
                                                               body, ok))
            data = b"" if method == "HEAD" or status in (204, 304) else self._whole_body(headers, rest)
            if not http1.keeps_alive(headers):
                self._drop()
        except BaseException as exc:
            self._drop()
            err = self._error(exc)
            raise err from cause_of(err, exc)
        return Answer(status, headers, data)

    def fetch(self, path: str, extra: list[tuple[str, str]], query: str = "", *,
              ok: tuple[int, ...] = (200, 206), begin: BodyStart,
              on_bytes: Callable[[int], None] | None = None) -> tuple[int, Headers, int, Any]:
        """One GET whose body goes to the writer ``begin(status, headers, length)`` returns, block by
        block as received; returns (status, headers, bytes written, writer).  An answer without a
        Content-Length is refused (retryable)."""
        status = n = 0
        try:
            steps = http1.exchange(self.route, "GET", path, extra, query, None, ok)
            status, headers, rest = self._drive(steps)
            length, writer, n = body_start(status, headers, rest, begin, on_bytes)
            if n < length:
                sock, flags = self._local.sock, self._local.flags
                buf = self._buffer()
                view = memoryview(buf)
                while n < length:
                    got = sock.recv_into(view, min(CHUNK, length - n), flags)
                    if not got:
                        raise TransferError(f"truncated body: got {n} of {length} bytes", retryable=True,
                                            status=status)
                    written(writer, view[:got])
                    n += got
                    if on_bytes is not None:
                        on_bytes(got)
            if not http1.keeps_alive(headers):
                self._drop()
        except BaseException as exc:
            self._drop()
            err = self._error(exc, answered=status != 0)
            err.received = n          # type: ignore[attr-defined]  (for the trace)
            raise err from cause_of(err, exc)
        return status, headers, n, writer

    def open(self, method: str, path: str, extra: list[tuple[str, str]], query: str = "", *,
             ok: tuple[int, ...] = (200, 206),
             on_transport: Callable[[Transport], None] | None = None) -> Response:
        """Send one request on a connection of its own and return the response, body unread (a
        stream read block by block, possibly by another thread); raises TransferError for an
        answer not in ``ok``.  The connection is closed with the response.  ``on_transport`` is
        given the transport that sends the request, before it does: its :meth:`abort` ends the
        wait for the answer from another thread."""
        own = Transport(self.route, self.timeout, connect_timeout=self.connect_timeout)
        own._open = self._open          # its connection is this transport's to interrupt()
        if on_transport is not None:
            on_transport(own)
        try:
            status, headers, rest = own._drive(http1.exchange(self.route, method, path, list(extra), query,
                                                              None, ok))
        except BaseException as exc:
            own._drop()
            err = own._error(exc)
            raise err from cause_of(err, exc)
        sock, flags = own._local.sock, own._local.flags
        own._local.sock = None      # the response owns the socket now
        return Response(sock, flags, status, headers, rest, method == "HEAD", transport=own)

    def abort(self) -> None:
        """From another thread: the request :meth:`open` is sending or waiting on fails at once
        (its socket is shut down, as is any connection it makes after this)."""
        self._aborted = True
        sock = self._newest
        if sock is not None:
            _shut(sock)

    def interrupt(self) -> None:
        """From another thread: every request of this transport in flight now fails at once (their
        connections are shut down; later requests make new ones)."""
        self._interrupts += 1
        for sock in list(self._open):
            _shut(sock)

    def close(self) -> None:
        """Close this thread's connection."""
        self._drop()

    # -- the core's steps -------------------------------------------------------------------------
    def _drive(self, steps):
        reply = None
        while True:
            try:
                op = steps.send(reply)
            except StopIteration as done:
                return done.value
            reply = self._send(op) if op.__class__ is Send else self._error_body(op)

    def _send(self, op: Send) -> tuple[bytes, bytes] | None:
        if op.fresh:
            self._drop()
        local = self._local
        reused = getattr(local, "sock", None) is not None and local.ep is op.ep
        interrupts = self._interrupts
        sock = self._conn(op.ep)
        try:
            sock.sendall(op.data)
            if op.body is not None:
                self._send_body(sock, op.body)
            return self._read_head(sock)
        except (_Closed, ConnectionError):
            if not reused or interrupts != self._interrupts:
                raise
            self._drop()
            return None

    def _send_body(self, sock: socket.socket, body: Any) -> None:
        if not isinstance(body, FileBody):
            sock.sendall(body)
            return
        pos, end = body.offset, body.offset + body.size
        plain = sock.__class__ is socket.socket        # TLS has no sendfile: the bytes go through Python
        while pos < end:
            if plain:
                sent = os.sendfile(sock.fileno(), body.fd, pos, min(CHUNK, end - pos))
            else:
                data = os.pread(body.fd, min(CHUNK, end - pos), pos)
                sock.sendall(data)
                sent = len(data)
            if not sent:
                raise TransferError("the file to send got shorter while it was sent", retryable=False)
            pos += sent

    def _error_body(self, op: ErrorBody) -> bytes:
        sock = self._local.sock
        body = b""
        try:
            if op.want and not op.length_known:
                sock.settimeout(min(self.timeout, 5.0))
            while len(body) < op.want:     # the error document, for its <Code>
                more = sock.recv(op.want - len(body))
                if not more:
                    break
                body += more
        except OSError:
            pass
        finally:
            self._drop()
        return body

    def _read_head(self, sock: socket.socket) -> tuple[bytes, bytes]:
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                if not data:
                    raise _Closed("connection closed before the response head", retryable=True)
                raise TransferError("connection closed inside the response head", retryable=True)
            data += chunk
            got = http1.split_head(data)
            if got is not None:
                return got

    def _whole_body(self, headers: Headers, rest: bytes) -> bytes:
        length = http1.content_length(headers)
        sock = self._local.sock
        body = bytearray(rest)
        if length < 0 and headers.get("transfer-encoding", "").lower() == "chunked":
            return self._read_chunked(sock, body)
        if length < 0:          # until the server closes
            while more := sock.recv(1 << 20):
                body += more
            self._drop()
            return bytes(body)
        while len(body) < length:
            more = sock.recv(min(1 << 20, length - len(body)))
            if not more:
                raise TransferError(f"truncated body: got {len(body)} of {length} bytes", retryable=True)
            body += more
        return bytes(body[:length])

    def _read_chunked(self, sock: socket.socket, buf: bytearray) -> bytes:
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

    # -- connections ------------------------------------------------------------------------------
    def _conn(self, ep: Endpoint) -> socket.socket:
        local = self._local
        sock = getattr(local, "sock", None)
        if sock is not None and local.ep is not ep:   # the route moved (region redirect)
            self._drop()
            sock = None
        if sock is None:
            ssl_ctx = self.route.ssl_ctx if ep.scheme == "https" else None
            host, port = ep.proxy or (ep.connect_host, ep.port)
            try:
                sock = socket.create_connection((lookup_name(host), port), timeout=self.connect_timeout)
            except OSError as exc:
                err = http1.connect_error(exc, ep.name, self.connect_timeout)
                raise err from cause_of(err, exc)
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ep.proxy and ssl_ctx is not None:
                sock.sendall(http1.connect_request(ep))
                http1.check_tunnel(self._read_head(sock)[0])
            if ssl_ctx is not None:
                sock = ssl_ctx.wrap_socket(sock, server_hostname=ep.connect_host)
                local.flags = 0
            else:
                # Blocking mode with kernel timeouts, so that MSG_WAITALL fills the whole buffer in
                # one recv: 16x fewer syscalls and GIL hand-offs than recv()'s ~64 KiB pieces.
                sock.settimeout(None)
                tv = struct.pack("ll", int(self.timeout), int((self.timeout % 1) * 1e6))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
                local.flags = socket.MSG_WAITALL
            local.sock = sock
            local.ep = ep
            self._newest = sock
            self._open.add(sock)
            if self._aborted:       # abort() ran while this connection was being made
                _shut(sock)
        return sock

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

    def _error(self, exc: BaseException, answered: bool = False) -> TransferError:
        """The TransferError of a request that failed (``answered``: its response had begun)."""
        return request_failure(exc, self.route.ep.name, self.timeout, answered)


class Response:
    """One response whose body is read by the caller (:meth:`Transport.open`): ``status``,
    ``headers`` (lower-case names), ``length`` (Content-Length), :meth:`readinto` / :meth:`read`
    until the body ends, then :meth:`close`.  Short bodies and socket errors raise retryable
    TransferErrors."""

    def __init__(self, sock, flags: int, status: int, headers: Headers, rest: bytes,
                 head_only: bool = False, *, transport: Transport) -> None:
        self.sock, self.flags, self.status, self.headers = sock, flags, status, headers
        self._transport = transport
        self._lock = threading.Lock()
        self._reading = False       # a thread is in _take: the socket's fd stays open until it leaves
        self.length = http1.content_length(headers) if not head_only else 0
        if self.length < 0:
            self.close()
            raise TransferError("response without Content-Length", retryable=True, status=status)
        self._rest = memoryview(rest)[: self.length]
        self.remaining = self.length

    def readinto(self, view) -> int:
        """Fill ``view`` with up to ``len(view)`` bytes of the body (fewer only at its end); 0 at the end."""
        def rest(n: int, k: int) -> None:
            view[n:n + k] = self._rest[:k]

        return self._take(min(len(view), self.remaining), rest,
                          lambda sock, n, k: sock.recv_into(view[n:n + k], k, self.flags))

    @property
    def spliceable(self) -> bool:
        """Can :meth:`land` move this body in the kernel (plain HTTP, not TLS)?"""
        return self.sock.__class__ is socket.socket

    def land(self, splicer: Splicer, offset: int, want: int) -> int:
        """Move up to ``want`` bytes of the body into ``splicer`` 's file at ``offset`` (fewer only at
        its end; 0 at the end): the bytes that came with the head are written, the rest spliced.  A
        failure to write is the file's error (ENOSPC...), not the network's."""
        def rest(n: int, k: int) -> None:
            try:
                pwrite_all(splicer.fd, self._rest[:k], offset + n)
            except OSError as exc:
                raise BodyWriteError() from exc

        return self._take(min(want, self.remaining), rest,
                          lambda sock, n, k: splicer.move(sock.fileno(), offset + n, k))

    def _take(self, want: int, rest: Callable[[int, int], None], move: Callable[[Any, int, int], int]) -> int:
        """``want`` bytes of the body: first those that came with the head (``rest(at, k)``), then
        from the socket (``move(sock, at, k)`` -> bytes moved, 0 once the peer closed)."""
        n = 0
        with self._lock:
            sock, self._reading = self.sock, True
        try:
            if self._rest and want:
                n = min(want, len(self._rest))
                rest(0, n)
                self._rest = self._rest[n:]
            while n < want:
                if self.sock is None:
                    raise TransferError("the response was closed", retryable=True, status=self.status)
                got = move(sock, n, want - n)
                if not got:
                    raise TransferError(f"truncated body: got {self.length - self.remaining + n} of "
                                        f"{self.length} bytes", retryable=True, status=self.status)
                n += got
        except BaseException as exc:
            self.close()
            err = self._transport._error(exc, answered=True)
            raise err from cause_of(err, exc)
        finally:
            with self._lock:
                self._reading = False
                closed_meanwhile = sock is not None and self.sock is None
            if closed_meanwhile:
                _release(sock)
        self.remaining -= n
        return n

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the body (fewer only at its end; b"" at the end)."""
        buf = bytearray(min(n, self.remaining))
        got = self.readinto(memoryview(buf))
        return bytes(buf) if got == len(buf) else bytes(buf[:got])

    def close(self) -> None:
        """Close the connection; a thread blocked reading the body (a stalled server) returns at
        once: the socket is shut down first.  Its fd is released by that thread as it leaves, never
        under it: a read that took the fd's number just before would otherwise read whichever
        connection opened next under that number (and take that response's body)."""
        with self._lock:
            sock, self.sock = self.sock, None
            reading = self._reading
        if sock is not None:
            _shut(sock)
            if not reading:
                _release(sock)


def _release(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


# -- a loop ----------------------------------------------------------------------------------------

class AsyncConnection:
    """One keep-alive connection on a :class:`~manyfiles.s3.config.Route`, for one coroutine at a
    time; reopened after any error, a ``Connection: close``, or when the route moved.  The twin of
    :class:`Transport`: ``request`` and ``fetch``, awaited.  (Its methods import asyncio: a pull on
    threads never loads it, ~10 ms of start-up.)"""

    def __init__(self, route: Route, timeout: float, *, connect_timeout: float | None = None) -> None:
        self.route, self.timeout = route, timeout
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout
        self.ep: Endpoint = route.ep
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    # -- requests ---------------------------------------------------------------------------------
    async def request(self, method: str, path: str, query: str = "", extra: list[tuple[str, str]] = (), *,
                      body: bytes | None = None, ok: tuple[int, ...] = (200,)) -> Answer:
        """One request whose answer is read whole (Content-Length bodies); raises TransferError."""
        import asyncio

        try:
            status, headers, rest = await self._drive(http1.exchange(self.route, method, path, list(extra),
                                                                     query, body, ok))
            data = b""
            if method != "HEAD" and status not in (204, 304):
                length = http1.content_length(headers)
                if length < 0:
                    raise TransferError("response without Content-Length", retryable=True, status=status)
                data = bytes(rest[:length])
                if len(data) < length:
                    data += await asyncio.wait_for(self.reader.readexactly(length - len(data)), self.timeout)
            if not http1.keeps_alive(headers):
                self.close()
        except BaseException as exc:
            self.close()
            if not isinstance(exc, Exception):     # cancelled, or the coroutine closed
                raise
            err = self._error(exc)
            raise err from cause_of(err, exc)
        return Answer(status, headers, data)

    async def fetch(self, path: str, extra: list[tuple[str, str]], query: str = "", *,
                    ok: tuple[int, ...] = (200, 206), begin: BodyStart,
                    on_bytes: Callable[[int], None] | None = None) -> tuple[int, Headers, int, Any]:
        """The twin of :meth:`Transport.fetch`."""
        import asyncio

        status = n = 0
        try:
            status, headers, rest = await self._drive(http1.exchange(self.route, "GET", path, extra, query,
                                                                     None, ok))
            length, writer, n = body_start(status, headers, rest, begin, on_bytes)
            reader = self.reader
            while n < length:
                chunk = await asyncio.wait_for(reader.read(min(CHUNK, length - n)), self.timeout)
                if not chunk:
                    raise TransferError(f"truncated body: got {n} of {length} bytes", retryable=True,
                                        status=status)
                written(writer, chunk)
                n += len(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            if not http1.keeps_alive(headers):
                self.close()
        except BaseException as exc:
            self.close()
            if not isinstance(exc, Exception):     # cancelled, or the coroutine closed
                raise
            err = self._error(exc, answered=status != 0)
            err.received = n          # type: ignore[attr-defined]  (for the trace)
            raise err from cause_of(err, exc)
        return status, headers, n, writer

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    # -- the core's steps -------------------------------------------------------------------------
    async def _drive(self, steps):
        reply = None
        while True:
            try:
                op = steps.send(reply)
            except StopIteration as done:
                return done.value
            reply = await (self._send(op) if op.__class__ is Send else self._error_body(op))

    async def _send(self, op: Send) -> tuple[bytes, bytes] | None:
        import asyncio

        if op.fresh or (self.writer is not None and self.ep is not op.ep):
            self.close()
        reused = self.writer is not None
        if not reused:
            await self._connect(op.ep)
        self.writer.write(op.data)
        if op.body is not None:
            self.writer.write(bytes(op.body))
        try:
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), self.timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                raise
            self.close()
            return None
        except asyncio.LimitOverrunError as exc:
            raise TransferError("response head too large", retryable=True) from exc
        return head, b""

    async def _error_body(self, op: ErrorBody) -> bytes:
        import asyncio

        body = b""
        if op.want:
            with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
                if op.length_known:
                    body = await asyncio.wait_for(self.reader.readexactly(op.want), self.timeout)
                else:
                    body = await asyncio.wait_for(self.reader.read(op.want), min(self.timeout, 5.0))
        self.close()   # keep-alive after an error is not worth the risk
        return body

    async def _connect(self, ep: Endpoint) -> None:
        """:meth:`_open`, within the connect timeout (a NetworkError otherwise)."""
        import asyncio

        try:
            await asyncio.wait_for(self._open(ep), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            self.close()
            err = http1.connect_error(exc, ep.name, self.connect_timeout)
            raise err from cause_of(err, exc)

    async def _open(self, ep: Endpoint) -> None:
        import asyncio

        self.ep = ep
        ssl_ctx = self.route.ssl_ctx if ep.scheme == "https" else None
        if ep.proxy:
            self.reader, self.writer = await asyncio.open_connection(*ep.proxy, limit=1 << 20)
            if ssl_ctx is not None:
                self.writer.write(http1.connect_request(ep))
                http1.check_tunnel(await self.reader.readuntil(b"\r\n\r\n"))
                await self.writer.start_tls(ssl_ctx, server_hostname=ep.connect_host)
            return
        self.reader, self.writer = await asyncio.open_connection(
            ep.connect_host, ep.port, ssl=ssl_ctx, server_hostname=ep.connect_host if ssl_ctx else None,
            limit=1 << 20)

    def _error(self, exc: BaseException, answered: bool = False) -> TransferError:
        return request_failure(exc, self.ep.name, self.timeout, answered)


__all__ = ["CHUNK", "Answer", "AsyncConnection", "BodyStart", "BodyWriteError", "Response", "Transport",
           "body_start", "lookup_name", "request_failure", "written"]
