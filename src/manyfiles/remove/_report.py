"""What a removal did: counts, timing and failures on the shared report base."""

from __future__ import annotations

from dataclasses import dataclass

from manyfiles._core.report import Report


@dataclass(kw_only=True)
class RemoveReport(Report):
    """What a removal did.  ``bytes`` is None: sizes are unknown because nothing is stat'ed.

    ``kept`` counts entries an ``exclude`` pattern kept; ``retries`` the rmdirs that met
    new entries (ENOTEMPTY) and were cleaned and retried.
    """

    files: int = 0
    dirs: int = 0
    kept: int = 0
    retries: int = 0
    dry_run: bool = False
    bytes: int | None = None

    @property
    def files_per_second(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        text = f"{verb} {self.files:,} files and {self.dirs:,} directories in {self.seconds:.2f} s"
        if not self.dry_run and self.seconds > 0:
            text += f" ({self.files_per_second:,.0f} files/s)"
        if self.kept:
            text += f"; {self.kept:,} kept by --exclude"
        return text
