"""Work cut into slices for a cluster's shards: ``s3pull --cluster``'s objects to download and
``s3push --cluster``'s files to upload, by key count and by bytes (:func:`cut_slices`).

A slice's items are tuples whose first two fields are a key and a size (the rest is the tool's:
an ETag, a local path and its identity...); the cuts follow the keys, so the same work on as many
workers cuts the same, and a slice's :attr:`Slice.id` names its state on a rerun.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

__all__ = ["MAX_SLICES_PER_BATCH", "MIN_SLICE_BYTES", "MIN_SLICE_KEYS", "SLICES_PER_WORKER", "SLICE_KEYS",
           "Slice", "cut_slices"]

SLICE_KEYS = 10_000       # keys per listing shard (10 pages of 1000), and per download slice at most
SLICES_PER_WORKER = 4     # a whole job that one lister read is cut into this many slices per worker...
MIN_SLICE_KEYS = 100      # ...of this many keys at least (a task costs the scheduler ~3 ms)...
MIN_SLICE_BYTES = 64 << 20  # ...or this many bytes (a slice ends at its share of the bytes);
MAX_SLICES_PER_BATCH = 16   # a lister's keys when more follow: at most this many (10^8 keys: ~10^5 tasks)


def cut_slices(objects: list[tuple], workers: int, max_keys: int = SLICE_KEYS, *,
               whole: bool = False) -> list[Slice]:
    """``objects`` (``(key, size, etag...)`` in key order) cut into slices for ``workers`` shards at
    once: ``SLICES_PER_WORKER`` per worker (at most ``MAX_SLICES_PER_BATCH`` unless they are the
    ``whole`` job), by key count and by bytes -- a slice ends at its share of either (but holds at
    least ``MIN_SLICE_KEYS`` keys or ``MIN_SLICE_BYTES``), and at ``max_keys`` keys.  The cuts follow
    the keys: the same listing on as many workers cuts the same."""
    want = SLICES_PER_WORKER * max(1, workers)
    if not whole:
        want = min(want, MAX_SLICES_PER_BATCH)
    keys = min(max_keys, max(MIN_SLICE_KEYS, -(-len(objects) // want)))
    budget = max(MIN_SLICE_BYTES, -(-sum(o[1] or 0 for o in objects) // want))
    out: list[Slice] = []
    batch: list[tuple] = []
    held = 0
    for o in objects:
        size = o[1] or 0
        if batch and (len(batch) >= keys or held + size > budget):
            out.append(Slice(tuple(batch)))
            batch, held = [], 0
        batch.append(tuple(o))
        held += size
    if batch:
        out.append(Slice(tuple(batch)))
    return out


class Slice(NamedTuple):
    """Items of one shard: ``(key, size, ...)`` each (s3pull: ``(key, size, etag)``), in order."""

    objects: tuple[tuple, ...]

    @property
    def id(self) -> str:
        """Names the slice's state files: the same keys make the same slice on a rerun."""
        first, last = self.objects[0][0], self.objects[-1][0]
        digest = hashlib.sha1(f"{first}\0{last}\0{len(self.objects)}".encode("utf-8", "surrogateescape"))
        return digest.hexdigest()[:20]
