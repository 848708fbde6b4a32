"""A job for the lease tests, imported by the client subprocesses they kill (and shipped to the
workers by value: they cannot import tests)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from manyfiles._core.report import Report
from manyfiles.scale.executor import Job, ShardResult

TICK = 0.05


@dataclass(frozen=True)
class TickJob(Job):
    """Shard i writes ``folder/<i>-<k>`` (k = 0, 1, ...) every TICK seconds, ``ticks`` times, and
    publishes after each: without a lease a shard would go on for ``ticks * TICK`` seconds."""

    folder: str
    n: int = 2
    ticks: int = 2000
    name = "ticks"
    unit = "files"

    def shards(self):
        return range(self.n)

    def new_report(self) -> Report:
        return Report()

    def run(self, shard: int, publish) -> ShardResult:
        for k in range(self.ticks):
            Path(self.folder, f"{shard}-{k}").write_bytes(str(os.getpid()).encode())
            publish(k + 1, 0, 0)
            time.sleep(TICK)
        return ShardResult(report=Report(), items=self.ticks)
