"""The processes engine: kill() after a worker died mid-put must not hang the exit; no outcome is lost."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, os, signal, sys
    from manyfiles._core.retry import RetryPolicy
    from manyfiles.s3.client import ClientSettings
    from manyfiles.s3.engines.base import Ctx, Options
    from manyfiles.s3.engines.processes import ProcessesEngine

    options = Options("bucket", ClientSettings(endpoint_url="http://127.0.0.1:9"), RetryPolicy(),
                      dest=sys.argv[1])
    engine = ProcessesEngine(Ctx(options, None), 1, 1, "threads")

    def die_holding_the_write_lock():     # what SIGTERM does to a worker in the middle of a put
        engine.outq._wlock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)

    holder = mp.get_context("fork").Process(target=die_holding_the_write_lock)
    holder.start()
    holder.join()
    engine.kill()
    print("killed", flush=True)
""")


def test_kill_after_a_worker_died_holding_the_queue_lock_exits(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "dest")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "killed\n"


LATE_OUTCOME = textwrap.dedent("""
    import multiprocessing.queues, os, queue, sys, threading
    from manyfiles._core.retry import RetryPolicy
    from manyfiles.s3.client import ClientSettings
    from manyfiles.s3.engines.base import Ctx, Options
    from manyfiles.s3.engines.events import JobFailed
    from manyfiles.s3.engines.processes import ProcessesEngine
    from manyfiles.s3.transfer import Download

    # The reader's first wait for results times out just as the worker, done, writes its outcome
    # and exits (what a loaded machine does to the reader thread): the outcome is in the pipe.
    parent, real_get, started = os.getpid(), multiprocessing.queues.Queue.get, threading.Event()

    def get(self, block=True, timeout=None):
        if os.getpid() == parent and threading.current_thread().name == "s3pull-processes-reader" \\
                and not getattr(get, "done", False):
            get.done = True
            started.wait()
            for p in engine.procs:
                p.join()
            raise queue.Empty
        return real_get(self, block, timeout)

    multiprocessing.queues.Queue.get = get
    # nothing listens there: the first-contact budget (half the stall timeout) ends the job at once
    options = Options("bucket", ClientSettings(endpoint_url="http://127.0.0.1:9"),
                      RetryPolicy(attempts=1, stall_timeout=0.2), dest=sys.argv[1])
    ctx = Ctx(options, None)
    engine = ProcessesEngine(ctx, 1, 1, "threads")
    started.set()
    engine.submit(Download("k", "k", 10, None, "processes"))
    engine.close()
    while not ctx.events.empty():
        ev = ctx.events.get()
        if type(ev) is JobFailed:
            print(ev.outcome.reason)
""")


def test_an_outcome_written_as_the_reader_gives_up_waiting_is_still_read(tmp_path: Path) -> None:
    """Seen as a flaky test under load: the worker's "failed" (a refused signature) was never read,
    and the job was reported "worker process died" instead of stopping the run."""
    proc = subprocess.run([sys.executable, "-c", LATE_OUTCOME, str(tmp_path / "dest")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (reason,) = proc.stdout.splitlines()
    assert reason != "worker process died"
