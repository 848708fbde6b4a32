"""Layout: pure name -> bucket mapping and its descriptor."""

from __future__ import annotations

import hashlib

import pytest

from manyfiles.errors import UsageError
from manyfiles.shard import Layout, parse_levels


def test_default_is_md5_two_levels_of_two_and_keeps_the_name() -> None:
    h = hashlib.md5(b"Foo.png").hexdigest()
    assert Layout().relpath("Foo.png") == f"{h[:2]}/{h[2:4]}/Foo.png"
    assert Layout().relpath(b"Foo.png") == f"{h[:2]}/{h[2:4]}/Foo.png".encode()


@pytest.mark.parametrize("algo", ["md5", "sha1", "blake2b"])
def test_hash_choices_use_the_digest_of_the_name_bytes(algo: str) -> None:
    name = b"caf\xe9\nname"  # non-UTF-8 and a newline: hashed as raw bytes
    h = hashlib.new(algo, name).hexdigest().encode()
    want = h[:1] + b"/" + h[1:3] + b"/" + h[3:5] + b"/" + name
    assert Layout(levels=(1, 2, 2), hash=algo).relpath(name) == want


def test_mapping_is_stable_across_processes() -> None:
    # never Python's salted hash(): a fixed, known answer
    assert Layout().relpath("x") == "9d/d4/x"


def test_prefix_key_takes_the_names_own_characters_like_git() -> None:
    lay = Layout(levels=(2,), key="prefix")
    assert lay.relpath("3f2a9c") == "3f/3f2a9c"
    assert Layout(levels=(2, 2), key="prefix").relpath("a") == "a_/__/a"          # short names are padded
    assert Layout(levels=(2,), key="prefix").relpath("..hidden") == "__/..hidden"  # never "." or ".."


@pytest.mark.parametrize("spec,levels", [("2:2", (2, 2)), ("1", (1,)), ("2:2:2", (2, 2, 2)), ("1:2", (1, 2))])
def test_levels_spec(spec: str, levels: tuple[int, ...]) -> None:
    assert parse_levels(spec) == levels


@pytest.mark.parametrize("spec", ["", "0", "2:x", "9", "1:1:1:1:1"])
def test_bad_levels_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError):
        parse_levels(spec)


def test_bad_hash_and_key_and_too_wide() -> None:
    with pytest.raises(UsageError):
        Layout(hash="crc32")
    with pytest.raises(UsageError):
        Layout(key="suffix")
    assert Layout(levels=(8, 8, 8, 8), hash="md5").relpath("a").count("/") == 4  # the whole digest


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\0b", ".manyfiles-shard.json"])
def test_names_that_cannot_be_stored_are_refused(bad: str) -> None:
    with pytest.raises(UsageError):
        Layout().relpath(bad)


def test_is_bucket() -> None:
    lay = Layout()
    assert lay.is_bucket(b"ab", 0) and lay.is_bucket(b"09", 1)
    assert not lay.is_bucket(b"abc", 0) and not lay.is_bucket(b"zz", 0) and not lay.is_bucket(b"AB", 0)


def test_descriptor_round_trip_and_rejects_foreign_json() -> None:
    lay = Layout(levels=(1, 2), hash="sha1", key="hash")
    assert Layout.from_json(lay.to_json()) == lay
    with pytest.raises(ValueError):
        Layout.from_json(b'{"levels": [2, 2]}')


@pytest.mark.parametrize("levels", [(2, 2), (1,), (3, 1)])
def test_bucket_globs_accept_exactly_what_is_bucket_accepts(levels: tuple[int, ...]) -> None:
    """The C walker enters bucket directories by these globs (manyfiles._core.glob, both backends);
    Python's is_bucket decides everything else: they must agree on every name."""
    from itertools import product

    from manyfiles._core import glob as _glob

    layout = Layout(levels=levels)
    alphabet = [b"0", b"9", b"a", b"f", b"A", b"F", b"g", b"z", b"-", b".", b"\xff", b"\xc3", b"\xa9", b"?"]
    for level, glob in enumerate(layout.bucket_globs()):
        width = levels[level]
        names = [b"".join(p) for n in (width - 1, width, width + 1) for p in product(alphabet, repeat=n)]
        for backend in _glob.BACKENDS if _glob.default_backend() == "c" else ("python",):
            m = _glob.compile(glob, backend)
            want = [n for n in names if layout.is_bucket(n, level)]
            assert [n for n in names if m.match(n)] == want, backend
    assert Layout(levels=(1, 2), key="prefix").bucket_globs() is None  # widths in bytes: no glob for it
