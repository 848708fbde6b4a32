"""What a migration did: :class:`MigrationReport` (``shard apply/revert/reshard``).

Its own module so that both the engine's entry points (:mod:`manyfiles.shard.migrate`) and the
cluster job (``shard/_cluster.py``), which migrate calls, can build one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from manyfiles._core.report import Report
from manyfiles.shard.layout import Layout


@dataclass(kw_only=True)
class MigrationReport(Report):
    """What a migration did.  ``ok`` is False when something failed or was left in the way.

    ``conflicts`` (names at source AND destination, both kept) are also in ``failures``.
    ``left_flat``: files still flat at the end -- created after the last rescan, or (with a
    plan) not in the plan; they are not failures: run ``apply`` again to move them.
    """

    op: str
    root: str
    layout: Layout | None
    moved: int = 0
    already: int = 0       # found done: a previous (killed) run or an NFS rename retry did it
    vanished: int = 0      # deleted by someone else before we got to it
    appeared: int = 0      # created during the migration and moved by a rescan
    set_aside: int = 0     # files named like a top bucket, parked in the aside directory first
    left_flat: int = 0
    buckets: int = 0
    resumed: bool = False
    nothing_to_do: bool = False
    dry_run: bool = False  # revert/reshard(dry_run=True): nothing moved; ``planned`` would be
    planned: int = 0
    skipped: list[tuple[bytes, str]] = field(default_factory=list)   # left alone on purpose
    conflicts: list[bytes] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def errors(self) -> list[tuple[str, str]]:
        """``(path, reason)`` of the failures that are not conflicts (the list ``errors`` was before
        issue 10, which held names relative to the root)."""
        return [(f.path, f.reason) for f in self.failures if f.code != "EEXIST"]

    def summary(self) -> str:
        if self.nothing_to_do:
            state = {"revert": "not sharded"}.get(self.op, f"already sharded ({self.layout.describe()})"
                                                  if self.layout else "not sharded")
            return f"{self.root}: {state}; nothing to do"
        if self.dry_run:
            how = {"revert": "back to the top level",
                   "reshard": f"into {self.layout.describe() if self.layout else '?'}"}.get(self.op, "")
            again = "; an interrupted run would be resumed" if self.resumed else ""
            return f"{self.op} (dry run): {self.planned:,} files would move {how}; nothing moved{again}"
        extra = [f"{self.already:,} already done" if self.already else "",
                 f"{self.appeared:,} appeared during the run" if self.appeared else "",
                 f"{self.vanished:,} vanished" if self.vanished else "",
                 f"{self.left_flat:,} left flat (rerun apply to move them)" if self.left_flat else "",
                 "resumed an interrupted run" if self.resumed else ""]
        tail = "; ".join(x for x in extra if x)
        return (f"{self.op}: {self.moved:,} files moved, {self.buckets:,} buckets, {self.seconds:.1f} s "
                f"({self.rate:,.0f} files/s){'; ' + tail if tail else ''}")


__all__ = ["MigrationReport"]
