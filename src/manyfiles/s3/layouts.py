"""Multipart layouts: the part sizes behind a multipart ETag ``<md5>-N``.

Learnt from ``HEAD ?partNumber=n`` (:func:`learn_layout`, retried while the answer is unusable; ``()``
when it stays unusable), or guessed from the sizes uploaders use (:func:`candidate_part_sizes`), which
:class:`~manyfiles.s3.integrity.LayoutSearch` tries when no HEAD gave the layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from manyfiles._core.retry import RetryPolicy, aretrying, retrying
from manyfiles.errors import TransferError
from manyfiles.s3.retry import Inconsistent, classify

MiB = 1 << 20
_MULTIPART = re.compile(r"^[0-9a-f]{32}-(\d+)$")


def uniform_parts(size: int, part_size: int) -> list[int]:
    n = max(1, -(-size // part_size))
    return [part_size] * (n - 1) + [size - part_size * (n - 1)]


def etag_parts(etag: str | None) -> int:
    """N for a multipart ETag ``<md5>-N``, 0 otherwise."""
    m = _MULTIPART.match(etag or "")
    return int(m.group(1)) if m else 0


# Part sizes uploaders use: rclone 5 MiB, aws cli / boto3 8 MiB (doubled past 10,000 parts), mc 16 MiB,
# s5cmd 50 MiB, and the usual round sizes.
UPLOADER_PART_SIZES = tuple(m * MiB for m in (5, 8, 10, 15, 16, 25, 32, 50, 64, 100, 128, 256, 512))
MAX_CANDIDATES = 16


def candidate_part_sizes(size: int, n: int) -> list[int]:
    """Uniform part sizes that cut ``size`` bytes into exactly ``n`` parts, most common first: the
    sizes uploaders use, those doubled (s3transfer past 10,000 parts), and sizes derived from the
    object size and part count (``ceil(size/n)`` as is and rounded up to 1, 5 and 16 MiB; the AWS
    Go SDK's ``size/10000 + 1``; minio-go's ``ceil(size/10000)`` rounded up to 16 MiB)."""
    if n < 2 or size < n:
        return []
    base = -(-size // n)
    out = list(UPLOADER_PART_SIZES)
    for start in (5 * MiB, 8 * MiB):
        p = start
        while p <= size:
            p *= 2
            out.append(p)
    minio = -(-size // 10_000)
    out += [base, size // 10_000 + 1, -(-minio // (16 * MiB)) * 16 * MiB]
    out += [-(-base // unit) * unit for unit in (MiB, 5 * MiB, 16 * MiB)]
    seen: set[int] = set()
    fits = []
    for p in out:
        if p > 0 and p not in seen and -(-size // p) == n:
            seen.add(p)
            fits.append(p)
    return fits[:MAX_CANDIDATES]


def part_layout(size: int, etag: str | None,
                head_part: Callable[[int], Mapping[str, str]]) -> tuple[int, ...]:
    """Part sizes of a multipart object from ``head_part(n)`` (headers of ``HEAD ?partNumber=n``).

    One HEAD when the parts are uniform (every uploader's case); one per part otherwise.
    """
    steps = _layout_steps(size, etag)
    try:
        part = next(steps)
        while True:
            part = steps.send(head_part(part))
    except StopIteration as done:
        return done.value


async def apart_layout(size: int, etag: str | None, head_part) -> tuple[int, ...]:
    """The coroutine twin of :func:`part_layout` (``head_part(n)`` returns an awaitable)."""
    steps = _layout_steps(size, etag)
    try:
        part = next(steps)
        while True:
            part = steps.send(await head_part(part))
    except StopIteration as done:
        return done.value


def _layout_or_raise(layout: tuple[int, ...]) -> tuple[int, ...]:
    if not layout:
        raise Inconsistent("HEAD ?partNumber=1 gave no usable part size or part count")
    return layout


def learn_layout(size: int, etag: str | None, head_part: Callable[[int], Mapping[str, str]],
                 policy: RetryPolicy | None = None, *, on_retry: Callable[[TransferError], None] | None = None
                 ) -> tuple[int, ...]:
    """The part sizes of a multipart object (``head_part(n)``: the headers of ``HEAD ?partNumber=n``),
    asked again while the answer is unusable; ``()`` when it stays unusable: :func:`object_claim`
    then makes the check a layout search over the whole object.  Other errors are raised."""
    try:
        return retrying(lambda: _layout_or_raise(part_layout(size, etag, head_part)), policy or RetryPolicy(),
                        classify=classify, on_retry=on_retry)
    except Inconsistent:
        return ()


async def alearn_layout(size: int, etag: str | None, head_part, policy: RetryPolicy | None = None, *,
                        on_retry: Callable[[TransferError], None] | None = None) -> tuple[int, ...]:
    """The coroutine twin of :func:`learn_layout` (``head_part(n)`` returns an awaitable)."""
    async def attempt() -> tuple[int, ...]:
        return _layout_or_raise(await apart_layout(size, etag, head_part))

    try:
        return await aretrying(attempt, policy or RetryPolicy(), classify=classify, on_retry=on_retry)
    except Inconsistent:
        return ()


def _layout_steps(size: int, etag: str | None):
    """The layout decision of both twins, without I/O: yields the part numbers to HEAD, is sent
    their headers, and returns the part sizes (``()``: unknown)."""
    n = etag_parts(etag)
    if n <= 1:
        return (size,) if n == 1 else ()
    h1 = yield 1
    count = _header_int(h1, "x-amz-mp-parts-count", n)
    first = _header_int(h1, "content-length", 0)
    if count != n or first <= 0 or first >= size:
        return ()
    if -(-size // first) == n:
        return tuple(uniform_parts(size, first))
    sizes = [first]
    for i in range(2, n + 1):
        sizes.append(_header_int((yield i), "content-length", 0))
    return tuple(sizes) if sum(sizes) == size and min(sizes) > 0 else ()


def _header_int(headers: Mapping[str, str], name: str, default: int) -> int:
    """An integer header; a missing one is ``default``, a garbled one -1 (never a usable size)."""
    value = headers.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        return -1
