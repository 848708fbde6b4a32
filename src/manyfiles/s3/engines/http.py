"""The ``http`` engine: a lean HTTP/1.1 GetObject client on asyncio streams.

Small objects are bound by client CPU per request, not by bandwidth: botocore and
aiobotocore spend ~1-3 ms of CPU on each GET (request building, signing, event hooks,
response parsing), which caps one Python process at a few hundred small objects a second.
This engine does only what a GET needs: SigV4 signing by hand (:mod:`manyfiles.s3.sigv4`,
on the configuration botocore resolved), one keep-alive connection per worker coroutine,
Content-Length bodies written straight into the temp file and checked by the same
:class:`~manyfiles.s3.transfer.WholeBody` as every other engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.http1 import (
    ClockSkewed,
    RegionRedirect,
    http_error,
    parse_head,
    request_head,
    request_target,
)
from manyfiles.s3.layouts import alearn_layout
from manyfiles.s3.retry import (
    RetryPolicy,
    TransferError,
    answered,
    cause_of,
    classify,
    network_error,
    tls_refusal,
)
from manyfiles.s3.sigv4 import Endpoint, Route, uri_path
from manyfiles.s3.transfer import CHUNK, Fetched, Job, WholeBody, needs_layout
from manyfiles.trace import iotrace


class _Conn:
    """One keep-alive connection on a :class:`Route`; reopened after any error, a
    `Connection: close`, or when the route moved.  ``connect_timeout``: the seconds a new
    connection (and a proxy's CONNECT, and the TLS handshake) may take."""

    def __init__(self, route: Route, connect_timeout: float) -> None:
        self.route = route
        self.connect_timeout = connect_timeout
        self.answered = False
        self.ep: Endpoint = route.ep
        self.signed: list[tuple[str, str]] = []    # the last request's headers
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def connect(self) -> None:
        """:meth:`open`, within the connect timeout (a NetworkError otherwise)."""
        try:
            await asyncio.wait_for(self.open(), self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            self.close()
            err = network_error(exc, self.ep.name, waited=f"connecting, {self.connect_timeout:g} s")
            if err is None:
                raise
            raise err from exc

    async def open(self) -> None:
        self.ep = ep = self.route.ep
        ssl_ctx = self.route.ssl_ctx if ep.scheme == "https" else None
        if ep.proxy:
            self.reader, self.writer = await asyncio.open_connection(*ep.proxy, limit=1 << 20)
            if ssl_ctx is not None:
                self.writer.write(f"CONNECT {ep.connect_host}:{ep.port} HTTP/1.1\r\n"
                                  f"Host: {ep.connect_host}:{ep.port}\r\n\r\n".encode())
                status, _ = parse_head(await self.reader.readuntil(b"\r\n\r\n"))
                if status != 200:
                    raise TransferError(f"proxy refused CONNECT (HTTP {status})", retryable=False)
                await self.writer.start_tls(ssl_ctx, server_hostname=ep.connect_host)
            return
        self.reader, self.writer = await asyncio.open_connection(
            ep.connect_host, ep.port, ssl=ssl_ctx, server_hostname=ep.connect_host if ssl_ctx else None,
            limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _exchange(conn: _Conn, method: str, path: str, extra: list, query: str, timeout: float):
    """Send one request, read the response head: (status, headers).  A region redirect is
    followed once (the route moves, the request is signed again)."""
    for redirected in (False, True):
        status, headers = await _send(conn, method, path, extra, query, timeout)
        if status in (301, 307, 400) and not redirected:
            err = await _error_for(conn, status, headers, method, timeout)
            if isinstance(err, RegionRedirect):
                conn.route.relocate(err.region)
                continue
            raise err
        return status, headers
    raise AssertionError("unreachable")


async def _send(conn: _Conn, method: str, path: str, extra: list, query: str, timeout: float):
    if conn.writer is not None and conn.ep is not conn.route.ep:
        conn.close()
    reused = conn.writer is not None
    if not reused:
        await conn.connect()
    ep = conn.ep
    conn.signed = conn.route.signer.headers(ep.host, path, extra, query=query, method=method)
    request = request_head(method, request_target(ep, path, query), conn.signed)
    conn.writer.write(request)
    try:
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), timeout)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
            raise
        # the server closed an idle keep-alive connection: not a failure, just reconnect
        conn.close()
        await conn.connect()
        conn.writer.write(request)
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), timeout)
    status, headers = parse_head(head)
    if not conn.answered:
        conn.answered = True
        answered(conn.ep.name)
    return status, headers


async def _error_for(conn: _Conn, status: int, headers: dict, method: str, timeout: float) -> TransferError:
    """The error of a non-2xx answer (its XML document read); the connection is closed."""
    length = int(headers.get("content-length", "-1"))
    body = b""
    if method != "HEAD" and length >= 0:
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
            body = await asyncio.wait_for(conn.reader.readexactly(min(length, 1 << 16)), timeout)
    conn.close()   # keep-alive after an error is not worth the risk
    err = http_error(status, body, headers, conn.signed)
    if isinstance(err, ClockSkewed):
        conn.route.signer.correct_clock(err.server_date)
    return err


def _classified(exc: BaseException, conn: _Conn, timeout: float, answered: bool = False) -> TransferError:
    """The TransferError of a request on ``conn`` that failed (``answered``: its response had begun)."""
    if isinstance(exc, TransferError):
        return exc
    waited = f"no data for {timeout:g} s" if answered else f"no answer in {timeout:g} s"
    err = network_error(exc, conn.ep.name, answered=answered, waited=waited)
    if err is not None and tls_refusal(exc) is None:
        return err
    return classify(exc)   # a TLS certificate refusal included (retry.tls_refusal)


async def ahead_lean(conn: _Conn, job: Job, part_number: int | None, timeout: float) -> dict:
    path = uri_path(conn.route.ep.path_prefix, job.key)
    try:
        status, headers = await _exchange(conn, "HEAD", path, [],
                                          f"partNumber={part_number}" if part_number else "", timeout)
        if status not in (200, 206):
            raise await _error_for(conn, status, headers, "HEAD", timeout)
        if headers.get("connection", "").lower() == "close":
            conn.close()
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, Exception):     # cancelled, or the coroutine closed
            raise
        err = _classified(exc, conn, timeout)
        raise err from cause_of(err, exc)
    return headers


async def aget_lean(conn: _Conn, bucket: str, job: Job, target, *, verify: bool, checksum_mode: bool,
                    timeout: float, on_bytes=None, retry: RetryPolicy | None = None,
                    on_retry=None) -> Fetched:
    """GET the whole object over ``conn`` into ``target``, checked; raises TransferError.  A
    multipart ETag's part sizes are learnt first (:func:`~manyfiles.s3.layouts.alearn_layout`)."""
    path = uri_path(conn.route.ep.path_prefix, job.key)
    extra = [("x-amz-checksum-mode", "ENABLED")] if checksum_mode else []
    if job.etag:
        extra.append(("if-match", f'"{job.etag}"'))
    t0 = time.monotonic_ns()
    status = 0
    body = None
    try:
        layout = None
        if needs_layout(job, verify):
            layout = await alearn_layout(job.size, job.etag, lambda n: ahead_lean(conn, job, n, timeout),
                                         retry, on_retry=on_retry)
        status, headers = await _exchange(conn, "GET", path, extra, "", timeout)
        if status != 200:
            raise await _error_for(conn, status, headers, "GET", timeout)
        length = int(headers.get("content-length", "-1"))
        if length < 0:
            raise TransferError("response without Content-Length", retryable=True, status=status)
        body = WholeBody(job, target, headers, verify=verify, layout=layout)
        remaining = length
        reader = conn.reader
        while remaining:
            chunk = await asyncio.wait_for(reader.read(min(CHUNK, remaining)), timeout)
            if not chunk:
                raise TransferError(f"truncated body: got {length - remaining} of {length} bytes",
                                    retryable=True, status=status)
            remaining -= len(chunk)
            body.write(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        if headers.get("connection", "").lower() == "close":
            conn.close()
        fetched = body.finish(length)
    except BaseException as exc:
        conn.close()
        if not isinstance(exc, Exception):     # cancelled, or the coroutine closed
            raise
        err = _classified(exc, conn, timeout, answered=status != 0)
        tr = iotrace.TRACER
        if tr is not None:
            tr.record("s3.get", f"{bucket}/{job.key}", 0, body.n if body else 0, t0, time.monotonic_ns() - t0,
                      err.status or status or -1)
        raise err from cause_of(err, exc)
    tr = iotrace.TRACER
    if tr is not None:
        tr.record("s3.get", f"{bucket}/{job.key}", 0, body.n, t0, time.monotonic_ns() - t0, status)
    return fetched


class HttpEngine(LoopThreadEngine):
    name = "http"
    thread_name = "s3pull-http"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        super().__init__(ctx, workers)
        opts = ctx.options
        self.route = Route(opts.settings, opts.bucket)
        self.timeout = opts.settings.read_timeout
        self.connect_timeout = opts.settings.connect_timeout
        self._start()

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        opts, ctx = self.ctx.options, self.ctx
        conn = _Conn(self.route, self.connect_timeout)
        try:
            await self._serve(lambda job, target: aget_lean(
                conn, opts.bucket, job, target, verify=opts.verify,
                checksum_mode=opts.checksum_mode, timeout=self.timeout, on_bytes=ctx.bytes, retry=opts.retry,
                on_retry=lambda err: ctx.retried(job, str(err))))
        finally:
            conn.close()
