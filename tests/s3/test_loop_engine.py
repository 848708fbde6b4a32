"""The engines on an event loop (http, async) clean up every worker when killed.

A gather ends at its first cancelled worker; a worker that takes longer to finish its
cancellation (one inside nested ``asyncio.wait_for``, as a read with a timeout can be) was still pending
when the loop closed: its temp file was never aborted and its coroutine was collected at exit on
a closed loop ("Exception ignored in: <coroutine object HttpEngine._worker>", a traceback on
stderr after a full disk stopped the run).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from types import SimpleNamespace

from manyfiles.s3.engines.base import LoopThreadEngine


class TwoWorkers(LoopThreadEngine):
    """One worker idle on its queue, one inside a read with a timeout; both record their cleanup."""

    def __init__(self) -> None:
        super().__init__(SimpleNamespace(cancel=threading.Event()), 2)
        self.cleaned: list[str] = []
        self.reading = threading.Event()
        self._start()

    async def _main(self) -> None:
        self._ready.set()
        await asyncio.gather(self._idle(), self._reading())

    async def _idle(self) -> None:
        try:
            await self.q.get()
        finally:
            self.cleaned.append("idle")

    async def _reading(self) -> None:
        try:
            self.loop.call_soon(self.reading.set)
            # a connect inside a request's timeout: two timeouts deep, as the store's reads can be
            await asyncio.wait_for(asyncio.wait_for(asyncio.Event().wait(), 3600), 3600)
        finally:
            self.cleaned.append("reading")


def test_kill_lets_every_worker_clean_up_on_a_live_loop(monkeypatch):
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    engine = TwoWorkers()
    assert engine.reading.wait(30)
    engine.kill()
    assert sorted(engine.cleaned) == ["idle", "reading"]
    del engine
    gc.collect()
    assert not unraisable, [u.exc_value for u in unraisable]
