"""Key -> path safety, URL parsing and filters (pure functions)."""

from __future__ import annotations

import pytest

from manyfiles.errors import UsageError
from manyfiles.s3.keys import UnsafeKey, local_relpath, make_filter, parse_url
from manyfiles.s3.routing import LOOP_MAX, PART_SIZE, budget, choose, part_size_for


@pytest.mark.parametrize("key", [
    "../x", "a/../../x", "/abs", "a//b", "dir/", "./a", "a/./b", "", "a\0b",
    "x" * 256, "/".join(["d" * 200] * 25), ".s3pull/state.jsonl",
])
def test_unsafe_keys_are_rejected(key):
    with pytest.raises(UnsafeKey):
        local_relpath(key)


@pytest.mark.parametrize("key,base,rel", [
    ("a/b/c.txt", "", "a/b/c.txt"),
    ("data/a/b.json", "data/", "a/b.json"),
    ("weird name\nwith newline", "", "weird name\nwith newline"),
    ("ünïcödé/ключ", "", "ünïcödé/ключ"),
    ("..hidden", "", "..hidden"),
    ("x" * 255, "", "x" * 255),
])
def test_safe_keys_map_verbatim(key, base, rel):
    assert local_relpath(key, base) == rel


def test_base_stripping_cannot_produce_an_escape():
    # "data/" stripped leaves "../x": still rejected
    with pytest.raises(UnsafeKey):
        local_relpath("data/../x", "data/")


def test_parse_url():
    u = parse_url("s3://bkt/logs/2026-*/a?.json")
    assert (u.bucket, u.prefix, u.base) == ("bkt", "logs/2026-", "logs/")
    assert u.matches("logs/2026-01/ab.json") and not u.matches("logs/2026-01/abc.json")
    u = parse_url("s3://bkt/data")
    assert (u.prefix, u.base, u.pattern) == ("data", "", None)
    assert parse_url("s3://bkt").prefix == ""
    for bad in ("bkt/x", "s3://", "s3:///x", "/local/path"):
        with pytest.raises(UsageError):
            parse_url(bad)


def test_filter_include_exclude():
    keep = make_filter(["*.json"], ["tmp/*"])
    assert keep("a/b.json") and not keep("a/b.txt") and not keep("tmp/x.json")
    # the shared rule set: no '/' -> the name, with '/' -> the relative path ('*' crosses '/')
    by_name = make_filter(["b*"], [])
    assert by_name("a/b.json") and by_name("b") and not by_name("b/a.json")
    by_path = make_filter(["a/*"], ["*/tmp/*"])
    assert by_path("a/b/c") and not by_path("x/a/b") and not by_path("a/tmp/c")
    assert make_filter([], []) is None


def test_auto_routes_by_size():
    assert choose("auto", 1024)[0] == "loop"
    assert choose("auto", LOOP_MAX)[0] == "loop"
    assert choose("auto", LOOP_MAX + 1)[0] == "lean"
    assert choose("auto", None)[0] == "lean"
    assert choose("auto", 4 << 20)[0] == "lean"
    engine, part = choose("auto", 1 << 30)
    assert engine == "ranged" and part == part_size_for(1 << 30)
    assert choose("auto", 1 << 30, part_size=PART_SIZE) == ("ranged", PART_SIZE)
    assert choose("threads", 1 << 30) == ("threads", 0)
    assert choose("ranged", 100) == ("ranged", 0)
    assert part_size_for(10 << 40) * 10_000 >= 10 << 40


def test_auto_part_size_follows_object_size_and_cores():
    MiB = 1 << 20
    assert part_size_for(1 << 30, cores=2) == 64 * MiB          # 16 ranges: 8 per core
    assert part_size_for(1 << 30, cores=16) == 8 * MiB          # never below 8 MiB
    assert part_size_for(64 * MiB, cores=2) == 8 * MiB
    assert part_size_for(100 << 30, cores=2) == 128 * MiB       # never above 128 MiB...
    assert part_size_for(2 << 40, cores=2) * 10_000 >= 2 << 40  # ...unless 10,000 parts need it
    assert part_size_for(100 * MiB + 1, cores=2) == 8 * MiB        # 6.3 MiB wanted: 8 MiB floor
    assert part_size_for(1 << 30, 8 * MiB, cores=2) == 8 * MiB   # given: taken


def test_budget_is_shared():
    b = budget("auto", 64)
    assert b.small + b.big == 64 and b.big >= 2
    assert budget("auto", 4).small >= 1
    assert budget("processes", 64, 4).processes == 4
