"""``Cache.verify``: check every cached file, make the index match the disk, sort objects by their check.

Per object:

* packed (a small object held whole as a record of a pack): its record's header (this object,
  this place, this length) and CRC-32 are checked, and its payload is re-hashed against the check
  its object passed; a record that fails is dropped (its bytes stay dead in the pack);
* held whole: its whole file is re-hashed against the check its object passed when it was
  written (the S3 checksum, MD5 or multipart ETag; the CRC-32 of a file or of an object with
  nothing to check against): *verified* (or *unverifiable*, when the origin gave nothing to
  check), or wrong data: removed;
* held in blocks: every block is checked against its header and CRC-32 (a corrupt block is
  removed, a block the index lists but that is missing is unlisted, a sound block the index
  does not list -- a fill whose accounting a kill cut short -- is adopted).  Blocks checked per
  part (or of a local file) are verified; an object holding blocks no check covered is
  *unverified* -- unless ``complete``: then it is fetched whole, checked and installed whole
  (the blocks that differ from the checked bytes are wrong data), or dropped when it cannot be
  checked.

Objects removed or replaced while ``verify`` runs (by other processes: eviction, fills) are left
to them: what fails a check is counted only if the index still names it as it did.

Then files of no entry are removed (when older than ``ORPHAN_AGE``, so fills in flight are
left alone), packs the index does not account (unless a live process holds one to append to:
its first records are not accounted yet), temporary files of dead processes too; the packs whose
file is gone are forgotten with their objects, each pack's size is taken from its file (appends
whose accounting a kill cut short are dead bytes in it) and the counters are recomputed.  The
report is ``ok`` only when no wrong data was found and every object is verified or
unverifiable (partial objects whose blocks are all checked are fine).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from manyfiles._core.progress import Progress
from manyfiles.cache import _format as fmt
from manyfiles.cache._index import Entry, Version
from manyfiles.cache._store import BlockStore, clean_stale_temps
from manyfiles.errors import ManyfilesError, NotFound, ObjectChanged

ORPHAN_AGE = 60.0


def check_block(path: str, objid: bytes, index: int, length: int) -> str:
    """"checked", "unverified" (sound, no check of the origin's covered it), "missing" or "corrupt"."""
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
    if not fmt.crc_ok(h, memoryview(raw)[fmt.HEADER_SIZE:]):
        return "corrupt"
    return "checked" if h.checked else "unverified"


def verify(cache: Any, report: Any, progress: Progress, *, complete: bool = False) -> Any:
    """Fill ``report`` (a VerifyReport) while checking ``cache``; ``progress`` counts objects."""
    t0 = time.monotonic()
    store: BlockStore = cache._store
    store.flush()
    index = store.index
    checks = index.verifications()
    _verify_pack_files(store, report)
    for e in list(index.entries()):
        report.entries += 1
        if e.whole and e.pack is not None:
            _verify_packed(store, e, checks.get(e.objid), report)
        elif e.whole:
            _verify_whole(store, e, checks.get(e.objid), report)
        else:
            _verify_blocks(cache, e, checks.get(e.objid), report, complete)
        progress.add(1)
    store.flush()
    report.orphans = _remove_orphans(store)
    report.temps = clean_stale_temps(store.tmp)
    index.recount()
    store.counters.count(corrupt=report.corrupt)
    store.counters.flush()
    report.seconds = time.monotonic() - t0
    return report


def _shown(e: Entry) -> str:
    """What a user calls the entry's source: its path, or ``s3://bucket/key`` (without the endpoint)."""
    text = e.source.decode(errors="replace")
    if text.startswith("file:"):
        return text[5:]
    if text.startswith("s3+"):
        from urllib.parse import urlsplit

        parts = urlsplit(text[3:])
        return "s3:/" + text[3 + len(f"{parts.scheme}://{parts.netloc}"):]
    return text


def _verify_whole(store: BlockStore, e: Entry, check: tuple[str, str | None] | None, report: Any) -> None:
    path = store.whole_path(e.objid)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        if store.index.entry(e.objid) is not None:      # (else: removed meanwhile, by another process)
            report.missing += 1
            store.index.remove_objects([e.objid])
        return
    try:
        sound = os.fstat(fd).st_size == e.size and store.whole_sound(e.objid, fd, e.size)
    finally:
        os.close(fd)
    if sound or store.index.entry(e.objid) is not None:   # (else: removed meanwhile, by another process)
        _count_whole(store, e, check, report, sound, "copy")


def _count_whole(store: BlockStore, e: Entry, check: tuple[str, str | None] | None, report: Any, sound: bool,
                 what: str) -> None:
    """Count an object held whole by the check it passed (``sound``: its bytes at rest still pass
    it), or drop it (wrong data)."""
    if not sound:
        report.corrupt += 1
        report.wrong += 1
        report.add_failure(_shown(e), f"its cached {what} failed its check: dropped", "wrong")
        store.remove_object(e.objid, e.size)
        return
    report.blocks += 1
    report.bytes += e.size
    if check is not None and check[0] == fmt.SIZE_ONLY:
        report.unverifiable += 1
    else:
        report.verified += 1


def _verify_packed(store: BlockStore, e: Entry, check: tuple[str, str | None] | None, report: Any) -> None:
    from manyfiles.cache._packs import Location

    index = store.index
    row = index.packed(e.objid)
    if row is None:
        if index.entry(e.objid) is not None:       # (else: removed meanwhile, by another process)
            report.missing += 1
            index.remove_objects([e.objid])
        return
    loc = Location(*row)
    try:
        data = store.packs.read_record(loc, e.objid)
    except OSError:
        data = None

    def sound(payload: bytes) -> bool:
        return len(payload) == e.size and store.packed_sound(e.objid, payload)

    if data is None or not sound(data):
        # (judged again under the index's write lock: an eviction elsewhere may have removed the object,
        # its check or its pack since the read above; what fails there is wrong data)
        named, data = store.reread_record(e.objid, loc, sound)
        if not named:
            return                                                   # removed meanwhile, elsewhere
    _count_whole(store, e, check, report, data is not None, "record")


def _verify_pack_files(store: BlockStore, report: Any) -> None:
    """Packs against their files: a pack whose file is gone (or is not that pack) is forgotten with
    its objects; a pack file the index does not account is removed once old and free (no live
    process appends to it); each accounted pack's size is its file's.  What looks wrong here is
    judged again under the index's write lock (``Index.reconcile_packs``): other processes create,
    grow and evict packs while this runs."""
    packs = store.packs

    def file_size(pack: int) -> int | None:
        try:
            with open(packs.path(pack), "rb") as f:
                if fmt.pack_file_id(f.read(fmt.PACK_HEADER_SIZE)) != pack:
                    return None
                return os.fstat(f.fileno()).st_size
        except OSError:
            return None

    files = packs.files()
    accounted = {r.id: r for r in store.index.packs()}
    suspects = [pack for pack, row in accounted.items() if file_size(pack) != row.size]
    if suspects:
        victims = store.index.reconcile_packs(suspects, file_size)
        report.missing += sum(v.entries for v in victims)
        for v in victims:
            packs.forget(v.pack)
        packs.removed(len(victims))
    cutoff = time.time() - ORPHAN_AGE
    for pack, path in files.items():
        if pack in accounted:
            continue
        with contextlib.suppress(OSError):
            if os.stat(path).st_mtime < cutoff and not packs.held_by_a_live_process(path):
                os.unlink(path)
                report.orphans += 1


def _verify_blocks(cache: Any, e: Entry, check: tuple[str, str | None] | None, report: Any,
                   complete: bool) -> None:
    store: BlockStore = cache._store
    unlisted, adopt, unverified, corrupt = [], [], 0, 0
    for i in range(store.nblocks(e.size) if e.size else 0):
        listed = i >> 3 < len(e.present) and e.present[i >> 3] >> (i & 7) & 1
        length = store.block_length(e.size, i)
        path = store.block_path(e.objid, i)
        status = check_block(path, e.objid, i, length)
        if status in ("checked", "unverified"):
            report.blocks += 1
            report.bytes += length
            unverified += status == "unverified"
            if not listed:
                adopt.append(i)
            continue
        if status == "corrupt":
            corrupt += 1
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        elif listed:
            report.missing += 1
        if listed:
            unlisted.append(i)
    if unlisted:
        store.index.drop_blocks(e.objid, unlisted)
    if adopt:
        v = Version(e.objid, e.source, e.validator, e.size, 0.0)
        store.index.record_fills([store.fill_record(v, i) for i in adopt], time.time())
        report.adopted += len(adopt)
    report.corrupt += corrupt
    whole = not unlisted and e.size > 0
    legacy_checked = whole and check is not None and not check[1] and check[0] != fmt.SIZE_ONLY
    if corrupt:
        report.wrong += 1
        report.add_failure(_shown(e), f"{corrupt} cached blocks failed their CRC-32: dropped", "wrong")
    if complete and (unverified or not whole) and not legacy_checked:
        _complete(cache, e, report)
    elif unverified and not legacy_checked:
        report.unverified += 1
        report.add_failure(_shown(e), f"holds {unverified} unverified blocks (`cache verify --complete` "
                                      "checks them)", "unverified")
    elif whole and e.source.startswith(b"file:"):
        report.unverifiable += 1        # a file's blocks: as good as a read of it, nothing to check
    elif whole:
        report.verified += 1
    else:
        report.partial += 1


def _complete(cache: Any, e: Entry, report: Any) -> None:
    from manyfiles.cache._complete import complete

    store: BlockStore = cache._store
    v = Version(e.objid, e.source, e.validator, e.size, time.time())
    try:
        origin = origin_of(cache, e.source)
        done = complete(store, origin, v, cache.retry)
    except (ObjectChanged, NotFound):     # that version is gone from the origin: nothing to keep
        store.fills.reject(v)
        report.dropped += 1
        return
    except (ManyfilesError, OSError) as exc:
        store.fills.reject(v)
        report.dropped += 1
        report.add_failure(_shown(e), f"could not be checked whole ({exc}): dropped", "dropped")
        return
    report.completed += 1
    if done.wrong_blocks:
        report.wrong += 1
        report.add_failure(_shown(e), f"{done.wrong_blocks} cached blocks were wrong data: replaced by the "
                                      "checked object", "wrong")
    if done.method == fmt.SIZE_ONLY:
        report.unverifiable += 1
    else:
        report.verified += 1


def origin_of(cache: Any, source: bytes) -> Any:
    """The origin of an index entry's ``source`` (the endpoint of an S3 source is part of it)."""
    from manyfiles.cache._origin import FileOrigin

    text = source.decode()
    if text.startswith("file:"):
        return FileOrigin(source[5:])
    if text.startswith("s3://"):
        return cache.origin(text)
    from dataclasses import replace
    from urllib.parse import urlsplit

    from manyfiles.s3.client import ClientSettings

    rest = text[3:]                                   # "s3+" endpoint "/" bucket "/" key
    parts = urlsplit(rest)
    endpoint = f"{parts.scheme}://{parts.netloc}"
    settings = replace(cache.settings or ClientSettings(), endpoint_url=endpoint)
    return cache.origin("s3://" + rest[len(endpoint) + 1:], settings)


def _remove_orphans(store: BlockStore) -> int:
    """Remove files (``<32 hex>.<n>`` blocks, ``<32 hex>.w`` whole files) of no entry, blocks past the
    end of their entry's object, and blocks of an entry held whole."""
    removed = 0
    cutoff = time.time() - ORPHAN_AGE
    for folder, _dirs, files in os.walk(os.path.join(store.root, fmt.BLOCKS)):
        named: dict[bytes, list[tuple[str, int]]] = {}
        for name in files:
            hexid, _, n = name.partition(".")
            if len(hexid) != 32 or not (n.isdigit() or n == "w"):
                continue
            try:
                named.setdefault(bytes.fromhex(hexid), []).append((name, -1 if n == "w" else int(n)))
            except ValueError:
                continue
        if not named:
            continue
        shapes = store.index.shapes(list(named))
        for objid, files_of in named.items():
            size, whole = shapes.get(objid, (-1, False))
            for name, n in files_of:
                if size >= 0 and (whole if n < 0 else not whole and n < store.nblocks(size)):
                    continue
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.stat(path).st_mtime < cutoff:
                        os.unlink(path)
                        removed += 1
    return removed
