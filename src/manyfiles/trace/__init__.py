"""Reading I/O traces written by ``--trace FILE`` / :func:`manyfiles.tracing`.

Example:
    >>> from manyfiles import trace
    >>> ts = trace.load(["run.mftrace"])          # doctest: +SKIP  (+ run.mftrace.worker-* files)
    >>> s = trace.summarize(ts)                    # doctest: +SKIP
    >>> [(o.op, o.count, o.p99_ns) for o in s.ops] # doctest: +SKIP
    [('rename', 200000, 41000), ...]
    >>> trace.export_chrome(ts, "run.json")        # doctest: +SKIP

The writer is :mod:`manyfiles.trace.iotrace` (also at its old path ``manyfiles.iotrace``), the file
format :mod:`manyfiles.trace.format`; :mod:`manyfiles.trace.profiling` writes viztracer profiles.
Names are loaded lazily so that starting a trace imports only the format module.
"""

from __future__ import annotations

from manyfiles._core.lazy import lazy_exports

_EXPORTS = {
    "export_chrome": ".chrome",
    "to_chrome": ".chrome",
    "Record": ".reader",
    "TraceSet": ".reader",
    "load": ".reader",
    "worker_files": ".reader",
    "OpStats": ".summary",
    "Summary": ".summary",
    "summarize": ".summary",
}

__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
