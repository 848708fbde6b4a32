"""The ``async`` engine: aioboto3 on an event loop in its own thread.

aiobotocore's connection pool defaults to 10, which silently caps any
concurrency above it; here the pool is sized to the number of worker
coroutines.  Objects are fetched whole (one GET each) and written to their temp
file from the loop thread: small writes into the page cache cost less than a
hop to a thread.  The blocking twin of each coroutine is in
:mod:`manyfiles.s3.transfer`, in the same order.
"""

from __future__ import annotations

import asyncio
import time

from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.layouts import alearn_layout
from manyfiles.s3.retry import cause_of, classify
from manyfiles.s3.transfer import CHUNK, Download, Fetched, WholeBody, get_kwargs, needs_layout, trace_request


async def aget_whole(client, bucket: str, job: Download, target, *, verify: bool = True,
                     checksum_mode: bool = True, on_bytes=None, retry=None, on_retry=None) -> Fetched:
    """Async twin of :func:`manyfiles.s3.transfer.get_whole`."""
    kw = get_kwargs(bucket, job, checksum_mode)
    t0 = time.monotonic_ns()
    status = 0
    body_w = None

    async def head_part(n: int):
        resp = await client.head_object(Bucket=bucket, Key=job.key, PartNumber=n)
        return resp["ResponseMetadata"]["HTTPHeaders"]

    try:
        layout = None
        if needs_layout(job.size, job.etag, verify):
            layout = await alearn_layout(job.size, job.etag, head_part, retry, on_retry=on_retry)
        resp = await client.get_object(**kw)
        status = resp["ResponseMetadata"]["HTTPStatusCode"]
        body = resp["Body"]
        try:
            body_w = WholeBody(job.key, job.size, job.etag, target, resp["ResponseMetadata"]["HTTPHeaders"],
                               verify=verify, layout=layout)
            while True:
                chunk = await body.read(CHUNK)
                if not chunk:
                    break
                body_w.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
        finally:
            body.close()
        fetched = body_w.finish(resp.get("ContentLength"))
    except Exception as exc:
        err = classify(exc, answered=status != 0)
        trace_request("s3.get", bucket, job.key, 0, body_w.n if body_w else 0, t0, err.status or status or -1)
        raise err from cause_of(err, exc)
    trace_request("s3.get", bucket, job.key, 0, body_w.n, t0, status)
    return fetched


class AsyncEngine(LoopThreadEngine):
    name = "async"
    thread_name = "s3pull-async"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        super().__init__(ctx, workers)
        self._start()

    async def _main(self) -> None:
        try:
            opts = self.ctx.options
            cm = opts.settings.aio_client(pool=self.workers, checksums=opts.checksum_mode)
            client = await cm.__aenter__()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await asyncio.gather(*(self._worker(client) for _ in range(self.workers)))
        finally:
            await cm.__aexit__(None, None, None)

    async def _worker(self, client) -> None:
        opts, ctx = self.ctx.options, self.ctx
        await self._serve(lambda job, target: aget_whole(
            client, opts.bucket, job, target, verify=opts.verify, checksum_mode=opts.checksum_mode,
            on_bytes=ctx.bytes, retry=opts.retry, on_retry=lambda err: ctx.retried(job, str(err))))
