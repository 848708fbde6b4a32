"""Per-worker-process set-up.  INTERFACE ONLY: the implementation is issue 6's work.

Every engine that starts worker processes wraps each worker's whole loop in
``instrumented_worker()`` so that ``--profile`` and ``--trace`` include the workers
(each writes its own file; the parent merges them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def instrumented_worker() -> Iterator[None]:
    """Start profiling/tracing in this worker process if the parent has them on."""
    yield
