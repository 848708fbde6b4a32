"""What a push did: :class:`PushReport` (and, for a dry run, the planned files)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.report import Report
from manyfiles._core.units import format_size as human_bytes


@dataclass(kw_only=True)
class PushReport(Report):
    """One push: files listed, uploaded (``bytes``), by one PUT or multipart (``parts`` sent,
    ``resumed_parts`` kept from a killed run's uploads), ``skipped`` (symlinks not followed, files a
    killed run had finished), ``aborted`` (uploads of a killed run no longer needed); ``failures``
    one per file refused or not uploaded.  ``dry_run``: ``planned`` holds what would be sent."""

    dest: str = ""
    listed: int = 0
    uploaded: int = 0
    bytes: int = 0
    puts: int = 0
    multipart: int = 0
    parts: int = 0
    resumed_parts: int = 0
    skipped: int = 0
    aborted: int = 0
    same: int = 0
    deleted: int = 0
    retried: int = 0
    checksum: str = ""
    dry_run: bool = False
    planned: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def summary(self) -> str:
        if self.dry_run:
            uploads = [p for p in self.planned if p["how"] != "delete"]
            total = sum(p["size"] for p in uploads)
            gone = len(self.planned) - len(uploads)
            return (f"would upload {len(uploads):,} files ({human_bytes(total)}) to {self.dest}"
                    + (f", {self.same:,} already there" if self.same else "")
                    + (f", delete {gone:,} objects" if gone else "")
                    + (f", {self.skipped:,} skipped" if self.skipped else ""))
        rate = self.bytes / self.seconds if self.seconds > 0 else 0.0
        out = (f"uploaded {self.uploaded:,} of {self.listed:,} files ({human_bytes(self.bytes)}) "
               f"to {self.dest} in {self.seconds:.2f} s ({human_bytes(rate)}/s); {self.puts:,} PUT, "
               f"{self.multipart:,} multipart "
               f"({self.parts:,} parts), checked by {self.checksum}")
        extra = [f"{self.resumed_parts:,} parts resumed" if self.resumed_parts else "",
                 f"{self.skipped:,} skipped" if self.skipped else "",
                 f"{self.aborted:,} stale uploads aborted" if self.aborted else "",
                 f"{self.same:,} already there" if self.same else "",
                 f"{self.deleted:,} deleted" if self.deleted else "",
                 f"{self.retried:,} re-read" if self.retried else ""]
        return out + "".join(f", {e}" for e in extra if e)


@dataclass(kw_only=True)
class AbortReport(Report):
    """``abort_stale``: multipart uploads under the prefix listed, and those aborted (or that would be)."""

    prefix: str = ""
    listed: int = 0
    aborted: list[dict[str, Any]] = field(default_factory=list)
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would abort" if self.dry_run else "aborted"
        return f"{verb} {len(self.aborted):,} of {self.listed:,} multipart uploads under {self.prefix}"
