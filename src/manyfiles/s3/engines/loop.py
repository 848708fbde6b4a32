"""The ``loop`` engine: whole-object GETs on one thread over many non-blocking keep-alive connections.

Small objects cost per request, not per byte.  The thread pools pay that cost on 48 threads that
hand the GIL to each other at every system call (a send, a receive, the install), and whose file
creations in one folder contend for its lock.  Here one thread multiplexes ``connections``
sockets with epoll: each GET goes through the same sans-IO core (:func:`manyfiles.s3.http1.exchange`:
signing, redirect-once, a closed keep-alive sent again, error documents, clock skew), its body is
checked by the same :class:`~manyfiles.s3.transfer.WholeBody` and installed by the same
:func:`~manyfiles.s3.engines.base.finish`, on this thread: one send and one receive per object,
nothing to hand over.

Timeouts are the transport's: ``connect_timeout`` for a connection, ``read_timeout`` without a byte
while an answer is awaited; every failure is retried under the run's
:class:`~manyfiles.s3.retry.RetryPolicy` (the same two budgets as :func:`manyfiles._core.retry.retrying`,
backoff on a timer, never a sleep).  What the loop does not speak is sent to the ``lean`` thread pool
(:class:`~manyfiles.s3.engines.threads.ThreadsEngine`): TLS and proxies (every job then), and
objects whose multipart ETag needs its part sizes learnt first.

The connections are :class:`Connections`, shared with :class:`PutLoop`: s3push's small PUTs (a
body sent with its head) on the same one thread, their outcomes handled there.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from manyfiles._core.retry import Tries
from manyfiles.errors import TransferError
from manyfiles.s3 import http1
from manyfiles.s3.engines.base import Ctx, Engine, Failed, cancelled, finish, open_target
from manyfiles.s3.engines.events import Batch, JobDone, JobFailed, Retried
from manyfiles.s3.retry import classify
from manyfiles.s3.store import store_for
from manyfiles.s3.transfer import Download, needs_layout
from manyfiles.s3.transport import BodyWriteError, body_start, lookup_name, request_failure, written

RECV = 1 << 16
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT

# the phases of a connection
_IDLE, _CONNECTING, _SENDING, _HEAD, _BODY, _ERROR_BODY = range(6)


class _Closed(TransferError):
    """A reused connection closed before any byte of the answer (an idle keep-alive the server
    dropped): the exchange sends the request again on a new one."""


class _Get:
    """One job on its way: its target (a GET's file; a PUT's body), its tries (the retry policy's
    book-keeping) and, while an attempt is on a connection, the exchange's steps and the body's writer."""

    __slots__ = ("job", "keep", "length", "n", "status", "steps", "target", "tries", "whole", "writer")

    def __init__(self, job, target, tries: Tries) -> None:
        self.job, self.target, self.tries = job, target, tries
        self.steps = self.whole = self.writer = None
        self.status = self.n = self.length = 0
        self.keep = True


class _Conn:
    """One keep-alive connection and the attempt it carries (``get``), if any."""

    __slots__ = ("addrs", "buf", "deadline", "ep", "fd", "get", "mask", "out", "phase", "reused",
                 "sock", "want")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.fd = -1
        self.ep = None
        self.get: _Get | None = None
        self.phase = _IDLE
        self.buf = b""
        self.out = b""
        self.deadline = 0.0
        self.mask = 0
        self.reused = False
        self.want = 0
        self.addrs: list = []


class _Outbox:
    """The run's :class:`~manyfiles.s3.engines.base.Ctx` as the loop thread sees it: the outcomes and
    retries of one turn of the loop are held and handed to the consumer as one :class:`Batch`
    (:meth:`send`), so that its thread wakes once a turn, not once an object."""

    def __init__(self, ctx: Ctx) -> None:
        self.run = ctx
        self.options, self.sink, self.cancel, self.bytes = ctx.options, ctx.sink, ctx.cancel, ctx.bytes
        self.held: list = []

    def done(self, job, outcome) -> None:
        self.held.append(JobDone(job, outcome))

    def failed(self, job, outcome) -> None:
        self.held.append(JobFailed(job, outcome))

    def retried(self, job, reason: str) -> None:
        self.held.append(Retried(job, reason))

    def send(self) -> None:
        if self.held:
            self.run.events.put(Batch(tuple(self.held)))
            self.held = []


class Connections:
    """One thread multiplexing up to ``connections`` keep-alive sockets to ``store``'s endpoint, each
    job's requests driven through :func:`manyfiles.s3.http1.exchange` and retried under the store's
    policy (see the module docstring).  A subclass says what a job's request is (:meth:`_take`,
    :meth:`_request`) and what its outcome does (:meth:`_outcome`, :meth:`_gone`); ``ctx`` is its
    outbox (``cancel``, ``send()``, ``bytes(n)``)."""

    name = "loop"

    def _open_loop(self, ctx, store, connections: int, thread_name: str) -> None:
        self.ctx, self.store, self.connections = ctx, store, max(1, connections)
        self.route = store.route
        self.timeout = store.settings.read_timeout
        self.connect_timeout = store.settings.connect_timeout
        self._incoming: collections.deque = collections.deque()
        self._closing = self._killed = self._ended = False
        self._broken: Failed | None = None
        self._sleeping = False
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._ep = select.epoll()
        self._ep.register(self._wake, _IN)
        self._conns = [_Conn() for _ in range(self.connections)]
        self._free = list(self._conns)          # connections without a job (open or not)
        self._by_fd: dict[int, _Conn] = {}
        self._timers: list = []                 # (when, seq, _Get): a retry's backoff
        self._seq = 0
        self._busy = 0                          # jobs on a connection or waiting for their retry
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    # -- what a subclass says -------------------------------------------------------------------------
    def _take(self, job) -> _Get | None:
        """The job on its way (on the loop thread, when a connection is free), or None: settled already."""
        raise NotImplementedError

    def _request(self, get: _Get):
        """One attempt's request: its ``method``, ``path``, ``extra``, ``body``, ``begin``, ``finished``,
        ``failed`` (:meth:`~manyfiles.s3.store.S3Store.whole_get`'s, :meth:`~...whole_put`'s)."""
        raise NotImplementedError

    def _outcome(self, get: _Get, fetched, error: BaseException | None) -> None:
        """The job's end: ``fetched`` (what ``finished`` returned) or its final ``error``."""
        raise NotImplementedError

    def _gone(self, job, target, failed: Failed | None) -> None:
        """The run stopped (``failed``: the loop broke) before ``job`` ended."""
        raise NotImplementedError

    # -- the producer's side ------------------------------------------------------------------------
    @staticmethod
    def speaks(route) -> bool:
        """Whether the loop speaks to ``route``'s endpoint (plain HTTP, no proxy)."""
        ep = route.ep
        return ep.scheme == "http" and not ep.proxy

    def submit(self, job) -> None:
        self._incoming.append(job)
        if self._sleeping:
            self._poke()
        elif self._broken is not None:      # the loop is gone: nothing would ever take it
            self._abandon(self._broken)

    def _poke(self) -> None:
        self._sleeping = False
        if self._ended:         # (its eventfd is closed, its number maybe another file's now)
            return
        with contextlib.suppress(OSError):     # (closed: the loop ended)
            os.eventfd_write(self._wake, 1)

    def close(self) -> None:
        self._closing = True
        self._poke()
        self._thread.join()

    def kill(self) -> None:
        self.ctx.cancel.set()
        self._killed = True
        self._poke()
        self._thread.join()

    # -- the loop -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:        # a bug: every job still here fails, none is lost
            self._broken = Failed(f"internal error: {type(exc).__name__}: {exc}", "internal")
            self._abandon(self._broken)
        finally:
            self._ended = True
            self._abandon(self._broken)     # (what came after the loop's last turn)
            for conn in self._conns:
                self._drop(conn)
            self._ep.close()
            os.close(self._wake)

    def _loop(self) -> None:
        ctx, incoming, free, by_fd, poll, wake = (self.ctx, self._incoming, self._free, self._by_fd,
                                                  self._ep.poll, self._wake)
        scan = min(0.25, self.timeout / 4, self.connect_timeout / 4)
        next_scan = time.monotonic() + scan
        while True:
            if self._killed or ctx.cancel.is_set():
                self._abandon(None)
                return
            now = time.monotonic()
            timers = self._timers
            while timers and timers[0][0] <= now and free:
                self._attempt(heapq.heappop(timers)[2], free.pop())
            while incoming and free:
                get = self._take(incoming.popleft())
                if get is not None:
                    self._busy += 1
                    self._attempt(get, free.pop())
            if self._closing and not incoming and not self._busy:
                return
            wait = next_scan - now
            if timers:
                wait = min(wait, timers[0][0] - now)
            if incoming and free:
                wait = 0
            ctx.send()
            self._sleeping = True
            if incoming and free:       # (submitted after the check above)
                wait = 0
            events = poll(max(0.0, wait))
            self._sleeping = False
            for fd, mask in events:
                if fd == wake:
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(wake)
                    continue
                conn = by_fd.get(fd)
                if conn is not None:
                    self._ready(conn, mask)
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + scan
                for conn in self._conns:
                    if conn.get is not None and conn.deadline and now >= conn.deadline:
                        self._timed_out(conn)

    # -- one attempt ----------------------------------------------------------------------------------
    def _attempt(self, get: _Get, conn: _Conn) -> None:
        if self.ctx.cancel.is_set():
            self._busy -= 1
            self._gone(get.job, get.target, None)
            self._free.append(conn)
            return
        get.whole = whole = self._request(get)
        get.steps = http1.exchange(self.route, whole.method, whole.path, whole.extra, "", whole.body, (200,))
        get.writer = None
        get.status = get.n = 0
        conn.get = get
        self._step(conn, None)

    def _step(self, conn: _Conn, reply) -> None:
        """Feed the exchange ``reply`` and do what it asks next (or begin the body once it answered)."""
        get = conn.get
        try:
            op = get.steps.send(reply)
        except StopIteration as done:
            status, headers, rest = done.value
            self._body(conn, status, headers, rest)
            return
        except Exception as exc:
            self._failed(conn, exc)
            return
        if op.__class__ is http1.Send:
            self._send(conn, op)
        else:
            conn.phase, conn.want, conn.buf = _ERROR_BODY, op.want, b""
            conn.deadline = time.monotonic() + (self.timeout if op.length_known else min(self.timeout, 5.0))
            if op.want == 0:
                self._error_body_read(conn)

    def _send(self, conn: _Conn, op: http1.Send) -> None:
        if conn.sock is not None and (op.fresh or conn.ep is not op.ep):
            self._drop(conn)
        conn.out, conn.buf = op.data if op.body is None else op.data + bytes(op.body), b""
        if conn.sock is None:
            conn.addrs = []         # (the endpoint's addresses, looked up again: it may have moved)
            try:
                self._connect(conn, op.ep)
            except OSError as exc:
                self._failed(conn, http1.connect_error(exc, op.ep.name, self.connect_timeout))
            return
        self._flush(conn)

    def _connect(self, conn: _Conn, ep) -> None:
        if not conn.addrs:
            conn.addrs = [(ai[0], ai[4]) for ai in socket.getaddrinfo(lookup_name(ep.connect_host), ep.port,
                                                                       type=socket.SOCK_STREAM)]
        family, addr = conn.addrs.pop(0)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock, conn.fd, conn.ep, conn.reused = sock, sock.fileno(), ep, False
        self._by_fd[conn.fd] = conn
        err = sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
        conn.phase = _CONNECTING
        conn.deadline = time.monotonic() + self.connect_timeout
        self._watch(conn, _OUT)

    def _watch(self, conn: _Conn, mask: int) -> None:
        if conn.mask == mask:
            return
        if conn.mask:
            self._ep.modify(conn.fd, mask)
        else:
            self._ep.register(conn.fd, mask)
        conn.mask = mask

    def _flush(self, conn: _Conn) -> None:
        """Send what is left of the request; then wait for the answer's head."""
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._head_lost(conn, exc)
            return
        conn.out = conn.out[sent:]
        conn.deadline = time.monotonic() + self.timeout
        if conn.out:
            conn.phase = _SENDING
            self._watch(conn, _OUT)
        else:
            conn.phase = _HEAD
            self._watch(conn, _IN)

    def _ready(self, conn: _Conn, mask: int) -> None:
        phase = conn.phase
        if phase == _CONNECTING:
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._connect_failed(conn, OSError(err, os.strerror(err)))
                return
            conn.addrs = []
            self._flush(conn)
        elif phase == _SENDING:
            self._flush(conn)
        elif phase == _HEAD:
            self._head_read(conn)
        elif phase == _BODY:
            self._body_read(conn)
        elif phase == _ERROR_BODY:
            self._error_body_read(conn)
        else:       # an idle keep-alive the server closed (or sent something unasked): drop it
            self._drop(conn)

    def _connect_failed(self, conn: _Conn, exc: OSError) -> None:
        self._drop(conn)
        if conn.addrs:          # another address of the name (IPv6, then IPv4...)
            try:
                self._connect(conn, conn.ep)
                return
            except OSError as again:
                exc = again
        err = http1.connect_error(exc, conn.ep.name, self.connect_timeout)
        self._failed(conn, err)

    def _head_read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(RECV)
        except BlockingIOError:
            return
        except OSError as exc:
            self._head_lost(conn, exc)
            return
        if not chunk:
            self._head_lost(conn, None)
            return
        conn.buf += chunk
        conn.deadline = time.monotonic() + self.timeout
        try:
            got = http1.split_head(conn.buf)
        except TransferError as exc:
            self._failed(conn, exc)
            return
        if got is not None:
            conn.buf = b""
            self._step(conn, got)

    def _head_lost(self, conn: _Conn, exc: OSError | None) -> None:
        """The connection ended before a whole head: a reused one, before any byte, is sent again."""
        if conn.reused and not conn.buf and (exc is None or isinstance(exc, ConnectionError)):
            self._drop(conn)
            self._step(conn, None)
            return
        if exc is None:
            exc = _Closed("connection closed before the response head" if not conn.buf
                          else "connection closed inside the response head", retryable=True)
        self._failed(conn, exc)

    def _body(self, conn: _Conn, status: int, headers, rest: bytes) -> None:
        get = conn.get
        get.status = status
        try:
            get.length, get.writer, get.n = body_start(status, headers, rest, get.whole.begin,
                                                       self.ctx.bytes)
        except Exception as exc:
            self._failed(conn, exc)
            return
        get.keep = http1.keeps_alive(headers)
        if get.n >= get.length:
            self._finished(conn)
            return
        conn.phase = _BODY
        conn.deadline = time.monotonic() + self.timeout
        self._watch(conn, _IN)

    def _body_read(self, conn: _Conn) -> None:
        get = conn.get
        try:
            chunk = conn.sock.recv(min(RECV, get.length - get.n))
        except BlockingIOError:
            return
        except OSError as exc:
            self._failed(conn, exc)
            return
        if not chunk:
            self._failed(conn, TransferError(f"truncated body: got {get.n} of {get.length} bytes",
                                             retryable=True, status=get.status))
            return
        try:
            written(get.writer, chunk)
        except BodyWriteError as exc:
            self._failed(conn, exc)
            return
        get.n += len(chunk)
        self.ctx.bytes(len(chunk))
        conn.deadline = time.monotonic() + self.timeout
        if get.n >= get.length:
            self._finished(conn)

    def _error_body_read(self, conn: _Conn) -> None:
        more = b""
        if conn.want > len(conn.buf):
            try:
                more = conn.sock.recv(conn.want - len(conn.buf))
            except BlockingIOError:
                return
            except OSError:
                more = b""
            conn.buf += more
        if more and len(conn.buf) < conn.want:
            conn.deadline = time.monotonic() + min(self.timeout, 5.0)
            self._watch(conn, _IN)
            return
        body, conn.buf = conn.buf, b""
        self._drop(conn)        # keep-alive after an error is not worth the risk
        self._step(conn, body)

    def _timed_out(self, conn: _Conn) -> None:
        if conn.phase == _ERROR_BODY:       # what came of the error document is enough
            body, conn.buf = conn.buf, b""
            self._drop(conn)
            self._step(conn, body)
        elif conn.phase == _CONNECTING:
            self._connect_failed(conn, TimeoutError(errno.ETIMEDOUT, "timed out"))
        else:
            self._failed(conn, TimeoutError(errno.ETIMEDOUT, "timed out"))

    # -- outcomes -------------------------------------------------------------------------------------
    def _finished(self, conn: _Conn) -> None:
        get = conn.get
        if not get.keep:
            self._drop(conn)
        conn.reused = conn.sock is not None
        try:
            fetched = get.whole.finished(get.status, get.n, get.writer)
        except Exception as exc:
            self._failed(conn, exc, answered=True)
            return
        self._release(conn)
        self._busy -= 1
        self._outcome(get, fetched, None)

    def _failed(self, conn: _Conn, exc: BaseException, answered: bool | None = None) -> None:
        """An attempt failed: its connection is dropped, the job tried again after its backoff, or
        it failed (the retry policy's decision, as :func:`~manyfiles._core.retry.retrying` makes it)."""
        get = conn.get
        if answered is None:
            answered = get.status != 0
        self._drop(conn)
        self._release(conn)
        err = request_failure(exc, (conn.ep or self.route.ep).name, self.timeout, answered)
        err.received = get.n          # type: ignore[attr-defined]  (for the trace)
        err = get.whole.failed(err) or err
        try:
            if self.ctx.cancel.is_set():
                raise err
            delay = get.tries.failed(err)
        except Exception as final:
            self._busy -= 1
            self._outcome(get, None, final if isinstance(final, TransferError) else err)
            return
        self._seq += 1
        heapq.heappush(self._timers, (time.monotonic() + delay, self._seq, get))

    def _release(self, conn: _Conn) -> None:
        conn.get = None
        conn.phase = _IDLE
        conn.deadline = 0.0
        self._free.append(conn)

    def _drop(self, conn: _Conn) -> None:
        sock = conn.sock
        if sock is None:
            return
        self._by_fd.pop(conn.fd, None)
        if conn.mask:
            with contextlib.suppress(OSError, ValueError):
                self._ep.unregister(conn.fd)
        sock.close()
        conn.sock, conn.fd, conn.mask, conn.reused = None, -1, 0, False

    def _abandon(self, failed: Failed | None) -> None:
        """The run stopped (or the loop broke): every job here is gone (a GET's temp file removed)."""
        gets = [c.get for c in self._conns if c.get is not None] + [t[2] for t in self._timers]
        for conn in self._conns:
            conn.get = None
        self._timers = []
        for get in gets:
            self._gone(get.job, get.target, failed)
        while True:
            try:
                job = self._incoming.popleft()
            except IndexError:
                break
            self._gone(job, None, failed)
        self._busy = 0
        self.ctx.send()


class LoopEngine(Connections, Engine):
    """Whole-object GETs on one thread and up to ``connections`` sockets (see the module docstring);
    ``elsewhere(job)`` takes the jobs it does not speak (the run's lean pool)."""

    def __init__(self, ctx: Ctx, connections: int, elsewhere: Callable[[Download], None]) -> None:
        opts = ctx.options
        store = store_for(opts.settings, opts.bucket, retry=opts.retry, verify=opts.verify,
                          checksum_mode=opts.checksum_mode, cancel=ctx.cancel)
        self._elsewhere = elsewhere
        self._open_loop(_Outbox(ctx), store, connections, "s3pull-loop")

    def submit(self, job) -> None:
        if not self.speaks(self.route) or needs_layout(job.size, job.etag, self.ctx.options.verify):
            self._elsewhere(job)
            return
        super().submit(job)

    def _take(self, job) -> _Get | None:
        target = open_target(self.ctx, job)
        if target is None:
            return None
        ctx = self.ctx
        return _Get(job, target, Tries(ctx.options.retry, classify=classify, reset=target.reset,
                                       on_retry=lambda err: ctx.retried(job, str(err))))

    def _request(self, get: _Get):
        job = get.job
        return self.store.whole_get(job.key, get.target, etag=job.etag, size=job.size)

    def _outcome(self, get: _Get, fetched, error: BaseException | None) -> None:
        finish(self.ctx, get.job, get.target, self.name, fetched, error)

    def _gone(self, job, target, failed: Failed | None) -> None:
        if target is not None:
            target.abort()
        self.ctx.failed(job, failed) if failed is not None else cancelled(self.ctx, job)


class _Quiet:
    """The outbox of a loop whose outcomes are handled on its own thread: only the cancel flag."""

    def __init__(self, cancel: threading.Event) -> None:
        self.cancel = cancel

    def send(self) -> None:
        pass

    def bytes(self, n: int) -> None:
        pass


class PutLoop(Connections):
    """Small PUTs on one thread over up to ``connections`` keep-alive sockets (see the module
    docstring): one send and one receive per object, retried under ``store``'s policy.

    ``prepare(item)`` (on the loop thread, when a connection is free) returns the PUT of ``item``,
    ``(key, body, checksum, content_md5)`` as :meth:`~manyfiles.s3.store.S3Store.put` takes them,
    or None when it settled ``item`` itself; ``settle(item, result, error)`` is told the outcome of
    every item submitted, on the loop thread: the :class:`~manyfiles.s3.store.PutResult`, or the
    final error, or neither (the run stopped first: ``cancel``)."""

    def __init__(self, store, connections: int, cancel: threading.Event,
                 prepare: Callable[[object], tuple | None],
                 settle: Callable[[object, object, BaseException | None], None]) -> None:
        self._prepare, self._settle = prepare, settle
        self._open_loop(_Quiet(cancel), store, connections, "s3push-loop")

    def submit(self, job) -> None:
        super().submit(job)
        if self._ended:         # (the loop stopped: nothing would take it)
            self._abandon(self._broken)

    def _take(self, job) -> _Get | None:
        put = self._prepare(job)
        if put is None:
            return None
        return _Get(job, put, Tries(self.store.retry, classify=classify, on_retry=self.store.on_retry))

    def _request(self, get: _Get):
        key, body, checksum, content_md5 = get.target
        return self.store.whole_put(key, body, checksum=checksum, content_md5=content_md5)

    def _outcome(self, get: _Get, fetched, error: BaseException | None) -> None:
        self._settle(get.job, fetched, error)

    def _gone(self, job, target, failed: Failed | None) -> None:
        self._settle(job, None, None if failed is None else TransferError(failed.reason, retryable=False))
