"""How to free space in a cache of packs (issue 27): LRU of packs against LRU of objects with compaction.

A simulation (no I/O) of one cache of ``--capacity`` objects of one size, packs of 1/32 of it (what
``Space.pack_bytes`` gives), a low watermark of 0.9, under three access patterns:

* ``epochs``: training epochs, each a new shuffle of a dataset 1.5x the cache;
* ``zipf``: random reads of 4x the cache's objects, Zipf-skewed (s = 1);
* ``hot+scan``: 30% of the reads to a hot set of 0.3x the cache, the others a cyclic scan of 3x.

Policies: ``files`` (each object a file of its own, LRU by object: the ideal the others approach),
``packs`` (LRU of packs: a pack's last access is its records' latest; a pack goes whole, what this
cache does), ``objects+compaction`` (LRU by object, records left dead in their packs; a pack under
half live is compacted: its live records copied into the current pack, then removed).  For each:
the hit ratio, and the bytes compaction rewrites per byte read (disk writes the others do not do).

    .venv/bin/python benchmarks/pack_eviction.py [--capacity 8192]
"""

from __future__ import annotations

import argparse
import random
from collections import OrderedDict


def traces(capacity: int, seed: int = 1) -> dict[str, list[int]]:
    rng = random.Random(seed)
    out = {}
    n = int(capacity * 1.5)
    epochs = []
    for _ in range(5):
        order = list(range(n))
        rng.shuffle(order)
        epochs += order
    out["epochs"] = epochs
    n = capacity * 4
    weights = [1 / (k + 1) for k in range(n)]
    ids = list(range(n))
    rng.shuffle(ids)
    out["zipf"] = rng.choices(ids, weights, k=n * 3)
    hot, scan = int(capacity * 0.3), capacity * 3
    seq, pos = [], 0
    for _ in range(capacity * 12):
        if rng.random() < 0.3:
            seq.append(rng.randrange(hot))
        else:
            seq.append(hot + pos % scan)
            pos += 1
    out["hot+scan"] = seq
    return out


def files(trace: list[int], capacity: int) -> tuple[float, float]:
    lru: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for obj in trace:
        if obj in lru:
            hits += 1
            lru.move_to_end(obj)
            continue
        lru[obj] = None
        if len(lru) > capacity:
            while len(lru) > capacity * 0.9:
                lru.popitem(last=False)
    return hits / len(trace), 0.0


def packs(trace: list[int], capacity: int) -> tuple[float, float]:
    per_pack = max(1, capacity // 32)
    where: dict[int, int] = {}
    members: dict[int, list[int]] = {}
    last: dict[int, int] = {}
    active, used, hits = 0, 0, 0
    members[0] = []
    for t, obj in enumerate(trace):
        p = where.get(obj)
        if p is not None:
            hits += 1
            last[p] = t
            continue
        if len(members[active]) >= per_pack:
            active += 1
            members[active] = []
        members[active].append(obj)
        where[obj] = active
        last[active] = t
        used += 1
        if used > capacity:
            while used > capacity * 0.9:
                victim = min(members, key=last.get)
                for o in members.pop(victim):
                    del where[o]
                used -= per_pack if victim != active else len(members.get(victim, ()))
                del last[victim]
                if victim == active:
                    active += 1
                    members[active] = []
    return hits / len(trace), 0.0


def objects_and_compaction(trace: list[int], capacity: int) -> tuple[float, float]:
    per_pack = max(1, capacity // 32)
    lru: OrderedDict[int, int] = OrderedDict()        # live object -> its pack
    live: dict[int, set[int]] = {0: set()}
    size: dict[int, int] = {0: 0}                     # records appended (live or dead)
    active, hits, rewritten = 0, 0, 0

    def append(obj: int) -> None:
        nonlocal active
        if size[active] >= per_pack:
            active += 1
            live[active], size[active] = set(), 0
        live[active].add(obj)
        size[active] += 1
        lru[obj] = active

    for obj in trace:
        if obj in lru:
            hits += 1
            lru.move_to_end(obj)
            continue
        append(obj)
        if sum(size.values()) <= capacity:
            continue
        while len(lru) > capacity * 0.9:             # LRU objects out: dead records in their packs
            old, p = lru.popitem(last=False)
            live[p].discard(old)
        while sum(size.values()) > capacity * 0.9:   # then compact the emptiest packs
            victim = min((p for p in live if p != active), key=lambda p: len(live[p]) / size[p], default=None)
            if victim is None or len(live[victim]) > size[victim] // 2:
                break
            moving = live.pop(victim)
            del size[victim]
            for o in moving:
                lru_pos = o in lru
                append(o)
                rewritten += 1
                if lru_pos:
                    lru.move_to_end(o, last=False)     # (keeps its place among the old ones, roughly)
    return hits / len(trace), rewritten / len(trace)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=8192, help="objects the cache holds")
    args = ap.parse_args()
    policies = {"files": files, "packs": packs, "objects+compaction": objects_and_compaction}
    print(f"cache of {args.capacity:,} objects, packs of {args.capacity // 32:,}, low water 0.9")
    print()
    print("| access pattern | reads | " + " | ".join(f"{p} hit ratio" for p in policies)
          + " | compaction: records rewritten per read |")
    print("|---|---:|" + "---:|" * (len(policies) + 1))
    for name, trace in traces(args.capacity).items():
        got = {p: f(trace, args.capacity) for p, f in policies.items()}
        print(f"| {name} | {len(trace):,} | " + " | ".join(f"{got[p][0]:.3f}" for p in policies)
              + f" | {got['objects+compaction'][1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
