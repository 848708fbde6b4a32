"""The ``http`` engine: a lean HTTP/1.1 GetObject client on asyncio streams.

Small objects are bound by client CPU per request, not by bandwidth: botocore
and aiobotocore spend ~1-3 ms of CPU on each GET (request building, signing,
event hooks, response parsing), which caps one Python process at a few hundred
small objects a second.  This engine does only what a GET needs: SigV4 signing
by hand (:mod:`manyfiles.s3.sigv4`), one keep-alive connection per worker
coroutine, Content-Length bodies read straight into the temp file.  Checks are
the same as elsewhere: status, length, MD5 against a plain ETag, IfMatch on the
listed ETag, and the server's CRC32/SHA checksum when it sends one.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import ssl
import time
import zlib

from manyfiles import iotrace
from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.retry import FATAL_CODES, RETRYABLE_CODES, ObjectChanged, TransferError, classify
from manyfiles.s3.sigv4 import Endpoint, Signer, bucket_region, resolve_endpoint, uri_path
from manyfiles.s3.transfer import CHUNK, Job, Verifier

_CODE = re.compile(rb"<Code>([^<]*)</Code>")
_MSG = re.compile(rb"<Message>([^<]*)</Message>")


class _Checksum:
    """The server's full-object checksum, when it sent one we can compute cheaply."""

    def __init__(self, headers: dict[str, str]) -> None:
        self.kind = None
        if "x-amz-checksum-crc32" in headers:
            self.kind, self.want, self.crc = "crc32", headers["x-amz-checksum-crc32"], 0
        elif "x-amz-checksum-sha256" in headers:
            self.kind, self.want, self.h = "sha256", headers["x-amz-checksum-sha256"], hashlib.sha256()
        elif "x-amz-checksum-sha1" in headers:
            self.kind, self.want, self.h = "sha1", headers["x-amz-checksum-sha1"], hashlib.sha1()
        # crc32c / crc64nvme need a native library; the MD5/ETag and length checks still apply
        if self.kind and "-" in self.want:   # composite (per-part) checksum: not a whole-body digest
            self.kind = None

    def update(self, data) -> None:
        if self.kind == "crc32":
            self.crc = zlib.crc32(data, self.crc)
        elif self.kind:
            self.h.update(data)

    def check(self) -> None:
        if not self.kind:
            return
        digest = self.crc.to_bytes(4, "big") if self.kind == "crc32" else self.h.digest()
        if base64.b64encode(digest).decode() != self.want:
            raise TransferError(f"{self.kind} checksum of the body does not match the server's",
                                retryable=True)


class _Conn:
    """One keep-alive connection; reopened after any error or `Connection: close`."""

    def __init__(self, ep: Endpoint, ssl_ctx) -> None:
        self.ep, self.ssl_ctx = ep, ssl_ctx
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        host = self.ep.host.split(":")[0] if not self.ep.host.startswith("[") else self.ep.host
        self.reader, self.writer = await asyncio.open_connection(
            host, self.ep.port, ssl=self.ssl_ctx, server_hostname=host if self.ssl_ctx else None,
            limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def aget_lean(conn: _Conn, signer: Signer, bucket: str, job: Job, target, *, verify_md5: bool,
                    timeout: float, on_bytes=None) -> int:
    """GET the whole object over ``conn`` into ``target``; raises TransferError."""
    ep = conn.ep
    path = uri_path(ep.path_prefix, job.key)
    extra = [("x-amz-checksum-mode", "ENABLED")]
    if job.etag:
        extra.append(("if-match", f'"{job.etag}"'))
    lines = [f"GET {path} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in signer.headers(ep.host, path, extra)]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8", "surrogateescape")
    t0 = time.monotonic_ns()
    status = 0
    ver = Verifier(job, verify_md5)
    try:
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
        status, headers = _parse_head(head)
        length = int(headers.get("content-length", "-1"))
        if status != 200:
            body = await _read_small_body(conn, headers, length, timeout)
            conn.close()   # keep-alive after an error is not worth the risk
            raise _http_error(status, body)
        if length < 0:
            raise TransferError("response without Content-Length", retryable=True, status=status)
        csum = _Checksum(headers if ver.md5 is None else {})   # MD5 checked: the CRC adds nothing
        remaining = length
        reader = conn.reader
        while remaining:
            chunk = await asyncio.wait_for(reader.read(min(CHUNK, remaining)), timeout)
            if not chunk:
                raise TransferError(f"truncated body: got {length - remaining} of {length} bytes",
                                    retryable=True, status=status)
            remaining -= len(chunk)
            target.append(chunk)
            ver.update(chunk)
            csum.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        if headers.get("connection", "").lower() == "close":
            conn.close()
        ver.check(length)
        csum.check()
    except BaseException as exc:
        conn.close()
        if isinstance(exc, asyncio.CancelledError):
            raise
        err = exc if isinstance(exc, TransferError) else (
            TransferError("timed out", retryable=True) if isinstance(exc, asyncio.TimeoutError)
            else classify(exc))
        tr = iotrace.TRACER
        if tr is not None:
            tr.record("s3.get", f"{bucket}/{job.key}", 0, ver.n, t0, time.monotonic_ns() - t0,
                      err.status or status or -1)
        raise err from exc
    tr = iotrace.TRACER
    if tr is not None:
        tr.record("s3.get", f"{bucket}/{job.key}", 0, ver.n, t0, time.monotonic_ns() - t0, status)
    if job.size is None:
        job.size = ver.n
    return ver.n


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    text = head.decode("latin-1")
    status_line, _, rest = text.partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise TransferError(f"bad HTTP status line {status_line[:60]!r}", retryable=True)
    headers = {}
    for line in rest.split("\r\n"):
        k, sep, v = line.partition(":")
        if sep:
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _read_small_body(conn: _Conn, headers: dict[str, str], length: int, timeout: float) -> bytes:
    try:
        if length >= 0:
            return await asyncio.wait_for(conn.reader.readexactly(min(length, 1 << 16)), timeout)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while len(out) < (1 << 16):
                size = int((await asyncio.wait_for(conn.reader.readline(), timeout)).split(b";")[0], 16)
                if size == 0:
                    break
                out += await asyncio.wait_for(conn.reader.readexactly(size + 2), timeout)
            return out
    except (asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError, OSError):
        pass
    return b""


def _http_error(status: int, body: bytes) -> TransferError:
    m = _CODE.search(body)
    code = m.group(1).decode("utf-8", "replace") if m else str(status)
    m = _MSG.search(body)
    msg = m.group(1).decode("utf-8", "replace") if m else ""
    if status == 412 or code == "PreconditionFailed":
        return ObjectChanged()
    if status == 404 and code in ("NoSuchKey", "404"):
        return TransferError("no such key (deleted since listing?)", retryable=False, status=404)
    text = f"{code}: {msg}" if msg else code
    if code in RETRYABLE_CODES or status >= 500 or status == 429:
        return TransferError(text, retryable=True, status=status)
    if code in FATAL_CODES or status in (400, 401, 403, 404):
        return TransferError(text, retryable=False, status=status)
    return TransferError(text, retryable=False, status=status)


class HttpEngine(LoopThreadEngine):
    name = "http"
    thread_name = "s3pull-http"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        super().__init__(ctx, workers)
        opts = ctx.options
        region = bucket_region(opts.settings, opts.bucket)
        self.signer = Signer(opts.settings, region)
        self.ep = resolve_endpoint(opts.settings, opts.bucket, region)
        self.ssl_ctx = ssl.create_default_context() if self.ep.scheme == "https" else None
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
                conn, self.signer, opts.bucket, job, target, verify_md5=opts.verify_md5,
                timeout=self.timeout, on_bytes=self.ctx.bytes))
        finally:
            conn.close()
