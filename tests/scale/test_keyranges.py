"""Key ranges: every key of a listing lands in exactly one range, whatever the keys look like."""

from __future__ import annotations

import bisect
import random
from collections import deque

import pytest

from manyfiles.scale.keyranges import KeyRange, midpoint, take

ALPHABETS = {
    "hex": "0123456789abcdef",
    "digits": "0123456789",
    "printable": "".join(chr(c) for c in range(0x20, 0x7F)),
    "unicode": "aé€😀\u07ff\ud7ff\ue000\U0010fffd/",
    "low": "\x00\x01\x7f\x80",
}


def keys_like(name: str, n: int, rnd: random.Random, prefix: str = "data/") -> list[str]:
    alphabet = ALPHABETS[name]
    out = {prefix + "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 12))) for _ in range(n)}
    return sorted(out)


def listing(keys: list[str], page_size: int):
    """ListObjectsV2 semantics over a sorted key list: the keys after StartAfter, page by page."""

    def pages(after: str | None):
        i = 0 if after is None else bisect.bisect_right(keys, after)
        while i < len(keys):
            yield from keys[i:i + page_size]
            i += page_size

    return pages


@pytest.mark.parametrize("alphabet", sorted(ALPHABETS))
@pytest.mark.parametrize("budget, page_size", [(1, 1), (5, 3), (40, 10)])
def test_ranges_partition_the_listing(alphabet: str, budget: int, page_size: int) -> None:
    rnd = random.Random(f"{alphabet}-{budget}")
    keys = keys_like(alphabet, 400, rnd)
    pages = listing(keys, page_size)
    todo = deque([KeyRange(None, None)])
    seen: list[str] = []
    tasks = 0
    while todo:
        rng = todo.popleft()
        tasks += 1
        got, rest = take(pages(rng.after), rng, budget, "data/", key=lambda k: k)
        assert all(rng.holds(k) for k in got)
        assert all(r.after is not None and rng.holds(r.after) for r in rest)
        seen += got
        todo.extend(rest)
    assert sorted(seen) == keys and len(seen) == len(set(seen))
    assert tasks <= 6 * (len(keys) // budget + 1)          # splitting stays proportional


def test_keep_selects_but_every_key_read_counts_against_the_budget() -> None:
    keys = [f"k/{i:05d}" for i in range(1000)]
    pages = listing(keys, 100)
    todo, seen, tasks = deque([KeyRange(None, None)]), [], 0
    while todo:
        rng = todo.popleft()
        tasks += 1
        got, rest = take(pages(rng.after), rng, 50, "k/", key=lambda k: k, keep=lambda k: k.endswith("7"))
        assert len(got) <= 5
        seen += got
        todo.extend(rest)
    assert sorted(seen) == [k for k in keys if k.endswith("7")] and tasks < 200


def test_sequential_keys_split_into_balanced_ranges() -> None:
    keys = [f"img/{i * 500:07d}.jpg" for i in range(20_000)]      # img/0000000.jpg ... img/9999500.jpg
    pages = listing(keys, 1000)
    todo = deque([KeyRange(None, None)])
    sizes = []
    while todo and len(sizes) < 15:
        rng = todo.popleft()
        got, more = take(pages(rng.after), rng, 1000, "img/", key=lambda k: k)
        sizes.append(len(got))
        todo.extend(more)
    assert sizes.count(0) <= 2, sizes       # the cuts land among the keys (digits), not in empty space


def test_midpoint_is_strictly_between() -> None:
    rnd = random.Random(7)
    alphabet = "".join(ALPHABETS.values())
    for _ in range(5000):
        a = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 6)))
        b = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 6)))
        lo, hi = min(a, b), max(a, b)
        if lo == hi:
            continue
        m = midpoint(lo, hi)
        if m is None:
            assert hi == lo + "\x00", (lo, hi)
            continue
        assert lo < m < hi, (lo, m, hi)
        m.encode("utf-8")            # a valid key: no lone surrogates
    assert midpoint("data/x", None, "data/") > "data/x"
    assert midpoint("a", "a\x00") is None
    assert midpoint("b", "b") is None
