"""The mirror's option values, apart (no imports) so that a CLI can offer them without loading the
comparison: ``BY`` (how two files are compared), ``SOURCES`` (the side a copy goes from) and
``MAX_DELETE`` (the default limit of a sync's deletions)."""

from __future__ import annotations

BY = ("checksum", "size-mtime", "size")
SOURCES = ("local", "remote")
MAX_DELETE = 1000

__all__ = ["BY", "MAX_DELETE", "SOURCES"]
