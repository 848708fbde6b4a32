"""The ``processes`` engine: N worker processes, each running its own async or threads engine.

botocore spends about a millisecond of CPU per GetObject, so one Python process
tops out near a thousand small GETs a second whatever its concurrency; worker
processes multiply that by the number of free cores.  Jobs travel in batches
over one shared queue; each worker reports outcomes back as events, and the
parent keeps the state file and the report.  Workers are forked before the
planner starts any thread, die with the parent (PR_SET_PDEATHSIG), and ignore
SIGINT so that Ctrl-C is handled once, by the parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import threading
from dataclasses import replace

from manyfiles.s3.engines.base import Ctx, Done, Engine, Failed, Options
from manyfiles.s3.engines.events import BytesIn, JobDone, JobFailed, Retried, WorkerExit

BATCH = 64


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _WorkerCtx(Ctx):
    """Forwards events to the parent; byte counts are batched to keep the pipe quiet."""

    bytes_batch = 4 << 20

    def __init__(self, options: Options, sink, out) -> None:
        super().__init__(options, sink)
        self.out = out

    def _send_bytes(self, n: int) -> None:
        self.out.put(BytesIn(n))

    def _flush_bytes(self) -> None:
        n = self.take_bytes()
        if n:
            self._send_bytes(n)

    def retried(self, job, reason: str) -> None:
        self.out.put(Retried(job, reason))

    def done(self, job, outcome: Done) -> None:
        self._flush_bytes()
        self.out.put(JobDone(job, replace(outcome, engine="processes")))

    def failed(self, job, outcome: Failed) -> None:
        self.out.put(JobFailed(job, outcome))


def _worker_main(options: Options, sub: str, workers: int, inq, outq) -> None:
    from manyfiles._core.worker import instrumented_worker

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    with instrumented_worker():
        from manyfiles.s3.sink import FolderSink

        sink = FolderSink(options.dest, layout=options.layout, fsync=options.fsync).open(load_state=False)
        ctx = _WorkerCtx(options, sink, outq)
        engine = _make_sub(ctx, sub, workers)
        try:
            while True:
                batch = inq.get()
                if batch is None:
                    break
                for job in batch:
                    engine.submit(job)
        finally:
            engine.close()
            ctx._flush_bytes()
            outq.put(WorkerExit(os.getpid()))


def _make_sub(ctx: Ctx, sub: str, workers: int) -> Engine:
    if sub == "async":
        from manyfiles.s3.engines.aio import AsyncEngine

        return AsyncEngine(ctx, workers)
    if sub == "http":
        from manyfiles.s3.engines.http import HttpEngine

        return HttpEngine(ctx, workers)
    from manyfiles.s3.engines.threads import ThreadsEngine

    return ThreadsEngine(ctx, workers)


class ProcessesEngine(Engine):
    name = "processes"

    def __init__(self, ctx: Ctx, processes: int, workers_per_process: int, sub: str = "async") -> None:
        if ctx.options.dest is None:
            raise ValueError("the processes engine writes files; use threads or async for memory")
        self.ctx = ctx
        self.n = max(1, processes)
        mpctx = mp.get_context("fork")
        self.inq = mpctx.Queue()
        self.outq = mpctx.Queue()
        self.procs = [mpctx.Process(target=_worker_main, name=f"s3pull-worker-{i}",
                                    args=(ctx.options, sub, workers_per_process, self.inq, self.outq),
                                    daemon=True)
                      for i in range(self.n)]
        for p in self.procs:
            p.start()
        self._batch: list = []
        self._pending: dict[str, object] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.reader = threading.Thread(target=self._read, name="s3pull-processes-reader", daemon=True)
        self.reader.start()

    def submit(self, job) -> None:
        with self._lock:
            self._pending[job.key] = job
        self._batch.append(job)
        if len(self._batch) >= BATCH:
            self.flush()

    def flush(self) -> None:
        if self._batch:
            self.inq.put(self._batch)
            self._batch = []

    def close(self) -> None:
        self.flush()
        for _ in self.procs:
            self.inq.put(None)
        for p in self.procs:
            p.join()
        self.reader.join()
        with self._lock:
            lost = list(self._pending.values())
            self._pending.clear()
        for job in lost:
            self.ctx.failed(job, Failed("worker process died", "worker-died"))

    def kill(self) -> None:
        self.ctx.cancel.set()
        self._stopped.set()
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        # the reader polls the workers too: joined first, it cannot reap one while we look at it
        self.reader.join(5)
        for p in self.procs:
            p.join(5)
            if p.exitcode is not None and self.ctx.sink is not None:   # gone: its temps are nobody's
                self.ctx.sink.remove_temps_of(p.pid)
        # A worker terminated in the middle of a put holds the result queue's shared write lock
        # for ever: nothing may write to these queues again (the reader is stopped by the event),
        # and their feeder threads must not be joined at exit (the process would hang there).
        self.outq.cancel_join_thread()
        self.inq.cancel_join_thread()

    def _read(self) -> None:
        exited = 0
        ctx = self.ctx
        while exited < self.n and not self._stopped.is_set():
            # liveness first: a worker that wrote its last outcomes and exited between a wait that
            # timed out and this check would otherwise leave them unread in the pipe
            gone = all(not p.is_alive() for p in self.procs)
            try:
                ev = self.outq.get(timeout=0 if gone else 1.0)
            except queue.Empty:
                if gone:
                    return
                continue
            if type(ev) is WorkerExit:
                exited += 1
                continue
            if type(ev) in (JobDone, JobFailed):
                with self._lock:
                    self._pending.pop(ev.job.key, None)
            ctx.events.put(ev)
