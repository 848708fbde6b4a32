"""Splitting an S3 listing into key ranges that workers list in parallel.

ListObjectsV2 pages are sequential (each needs the previous page's token), so one lister
reads 10^8 keys in 10^5 round trips, hours on its own.  But it also takes ``StartAfter``
(any string), so the key space can be cut: the range ``(after, upto]`` is listed from
``StartAfter=after`` until a key passes ``upto``.  A lister that has read its budget of keys
in a range hands back what is left, ``(last, upto]``, cut in two at a key between ``last`` and
``upto`` (:func:`midpoint`); each half is listed by whichever worker is free.  Without knowing
the keys in advance, the cuts adapt to them: an empty half costs one request, a full one is
cut again, and the number of listers doubles with each generation.

Correctness does not depend on where the cuts fall: ranges are half-open, contiguous and
disjoint, so every key is listed by exactly one range (:func:`take`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

ASCII_CEILING = 0x80        # an unbounded range is first cut below this (most keys are ASCII)
MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


class KeyRange(NamedTuple):
    """Keys ``k`` with ``after < k <= upto`` (``None``: unbounded on that side)."""

    after: str | None
    upto: str | None

    def holds(self, key: str) -> bool:
        return (self.after is None or key > self.after) and (self.upto is None or key <= self.upto)


def midpoint(lo: str, hi: str | None, prefix: str = "") -> str | None:
    """A short string ``m`` with ``lo < m < hi`` (``hi=None``: the end of ``prefix``'s keys), or None
    when there is none worth cutting at (``hi`` is ``lo`` plus a NUL)."""
    if hi is None:
        hi = prefix + chr(MAX_CODE_POINT)
    if not lo < hi:
        return None
    i = 0
    while i < len(lo) and i < len(hi) and lo[i] == hi[i]:
        i += 1
    a = ord(lo[i]) if i < len(lo) else -1
    b = ord(hi[i])
    if b == MAX_CODE_POINT:         # unbounded above: cut within lo's kind of character
        return lo[:i] + _char_above(a)
    between = _char_between(a, b)
    if between is not None:
        return lo[:i] + between
    # hi[i] is lo[i] + 1 (or only surrogates lie between, or lo ends and hi[i] is NUL):
    # cut just above lo, one position deeper
    if len(lo) > i:
        j = i + 1
        return lo[:j] + _char_above(ord(lo[j]) if j < len(lo) else -1)
    # lo is a prefix of hi and hi continues with NUL: the NUL branch itself, if hi goes on
    return hi[:i + 1] if len(hi) > i + 1 else None


_CLASSES = ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A))     # digits, upper case, lower case


def _char_above(a: int) -> str:
    """A character above code point ``a``, halfway to the end of its class (digits, letters), else
    to the end of ASCII, else of Unicode: sequential or hex keys get cut among themselves."""
    ceilings = [hi + 1 for lo, hi in _CLASSES if lo <= a <= hi]
    for ceiling in (*ceilings, ASCII_CEILING, MAX_CODE_POINT + 1):
        between = _char_between(a, ceiling)
        if between is not None:
            return between
    raise AssertionError(f"no character above {a:#x}")


def _char_between(a: int, b: int) -> str | None:
    """A character strictly between code points ``a`` and ``b``, never a surrogate (None: none)."""
    x = (a + b) // 2
    if x in _SURROGATES:
        x = _SURROGATES.start - 1 if a < _SURROGATES.start - 1 else _SURROGATES.stop
    return chr(x) if a < x < b else None


def take(listing: Iterable[Any], rng: KeyRange, budget: int, prefix: str = "",
         key: Any = None, keep: Any = None) -> tuple[list, list[KeyRange]]:
    """Read ``listing`` (lazily: a ListObjectsV2 walk from ``StartAfter=rng.after``) until ``budget``
    keys or the end of ``rng``; returns the items in the range that ``keep`` accepts (default: all)
    and what is left of the range, cut in two.

    ``key(item)`` gives an item's key (default: ``item.key``).  Every key read counts against the
    budget, kept or not, so a lister's work is bounded even when few keys match; a key past
    ``rng.upto`` ends the range.  With a budget that is a multiple of the page size, no page is
    fetched in vain.
    """
    key = key or (lambda item: item.key)
    items: list = []
    last = None
    read = 0
    for item in listing:
        k = key(item)
        if rng.upto is not None and k > rng.upto:
            return items, []
        if keep is None or keep(item):
            items.append(item)
        last, read = k, read + 1
        if read >= budget:
            break
    else:
        return items, []
    if last is None or (rng.upto is not None and last >= rng.upto):
        return items, []
    cut = midpoint(last, rng.upto, prefix)
    if cut is None:
        return items, [KeyRange(last, rng.upto)]
    return items, [KeyRange(last, cut), KeyRange(cut, rng.upto)]


__all__ = ["KeyRange", "midpoint", "take"]
