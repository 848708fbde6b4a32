"""Per-worker-process set-up for ``--profile`` and ``--trace``.

Every engine that starts worker processes wraps each worker's whole loop in
``instrumented_worker()`` so that ``--profile`` and ``--trace`` include the workers
(each writes its own file; the parent merges them).  The parent's settings reach
the worker through environment variables, so fork, spawn and forkserver all work.
With ``multiprocessing.Pool``, pass ``initializer=worker_initializer`` instead.

    def _worker_main(queue):
        with instrumented_worker():
            for item in iter(queue.get, None):
                ...
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from manyfiles.trace import iotrace
from manyfiles.trace.profiling import ENV_DIR as ENV_PROFILE_DIR

__all__ = ["instrumented_worker", "worker_initializer"]


@contextlib.contextmanager
def instrumented_worker() -> Iterator[None]:
    """Start profiling/tracing in this worker process if the parent has them on."""
    tracer = iotrace.start_worker()
    prof = _start_profile()
    try:
        yield
    finally:
        try:
            if prof is not None:
                from manyfiles.trace.profiling import stop_worker

                stop_worker(prof)
        finally:
            iotrace.stop_worker(tracer)


def worker_initializer() -> None:
    """``multiprocessing.Pool(initializer=...)`` form: instrument until the worker exits cleanly.

    Pool workers that end normally (``pool.close(); pool.join()``) run multiprocessing's
    finalizers, which save the files; a worker killed by ``pool.terminate()`` keeps its
    I/O trace up to the last periodic flush and loses its profile.
    """
    from multiprocessing.util import Finalize

    cm = instrumented_worker()
    cm.__enter__()
    Finalize(None, cm.__exit__, args=(None, None, None), exitpriority=10)


def _start_profile() -> object | None:
    if not os.environ.get(ENV_PROFILE_DIR):
        return None  # keeps viztracer unimported in the common case
    from manyfiles.trace.profiling import start_worker

    return start_worker()
