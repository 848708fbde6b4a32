"""I/O operation log.  INTERFACE ONLY: the implementation is issue 6's work.

Contract used by every module that performs I/O:

    from manyfiles import iotrace
    tr = iotrace.TRACER                  # None when tracing is off (the common case)
    if tr is not None:
        t0 = time.monotonic_ns()
    ... the operation ...
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)

``op`` is a short str ("getdents", "stat", "open", "write", "fsync", "rename",
"unlink", "mkdir", "rmdir", "s3.list", "s3.get", "s3.get_range"), ``path`` a str or
bytes (S3: "bucket/key"), ``result`` 0 on success, else the errno or HTTP status.
For "getdents", ``offset`` is the number of entries and ``length`` the bytes returned.
CLOCK_MONOTONIC is shared by all processes, so worker traces can be merged.
"""

from __future__ import annotations

TRACER = None
