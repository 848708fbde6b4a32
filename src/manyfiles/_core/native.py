"""The optional C core, ``manyfiles._dents``: whether it is built, and if not, why.

setup.py builds it where it can.  Where it cannot (no C compiler, no Python
headers), the install still succeeds, setup.py prints a warning and installs a
one-line note (:data:`NOTE_FILE`) saying why, and listing falls back to
``os.scandir``.  This module is the one place that imports the core, so every
tool tells the same story: ``manyfiles info``, ``fastls --help``, the one-line
warning of a listing verb, and the usage error of ``--backend dents``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from manyfiles.errors import UsageError

NOTE_FILE = "_dents_not_built.txt"  # written by setup.py next to where _dents would be


def _why_not(exc: ImportError) -> str:
    if not sys.platform.startswith("linux"):
        return f"getdents64 is Linux-only, this is {sys.platform}"
    try:
        note = (Path(__file__).parent.parent / NOTE_FILE).read_text().strip()  # beside manyfiles/_dents
    except OSError:
        note = ""
    return _one_line(f"the build failed: {note}" if note else str(exc))


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


try:
    from manyfiles import _dents as dents
except ImportError as _exc:
    dents: ModuleType | None = None  # type: ignore[no-redef]
    reason: str | None = _why_not(_exc)
else:
    reason = None

_warned = False


def require(feature: str) -> ModuleType:
    """The C core, or a UsageError (CLI exit 2) saying it is not built and why."""
    if dents is None:
        raise UsageError(f"{feature} needs the C core, not built here ({reason}); use the scandir backend")
    return dents


def warn_fallback(prog: str) -> None:
    """Once per process: one line on stderr when listing falls back to ``os.scandir``."""
    global _warned
    if dents is None and not _warned:
        _warned = True
        print(f"{prog}: C core not built ({reason}); using the os.scandir backend (slower)", file=sys.stderr)


def default_backend_note() -> str:
    """The default listing backend, as ``--help`` should describe it."""
    return "dents, the C core" if dents is not None else "scandir; the C core is not built"
