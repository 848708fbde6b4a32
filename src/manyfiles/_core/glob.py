"""The one glob rule set of manyfiles: every tool that selects names by pattern uses this.

The rules are Python's ``fnmatch.fnmatchcase``: ``*`` matches any run of characters
(also ``/`` and a leading dot), ``?`` one character, ``[seq]`` / ``[!seq]`` a class with
ranges; there are no backslash escapes and no POSIX classes (``[[:digit:]]`` is the class
``[:dgit`` followed by ``]``), ``[^a]`` is the class of ``^`` and ``a``, an unclosed ``[`` is
literal, and matching is case-sensitive.

Names are matched as text, the way ``os.fsdecode`` sees them: bytes that are not UTF-8
become lone surrogates, and ``?`` is one *character* (``é`` is one, even as two bytes).  A
``str`` pattern therefore selects the same entries whether a tool holds names as ``str``
or as raw ``bytes``.  A pattern containing ``/`` is matched against the path relative to
the starting directory (``rel``) when the caller gives one, otherwise against the name.

Backends: ``"c"`` (``manyfiles._dents.Glob``, the one the C walker runs without the GIL)
and ``"python"`` (``fnmatch.translate``); :func:`compile` picks C when it is built and the
filesystem encoding is UTF-8 (always on Linux unless a non-UTF-8 locale is forced).
tests/globcases.py holds the parity table every tool's tests run through both.

Example:
    >>> from manyfiles._core import glob
    >>> m = glob.compile(["*.jpg", "raw/*"])
    >>> m.match("a.jpg"), m.match(b"b.png"), m.match("x.png", rel="raw/x.png")
    (True, False, True)
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable

TYPE_CHECKING = False  # typing is not imported at run time (fastls start-up)
if TYPE_CHECKING:
    from typing import Any, Protocol
else:
    Protocol = object

try:
    from manyfiles._dents import Glob as _CGlob
except ImportError:  # no C core: the Python backend only
    _CGlob = None

__all__ = ["BACKENDS", "Matcher", "PyGlob", "compile", "default_backend"]

BACKENDS = ("c", "python")
Pattern = str | bytes


class Matcher(Protocol):
    """What :func:`compile` returns (both backends)."""

    patterns: tuple[bytes, ...]
    any_slash: bool

    def match(self, name: str | bytes, rel: str | bytes | None = None) -> bool:
        """True if any pattern matches (``/`` patterns against ``rel`` when given)."""
        ...


class PyGlob:
    """The Python backend: ``fnmatch.translate`` on ``os.fsdecode`` text."""

    __slots__ = ("_by_name", "_by_rel", "any_slash", "patterns")

    def __init__(self, patterns: Iterable[Pattern]) -> None:
        texts = [os.fsdecode(p) for p in patterns]
        self.patterns = tuple(t.encode("utf-8", "surrogateescape" if _escapable(t) else "surrogatepass")
                              for t in texts)
        self.any_slash = any("/" in t for t in texts)
        self._by_name = _regex([t for t in texts if "/" not in t])
        self._by_rel = _regex([t for t in texts if "/" in t])

    def match(self, name: str | bytes, rel: str | bytes | None = None) -> bool:
        text = os.fsdecode(name)
        if self._by_name is not None and self._by_name(text) is not None:
            return True
        if self._by_rel is None:
            return False
        return self._by_rel(text if rel is None else os.fsdecode(rel)) is not None

    def __repr__(self) -> str:
        return f"PyGlob({self.patterns!r})"


def _escapable(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def _regex(texts: list[str]) -> Callable[[str], Any] | None:
    if not texts:
        return None
    import fnmatch  # only here: the C backend needs neither (fastls start-up)
    import re

    return re.compile("|".join(f"(?:{fnmatch.translate(t)})" for t in texts)).match


def default_backend() -> str:
    """``"c"`` where the C core is built and names decode as UTF-8, else ``"python"``."""
    return "c" if _CGlob is not None and sys.getfilesystemencoding() == "utf-8" else "python"


def compile(patterns: Pattern | Iterable[Pattern], backend: str | None = None) -> Matcher:
    """One matcher for ``patterns`` (a pattern or several; any of them matching is a match)."""
    if isinstance(patterns, (str, bytes)):
        patterns = (patterns,)
    return _compile(tuple(patterns), backend or default_backend())


@functools.lru_cache(maxsize=256)
def _compile(patterns: tuple[Pattern, ...], backend: str) -> Matcher:
    if backend not in BACKENDS:
        raise ValueError(f"unknown glob backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "python":
        return PyGlob(patterns)
    if _CGlob is None:
        raise ImportError("the manyfiles._dents C extension is not built")
    try:
        raw = tuple(os.fsencode(p) for p in patterns)
    except UnicodeEncodeError:  # a surrogate no file name can contain: regex semantics still hold
        return PyGlob(patterns)
    return _CGlob(raw)
