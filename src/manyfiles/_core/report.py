"""What every bulk operation returns: a report of counts, timings and failures.

One base for all tools (listing, removal, sharding, S3 pulls, cache warm-ups), so that
scripts and notebooks handle them alike:

* ``report.ok`` -- True when nothing failed;
* ``report.failures`` -- a list of :class:`Failure` (``path``, ``code``, ``reason``);
* ``report.seconds`` -- wall time of the operation;
* ``report.raise_for_failures()`` -- raise :class:`~manyfiles.errors.PartialFailure` if not ok;
* ``str(report)`` -- one summary line plus the first failures;
* ``report._repr_html_()`` -- the same as a table in Jupyter;
* ``report.to_dict()`` -- plain JSON-ready values (what ``--json`` prints).

A tool's report is a dataclass deriving from :class:`Report` that adds its counters and
overrides :meth:`Report.summary`.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass(kw_only=True)
    ... class CopyReport(Report):
    ...     copied: int = 0
    ...     def summary(self) -> str:
    ...         return f"copied {self.copied:,} files in {self.seconds:.2f} s"
    >>> r = CopyReport(copied=3, seconds=0.5)
    >>> r.add_failure("a/b", "Permission denied", "EACCES")
    >>> print(r)
    copied 3 files in 0.50 s; 1 failed
      a/b: Permission denied
"""

from __future__ import annotations

import dataclasses
import enum
import errno as _errno
import html
import os
from dataclasses import dataclass, field
from typing import Any

from manyfiles.errors import SHOWN_LINES, PartialFailure

SHOWN_FAILURES = SHOWN_LINES   # failures listed by str(); the rest are counted (as on the CLI's stderr)
SHOWN_FAILURES_HTML = 20


@dataclass(frozen=True)
class Failure:
    """One item that failed: where (path or key), a short machine-readable code, and why."""

    path: str
    reason: str
    code: str = ""

    @classmethod
    def from_oserror(cls, path: str | bytes | os.PathLike, exc: OSError) -> Failure:
        """A failure for ``exc`` at ``path``; ``code`` is the errno name (``ENOENT``...)."""
        code = _errno.errorcode.get(exc.errno or 0, "") if exc.errno else type(exc).__name__
        return cls(_text(path), exc.strerror or str(exc), code)

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass(kw_only=True)
class Report:
    """Base of every report: failures, wall time, and the shared ways to show and check them."""

    failures: list[Failure] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def add_failure(self, path: str | bytes | os.PathLike, reason: str, code: str = "") -> None:
        self.failures.append(Failure(_text(path), reason, code))

    def summary(self) -> str:
        """One line saying what was done; subclasses override it."""
        return f"done in {self.seconds:.2f} s"

    def raise_for_failures(self) -> None:
        """Raise :class:`~manyfiles.errors.PartialFailure` (with this report) if anything failed."""
        if self.failures:
            first = self.failures[0]
            raise PartialFailure(f"{len(self.failures):,} failed; first: {first}", self.failures, self)

    def __str__(self) -> str:
        lines = [self.summary() + (f"; {len(self.failures):,} failed" if self.failures else "")]
        lines += [f"  {f}" for f in self.failures[:SHOWN_FAILURES]]
        if len(self.failures) > SHOWN_FAILURES:
            lines.append(f"  ... and {len(self.failures) - SHOWN_FAILURES:,} more")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values, plus ``ok`` and ``summary``."""
        out: dict[str, Any] = {"ok": self.ok, "summary": self.summary()}
        for f in dataclasses.fields(self):
            out[f.name] = _plain(getattr(self, f.name))
        return out

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><th style='text-align:left'>{html.escape(f.name)}</th>"
            f"<td style='text-align:left'>{html.escape(_short(getattr(self, f.name)))}</td></tr>"
            for f in dataclasses.fields(self) if f.name != "failures")
        status = "ok" if self.ok else f"{len(self.failures):,} failed"
        out = [f"<div><b>{html.escape(type(self).__name__)}</b>: {html.escape(self.summary())} "
               f"({html.escape(status)})", f"<table>{rows}</table>"]
        if self.failures:
            frows = "".join(f"<tr><td style='text-align:left'>{html.escape(f.path)}</td>"
                            f"<td>{html.escape(f.code)}</td><td style='text-align:left'>"
                            f"{html.escape(f.reason)}</td></tr>"
                            for f in self.failures[:SHOWN_FAILURES_HTML])
            more = len(self.failures) - SHOWN_FAILURES_HTML
            tail = f"<p>... and {more:,} more</p>" if more > 0 else ""
            out.append(f"<table><tr><th>path</th><th>code</th><th>reason</th></tr>{frows}</table>{tail}")
        return "".join(out) + "</div>"


def _text(path: str | bytes | os.PathLike) -> str:
    """Paths in reports are str; undecodable bytes survive as surrogate escapes (os.fsdecode)."""
    return os.fsdecode(path)


def _plain(value: Any) -> Any:
    if isinstance(value, Failure):
        return {"path": value.path, "code": value.code, "reason": value.reason}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (bytes, os.PathLike)):
        return os.fsdecode(value)
    if isinstance(value, dict):
        return {str(_plain(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    return value


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (list, tuple, set, frozenset)) and len(value) > 5:
        return f"{len(value):,} items"
    text = str(_plain(value))
    return text if len(text) <= 200 else text[:197] + "..."


__all__ = ["Failure", "Report"]
