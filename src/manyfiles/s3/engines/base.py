"""The seam between the planner and the engines.

An engine receives jobs with ``submit(job)`` from the planner's thread, runs them
on its own threads/loop/processes, and reports every outcome through the
:class:`Ctx` (``bytes``, ``retried``, ``done``, ``failed``), which only queues
events: the thread that called ``pull()`` consumes them (progress, state file,
report), so engines never share mutable state with it.  ``close()`` waits for
all submitted jobs.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from manyfiles.s3.client import ClientSettings
from manyfiles.s3.retry import RetryPolicy


@dataclass(frozen=True)
class Options:
    """What every engine (and every worker process) needs to know; picklable."""

    bucket: str
    settings: ClientSettings
    retry: RetryPolicy
    verify_md5: bool = True
    dest: str | None = None          # None: memory
    layout: str = "folder"
    fsync: bool = False


class Ctx:
    """Event channel from engines to the consuming thread, plus the cancel flag."""

    def __init__(self, options: Options, sink) -> None:
        self.options = options
        self.sink = sink
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.cancel = threading.Event()

    # Called from engine threads.  Event tuples: (kind, job_or_None, value)
    def bytes(self, n: int) -> None:
        self.events.put(("bytes", None, n))

    def retried(self, job, reason: str) -> None:
        self.events.put(("retry", job, reason))

    def done(self, job, engine: str) -> None:
        self.events.put(("done", job, engine))

    def failed(self, job, reason: str) -> None:
        self.events.put(("failed", job, reason))


class Engine:
    name = "engine"

    def submit(self, job) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Hand over buffered jobs (the listing finished a page)."""

    def close(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """Stop as fast as possible (Ctrl-C): in-flight temp files are removed or kept for resume."""
        self.close()
