"""The processes engine's kill(): a worker that dies in the middle of a put must not hang the exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, os, signal, sys
    from manyfiles._retry import RetryPolicy
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
