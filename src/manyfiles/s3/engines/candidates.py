"""Candidate engines on well-kept native clients, measured against the hand-written ones
(issue 18, "build or adopt"); not used by ``auto`` (docs/s3pull.md says why, with the numbers).

``obstore`` -- the Python bindings of Rust's object_store (``pip install 'manyfiles[obstore]'``):
every GET runs on its own Tokio runtime, off the GIL; this engine awaits them from an event loop
in one thread, as many in flight as the engine's share of ``-j``.  Held to the same rules as the
others: temp file + rename, a GET pinned to the listed ETag (``If-Match``), every byte hashed as
written (:class:`~manyfiles.s3.transfer.WholeBody`) and checked against the object's claim.  The
claim is where it falls short: obstore returns the ETag, the size and the ``Content-*``
attributes, never the ``x-amz-checksum-*`` nor ``x-amz-server-side-encryption`` headers.  So an
object's CRC64NVME/CRC32C is never used (the ETag's MD5 is the check), and an SSE-KMS object's
ETag (not an MD5) cannot be told from a corrupted body: the check fails and, after the retries,
so does the object, where the other engines check its checksum (or, without one, its size, and
say so).  A multipart ETag takes its part sizes from one hand-signed ``HEAD ?partNumber=1``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from manyfiles._core.extras import require
from manyfiles.s3.config import aws_config
from manyfiles.s3.engines.base import Ctx, Engine, LoopThreadEngine
from manyfiles.s3.retry import TransferError, cause_of, classify
from manyfiles.s3.store import store_for
from manyfiles.s3.transfer import Download, Fetched, WholeBody, needs_layout, trace_request

OBSTORE_FEATURE = "the obstore engine (--strategy obstore)"


def _classified(exc: BaseException) -> TransferError:
    """obstore's errors by name (its exception classes live in a native module)."""
    if isinstance(exc, TransferError):
        return exc
    name = type(exc).__name__
    if name == "PreconditionError":
        from manyfiles.s3.retry import ObjectChanged

        return ObjectChanged()
    if name == "NotFoundError":
        return TransferError(f"no such key (deleted since listing?): {exc}", retryable=False, status=404)
    if name in ("PermissionDeniedError", "UnauthenticatedError"):
        return TransferError(f"AccessDenied: {exc}", retryable=False, status=403)
    if isinstance(exc, OSError):
        return classify(exc)
    return TransferError(f"{name}: {exc}", retryable=True)


class ObstoreEngine(LoopThreadEngine):
    name = "obstore"
    thread_name = "s3pull-obstore"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        super().__init__(ctx, workers)
        self.obstore = require("obstore", "obstore", OBSTORE_FEATURE)
        S3Store = require("obstore", "obstore.store", OBSTORE_FEATURE).S3Store
        opts = ctx.options
        self.lean = store_for(opts.settings, opts.bucket, retry=opts.retry)   # HEAD ?partNumber=n
        route = self.lean.route     # credentials, region, endpoint
        cfg = aws_config(opts.settings)
        config: dict = {"region": route.region, "virtual_hosted_style_request": route.ep.path_prefix == ""}
        if cfg.endpoint_url:
            config["endpoint"] = cfg.endpoint_url
        if route.signer.unsigned:
            config["skip_signature"] = True
        else:
            creds = route.signer._creds
            config.update(access_key_id=creds.access_key, secret_access_key=creds.secret_key)
            if creds.token:
                config["token"] = creds.token
        client_options = {"allow_http": route.ep.scheme == "http",
                          "timeout": timedelta(seconds=opts.settings.read_timeout),
                          "connect_timeout": timedelta(seconds=opts.settings.connect_timeout)}
        # our retries, counted per object like every engine's: none of obstore's own
        self.store = S3Store(opts.bucket, config=config, client_options=client_options,
                             retry_config={"max_retries": 0, "retry_timeout": timedelta(0)})
        self._start()

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(*(self._serve(self._fetch) for _ in range(self.workers)))

    async def _fetch(self, job: Download, target) -> Fetched:
        opts = self.ctx.options
        t0 = time.monotonic_ns()
        status = 0
        body = None
        try:
            layout = None
            if needs_layout(job.size, job.etag, opts.verify):
                from manyfiles.s3.layouts import part_layout

                loop = asyncio.get_running_loop()
                layout = await loop.run_in_executor(
                    None, part_layout, job.size, job.etag,
                    lambda n: self.lean.head_headers(job.key, etag=job.etag, part_number=n))
            options = {"if_match": f'"{job.etag}"'} if job.etag else {}
            resp = await self.obstore.get_async(self.store, job.key, options=options)
            data = await resp.bytes_async()
            meta = resp.meta
            status = 200
            etag = (meta.get("e_tag") or "").strip('"')
            if job.etag and etag and etag != job.etag:
                from manyfiles.s3.retry import ObjectChanged

                raise ObjectChanged(f"ETag changed since listing ({job.etag} -> {etag})")
            # all obstore tells of the object: no x-amz-checksum-*, no x-amz-server-side-encryption
            headers = {"etag": f'"{etag}"', "content-length": str(meta["size"])}
            body = WholeBody(job.key, job.size, job.etag, target, headers, verify=opts.verify, layout=layout)
            body.write(data)
            self.ctx.bytes(len(data))
            fetched = body.finish(meta["size"])
        except BaseException as exc:
            if not isinstance(exc, Exception):     # cancelled, or the coroutine closed
                raise
            err = _classified(exc)
            trace_request("s3.get", opts.bucket, job.key, 0, body.n if body else 0, t0, err.status or -1)
            raise err from cause_of(err, exc)
        trace_request("s3.get", opts.bucket, job.key, 0, body.n, t0, status)
        return fetched


class CrtEngine(Engine):
    """``crt`` -- awscrt's native S3 client (the engine of boto3's CRT transfer manager and of AWS's
    own fastest tools): its event-loop threads run the HTTP and the signing off the GIL; Python sees
    three callbacks per object (headers, body chunks in order, done).  The headers are all there, so
    the claim is the same as the lean engine's (checksums, encryption); every chunk is written and
    hashed as it arrives (:class:`WholeBody`).  Plain-HTTP endpoints need TLS off: boto3's own CRT
    factory always asks for TLS, which an http:// server answers by closing the socket (the
    AWS_IO_SOCKET_CLOSED the first benchmark met).  Objects are fetched whole (awscrt splits large
    ones into its own ranged parts, in order); a multipart ETag's part sizes come from one
    hand-signed ``HEAD ?partNumber=1``.  Retries are ours (awscrt's are off), per object.
    """

    name = "crt"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        import threading

        from awscrt.auth import AwsCredentialsProvider
        from awscrt.io import ClientBootstrap, DefaultHostResolver, EventLoopGroup
        from awscrt.s3 import S3Client, S3RequestTlsMode, S3RetryConfig, S3RetryMode

        self.ctx = ctx
        opts = ctx.options
        self.lean = store_for(opts.settings, opts.bucket, retry=opts.retry)   # HEAD ?partNumber=n
        self.route = route = self.lean.route
        if route.signer.unsigned:
            creds = AwsCredentialsProvider.new_static("", "")     # never used: unsigned below
        else:
            c = route.signer._creds
            creds = AwsCredentialsProvider.new_static(c.access_key, c.secret_key, c.token)
        elg = EventLoopGroup()
        self.client = S3Client(
            bootstrap=ClientBootstrap(elg, DefaultHostResolver(elg)), region=route.region,
            credential_provider=creds,
            tls_mode=S3RequestTlsMode.ENABLED if route.ep.scheme == "https" else S3RequestTlsMode.DISABLED,
            max_active_connections_override=max(1, workers),
            retry_config=S3RetryConfig(retry_mode=S3RetryMode.NONE))
        self._open = 0
        self._cond = threading.Condition(threading.Lock())

    def submit(self, job: Download) -> None:
        with self._cond:
            self._open += 1
        self._attempt(job, 0)

    def _attempt(self, job: Download, attempt: int) -> None:
        from manyfiles.s3.engines.base import cancelled, open_target

        ctx = self.ctx
        target = None
        if ctx.cancel.is_set():
            cancelled(ctx, job)
        else:
            target = open_target(ctx, job)
        if target is None:
            self._ended()
            return
        try:
            self._start(job, target, attempt)
        except BaseException as exc:
            self._end(job, target, None, _classified(exc), attempt)

    def _ended(self) -> None:
        with self._cond:
            self._open -= 1
            self._cond.notify_all()

    def _start(self, job: Download, target, attempt: int) -> None:
        from awscrt.http import HttpHeaders, HttpRequest
        from awscrt.s3 import S3RequestType

        from manyfiles.s3.sigv4 import uri_path

        opts = self.ctx.options
        layout = None
        if needs_layout(job.size, job.etag, opts.verify):
            from manyfiles.s3.layouts import part_layout

            layout = part_layout(job.size, job.etag,
                                 lambda n: self.lean.head_headers(job.key, etag=job.etag, part_number=n))
        ep = self.route.ep
        headers = [("Host", ep.host)]
        if opts.checksum_mode:
            headers.append(("x-amz-checksum-mode", "ENABLED"))
        if job.etag:
            headers.append(("If-Match", f'"{job.etag}"'))
        request = HttpRequest("GET", uri_path(ep.path_prefix, job.key), HttpHeaders(headers))
        state: dict = {"body": None, "error": None, "status": 0}
        t0 = time.monotonic_ns()

        def on_headers(status_code, headers, **kwargs):
            state["status"] = status_code
            if 200 <= status_code < 300:
                hdrs = {k.lower(): v for k, v in headers}
                state["length"] = int(hdrs.get("content-length", "-1"))
                state["body"] = WholeBody(job.key, job.size, job.etag, target, hdrs, verify=opts.verify,
                                          layout=layout)

        def on_body(chunk, offset, **kwargs):
            body = state["body"]
            if state["error"] is not None or body is None:
                return
            try:
                if offset != body.n:
                    raise TransferError(f"body chunk at {offset}, expected {body.n}", retryable=True)
                body.write(chunk)
                self.ctx.bytes(len(chunk))
            except BaseException as exc:
                state["error"] = exc

        def on_done(error, error_headers=None, error_body=None, **kwargs):
            body, err, fetched = state["body"], state["error"], None
            try:
                if err is None and error is not None:
                    if error_headers is not None:
                        from manyfiles.s3.http1 import http_error

                        status = kwargs.get("status_code") or state["status"]
                        hdrs = {k.lower(): v for k, v in error_headers}
                        err = http_error(status, bytes(error_body or b""), hdrs)
                    else:
                        err = error
                if err is None:
                    if body is None:
                        raise TransferError("no response body", retryable=True)
                    # the object's size: the listing's, or (awscrt's own ranges) the whole body
                    fetched = body.finish(job.size if job.size is not None else body.n)
            except BaseException as exc:
                err = exc
            n = body.n if body is not None else 0
            trace_request("s3.get", opts.bucket, job.key, 0, n, t0, -1 if err else state["status"])
            self._end(job, target, fetched, None if err is None else _classified(err), attempt)

        self.client.make_request(type=S3RequestType.GET_OBJECT, request=request, on_headers=on_headers,
                                 on_body=on_body, on_done=on_done)

    def _end(self, job: Download, target, fetched, error: TransferError | None, attempt: int) -> None:
        """One attempt ended (on an awscrt thread): retried after our back-off, or finished."""
        import threading

        from manyfiles.s3.engines.base import finish

        ctx, policy = self.ctx, self.ctx.options.retry
        again = error is not None and error.retryable and attempt + 1 < policy.attempts
        if again and not ctx.cancel.is_set():
            ctx.retried(job, str(error))
            target.abort()
            threading.Timer(policy.delay(attempt), self._attempt, (job, attempt + 1)).start()
            return
        finish(ctx, job, target, self.name, fetched, error)
        self._ended()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        with self._cond:
            while self._open > 0:
                self._cond.wait(0.5)

    def kill(self) -> None:
        self.ctx.cancel.set()
        self.close()
