"""Chrome trace-event JSON from an I/O trace (opens in Perfetto / chrome://tracing / vizviewer).

Each operation becomes an async begin/end pair, so operations that overlap on one
thread (asyncio, or a process's worker threads) get their own lanes.  Timestamps
are CLOCK_MONOTONIC microseconds, the clock viztracer uses, so the events line up
with a ``--profile`` of the same run when merged into it.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from manyfiles.errors import ManyfilesError
from manyfiles.trace.reader import TraceSet
from manyfiles.trace.summary import is_error, result_name

CATEGORY = "io"


def to_chrome(traces: TraceSet) -> list[dict[str, Any]]:
    """The trace events (``traceEvents`` list) for every record of ``traces``."""
    events: list[dict[str, Any]] = []
    for f in traces.files:
        pid = int(f.header.get("pid", 0))
        role = f.header.get("role", "main")
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"manyfiles {role} {pid}"}})
    for (pid, tid), name in sorted(traces.thread_names().items()):
        if name:
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
    for n, r in enumerate(traces.records()):
        args: dict[str, Any] = {"path": r.path.decode("utf-8", "backslashreplace")}
        if r.op == "getdents":
            args["entries"] = r.offset
            args["bytes"] = r.length
        elif r.offset or r.length:
            args["offset"] = r.offset
            args["length"] = r.length
        if r.result:
            args["result"] = result_name(r.op, r.result) if is_error(r.op, r.result) else r.result
        common = {"cat": CATEGORY, "name": r.op, "id": n, "pid": r.pid, "tid": r.tid}
        events.append({"ph": "b", "ts": r.start_ns / 1000, "args": args, **common})
        events.append({"ph": "e", "ts": (r.start_ns + r.dur_ns) / 1000, **common})
    if traces.dropped:
        first = min((int(f.header.get("pid", 0)) for f in traces.files), default=0)
        events.append({"ph": "M", "name": "process_labels", "pid": first, "tid": 0,
                       "args": {"labels": f"{traces.dropped} I/O records dropped"}})
    return events


def export_chrome(traces: TraceSet, output: str | os.PathLike, *,
                  merge: str | os.PathLike | None = None) -> int:
    """Write Chrome-trace JSON to ``output``; with ``merge``, add the events to that viztracer profile.

    Returns the number of I/O records written.  The output is replaced atomically.
    """
    events = to_chrome(traces)
    if merge is not None:
        doc = _load_profile(merge)
        doc.setdefault("traceEvents", []).extend(events)
    else:
        doc = {"traceEvents": events, "displayTimeUnit": "ns"}
    tmp = f"{os.fspath(output)}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as out:
            json.dump(doc, out, separators=(",", ":"))
        os.replace(tmp, output)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise ManyfilesError(f"{os.fsdecode(output)}: {exc.strerror or exc}") from exc
    return len(traces)


def _load_profile(path: str | os.PathLike) -> dict[str, Any]:
    name = os.fsdecode(path)
    try:
        with open(path, "rb") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ManyfilesError(f"{name}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ManyfilesError(f"{name}: not a JSON profile (save it as .json to merge into it)") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ManyfilesError(f"{name}: not a Chrome-trace/viztracer JSON profile (no traceEvents)")
    return doc
