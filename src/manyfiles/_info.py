"""``manyfiles info`` / :func:`manyfiles.info`: what this installation can do.

The first thing to paste into a bug report: version, Python, platform, whether
the C core is built (and why not), the listing backends available and the
extras installed, with their versions.

Example:
    >>> import manyfiles as mf
    >>> mf.info().c_core                       # doctest: +SKIP
    True
    >>> print(mf.info())                       # doctest: +SKIP
    manyfiles 0.1.0
    ...
"""

from __future__ import annotations

import html
import importlib.util
import platform
import sys
from dataclasses import asdict, dataclass
from typing import Any

from manyfiles import __version__
from manyfiles._core import extras as _extras
from manyfiles._core import native as _native


@dataclass(frozen=True)
class Info:
    """A snapshot of the installation; ``str()`` for people, ``to_dict()`` for ``--json``."""

    version: str
    python: str
    executable: str
    platform: str
    c_core: bool
    c_core_path: str | None                 # the built module's file
    c_core_reason: str | None               # why it is not available
    backends: dict[str, bool]               # listing backend -> usable here
    default_backend: str
    extras: dict[str, dict[str, str | None]]  # extra -> {distribution: version or None}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) lines: what ``str()`` and the notebook table show."""
        rows = [
            ("manyfiles", self.version),
            ("python", f"{self.python} ({self.executable})"),
            ("platform", self.platform),
            ("C core", f"built ({self.c_core_path})" if self.c_core else f"not built: {self.c_core_reason}"),
            ("backends", ", ".join(
                f"{name} (default)" if name == self.default_backend else name
                for name, ok in self.backends.items() if ok)),
        ]
        missing = [name for name, ok in self.backends.items() if not ok]
        if missing:
            rows.append(("", "not available: " + ", ".join(missing)))
        for extra, dists in self.extras.items():
            if all(v is not None for v in dists.values()):
                value = ", ".join(f"{d} {v}" for d, v in dists.items())
            else:
                absent = ", ".join(d for d, v in dists.items() if v is None)
                value = f'- (no {absent}: pip install "manyfiles[{extra}]")'
            rows.append((f"[{extra}]", value))
        return rows

    def __str__(self) -> str:
        width = max(len(label) for label, _ in self.rows())
        return "\n".join(f"{label:<{width}}  {value}".rstrip() for label, value in self.rows())

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr><th style='text-align:left'>{html.escape(label)}</th>"
            f"<td style='text-align:left'>{html.escape(value)}</td></tr>"
            for label, value in self.rows())
        return f"<table>{cells}</table>"


def _usable(backend: str) -> bool:
    if backend == "dents":
        return _native.dents is not None
    if backend == "getdents":
        return importlib.util.find_spec("getdents") is not None
    return True


def info() -> Info:
    """What this installation of manyfiles can do (see :class:`Info`)."""
    from manyfiles import listing

    dents = _native.dents
    return Info(
        version=__version__,
        python=platform.python_version(),
        executable=sys.executable,
        platform=platform.platform(),
        c_core=dents is not None,
        c_core_path=getattr(dents, "__file__", None),
        c_core_reason=_native.reason,
        backends={name: _usable(name) for name in listing.BACKENDS},
        default_backend=listing.default_backend(),
        extras=_extras.installed(),
    )
