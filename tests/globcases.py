"""The glob parity table: tricky patterns x awkward names, and the oracle that decides.

One rule set for every tool (manyfiles/_glob.py): Python's ``fnmatch.fnmatchcase`` on the
text ``os.fsdecode`` gives.  Every selection path of every tool must pick exactly
``expected(pattern)`` from ``NAMES``.  Use it from any test module in tests/ (tests/ is on
sys.path under pytest)::

    from globcases import NAMES, PATTERNS, expected, make_files

    make_files(folder)                        # one empty file per name of NAMES
    for pattern in PATTERNS:
        assert sorted(selected_by_my_tool(folder, pattern)) == expected(pattern)

Names are bytes (what a directory holds); patterns are str (what users type), plus a few
bytes patterns (non-UTF-8) that callers pass through ``os.fsdecode``.
"""

from __future__ import annotations

import fnmatch
import os

NAMES: list[bytes] = [
    b"plain", b"a1", b"b2", b"ab", b"^x", b"a\\b", b"!bang", b"-dash", b"]close", b"[open", b"x]", b"a-b",
    b"file.c", b"file.h", b"file.o", b"file.", b".hidden", b"..dots", b"with\nnewline", b"tab\there",
    b"star*", b"quest?", b"amp&", b"tilde~", b"pipe|", b"Upper", b"upper", b"9digit", b"d:", b"g",
    "caf\u00e9".encode(), "\u00e9t\u00e9".encode(), "\u03b1\u03b2".encode(), "x\U0001f642y".encode(),
    "\u65e5\u672c".encode(),
    b"bad\xff", b"\xff", b"lone\xc3", b"over\xc0\xaf", b"surr\xed\xa0\x80", b"\xe9t\xe9",
    b"x" * 255,
]

PATTERNS: list[str | bytes] = [
    # the three of issue 10: fnmatch(3) and Python disagreed on each
    "[^a]*", "a\\b", "*[[:digit:]]",
    # classes
    "[!a-c]*", "[]]*", "[]a]*", "[!]]*", "[a-]*", "[-a]*", "[!-]*", "[-]*", "*.[ch]", "*.[!ch]",
    "[z-a]*", "[!z-a]*", "[a-z-0]*", "[b-a-c]*", "[a--]*", "[--/]*", "[a-c-e]*", "[a-cx-z]*",
    "[&~|]*", "*[&~|]", "[\\]*", "[a-\\]*", "[[]*", "[*]*", "[?]*", "[^]*", "[\\^]*", "[!.]*",
    "[0-9]*", "[A-Z]*", "[[:alpha:]]*",
    # unclosed and empty brackets are literals
    "[", "[open", "a[", "*[", "[!", "[]", "[!]", "[]close",
    # stars and question marks
    "*", "?", "??", "?*", "*?", "***a*", "x*y", "*.*", "*.", ".*", "*\\*", "star*", "star[*]",
    "quest?", "quest[?]", "x" * 254 + "?", "x" * 255,
    # newlines, tabs, case
    "*\n*", "with?newline", "tab?here", "upper", "[Uu]pper", "UPPER",
    # non-ASCII: `?` is one character, ranges are code points
    "caf?", "caf\u00e9", "?t?", "[\u00e0-\u00ff]*", "*\u00e9", "\u03b1?", "[\u03b1-\u03c9]*",
    "x?y", "x??y", "?\u672c", "*\U0001f642*",
    # non-UTF-8 bytes, as os.fsdecode sees them (lone surrogates U+DC80..U+DCFF)
    "*\udcff", "bad?", "\udcff", "lone?", "over??", "surr???", "[\udc80-\udcff]*", "*[!\udc80-\udcff]",
    b"bad\xff", b"*\xc3", b"?t?",
]


def selects(pattern: str | bytes, name: bytes, rel: bytes | None = None) -> bool:
    """The oracle: Python's fnmatch on fsdecode'd text; a pattern containing "/" is tested
    on ``rel`` (the path relative to the walk's root) when there is one."""
    text = os.fsdecode(pattern)
    subject = rel if rel is not None and "/" in text else name
    return fnmatch.fnmatchcase(os.fsdecode(subject), text)


def expected(pattern: str | bytes, names: list[bytes] = NAMES, under: bytes = b"") -> list[bytes]:
    """What the oracle selects from ``names`` (in the directory ``under``, relative to the
    walk's root), sorted as bytes."""
    return sorted(n for n in names if selects(pattern, n, os.path.join(under, n) if under else None))


def make_files(folder: str | os.PathLike) -> None:
    """One empty file per name of NAMES in ``folder``."""
    base = os.fsencode(folder)
    for name in NAMES:
        with open(os.path.join(base, name), "wb"):
            pass
