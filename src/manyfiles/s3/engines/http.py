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

from manyfiles import iotrace
from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.http1 import ClockSkewed, http_error, parse_head, request_head
from manyfiles.s3.integrity import apart_layout
from manyfiles.s3.retry import TransferError, classify, tls_refusal
from manyfiles.s3.sigv4 import Endpoint, Signer, bucket_region, resolve_endpoint, ssl_context, uri_path
from manyfiles.s3.transfer import CHUNK, Fetched, Job, WholeBody, needs_layout


class _Conn:
    """One keep-alive connection; reopened after any error or `Connection: close`."""

    def __init__(self, ep: Endpoint, ssl_ctx) -> None:
        self.ep, self.ssl_ctx = ep, ssl_ctx
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        ep = self.ep
        if ep.proxy:
            self.reader, self.writer = await asyncio.open_connection(*ep.proxy, limit=1 << 20)
            if self.ssl_ctx is not None:
                self.writer.write(f"CONNECT {ep.connect_host}:{ep.port} HTTP/1.1\r\n"
                                  f"Host: {ep.connect_host}:{ep.port}\r\n\r\n".encode())
                status, _ = parse_head(await self.reader.readuntil(b"\r\n\r\n"))
                if status != 200:
                    raise TransferError(f"proxy refused CONNECT (HTTP {status})", retryable=False)
                await self.writer.start_tls(self.ssl_ctx, server_hostname=ep.connect_host)
            return
        self.reader, self.writer = await asyncio.open_connection(
            ep.connect_host, ep.port, ssl=self.ssl_ctx,
            server_hostname=ep.connect_host if self.ssl_ctx else None, limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _exchange(conn: _Conn, signer: Signer, method: str, path: str, extra: list, query: str,
                    timeout: float):
    ep = conn.ep
    target = f"{path}?{query}" if query else path
    if ep.proxy and conn.ssl_ctx is None:
        target = f"http://{ep.host}{target}"
    request = request_head(method, target, signer.headers(ep.host, path, extra, query=query, method=method))
    reused = conn.writer is not None
    if not reused:
        await asyncio.wait_for(conn.open(), timeout)
    conn.writer.write(request)
    try:
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), timeout)
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
            raise
        # the server closed an idle keep-alive connection: not a failure, just reconnect
        conn.close()
        await asyncio.wait_for(conn.open(), timeout)
        conn.writer.write(request)
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), timeout)
    return parse_head(head)


async def _raise_for(conn: _Conn, signer: Signer, status: int, headers: dict, method: str, timeout: float):
    length = int(headers.get("content-length", "-1"))
    body = b""
    if method != "HEAD" and length >= 0:
        with contextlib.suppress(asyncio.IncompleteReadError, asyncio.TimeoutError, OSError):
            body = await asyncio.wait_for(conn.reader.readexactly(min(length, 1 << 16)), timeout)
    conn.close()   # keep-alive after an error is not worth the risk
    err = http_error(status, body, headers)
    if isinstance(err, ClockSkewed):
        signer.correct_clock(err.server_date)
    raise err


def _classified(exc: BaseException) -> TransferError:
    if isinstance(exc, TransferError):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return TransferError("timed out", retryable=True)
    return tls_refusal(exc) or classify(exc)


async def ahead_lean(conn: _Conn, signer: Signer, job: Job, part_number: int | None, timeout: float) -> dict:
    path = uri_path(conn.ep.path_prefix, job.key)
    try:
        status, headers = await _exchange(conn, signer, "HEAD", path, [],
                                          f"partNumber={part_number}" if part_number else "", timeout)
        if status not in (200, 206):
            await _raise_for(conn, signer, status, headers, "HEAD", timeout)
        if headers.get("connection", "").lower() == "close":
            conn.close()
    except BaseException as exc:
        conn.close()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise _classified(exc) from exc
    return headers


async def aget_lean(conn: _Conn, signer: Signer, bucket: str, job: Job, target, *, verify: bool,
                    checksum_mode: bool, timeout: float, on_bytes=None) -> Fetched:
    """GET the whole object over ``conn`` into ``target``, checked; raises TransferError."""
    path = uri_path(conn.ep.path_prefix, job.key)
    extra = [("x-amz-checksum-mode", "ENABLED")] if checksum_mode else []
    if job.etag:
        extra.append(("if-match", f'"{job.etag}"'))
    t0 = time.monotonic_ns()
    status = 0
    body = None
    try:
        layout = None
        if needs_layout(job, verify) and job.size is not None:
            layout = await apart_layout(job.size, job.etag,
                                        lambda n: ahead_lean(conn, signer, job, n, timeout))
        status, headers = await _exchange(conn, signer, "GET", path, extra, "", timeout)
        if status != 200:
            await _raise_for(conn, signer, status, headers, "GET", timeout)
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
        if isinstance(exc, asyncio.CancelledError):
            raise
        err = _classified(exc)
        tr = iotrace.TRACER
        if tr is not None:
            tr.record("s3.get", f"{bucket}/{job.key}", 0, body.n if body else 0, t0, time.monotonic_ns() - t0,
                      err.status or status or -1)
        raise err from exc
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
        region = bucket_region(opts.settings, opts.bucket)
        self.signer = Signer(opts.settings, region)
        self.ep = resolve_endpoint(opts.settings, opts.bucket, region)
        self.ssl_ctx = ssl_context(opts.settings) if self.ep.scheme == "https" else None
        self.timeout = opts.settings.read_timeout
        self._start()

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        opts = self.ctx.options
        conn = _Conn(self.ep, self.ssl_ctx)
        try:
            await self._serve(lambda job, target: aget_lean(
                conn, self.signer, opts.bucket, job, target, verify=opts.verify,
                checksum_mode=opts.checksum_mode, timeout=self.timeout, on_bytes=self.ctx.bytes))
        finally:
            conn.close()
