"""The journaled execution of a migration: its two phases, run on a
:class:`~manyfiles.shard._engine.Migration` once :mod:`manyfiles.shard.migrate` has decided what
to do (a fresh run or a resumed one, from which layout to which).

* :func:`build_tree` (flat -> tree): ``apply``, and the second phase of ``reshard``;
* :func:`flatten_tree` (tree -> flat): ``revert``, and the first phase of ``reshard``.

Each starts the journal (a fresh run writes its header, a resumed one notes the resume), moves the
files in rounds (:mod:`manyfiles.shard._rounds`) on the engine's workers, then makes up to
``_RESCANS`` more rounds for files created meanwhile.  The descriptor marks the phase: written
before the first file of a build moves, removed once a flatten emptied the tree.  ``finish``
(syncfs, then the journal goes) ends a complete op.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from manyfiles import listing
from manyfiles._core import fsops as _fsops
from manyfiles._core.testing import killpoint
from manyfiles.errors import ManyfilesError
from manyfiles.shard._engine import Migration, lexists
from manyfiles.shard._rounds import ASIDE, apply_round, revert_round
from manyfiles.shard.journal import Journal
from manyfiles.shard.layout import Layout
from manyfiles.shard.scan import scan_root
from manyfiles.shard.sharded_dir import (
    DESCRIPTOR,
    STORED_FILES,
    create_descriptor,
    read_descriptor,
    remove_descriptor,
)

_RESCANS = 3  # extra passes for files created while we run


def layout_doc(layout: Layout | None) -> dict[str, Any] | None:
    """A layout as the journal header stores it (``from``, ``to``)."""
    return None if layout is None else json.loads(layout.to_json())


def layout_from(doc: dict[str, Any] | None) -> Layout | None:
    """The layout a journal header stored."""
    return None if doc is None else Layout.from_json(json.dumps(doc).encode())


def _start_journal(m: Migration, op: str, source: Layout | None, target: Layout | None,
                   **counts: int) -> None:
    """A fresh run's journal: the header says which op, from and to which layout, and the counts
    ``shard status`` measures progress against."""
    m.journal = Journal.create(m.rootfd, {"type": "header", "op": op, "from": layout_doc(source),
                                          "to": layout_doc(target), **counts, "pid": os.getpid(),
                                          "started": time.time()}, sync=m.journal_sync)


# -- flat -> tree ------------------------------------------------------------------------------------


def build_tree(m: Migration, target: Layout, *, fresh: bool, recorded: Layout | None,
               op: str = "apply", only: frozenset[bytes] | None = None) -> None:
    """Move the root's flat files into their buckets (``only``: just these names, a plan's)."""
    _clean_descriptor_temps(m)
    flat, buckets, skipped = scan_root(m.rootb, target)
    m.report.skipped.extend(skipped)
    flat_at_start = len(flat)  # `shard status` counts what left the top level against it
    if only is not None:
        flat = [n for n in flat if n in only]
    if fresh:
        if _nothing_to_build(m, recorded, buckets, flat):
            return
        _start_journal(m, op, None, target, total=len(flat), flat=flat_at_start)
    else:
        m.note({"type": "resume", "remaining": len(flat), "pid": os.getpid()}, durable=True)
    if read_descriptor(m.rootfd, m.rootb) is None:
        create_descriptor(m.rootfd, target, m.rootb)
        killpoint("descriptor")
    _build_rounds(m, target, flat, only)
    m.finish()


def _nothing_to_build(m: Migration, recorded: Layout | None, buckets: list[bytes], flat: list[bytes]) -> bool:
    """A fresh build: refuse buckets it did not make; True if a sharded root has nothing flat."""
    if recorded is None and buckets:
        names = ", ".join(os.fsdecode(b) for b in sorted(buckets)[:3])
        raise ManyfilesError(f"{os.fsdecode(m.rootb)}: subdirectories named like shard buckets already "
                             f"exist ({names}); rename them or choose other --levels (nothing was moved)")
    if recorded is not None and not flat and not _aside_left(m):
        m.report.nothing_to_do = True
        return True
    return False


def _build_rounds(m: Migration, target: Layout, flat: list[bytes], only: frozenset[bytes] | None) -> None:
    rep = m.report
    m.add_total(len(flat))
    apply_round(m, target, flat)
    for _ in range(_RESCANS):
        # files created while we ran: move them too (later ones stay flat and are counted)
        flat = _still_flat(m, target, only)
        if not flat:
            break
        before = rep.moved
        m.add_total(len(flat))
        apply_round(m, target, flat)
        rep.appeared += rep.moved - before
    rep.left_flat = len(_still_flat(m, target, None))


def _still_flat(m: Migration, target: Layout, only: frozenset[bytes] | None) -> list[bytes]:
    """Flat names now (of ``only``, if given), without those that already failed (conflicts, errors)."""
    rep = m.report
    stuck = set(rep.conflicts) | {os.fsencode(os.path.basename(f.path)) for f in rep.failures}
    return [n for n in scan_root(m.rootb, target)[0] if n not in stuck and (only is None or n in only)]


# -- tree -> flat ------------------------------------------------------------------------------------


def flatten_tree(m: Migration, source: Layout, *, fresh: bool, op: str = "revert",
                 to: Layout | None = None) -> bool:
    """Move every file of the tree back to the root; True if the tree is gone (descriptor
    removed), False if something stayed.  As reshard's first phase (``to``: its target), a
    complete flatten leaves the journal for the build that follows."""
    if fresh:
        # `shard status` counts what reached the top level against the files already there
        _start_journal(m, op, source, to, flat=listing.count(m.rootb, filter=STORED_FILES))
    else:
        m.note({"type": "resume", "pid": os.getpid()}, durable=True)
    _flatten_rounds(m, source)
    gone = not _tree_left(m, source) and not _aside_left(m)
    if gone:
        remove_descriptor(m.rootfd)
        killpoint("descriptor")
    elif op == "revert":
        m.report.add_failure(m.report.root, "some entries stayed in the tree (see skipped/conflicts); the "
                                            "descriptor is kept, resolve them and rerun", "incomplete")
    if op == "revert":
        m.finish()
    return gone


def _flatten_rounds(m: Migration, source: Layout) -> None:
    rep = m.report
    revert_round(m, source)
    for _ in range(_RESCANS):
        if not _tree_left(m, source):
            break
        before = rep.moved
        if revert_round(m, source) == 0:
            break
        rep.appeared += rep.moved - before


# -- reshard: one, then the other --------------------------------------------------------------------


def reshard_tree(m: Migration, source: Layout, target: Layout, *, fresh: bool) -> None:
    """Flatten the ``source`` tree, then build the ``target`` one, in one journal (its header says
    reshard).  The descriptor says which phase a resumed run is in: ``source`` = still flattening."""
    if read_descriptor(m.rootfd, m.rootb) == source and not flatten_tree(m, source, fresh=fresh, op="reshard",
                                                                         to=target):
        m.report.add_failure(m.report.root, "the old tree could not be emptied; resolve the conflicts and "
                                            "rerun", "incomplete")
    else:
        build_tree(m, target, fresh=False, recorded=None, op="reshard")


# -- what is left on disk ----------------------------------------------------------------------------


def _tree_left(m: Migration, layout: Layout) -> bool:
    """Is any top bucket left?  (After a revert the root may hold millions of flat files: the
    C core filters them, creating no object per entry, for hashed layouts.)"""
    globs = layout.bucket_globs()
    if globs is not None:
        return listing.count(m.rootb, filter=listing.Filter(include=(globs[0],), types="d")) > 0
    return any(e.type == "d" and layout.is_bucket(e.name, 0) for e in listing.iter_entries(m.rootb))


def _aside_left(m: Migration) -> bool:
    return lexists(ASIDE, m.rootfd)


def _clean_descriptor_temps(m: Migration) -> None:
    """Temp files of a descriptor write that a kill interrupted (picked by the C core's glob)."""
    temps = listing.Filter(include=(os.fsdecode(DESCRIPTOR) + ".*.tmp",))
    for name in listing.listdir(m.rootb, filter=temps):
        with contextlib.suppress(FileNotFoundError):
            _fsops.unlink(name, dir_fd=m.rootfd)
