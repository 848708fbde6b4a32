"""The reports of the cache's operations and its statistics: plain dataclasses."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from manyfiles._core.report import Report
from manyfiles._core.units import format_size


@dataclass(kw_only=True)
class WarmReport(Report):
    """What :meth:`Cache.warm` did: ``fetched`` objects were read from their origin, ``cached`` were
    already complete in the cache (and were validated now)."""

    objects: int = 0
    cached: int = 0
    fetched: int = 0
    bytes: int = 0

    def summary(self) -> str:
        rate = f", {format_size(self.bytes / self.seconds)}/s" if self.seconds > 0 and self.bytes else ""
        failed = f", {len(self.failures):,} failed" if self.failures else ""
        return (f"{self.objects:,} objects: {self.fetched:,} fetched ({format_size(self.bytes)}{rate}), "
                f"{self.cached:,} already cached{failed} in {self.seconds:.1f} s")


@dataclass(kw_only=True)
class VerifyReport(Report):
    """What :meth:`Cache.verify` checked and repaired.  ``ok`` (exit 0) only when no wrong data was
    found and every object is verified or unverifiable (see docs/cache.md, "Integrity"); each
    object that is not is also one failure."""

    entries: int = 0
    blocks: int = 0             # block and whole files checked
    bytes: int = 0
    corrupt: int = 0            # files whose header, CRC or check was wrong (wrong data): removed
    missing: int = 0            # blocks the index listed but that were not on disk
    adopted: int = 0            # sound blocks the index did not list (a fill cut short by a kill)
    orphans: int = 0            # files of no entry: removed
    temps: int = 0              # temporary files of dead processes: removed
    # objects by the check their bytes passed:
    verified: int = 0           # complete, and their bytes passed the object's check (S3 checksum,
                                # MD5 or multipart ETag; a part checksum per block)
    unverifiable: int = 0       # complete, read whole, nothing to check against (SSE-KMS/SSE-C without
                                # a checksum, local files): their at-rest CRC-32 passed
    unverified: int = 0         # hold blocks no check covered (--complete checks them)
    partial: int = 0            # not complete (the blocks they hold may all be verified)
    completed: int = 0          # fetched whole and checked by --complete
    wrong: int = 0              # objects found holding wrong data: their wrong files dropped
    dropped: int = 0            # objects that could not be checked (--complete): dropped

    def summary(self) -> str:
        return (f"{self.entries:,} objects, {self.blocks:,} files ({format_size(self.bytes)}) checked in "
                f"{self.seconds:.1f} s: {self.verified:,} verified, {self.unverifiable:,} unverifiable, "
                f"{self.unverified:,} unverified, {self.partial:,} partial; {self.completed:,} completed, "
                f"{self.wrong:,} held wrong data, {self.dropped:,} dropped; {self.corrupt:,} corrupt and "
                f"{self.orphans:,} orphan files removed, {self.missing:,} missing, {self.adopted:,} adopted, "
                f"{self.temps:,} stale temporary files removed")


@dataclass(kw_only=True)
class EvictReport(Report):
    """What :meth:`Cache.evict` (or :meth:`Cache.clear`) removed, or would remove (``dry_run``)."""

    entries: int = 0
    bytes: int = 0
    dry_run: bool = False
    verb: str = "evicted"

    def summary(self) -> str:
        would = "would be " if self.dry_run else ""
        return f"{self.entries:,} entries {would}{self.verb} ({format_size(self.bytes)})"


@dataclass
class CacheStats:
    """Counters of a cache directory, summed over every process that used it."""

    dir: str
    entries: int
    bytes: int
    block_size: int
    max_size: int | None
    min_free: int
    free_bytes: int
    hits: int              # blocks served from the cache (a whole file: its blocks, when opened)
    misses: int            # blocks read from the origin
    hit_bytes: int
    miss_bytes: int
    fills: int             # blocks written to the cache (each counted once)
    fill_bytes: int
    fills_dropped: int     # blocks not cached: queue full or cache disk failing
    evictions: int         # entries evicted by the watermarks or `evict`
    evicted_bytes: int
    corrupt: int           # files found corrupt and removed
    object_hits: int = 0   # object reads served whole from the cache (get_bytes, a reader closed)
    object_misses: int = 0  # object reads that fetched at least one block from the origin

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    @property
    def object_hit_ratio(self) -> float:
        total = self.object_hits + self.object_misses
        return self.object_hits / total if total else 0.0

    def _repr_html_(self) -> str:
        import html

        cap = format_size(self.max_size) if self.max_size is not None else "unlimited"
        rows = [
            ("objects read", f"{self.object_hits + self.object_misses:,}: {self.object_hits:,} hits, "
                             f"{self.object_misses:,} misses ({self.object_hit_ratio:.1%} hits)"),
            ("blocks read", f"{self.hits:,} hits ({format_size(self.hit_bytes)}), {self.misses:,} misses "
                            f"({format_size(self.miss_bytes)}); {self.hit_ratio:.1%} hits"),
            ("entries", f"{self.entries:,} ({format_size(self.bytes)} of {cap}; "
                        f"{format_size(self.free_bytes)} free, keeps {format_size(self.min_free)})"),
            ("fills", f"{self.fills:,} blocks ({format_size(self.fill_bytes)}), "
                      f"{self.fills_dropped:,} dropped"),
            ("evictions", f"{self.evictions:,} entries ({format_size(self.evicted_bytes)})"),
            ("corrupt", f"{self.corrupt:,} files removed"),
        ]
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>" for k, v in rows)
        return (f"<div><b>CacheStats</b>: {html.escape(self.dir)} (block size "
                f"{format_size(self.block_size)})<table>{body}</table></div>")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "hit_ratio": round(self.hit_ratio, 6),
                "object_hit_ratio": round(self.object_hit_ratio, 6)}

    def __str__(self) -> str:
        cap = format_size(self.max_size) if self.max_size is not None else "unlimited"
        return "\n".join([
            f"cache       {self.dir}",
            f"entries     {self.entries:,}",
            f"size        {format_size(self.bytes)} (max {cap}, keep {format_size(self.min_free)} free; "
            f"{format_size(self.free_bytes)} free)",
            f"objects     {self.object_hits:,} hits, {self.object_misses:,} misses "
            f"({self.object_hit_ratio:.1%} hits)",
            f"hits        {self.hits:,} blocks ({format_size(self.hit_bytes)})",
            f"misses      {self.misses:,} blocks ({format_size(self.miss_bytes)})",
            f"hit ratio   {self.hit_ratio:.1%}",
            f"fills       {self.fills:,} ({format_size(self.fill_bytes)}), {self.fills_dropped:,} dropped",
            f"evictions   {self.evictions:,} entries ({format_size(self.evicted_bytes)})",
            f"corrupt     {self.corrupt:,} files removed",
        ])


__all__ = ["CacheStats", "EvictReport", "VerifyReport", "WarmReport"]
