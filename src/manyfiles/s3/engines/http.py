"""The ``http`` engine: the bucket's store on asyncio streams.

Small objects are bound by client CPU per request, not by bandwidth: botocore and
aiobotocore spend ~1-3 ms of CPU on each GET (request building, signing, event hooks,
response parsing), which caps one Python process at a few hundred small objects a second.
This engine does only what a GET needs, through the store (:meth:`~manyfiles.s3.store.S3Store.afetch_into`:
hand-signed, the same HTTP core as the threads' transport): one keep-alive connection per worker
coroutine, Content-Length bodies written straight into the temp file and checked by the same
:class:`~manyfiles.s3.transfer.WholeBody` as every other engine.
"""

from __future__ import annotations

import asyncio

from manyfiles.s3.engines.base import Ctx, LoopThreadEngine
from manyfiles.s3.store import store_for


class HttpEngine(LoopThreadEngine):
    name = "http"
    thread_name = "s3pull-http"

    def __init__(self, ctx: Ctx, workers: int) -> None:
        super().__init__(ctx, workers)
        opts = ctx.options
        self.store = store_for(opts.settings, opts.bucket, retry=opts.retry, verify=opts.verify,
                               checksum_mode=opts.checksum_mode, cancel=ctx.cancel)
        self._start()

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(*(self._worker() for _ in range(self.workers)))

    async def _worker(self) -> None:
        ctx, store = self.ctx, self.store
        conn = store.connection()
        try:
            await self._serve(lambda job, target: store.afetch_into(
                conn, job.key, target, etag=job.etag, size=job.size, on_bytes=ctx.bytes,
                on_retry=lambda err: ctx.retried(job, str(err))))
        finally:
            conn.close()
