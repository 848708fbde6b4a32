"""A job for the lease tests, imported by the client subprocesses they kill (and shipped to the
workers by value: they cannot import tests)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from manyfiles._core.report import Report
from manyfiles.scale import lease
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


@dataclass(frozen=True)
class LapseJob(Job):
    """Shard i registers and notes its attempt number; its first ``lapses`` attempts then stop as
    a shard whose worker lost the lease does (LeaseLapsed); the next one writes the notes of the
    attempts before it to ``folder/<i>`` and counts one item."""

    folder: str
    n: int = 3
    lapses: int = 1
    name = "lapses"

    def shards(self):
        return range(self.n)

    def new_report(self) -> Report:
        return Report()

    def run(self, shard: int, publish) -> ShardResult:
        attempt = lease.current()
        earlier = [str(v) for v in attempt.earlier.values()]
        attempt.note(f"attempt {len(earlier)}")
        publish(0, 0, 0)
        if len(earlier) < self.lapses:
            raise lease.LeaseLapsed("the job's lease lapsed (here: on purpose): shard stopped")
        Path(self.folder, str(shard)).write_text("\n".join(earlier))
        return ShardResult(report=Report(), items=1)
