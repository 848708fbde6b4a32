"""What a pull (or a verification of its destination) returns: counts, bytes, checks, failures.

Both derive from :class:`manyfiles._core.report.Report`: ``ok``, ``failures`` (``Failure(path=key,
reason, code)``), ``seconds``, ``raise_for_failures()``, a readable ``str()``, ``to_dict()``
(what ``--json`` prints) and a table in Jupyter.

Example:
    >>> r = PullReport(listed=3, done=2, skipped=1, bytes=3 << 20, seconds=1.5, verified={"md5": 2})
    >>> print(r.summary().replace("; ", ";\n"))
    2 downloaded (3.0 MiB) in 1.50 s, 2.0 MiB/s, 1 objects/s;
    1 skipped, 0 failed, 0 retries;
    verified: md5 2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from manyfiles._core.report import Report
from manyfiles._core.units import format_size


@dataclass
class Tally:
    """Objects and bytes (per engine, per check method...)."""

    objects: int = 0
    bytes: int = 0

    def add(self, nbytes: int) -> None:
        self.objects += 1
        self.bytes += nbytes


def _tally(counts: dict[str, Tally], name: str, nbytes: int) -> None:
    counts.setdefault(name, Tally()).add(nbytes)


@dataclass(kw_only=True)
class PullReport(Report):
    """Outcome of :func:`manyfiles.s3.pull`.

    ``done``/``skipped`` (already there)/``failures`` per object; ``bytes`` downloaded;
    ``engines`` and ``planned``: objects and bytes per engine (fetched, and chosen by the
    plan); ``verified``: objects per check kind (``md5``, ``multipart-md5``, ``crc64nvme``...;
    ``multipart-md5-searched`` when the part sizes were found by the layout search, ``size-only``
    for SSE-KMS/SSE-C objects without a checksum or ``--no-checksum``); ``notes``: why a better
    check was not possible.
    """

    listed: int = 0
    done: int = 0
    skipped: int = 0
    bytes: int = 0
    retries: int = 0
    resumed_parts: int = 0
    engines: dict[str, Tally] = field(default_factory=dict)
    planned: dict[str, Tally] = field(default_factory=dict)
    verified: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    budget: str = ""
    failures_file: str | None = None
    dry_run: bool = False
    deleted: int = 0            # local files a sync removed (``--sync --delete``; dry run: would remove)
    deletions: list[str] = field(default_factory=list, repr=False)   # their paths, relative to DEST

    @property
    def rate(self) -> float:
        """Bytes per second."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def elapsed(self) -> float:
        """Same as ``seconds`` (the name before reports shared a base)."""
        return self.seconds

    def add_done(self, engine: str, size: int, method: str, note: str = "", resumed_parts: int = 0) -> None:
        self.done += 1
        _tally(self.engines, engine, size)
        self.verified[method] = self.verified.get(method, 0) + 1
        self.resumed_parts += resumed_parts
        if note and note not in self.notes:
            self.notes.append(note)

    def add_planned(self, engine: str, size: int | None) -> None:
        _tally(self.planned, engine, size or 0)

    def summary(self) -> str:
        if self.dry_run:
            plan = ", ".join(f"{k} {v.objects} ({format_size(v.bytes)})"
                             for k, v in sorted(self.planned.items()))
            gone = f", would delete {self.deleted}" if self.deleted else ""
            return (f"dry run: {self.listed} listed, {self.skipped} already present, "
                    f"would fetch: {plan or 'nothing'}{gone}; budget {self.budget}")
        secs = max(self.seconds, 1e-9)
        text = (f"{self.done} downloaded ({format_size(self.bytes)}) in {self.seconds:.2f} s, "
                f"{format_size(self.bytes / secs)}/s, {self.done / secs:.0f} objects/s; "
                f"{self.skipped} skipped, {len(self.failures)} failed, {self.retries} retries")
        if self.resumed_parts:
            text += f", {self.resumed_parts} parts resumed"
        if self.deleted:
            text += f", {self.deleted} deleted"
        if self.verified:
            text += "; verified: " + ", ".join(f"{k} {v}" for k, v in sorted(self.verified.items()))
        if self.engines:
            used = ", ".join(f"{k} {v.objects}" for k, v in sorted(self.engines.items()))
            text += f"; engines: {used} ({self.budget})"
        return text

    def __str__(self) -> str:
        return _without_failed_count(self, [f"  note: {n}" for n in self.notes])

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.pop("deletions", None)      # one "delete" record each on the CLI
        out["failed"] = len(self.failures)
        return out


@dataclass(kw_only=True)
class VerifyReport(Report):
    """Outcome of :func:`manyfiles.s3.verify`: every recorded file re-hashed against its check.

    ``verified``: files per check method that passed (``size-only``: the record holds no
    content check, only the size was compared); failures have the codes ``missing``,
    ``changed`` (size or type differs, or a symlink on the way), ``integrity`` (the bytes do
    not match), ``weak-check`` (a size-only record its object did not allow) or an errno name.
    """

    dest: str = ""
    checked: int = 0
    bytes: int = 0
    verified: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        secs = max(self.seconds, 1e-9)
        text = (f"{self.checked} files checked ({format_size(self.bytes)}) in {self.seconds:.2f} s, "
                f"{format_size(self.bytes / secs)}/s; {self.checked - len(self.failures)} ok, "
                f"{len(self.failures)} failed")
        if self.verified:
            text += "; verified: " + ", ".join(f"{k} {v}" for k, v in sorted(self.verified.items()))
        return text

    def __str__(self) -> str:
        return _without_failed_count(self)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["failed"] = len(self.failures)
        return out


def _without_failed_count(report: Report, extra: list[str] = ()) -> str:
    """The base ``str()`` (summary, first failures) without its "; N failed": our summaries say it."""
    lines = Report.__str__(report).split("\n")
    return "\n".join([report.summary(), *extra, *lines[1:]])


__all__ = ["PullReport", "Tally", "VerifyReport"]
