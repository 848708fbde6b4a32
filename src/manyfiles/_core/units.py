"""Byte counts in and out: the one size parser every option and argument uses.

Sizes are binary: ``K``/``KB``/``KiB`` all mean 1024 bytes (the way ``dd``, ``--part-size``
in s5cmd and buffer sizes are read), and fractions are allowed: ``1.5M`` is 1,572,864.

Example:
    >>> parse_size("1.5M"), parse_size("64KiB"), parse_size("4096")
    (1572864, 65536, 4096)
    >>> format_size(1572864)
    '1.5 MiB'
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGTP]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int, minimum: int = 0) -> int:
    """``4096``, ``64K``, ``1.5M``, ``2GiB`` -> bytes; ValueError if malformed or below ``minimum``."""
    if isinstance(text, int):
        size = text
    else:
        m = _SIZE.match(text)
        if m is None:
            raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64K, 1.5M, 2GiB)")
        size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < minimum:
        raise ValueError(f"{text!r} is below the minimum of {minimum:,} bytes")
    return size


def format_size(n: float) -> str:
    """Bytes as a short binary size: ``512 B``, ``1.5 MiB``, ``3.2 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


__all__ = ["format_size", "parse_size"]
