"""``Cache.verify``: check every block on disk, and make the index match the disk.

Per entry, every block is read and checked against its header (object id, index,
length) and its CRC-32: a corrupt block is removed, a block the index lists but that is
missing is unlisted, a sound block the index does not list (a fill whose accounting a
kill cut short) is adopted.  Then the block tree is walked for files of no entry
(removed when older than ``ORPHAN_AGE``, so fills in flight are left alone), temporary
files of dead processes are removed, and the entries/bytes counters are recomputed.

Complete entries are also counted by their whole-object check (made when the object was
read whole from one GET, or warmed): ``verified`` (its ETag MD5, multipart ETag or S3
checksum matched), ``unverifiable`` (read whole, but nothing to check it against: an
SSE-KMS object without a checksum; or a local file, whose version is its stat), and
``unverified`` (assembled from ranged reads: each block is CRC-checked on disk, but the
object as a whole was never compared with what the origin says it is).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from manyfiles._progress import Progress
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Version
from manyfiles.cache._store import BlockStore

ORPHAN_AGE = 60.0


def check_block(path: str, objid: bytes, index: int, length: int) -> str:
    """"ok", "missing" or "corrupt"."""
    try:
        with open(path, "rb") as f:
            raw = f.read(fmt.HEADER_SIZE + length + 1)
    except FileNotFoundError:
        return "missing"
    except OSError:
        return "corrupt"
    h = fmt.unpack_header(raw)
    if h is None or h.objid != objid or h.index != index or h.length != length:
        return "corrupt"
    return "ok" if fmt.crc_ok(h, memoryview(raw)[fmt.HEADER_SIZE:]) else "corrupt"


def verify(store: BlockStore, report: Any, progress: Progress) -> Any:
    """Fill ``report`` (a VerifyReport) while checking ``store``; ``progress`` counts entries."""
    t0 = time.monotonic()
    store.flush()
    index = store.index
    checks = index.verifications()
    for objid, source, validator, size, present, _disk in list(index.entries()):
        report.entries += 1
        unlisted, adopt = [], []
        for i in range(-(-size // store.block_size)):
            listed = i >> 3 < len(present) and present[i >> 3] >> (i & 7) & 1
            length = store.block_length(size, i)
            path = store.block_path(objid, i)
            status = check_block(path, objid, i, length)
            if status == "ok":
                report.blocks += 1
                report.bytes += length
                if not listed:
                    adopt.append(i)
                continue
            if status == "corrupt":
                report.corrupt += 1
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            elif listed:
                report.missing += 1
            if listed:
                unlisted.append(i)
        if unlisted:
            index.drop_blocks(objid, unlisted)
        if adopt:
            v = Version(objid, source, validator, size, 0.0)
            index.record_fills([store.fill_record(v, i) for i in adopt], time.time())
            report.adopted += len(adopt)
        if not unlisted and size:       # complete
            method = checks.get(objid)
            if method is None and source.startswith(b"file:"):
                method = fmt.SIZE_ONLY
            if method is None:
                report.unverified += 1
            elif method == fmt.SIZE_ONLY:
                report.unverifiable += 1
            else:
                report.verified += 1
        progress.add(1)
    report.orphans = _remove_orphans(store)
    report.temps = store.clean_stale_temps()
    index.recount()
    store.count(corrupt=report.corrupt)
    store.flush_counters()
    report.seconds = time.monotonic() - t0
    return report


def _remove_orphans(store: BlockStore) -> int:
    """Remove block files (named ``<32 hex>.<n>``) whose entry does not exist or is smaller."""
    removed = 0
    cutoff = time.time() - ORPHAN_AGE
    for folder, _dirs, files in os.walk(os.path.join(store.root, fmt.BLOCKS)):
        named: dict[bytes, list[tuple[str, int]]] = {}
        for name in files:
            hexid, _, n = name.partition(".")
            if len(hexid) != 32 or not n.isdigit():
                continue
            try:
                named.setdefault(bytes.fromhex(hexid), []).append((name, int(n)))
            except ValueError:
                continue
        if not named:
            continue
        sizes = store.index.sizes(list(named))
        for objid, blocks in named.items():
            nblocks = -(-sizes[objid] // store.block_size) if objid in sizes else 0
            for name, n in blocks:
                if n < nblocks:
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
    return removed
