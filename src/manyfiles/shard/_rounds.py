"""The rounds of a migration: each moves the files it is given, one top bucket per task on the
:class:`~manyfiles.shard._engine.Migration`'s workers (or a cluster's: a task is shipped by name,
see :data:`TASKS`), and journals each top bucket once it is done.

* :func:`apply_round` (flat -> tree): files named like a top bucket step aside first, then every
  top bucket's files move into their leaves (:func:`apply_top`), then the set-aside ones follow;
* :func:`revert_round` (tree -> flat): the tree is scanned (:func:`scan_tree`), every top bucket's
  leaves are emptied into the root and pruned (:func:`revert_top`), the set-aside files last.

:mod:`manyfiles.shard._phases` decides how many rounds a phase makes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from manyfiles import listing
from manyfiles._core import fsops as _fsops
from manyfiles._core.testing import killpoint
from manyfiles.errors import ManyfilesError, describe_oserror
from manyfiles.shard._engine import Migration
from manyfiles.shard.journal import name_to_json
from manyfiles.shard.layout import Layout
from manyfiles.shard.scan import group_by_top
from manyfiles.shard.sharded_dir import TMP_PREFIX, bucket_walk

ASIDE = b".manyfiles-shard.aside"   # where files named like a top bucket wait while the buckets exist

_DIR_IN_BUCKET = "directory inside a bucket left in place"


# -- apply: flat -> tree ---------------------------------------------------------------------------

def apply_round(m: Migration, layout: Layout, flat: list[bytes]) -> None:
    rep = m.report
    # 1. flat files named like a top bucket (a file "ab" where "ab/" must go) step aside first,
    #    before any worker can mkdir that bucket; the journal records each one before it moves.
    collide = [n for n in flat if layout.is_bucket(n, 0)]
    if collide:
        asidefd = m.open_bucket(ASIDE, create=True)
        try:
            for name in collide:
                m.note({"type": "aside", "name": name_to_json(name)}, durable=True)
                m.move(m.rootfd, name, asidefd, name, name, "set_aside")
                killpoint("aside")
        finally:
            os.close(asidefd)
        m.progress.add(len(collide))  # counted here, as revert_top counts them (place_aside does not)
        moved_aside = set(collide)
        flat = [n for n in flat if n not in moved_aside]
    # 2. everything else, one top bucket per task
    tops = group_by_top(layout, flat)
    rep.buckets += sum(len(leaves) for leaves in tops.values())
    m.run_parallel(apply_top, list(tops.items()))
    # 3. the set-aside files go to their buckets (also those of an earlier, killed run)
    place_aside(m, lambda name: layout.bucket_rel(name))

def apply_top(m: Migration, item: tuple[bytes, dict[bytes, list[bytes]]]) -> None:
    top, leaves = item
    n = 0
    topfd = m.open_bucket(top, create=True)
    try:
        for leaf, names in leaves.items():
            if m.stopping():
                return
            below = leaf[len(top) + 1:]
            lfd = m.open_bucket(below, create=True, under=(topfd, top)) if below else topfd
            moved = 0
            try:
                for name in names:
                    moved += m.move(m.rootfd, name, lfd, name, name, None)
            finally:
                if lfd != topfd:
                    os.close(lfd)
                m.tally("moved", moved)
            m.progress.add(len(names))
            n += len(names)
    finally:
        os.close(topfd)
    m.note({"type": "done", "top": name_to_json(top), "files": n})

def place_aside(m: Migration, dest_rel: Callable[[bytes], bytes | None]) -> None:
    """Move every file in the aside directory to ``dest_rel(name)`` (None = the root)."""
    try:
        asidefd = m.open_bucket(ASIDE, create=False)
    except FileNotFoundError:
        return
    try:
        for name in [e.name for e in listing.iter_entries(os.path.join(m.rootb, ASIDE))]:
            rel = dest_rel(name)
            dfd = m.rootfd if rel is None else m.open_bucket(rel, create=True)
            try:
                m.move(asidefd, name, dfd, name, name)
            finally:
                if dfd != m.rootfd:
                    os.close(dfd)
            killpoint("place")
    finally:
        os.close(asidefd)
    if _fsops.rmdir_if_empty(ASIDE, dir_fd=m.rootfd):
        m.note({"type": "aside-done"}, durable=True)

# -- revert: tree -> flat --------------------------------------------------------------------------

def scan_tree(m: Migration, layout: Layout) -> tuple[dict[bytes, list[tuple[bytes, list[bytes]]]], int]:
    """top -> [(directory, non-directory names)] for every bucket directory, and the file count.

    The C walker enters bucket directories only and does not report the root's own entries
    (min_depth 1): a half-reverted root of a million flat files costs no Python object here.
    """
    depth = len(layout.levels)
    exact = layout.bucket_globs() is not None  # else is_bucket() decides below
    tops: dict[bytes, list[tuple[bytes, list[bytes]]]] = {}
    total = 0
    for d in listing.walk(m.rootb, **bucket_walk(layout, min_depth=1)):
        rel = d.path[len(m.rootb):].lstrip(b"/")
        parts = rel.split(b"/")
        if not exact and not all(layout.is_bucket(p, i) for i, p in enumerate(parts)):
            continue
        if d.error is not None:
            raise ManyfilesError(f"{m.where(rel)}: {describe_oserror(d.error)}")
        names = []
        for e in d.entries:
            if e.type != "d":
                names.append(e.name)
            elif d.depth == depth:
                m.report.skipped.append((rel + b"/" + e.name, _DIR_IN_BUCKET))
        tops.setdefault(parts[0], []).append((rel, names))
        total += len(names)
    for dirs in tops.values():
        dirs.sort(key=lambda x: -x[0].count(b"/"))  # deepest first, so pruning goes bottom-up
    return tops, total

def revert_round(m: Migration, layout: Layout) -> int:
    tops, total = scan_tree(m, layout)
    m.add_total(total)
    if any(layout.is_bucket(n, 0) for dirs in tops.values() for _, names in dirs for n in names):
        _fsops.makedirs(os.path.join(m.rootb, ASIDE))
    # leaf buckets only, as apply counts them (a 2:2 tree's 256 top directories are not buckets)
    depth = len(layout.levels) - 1
    m.report.buckets += sum(1 for dirs in tops.values() for rel, _ in dirs if rel.count(b"/") == depth)
    m.run_parallel(revert_top, list(tops.items()), layout)
    place_aside(m, lambda name: None)
    return total

def revert_top(m: Migration, layout: Layout, item: tuple[bytes, list[tuple[bytes, list[bytes]]]]) -> None:
    top, dirs = item
    asidefd = None
    n = 0
    try:
        for rel, names in dirs:
            if m.stopping():
                return
            try:
                sfd = m.open_bucket(rel, create=False)
            except FileNotFoundError:
                continue  # pruned by an earlier (killed) run
            moved = 0
            try:
                for name in names:
                    if name.startswith(TMP_PREFIX):
                        # an uncommitted put() of a killed writer: garbage by construction
                        with contextlib.suppress(FileNotFoundError):
                            _fsops.unlink(name, dir_fd=sfd)
                    elif layout.is_bucket(name, 0):
                        # a file named like a top bucket waits aside until the buckets are gone
                        if asidefd is None:
                            asidefd = m.open_bucket(ASIDE, create=False)
                        m.move(sfd, name, asidefd, name, rel + b"/" + name, "set_aside")
                    else:
                        moved += m.move(sfd, name, m.rootfd, name, rel + b"/" + name, None)
            finally:
                os.close(sfd)
                m.tally("moved", moved)
            m.progress.add(len(names))
            n += len(names)
            if _fsops.rmdir_if_empty(rel, dir_fd=m.rootfd):
                killpoint("prune")
    finally:
        if asidefd is not None:
            os.close(asidefd)
    m.note({"type": "done", "top": name_to_json(top), "files": n})


#: the tasks a round hands to :meth:`Migration.run_parallel`, by the name a cluster job ships
TASKS: dict[str, Callable[..., None]] = {"apply_top": apply_top, "revert_top": revert_top}
