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

from manyfiles._extras import require
from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.retry import TransferError, classify
from manyfiles.s3.sigv4 import Route, aws_config
from manyfiles.s3.transfer import Fetched, Job, WholeBody, needs_layout, trace_request

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
        self.route = route = Route(opts.settings, opts.bucket)     # credentials, region, endpoint
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
        self._lean = None
        self._start()

    def _head_part(self, job: Job, n: int):
        from manyfiles.s3.engines.lean import LeanClient

        if self._lean is None:
            self._lean = LeanClient(self.route, self.ctx.options.settings.read_timeout)
        return self._lean.head(self.ctx.options.bucket, job, n)

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(*(self._serve(self._fetch) for _ in range(self.workers)))
        if self._lean is not None:
            self._lean.close()

    async def _fetch(self, job: Job, target) -> Fetched:
        opts = self.ctx.options
        t0 = time.monotonic_ns()
        status = 0
        body = None
        try:
            layout = None
            if needs_layout(job, opts.verify) and job.size is not None:
                from manyfiles.s3.integrity import part_layout

                loop = asyncio.get_running_loop()
                layout = await loop.run_in_executor(
                    None, part_layout, job.size, job.etag, lambda n: self._head_part(job, n))
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
            body = WholeBody(job, target, headers, verify=opts.verify, layout=layout)
            body.write(data)
            self.ctx.bytes(len(data))
            fetched = body.finish(meta["size"])
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                raise
            err = _classified(exc)
            trace_request("s3.get", opts.bucket, job.key, 0, body.n if body else 0, t0, err.status or -1)
            raise err from exc
        trace_request("s3.get", opts.bucket, job.key, 0, body.n, t0, status)
        return fetched
