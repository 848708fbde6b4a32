"""Per-operation statistics of a trace: counts, bytes, throughput, latency percentiles."""

from __future__ import annotations

import errno
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from manyfiles.trace.reader import TraceSet


def is_error(op: str, result: int) -> bool:
    """0 is success for filesystem ops; S3 ops may also record their 2xx HTTP status."""
    if result == 0:
        return False
    return not (op.startswith("s3") and 200 <= result < 300)


def result_name(op: str, result: int) -> str:
    """``ENOENT`` for an errno, ``HTTP 404`` for an S3 status."""
    if op.startswith("s3") and result >= 100:
        return f"HTTP {result}"
    return errno.errorcode.get(result, str(result))


@dataclass
class OpStats:
    """Statistics of one operation type; times in ns, throughput over the op's active span."""

    op: str
    count: int
    errors: int
    entries: int              # getdents: directory entries returned (sum of ``offset``)
    bytes: int                # sum of ``length`` (getdents: bytes of dirents; S3 GET: bytes received)
    span_ns: int              # first start to last end of this op, across all processes
    busy_ns: int              # sum of durations (> span_ns when operations overlap)
    p50_ns: int
    p95_ns: int
    p99_ns: int
    max_ns: int
    results: dict[str, int] = field(default_factory=dict)   # failures by errno / HTTP status

    @property
    def ops_per_s(self) -> float:
        return self.count / (self.span_ns / 1e9) if self.span_ns else 0.0

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / (self.span_ns / 1e9) if self.span_ns else 0.0


@dataclass
class Summary:
    """What ``manyfiles trace summary`` prints."""

    files: list[str]
    processes: int
    threads: int
    records: int
    dropped: int
    span_ns: int
    ops: list[OpStats]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for op, s in zip(d["ops"], self.ops, strict=True):
            op["ops_per_s"] = round(s.ops_per_s, 3)
            op["bytes_per_s"] = round(s.bytes_per_s, 3)
        return d


def _percentile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return 0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def summarize(traces: TraceSet) -> Summary:
    """Aggregate every record of ``traces`` (parent and workers) by operation."""
    durs: dict[str, list[int]] = {}
    count: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    entries: Counter[str] = Counter()
    nbytes: Counter[str] = Counter()
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    failures: dict[str, Counter[str]] = {}
    threads: set[tuple[int, int]] = set()
    for f in traces.files:
        pid = int(f.header.get("pid", 0))
        for b in f.blocks:
            threads.update((pid, t) for t in set(b.tids))
            for op, offset, length, start, dur, result in zip(b.ops, b.offset, b.length, b.start_ns, b.dur_ns,
                                                              b.result, strict=True):
                count[op] += 1
                durs.setdefault(op, []).append(dur)
                nbytes[op] += length
                if op == "getdents":
                    entries[op] += offset
                if result and is_error(op, result):
                    errors[op] += 1
                    failures.setdefault(op, Counter())[result_name(op, result)] += 1
                if op not in first or start < first[op]:
                    first[op] = start
                if op not in last or start + dur > last[op]:
                    last[op] = start + dur
    stats = []
    for op in sorted(count, key=lambda o: (-count[o], o)):
        d = sorted(durs[op])
        stats.append(OpStats(op=op, count=count[op], errors=errors[op], entries=entries[op], bytes=nbytes[op],
                             span_ns=last[op] - first[op], busy_ns=sum(d), p50_ns=_percentile(d, 50),
                             p95_ns=_percentile(d, 95), p99_ns=_percentile(d, 99), max_ns=d[-1],
                             results=dict(failures.get(op, {}))))
    span = (max(last.values()) - min(first.values())) if first else 0
    pids = {int(f.header.get("pid", 0)) for f in traces.files}
    return Summary(files=[f.path for f in traces.files], processes=len(pids), threads=len(threads),
                   records=sum(count.values()), dropped=traces.dropped, span_ns=span, ops=stats,
                   notes=list(traces.notes))
