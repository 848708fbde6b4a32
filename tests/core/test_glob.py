"""One glob rule set: every backend and every selection path of fastls/walk picks the same names.

The table (tests/globcases.py) is judged by Python's fnmatch.fnmatchcase on os.fsdecode text.
"""

from __future__ import annotations

import os

import pytest

from forkcli import run_many
from globcases import NAMES, PATTERNS, expected
from manyfiles import listing
from manyfiles._core import glob as _glob
from manyfiles.listing import Filter

BACKENDS = [b for b in _glob.BACKENDS if b != "c" or _glob._CGlob is not None]
if os.environ.get("MANYFILES_REQUIRE_C_EXTENSION") == "1":
    assert "c" in BACKENDS, "the C glob must be built"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_pattern_matches_like_fnmatch_on_bytes_and_str(backend: str) -> None:
    for pattern in PATTERNS:
        m = _glob.compile(pattern, backend)
        want = expected(pattern)
        assert sorted(n for n in NAMES if m.match(n)) == want, pattern
        assert sorted(n for n in NAMES if m.match(os.fsdecode(n))) == want, pattern


def test_the_three_disagreements_of_issue_10() -> None:
    names = [b"^x", b"a1", b"a\\b", b"ab", b"b2"]
    assert expected("[^a]*", names) == [b"^x", b"a1", b"a\\b", b"ab"]
    assert expected("a\\b", names) == [b"a\\b"]
    assert expected("*[[:digit:]]", names) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_of_several_patterns_and_slash_patterns_use_rel(backend: str) -> None:
    m = _glob.compile(["*.c", "src/*.h"], backend)
    assert m.any_slash
    assert m.match("x.c") and m.match("x.c", rel="a/x.c")
    assert not m.match("x.h") and m.match("x.h", rel="src/x.h") and not m.match("x.h", rel="lib/x.h")
    assert m.match("src/x.h")  # no rel given: the name is the text
    assert not _glob.compile([], backend).match("anything")


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError):
        _glob.compile("*", "regex")


def _c_and_python() -> list[str]:
    return ["dents", "scandir"] if listing._directory._dents is not None else ["scandir"]


@pytest.mark.parametrize("backend", _c_and_python())
def test_listing_and_walk_select_like_the_table(table_tree: bytes, backend: str) -> None:
    root = table_tree
    for pattern in PATTERNS:
        want = expected(pattern)
        sub_hit = bool(expected(pattern, [b"sub"]))  # the directory itself is an entry of the root
        inc = Filter(include=(os.fsdecode(pattern),))
        exc = Filter(exclude=(os.fsdecode(pattern),))
        got = sorted(n for n in listing.listdir(root, backend=backend, filter=inc) if n != b"sub")
        assert got == want, (pattern, "listdir")
        # walk: the same selection in the root and in sub/, the filter never stops the descent
        listings = listing.walk(root, filter=inc, backend=backend)
        walked = {(d.path, e.name) for d in listings for e in d.entries}
        sub = os.path.join(root, b"sub")
        deep = expected(pattern, under=b"sub")  # differs only for patterns with "/"
        assert sorted(n for p, n in walked if p == sub) == deep, (pattern, "walk")
        assert len(walked) == len(want) + len(deep) + sub_hit, pattern
        tally = listing.count_tree(root, filter=exc, backend=backend)
        assert tally.entries == 2 * len(NAMES) + 1 - len(want) - len(deep) - sub_hit, (pattern, "exclude")


def test_fastls_flat_and_recursive_select_like_the_table(table_tree: bytes) -> None:
    root = table_tree
    sub = os.path.join(root, b"sub") + b"/"
    runs = iter(run_many("fastls", [[*recursive, "-0", "--include", os.fsdecode(pattern), root]
                                    for pattern in PATTERNS for recursive in ([], ["-r"])],
                         preload=["manyfiles.cli.ls"]))  # --include: the click command
    for pattern in PATTERNS:
        flat, deep = next(runs), next(runs)
        assert (flat.returncode, deep.returncode) == (0, 0), (pattern, flat.stderr, deep.stderr)
        assert sorted(n for n in flat.stdout.split(b"\0")[:-1] if n != b"sub") == expected(pattern), (
            pattern, "fastls")
        deep_names = [p[len(sub):] for p in deep.stdout.split(b"\0")[:-1] if p.startswith(sub)]
        assert sorted(deep_names) == expected(pattern, under=b"sub"), (pattern, "fastls -r")
