"""What one pull is asked to do (:class:`PullConfig`) and where it puts objects (:class:`Destination`).

Their own module: the run (``_run``), its planner (``_producer``) and its consumer (``_events``)
all take them, and ``_run`` imports the other two.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.s3 import routing
from manyfiles.s3.retry import RetryPolicy
from manyfiles.s3.state import State

LAYOUTS = ("folder", "sharded")


@dataclass(frozen=True)
class PullConfig:
    strategy: str = "auto"
    concurrency: int = 64
    processes: int = 0                  # 0: os.cpu_count() for the processes engine
    sub_engine: str = "http"            # what each worker process runs: http, async or threads
    ranged_min: int = routing.RANGED_MIN
    part_size: int | None = None        # None: by object size and cores (routing.part_size_for)
    verify: bool = True                 # False: size-only (--no-verify)
    verify_existing: bool = False       # re-hash every file the state file calls done
    checksum_mode: bool = True          # False: never ask for flexible checksums, ETags only
    fsync: bool = False
    layout: str = "folder"
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    cache: Any = None                   # a manyfiles.cache.Cache: hits are copied from it, downloads fill it

    def check(self) -> None:
        """UsageError for a bad value, before anything is listed or created."""
        if self.strategy not in routing.STRATEGIES + routing.CANDIDATES:
            raise UsageError(f"unknown strategy {self.strategy!r} "
                             f"(choose from {', '.join(routing.STRATEGIES)})")
        if self.layout not in LAYOUTS:
            raise UsageError(f"unknown layout {self.layout!r} (choose from {', '.join(LAYOUTS)})")
        for name in ("concurrency", "part_size", "ranged_min"):
            value = getattr(self, name)
            if value is None and name == "part_size":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name} must be a positive integer, not {value!r}")
        if not isinstance(self.retry, RetryPolicy):
            raise UsageError(f"retry must be a manyfiles.s3.RetryPolicy, not {self.retry!r}")
        stall = self.retry.stall_timeout
        if isinstance(stall, bool) or not isinstance(stall, (int, float)) or not stall > 0:
            raise UsageError(f"retry.stall_timeout must be a number of seconds > 0, not {stall!r}")


@dataclass
class Destination:
    """Where one run puts objects: the sink (None for a dry run), the state file (None in memory),
    and the final path of an object's relative path (what the state records and checks)."""

    sink: Any
    state: State | None
    final_path: Callable[[str], str]

    @classmethod
    def open(cls, dest: str | None, cfg: PullConfig, *, dry_run: bool, state_slice: str | None,
             on_data: Callable[[str, bytes], None]) -> Destination:
        """The folder opened (created) for writing, read only for a dry run, or memory (``dest``
        None: ``on_data(key, bytes)`` per object)."""
        from manyfiles.s3.sink import FolderSink, MemorySink

        if dest is None:
            return cls(MemorySink(on_data), None, _under(os.path.abspath(".")))
        if dry_run:
            state = State(os.path.abspath(dest))
            if os.path.isdir(dest):
                state.open(create=False)
            return cls(None, state, _under(os.path.abspath(dest)))
        if os.path.exists(dest) and not os.path.isdir(dest):
            raise ManyfilesError(f"{dest}: not a directory")
        sink = FolderSink(dest, layout=cfg.layout, fsync=cfg.fsync, state_slice=state_slice).open()
        return cls(sink, sink.state, sink.final_path)


def _under(root: str) -> Callable[[str], str]:
    def final_path(rel: str) -> str:
        return os.path.join(root, rel)

    return final_path


def _config(**kwargs: Any) -> PullConfig:
    names = {f.name for f in fields(PullConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise UsageError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    cfg = PullConfig(**kwargs)
    cfg.check()
    return cfg
