"""The Dask backend of the executor seam: the only module that imports ``distributed``.

* shards are tasks (``Client.submit``, ``pure=False``), at most ``IN_FLIGHT_PER_THREAD`` per
  worker thread at a time, so a job of 10^4 shards never floods the scheduler;
* a worker lost mid-shard (killed, OOM, machine gone) is Dask's business: the scheduler re-runs
  the task elsewhere (``distributed.scheduler.allowed-failures`` times), and the shard being
  idempotent makes the re-run safe;
* workers publish their shard's counters with ``Worker.log_event(topic, ...)`` (throttled);
  the client sums them (``Client.subscribe_topic``) into the progress display;
* the client holds the job's lease (:mod:`manyfiles.scale.lease`): an anchor task whose
  scheduler-side metadata (``Client.set_metadata``) holds a beat it renews; every shard attempt
  checks it, and stops when the anchor is gone (the client released it or disconnected) or the
  beat stopped.  Attempts register under their task's key (metadata Dask drops with the task),
  so a re-run sees what its earlier attempts noted;
* with ``--trace`` on the client, a worker plugin traces every worker process to a local
  file; at the end the client fetches them (``Client.run``) as ``FILE.worker-<pid>``, so
  ``manyfiles trace summary FILE`` merges the whole cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from manyfiles._core import client_facts
from manyfiles._core.extras import require
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.scale._jobs import (
    CLUSTER_FEATURE,
    IN_FLIGHT_EXTRA,
    IN_FLIGHT_PER_THREAD,
    ClusterLost,
    ClusterReport,
    Executor,
    Job,
    LiveCounts,
    ShardQueue,
    ShardResult,
    Throttle,
    execute_shard,
    parse_cluster,
    raise_shard_error,
    worker_name,
)
from manyfiles.scale.lease import LEASE_ENV, LeasedAttempt, LeaseLapsed, LeaseTerms, LeaseWatch, lease_seconds
from manyfiles.trace import iotrace

distributed = require("dask", "distributed", CLUSTER_FEATURE)
dask = require("dask", "dask", CLUSTER_FEATURE)

CONNECT_TIMEOUT = "10s"        # a wrong address fails within this (Dask retries refused connections)
TICK = 0.2                 # seconds between two progress renderings while waiting
WORKERS_REFRESH = 2.0      # seconds between two looks at the cluster's size
TRACE_CHUNK = 16 << 20     # bytes of a worker's trace file fetched per Client.run
# No dashboard; the scheduler's HTTP routes on a free port (the default, 8787, may be taken).
LOCAL_QUIET = {"dashboard_address": None, "scheduler_kwargs": {"dashboard_address": "127.0.0.1:0"}}
SPAWN_ENV = "distributed.nanny.pre-spawn-environ"


def worker_environ() -> dict:
    """The nanny's environment for new worker processes, without ``MALLOC_TRIM_THRESHOLD_``.

    Dask sets it (64 KiB) to hand memory back to the OS; it also turns off glibc's adaptive
    mmap threshold, so every 1 MiB getdents buffer becomes an mmap + munmap + page faults:
    listing a 65,536-directory tree made 131,000 such calls and ran ~1.7x slower here.
    """
    return {k: v for k, v in dask.config.get(SPAWN_ENV, {}).items() if k != "MALLOC_TRIM_THRESHOLD_"}


class DaskExecutor(Executor):
    """Shards as Dask tasks on ``client``'s cluster."""

    def __init__(self, client: Any, *, owns_client: bool = False, local_cluster: Any = None,
                 lease: float | None = None) -> None:
        self.client = client
        self.owns_client = owns_client
        self.local_cluster = local_cluster
        self.address = client.scheduler.address
        self.lease = lease_seconds(lease)
        self._workers = 0
        self._seen = float("-inf")
        self._spawn_env: Any = None       # our LocalCluster's worker environment (dask.config.set)

    @classmethod
    def open(cls, cluster: Any) -> DaskExecutor:
        """Connect to (or start) the cluster that ``cluster`` names; see ``executor.connect``."""
        lease = lease_seconds()        # a bad $MANYFILES_CLUSTER_LEASE before anything starts
        if isinstance(cluster, str):
            kind, value = parse_cluster(cluster)
            if kind == "local":
                return cls._local(value, lease)
            try:
                client = distributed.Client(value, timeout=CONNECT_TIMEOUT)
            except (OSError, TimeoutError) as exc:
                raise ManyfilesError(f"{value}: cannot reach the Dask scheduler ({exc})") from exc
            return cls(client, owns_client=True, lease=lease)
        if isinstance(cluster, distributed.Client):
            return cls(cluster, lease=lease)
        if hasattr(cluster, "scheduler_address"):     # LocalCluster, SLURMCluster, KubeCluster...
            return cls(distributed.Client(cluster), owns_client=True, lease=lease)
        raise UsageError(f"cluster must be 'local:N', 'tcp://HOST:PORT' or a distributed.Client, "
                         f"not {cluster!r}")

    @classmethod
    def _local(cls, n: int, lease: float) -> DaskExecutor:
        # One thread per worker process: our shards bring their own threads (s3 engines, the
        # tree walker), and one shard at a time per process keeps their budgets as tuned.  The
        # spawn environment stays set while the cluster lives: a nanny started later (a worker
        # started again, _restore_local) reads it too, and puts what it reads into this
        # process's os.environ for good (Dask's Nanny does), where every later spawn finds it.
        spawn = dask.config.set({SPAWN_ENV: worker_environ()})
        lc = None
        try:
            lc = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                          silence_logs=logging.ERROR, **LOCAL_QUIET)
            executor = cls(distributed.Client(lc), owns_client=True, local_cluster=lc, lease=lease)
        except BaseException:
            if lc is not None:
                lc.close()
            spawn.__exit__(None, None, None)
            raise
        executor._spawn_env = spawn
        return executor

    @property
    def workers(self) -> int:
        now = time.monotonic()
        if now - self._seen > WORKERS_REFRESH:
            self._seen = now
            if self.local_cluster is not None:
                self._restore_local()
            try:     # bounded: a client cut off from the scheduler keeps its loop (and its lease check)
                self._workers = sum(self.client.nthreads(callback_timeout=WORKERS_REFRESH).values())
            except Exception:
                if not self._workers:
                    raise
                # the last count stands; the job's own checks decide whether the cluster is lost
        return self._workers

    def _restore_local(self) -> None:
        """Our LocalCluster back at its size.  A worker killed twice within Dask's
        ``lost-worker-timeout`` (15 s) makes the cluster close that worker's nanny for good (it
        looks for a worker of that name only at that instant); ``scale`` starts the missing one,
        once no worker of that name is registered any more (a new one would be refused)."""
        lc = self.local_cluster
        missing = set(lc.worker_spec) - set(lc.workers)
        registered = {w.get("name") for w in lc.scheduler_info.get("workers", {}).values()}
        if missing and not missing & registered:
            lc.scale(len(lc.worker_spec))

    def close(self) -> None:
        try:
            if self.owns_client:
                self.client.close()
        finally:
            try:
                if self.local_cluster is not None:
                    self.local_cluster.close()
            finally:
                if self._spawn_env is not None:
                    self._spawn_env.__exit__(None, None, None)

    def _run(self, job: Job, shards: ShardQueue, report: ClusterReport, live: LiveCounts) -> None:
        client = self.client
        if not self.workers:
            client.wait_for_workers(1)
        token = secrets.token_hex(4)
        topic = f"manyfiles-{job.name}-{token}"
        client.subscribe_topic(topic, lambda event: live.update(*event[1]))
        finished: queue.SimpleQueue = queue.SimpleQueue()
        in_flight: dict[Any, Pending] = {}

        def where() -> str:
            known = report.shards + len(in_flight) + len(shards.found)
            return (f"{report.shards:,} of {'' if shards.exhausted else 'at least '}{known:,} shards done; "
                    "rerun to resume")

        try:
            with ClientLease(client, self.lease) as lease, worker_traces(client):

                def submit(p: Pending) -> None:
                    key = f"{job.name}-{token}-{p.sid}" + (f"-{p.lapses}" if p.lapses else "")
                    fut = client.submit(run_on_worker, job, p.sid, p.shard, topic, lease.terms, key, p.notes,
                                        client_facts.collect(), key=key, pure=False)
                    in_flight[fut] = p
                    fut.add_done_callback(finished.put)

                while True:
                    limit = IN_FLIGHT_PER_THREAD * max(1, self.workers) + IN_FLIGHT_EXTRA
                    while len(in_flight) < limit and (item := shards.next()) is not None:
                        submit(Pending(*item))
                    if not in_flight:
                        break
                    try:
                        done = [finished.get(timeout=TICK)]
                    except queue.Empty:
                        lease.check_reach(self.address, where)
                        live.show_stall()
                        live.progress.tick()
                        continue
                    while not finished.empty():          # whatever else finished: one gather for all
                        done.append(finished.get())
                    for fut, result in zip(done, _results(client, done, in_flight), strict=True):
                        p = in_flight.pop(fut)
                        if result.lapsed:
                            # its worker was cut off from the scheduler (or could not confirm the
                            # lease) and stopped; the job fails only if this client is the one cut off
                            lease.check_reach(self.address, where)
                            if p.lapses + 1 >= MAX_LAPSES:
                                self._cancel(in_flight)
                                raise LeaseLapsed(
                                    f"shard {p.sid} stopped {MAX_LAPSES} times, its worker each time cut off "
                                    f"from the Dask scheduler at {self.address} longer than the job's lease "
                                    f"({self.lease:g} s, ${LEASE_ENV}); {where()}")
                            submit(p._replace(lapses=p.lapses + 1, notes=result.notes))
                            continue
                        raise_shard_error(result)
                        live.finish(p.sid, result)
                        report.add(result)
                        shards.add(result.more)
                    live.progress.tick()
        except (LeaseLapsed, ClusterLost):
            raise            # cut off: no scheduler to ask (it forgets the tasks of a client it lost)
        except Exception as exc:
            if connection_lost(exc, client):
                raise ClusterLost(f"lost the Dask scheduler at {self.address}: {where()}") from None
            self._cancel(in_flight)
            raise
        except BaseException:
            self._cancel(in_flight)
            raise
        finally:
            with contextlib.suppress(Exception):
                client.unsubscribe_topic(topic)

    def _cancel(self, in_flight: dict[Any, Pending]) -> None:
        if in_flight:
            with contextlib.suppress(Exception):
                self.client.cancel(list(in_flight))


MAX_LAPSES = 4       # times one shard may stop on a lapsed lease before the job gives up


class Pending(NamedTuple):
    """A shard submitted: its id, the shard, how often it stopped on a lapsed lease, and the notes
    of its attempts so far (handed to the next task of the shard)."""

    sid: int
    shard: Any
    lapses: int = 0
    notes: dict | None = None


def connection_lost(exc: BaseException, client: Any) -> bool:
    """Is ``exc`` Dask telling ``client`` that its scheduler is gone (or unreachable)?  A timeout or
    an OSError only when the client itself says it lost the scheduler (our own code raises those
    too: a listing on the client, a progress line to a closed stderr)."""
    if isinstance(exc, (distributed.client.FutureCancelledError, distributed.comm.CommClosedError)):
        return True
    if isinstance(exc, ManyfilesError) or not isinstance(exc, (OSError, TimeoutError, asyncio.TimeoutError)):
        return False
    return getattr(client, "status", "running") != "running"


def _results(client: Any, futures: list[Any], pending: dict[Any, Pending]) -> list[ShardResult]:
    """The results of finished futures, fetched in one round trip (one by one to name a failure)."""
    try:
        results = client.gather(futures)
    except Exception:
        results = [_result(fut, pending[fut].sid) for fut in futures]
    for fut in futures:
        fut.release()
    return results


def _result(fut: Any, sid: int) -> ShardResult:
    try:
        return fut.result()
    except distributed.KilledWorker as exc:
        raise ManyfilesError(f"shard {sid}: every worker that ran it died ({exc})") from exc


def run_on_worker(job: Job, sid: int, shard: Any, topic: str, lease: LeaseTerms, key: str,
                  notes: dict | None = None, facts: dict | None = None) -> ShardResult:
    """The task: one shard under the job's lease, its counters published to ``topic`` as it goes
    (``key``: the task's own, under which its attempts register; ``notes``: those of the attempts
    of the shard's earlier tasks, which stopped when their lease lapsed; ``facts``: what the
    client knew when it submitted the shard, :mod:`manyfiles._core.client_facts`)."""
    client_facts.adopt(facts or {})
    worker = distributed.get_worker()
    attempt = f"{worker_name()}:{secrets.token_hex(4)}"

    def send(done: int, nbytes: int, failures: int, stall: Any = None) -> None:
        stalled = None if stall is None else tuple(stall)      # (seconds, last error): plain values
        worker.log_event(topic, [sid, attempt, done, nbytes, failures, stalled])

    publish = Throttle(send)
    publish(0, 0, 0)      # "started": the client learns which attempt runs the shard
    try:
        leased = attempt_on_worker(lease, key, attempt, notes)
    except LeaseLapsed as exc:     # the client went away, or this worker cannot reach the scheduler
        return ShardResult(error=(type(exc).__name__, str(exc)), worker=worker_name(), notes=notes)
    with leased.watch.used():
        return execute_shard(job, shard, publish, leased)


_WATCHES: dict[str, LeaseWatch] = {}      # lease key -> this worker process's watch of it
_WATCHES_LOCK = threading.Lock()


def attempt_on_worker(lease: LeaseTerms, key: str, attempt: str, notes: dict | None = None) -> LeasedAttempt:
    """This attempt, under the process's watch of the job's lease (the first attempt of the job on
    this process makes it: one request; the next ones only read its clocks).

    Requests go through the worker's client (``get_client``, one per worker process).  The
    attempt registers under its task's ``key`` only if its job asks (see LeasedAttempt), and only
    after the lease is confirmed: the task of a client that is gone is forgotten, and metadata
    written under its key then would stay on the scheduler.
    """
    try:
        client = distributed.get_client()

        def read() -> Any:     # bounded: an answer lost in a cut must not hold the watch for Dask's 30 s
            return client.sync(client.scheduler.get_metadata, keys=[lease.key], default=None,
                               callback_timeout=max(1.0, lease.seconds / 2))

        with _WATCHES_LOCK:
            watch = _WATCHES.get(lease.key)
            if watch is None or not watch.alive:
                for gone in [k for k, w in _WATCHES.items() if not w.alive]:
                    del _WATCHES[gone]
                watch = _WATCHES[lease.key] = LeaseWatch(lease, read=read)
    except Exception as exc:          # (a timeout of a loaded scheduler): do nothing unconfirmed
        raise LeaseLapsed(f"the scheduler could not confirm the job's lease ({exc}): shard not run") from exc
    watch.refresh()
    watch.check()
    return LeasedAttempt(watch, attempts=lambda: client.get_metadata([key, "attempts"], default=None),
                         write=lambda value: client.set_metadata([key, "attempts", attempt], value),
                         name=attempt, carried=notes)


def _anchor() -> None:
    """The lease anchor's task: nothing (its key and that key's metadata are the point)."""


class ClientLease:
    """The client's side of a job's lease (:mod:`manyfiles.scale.lease`): the anchor task, whose
    metadata holds the beat, and a thread renewing the beat every ``seconds / 6``.

    Leaving the block releases the anchor: Dask forgets it and drops its metadata, so every
    shard still running stops at its next check.  A client that dies without leaving the block
    loses its connection, and the scheduler releases (forgets) the anchor the same way.

    The thread also times its renewals: a client that could not renew for longer than the lease
    (cut off from the scheduler, or frozen) knows that every shard of the job has stopped, and
    :meth:`check_reach` ends the job; a shard that stopped while the client kept renewing was
    on a worker cut off from the scheduler, and is run again.
    """

    def __init__(self, client: Any, seconds: float) -> None:
        self.client = client
        self.terms = LeaseTerms(f"manyfiles-lease-{secrets.token_hex(8)}", seconds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="manyfiles-lease-renew", daemon=True)
        self.anchor: Any = None
        self.renewed = time.monotonic()      # the last renewal the scheduler acknowledged
        self.longest_gap = 0.0               # the longest time between two of them

    def __enter__(self) -> ClientLease:
        # the beat first: a shard started right after the submit must find it
        self.client.set_metadata([self.terms.key, "beat"], 0)
        self.anchor = self.client.submit(_anchor, key=self.terms.key, pure=False)
        self.renewed = time.monotonic()
        self._thread.start()
        return self

    def _renew(self) -> None:
        beat = 0
        while not self._stop.wait(self.terms.renew_every):
            beat += 1
            try:      # bounded: a cut-off connection must not hold the thread (or the exit)
                self.client.sync(self.client.scheduler.set_metadata, keys=[self.terms.key, "beat"],
                                 value=beat, callback_timeout=self.terms.seconds / 2)
            except Exception:
                continue          # the shards' clocks decide; we keep trying
            now = time.monotonic()
            self.longest_gap = max(self.longest_gap, now - self.renewed)
            self.renewed = now

    def unrenewed(self) -> float:
        """The longest time this client went without renewing the lease so far (seconds)."""
        return max(self.longest_gap, time.monotonic() - self.renewed)

    def check_reach(self, address: str, where: Callable[[], str]) -> None:
        """Raise LeaseLapsed (one line: the scheduler, how long, the lease and its knob, ``where()``
        the job stands) if this client went longer than the lease without renewing it."""
        gap = self.unrenewed()
        if gap > self.terms.seconds:
            raise LeaseLapsed(f"the job's lease lapsed: this client could not renew it at the Dask scheduler "
                              f"{address} for {gap:.1f} s (lease {self.terms.seconds:g} s: ${LEASE_ENV}), "
                              f"so its shards stopped; {where()}")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.terms.seconds)
        with contextlib.suppress(Exception):
            self.anchor.release()


# -- traces of the workers -------------------------------------------------------------------------

@contextlib.contextmanager
def worker_traces(client: Any) -> Iterator[None]:
    """While the client traces (``--trace FILE``), trace every worker; then gather their files."""
    tracer = iotrace.TRACER
    if tracer is None:
        yield
        return
    run_id = str(tracer.header.get("run_id", ""))
    name = f"manyfiles-trace-{run_id}"
    client.register_plugin(TracePlugin(run_id), name=name)
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, (LeaseLapsed, ClusterLost)) or connection_lost(exc, client):
            raise            # no scheduler to ask: the traces stay on the workers' hosts
        _end_traces(client, run_id, name, tracer.path)
        raise
    _end_traces(client, run_id, name, tracer.path)


def _end_traces(client: Any, run_id: str, name: str, path: str) -> None:
    with contextlib.suppress(Exception):
        client.unregister_worker_plugin(name)     # teardown closes every worker's file
    gather_traces(client, run_id, path)


def _trace_dir(run_id: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"manyfiles-trace-{run_id}")


class TracePlugin(distributed.WorkerPlugin):
    """Traces a worker process to ``$TMP/manyfiles-trace-<run>/<pid>`` while registered."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.tracer: iotrace.Tracer | None = None

    def setup(self, worker: Any) -> None:
        if iotrace.TRACER is not None:
            return
        folder = _trace_dir(self.run_id)
        os.makedirs(folder, exist_ok=True)
        self.tracer = iotrace.Tracer(os.path.join(folder, str(os.getpid())),
                                     header={"role": "worker", "run_id": self.run_id})
        iotrace.TRACER = self.tracer

    def teardown(self, worker: Any) -> None:
        if self.tracer is not None:
            if iotrace.TRACER is self.tracer:
                iotrace.TRACER = None
            self.tracer.close()
            self.tracer = None


def _trace_files(run_id: str) -> list[tuple[str, str, int]]:
    folder = _trace_dir(run_id)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    host = os.uname().nodename
    return [(host, os.path.join(folder, n), os.stat(os.path.join(folder, n)).st_size)
            for n in names if n.isdigit()]


def _read_chunk(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _remove_trace_dir(run_id: str) -> None:
    shutil.rmtree(_trace_dir(run_id), ignore_errors=True)


def gather_traces(client: Any, run_id: str, main_path: str) -> None:
    """Copy every worker's trace file next to ``main_path`` as ``main_path.worker-<pid>``.

    Files are found on each host (a worker killed mid-job leaves its file there; a live worker
    on the same host fetches it) and copied in chunks, never as one message.
    """
    found: dict[tuple[str, str], tuple[str, int]] = {}
    for address, files in client.run(_trace_files, run_id).items():
        for host, path, size in files:
            found.setdefault((host, path), (address, size))
    taken: set[str] = set()
    for (_host, path), (address, size) in sorted(found.items()):
        pid = os.path.basename(path)
        target = f"{main_path}{iotrace.WORKER_SUFFIX}{pid}"
        n = 0
        while target in taken or os.path.exists(target):     # same pid on two hosts
            n += 1
            target = f"{main_path}{iotrace.WORKER_SUFFIX}{pid}{n:03d}"
        taken.add(target)
        with open(target, "wb") as out:
            for offset in range(0, size, TRACE_CHUNK):
                out.write(client.run(_read_chunk, path, offset, TRACE_CHUNK, workers=[address])[address])
    with contextlib.suppress(Exception):
        client.run(_remove_trace_dir, run_id)
