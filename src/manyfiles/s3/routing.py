"""Engine choice per object (``--strategy``) and the shared connection budget.  Pure, no I/O.

The auto rule uses only the size the listing already gave (no HEAD per object).
It comes from ``benchmarks/s3pull.py`` (see docs/s3pull.md, "How auto decides"):

* objects up to ``LOOP_MAX`` go to the ``loop`` engine: one thread driving many
  non-blocking connections, the same hand-signed GETs without a GIL hand-over
  per object (it sends TLS, proxied and multipart-ETag objects on to ``lean``);
* larger objects below ``RANGED_MIN`` go whole to the ``lean`` pool: threads on raw
  sockets with hand-signed GETs.  Small objects cost client CPU per request,
  and a lean request costs a fraction of botocore's (~1 ms) or aiobotocore's;
  in the benchmark the lean thread pool also beat the asyncio ``http`` engine
  on 1 KiB and 1 MiB objects;
* objects from ``RANGED_MIN`` up are split into ``PART_SIZE`` ranged GETs on the
  ``ranged`` pool (same transport: recv_into + pwrite, both release the GIL), so
  one big object uses several connections at once.  Below 64 MiB a whole GET wins
  (issue 18, 20 x 50 MiB on versitygw): the client's CPU per byte is the same,
  but a server sends a whole object with sendfile, a partial range through its
  own buffers (3.5x its CPU: 8 ms vs 28 ms per 50 MiB), and a whole GET needs no
  HEAD; concurrent objects keep the connections busy anyway.

The pools share one budget of ``concurrency`` connections: the ranged pool
gets ``big_pool(concurrency)`` of them, the lean pool the rest, so a few large
objects can never take every connection from the small ones (nor the reverse);
the loop has the lean pool's share too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MiB = 1 << 20
LOOP_MAX = 64 << 10        # auto's objects for the loop engine: those a SmallTarget holds (sink.SMALL_MAX)
RANGED_MIN = 64 * MiB
PART_SIZE = 8 * MiB        # the smallest part auto chooses (and the size of a forced one's parts)
AUTO_PART_MAX = 128 * MiB
MAX_PARTS = 10_000

STRATEGIES = ("auto", "sync", "async", "http", "loop", "lean", "threads", "processes", "ranged")
# Engines on other libraries, measured against ours (issue 18), forced only by name; not held to every
# rule of the engines above (engines/candidates.py says which they cannot keep), not used by auto.
CANDIDATES = ("obstore", "crt")


def ranges_per_object(cores: int | None = None) -> int:
    """How many ranges an object is cut into when the part size is left to auto: 8 per core."""
    return 8 * (cores or os.cpu_count() or 1)


def part_size_for(size: int, part_size: int | None = None, cores: int | None = None) -> int:
    """The part size of a ranged object.  ``part_size`` None (auto): about
    :func:`ranges_per_object` ranges, each 8 to 128 MiB, MiB-aligned (1 GiB on 2 cores: 64 MiB);
    given: that size.  16 MiB at least from 4 GiB up, and never more than MAX_PARTS parts.

    Few large ranges cost the server less than many small ones (a ranged GET is one more
    request to authorise and open, and is copied through the server's buffers: 1 GiB on versitygw
    took 0.5 s of server CPU in 64 MiB ranges, 0.65-0.94 s in 8 MiB ones), while 8 per core keep
    every core busy and leave room for a slow range."""
    if part_size is None:
        want = -(-size // ranges_per_object(cores))
        part_size = min(AUTO_PART_MAX, max(PART_SIZE, -(-want // MiB) * MiB))
    if size >= 4096 * MiB:
        part_size = max(part_size, 16 * MiB)
    while size > part_size * MAX_PARTS:
        part_size *= 2
    return part_size


@dataclass(frozen=True)
class Budget:
    """How many connections each engine may hold."""

    concurrency: int
    big: int          # thread pool for ranged parts (and `threads`/`ranged` when forced)
    small: int        # http/async coroutines (or process workers when forced)
    processes: int = 0

    def describe(self) -> str:
        if self.processes:
            return f"{self.processes} processes x {self.small // max(1, self.processes)} connections"
        return f"{self.small} small + {self.big} large connections"


def big_pool(concurrency: int) -> int:
    return max(2, min(16, concurrency // 4))


def budget(strategy: str, concurrency: int, processes: int = 0) -> Budget:
    concurrency = max(1, concurrency)
    if strategy == "sync":
        return Budget(1, 1, 1)
    if strategy in ("threads", "ranged", "lean"):
        return Budget(concurrency, concurrency, 0)
    if strategy in ("async", "http", "loop", "obstore", "crt"):
        return Budget(concurrency, 0, concurrency)
    if strategy == "processes":
        procs = processes or 2
        return Budget(concurrency, 0, max(procs, concurrency), procs)
    big = big_pool(concurrency)
    return Budget(concurrency, big, max(1, concurrency - big))


def choose(strategy: str, size: int | None, *, ranged_min: int = RANGED_MIN,
           part_size: int | None = None) -> tuple[str, int]:
    """(engine, part size or 0) for one object of ``size`` bytes (None: unknown, fetched whole);
    ``part_size`` None: by object size (:func:`part_size_for`)."""
    smallest = part_size or PART_SIZE
    if strategy == "auto":
        if size is not None and size <= LOOP_MAX:
            return "loop", 0
        if size is None or size < max(ranged_min, smallest + 1):
            return "lean", 0
        return "ranged", part_size_for(size, part_size)
    if strategy == "ranged":
        if size is not None and size > smallest:
            return "ranged", part_size_for(size, part_size)
        return "ranged", 0     # one part: a whole GET on the same pool
    return strategy, 0
