"""What is handed to and taken from ``s3pull --cache``: what the cache holds checked, what s3pull fetched.

Only checked bytes leave: :func:`export` hands out an object held whole (its file, or its record
in a pack, or every block of it checked per part), never unverified blocks.  :func:`import_file`
installs a downloaded file as the object's whole file only after hashing it again against the
object's claim (nothing is cached when there is none to hash it against); :func:`fill` keeps
bytes a reader fetched itself, whole when it checked them, else as unverified blocks checked whole
in the background.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import Any

from manyfiles.cache._complete import Completions
from manyfiles.cache._format import HEADER_SIZE
from manyfiles.cache._index import Version
from manyfiles.cache._origin import S3Origin, crc_claim
from manyfiles.cache._store import BlockStore

CHUNK = 4 << 20


def export(store: BlockStore, origin: Any, v: Version, write: Callable[[bytes], Any]) -> bool:
    """See :meth:`Cache.export` (``v``: the version a listing named)."""
    size = v.size
    fd = store.open_whole(v.objid, size)
    if fd is not None:
        try:
            pos = 0
            while pos < size:
                data = os.pread(fd, min(CHUNK, size - pos), pos)
                if not data:
                    raise OSError(5, f"{origin.display}: the cached file is shorter than its object")
                write(data)
                pos += len(data)
        finally:
            os.close(fd)
    else:
        # (in this order: a queued object leaves the queue only once its record is findable)
        data = store.fills.queued_whole(v.objid)         # checked, not on disk yet
        if data is None:
            data = store.read_packed(v.objid, size)
        if data is not None:
            write(bytes(data))
        elif not _export_blocks(store, origin, v, write):
            return False
    store.counters.note_access(v.objid, v.validated_at)
    store.counters.count(hits=store.nblocks(size) if size else 0, hit_bytes=size, object_hits=1)
    return True


def fill(store: BlockStore, completions: Completions, origin: Any, v: Version, data: bytes,
         checked: str | None) -> None:
    """See :meth:`Cache.fill` (``checked``: the check the caller's bytes passed, or None)."""
    bs = store.block_size
    if checked is not None:
        store.fills.whole(v, data, checked, crc_claim(zlib.crc32(data)))
    elif data:
        view = memoryview(data)
        for i in range(store.nblocks(len(data))):
            store.fills.block(v, i, bytes(view[i * bs:(i + 1) * bs]), checked=False)
        completions.schedule(origin, v)
    n = len(data)
    store.counters.note_access(v.objid, v.validated_at)
    store.counters.count(misses=store.nblocks(n) if n else 0, miss_bytes=n, object_misses=1)


def _export_blocks(store: BlockStore, origin: Any, v: Version, write: Callable[[bytes], Any]) -> bool:
    """Every block of ``v`` checked (per part): hand them out; else False, nothing written."""
    if not v.size:
        return False
    fds: list[int] = []
    try:
        for i in range(store.nblocks(v.size)):
            got = store.open_block(v.objid, i, store.block_length(v.size, i))
            if got is not None:
                fds.append(got[0])
            if got is None or not got[1]:
                return False
        for i, fd in enumerate(fds):
            n = store.block_length(v.size, i)
            data = os.pread(fd, n, HEADER_SIZE)
            if len(data) != n:
                store.discard(v.objid, i, fd)
                raise OSError(5, f"{origin.display}: a cached block is shorter than its header says")
            write(data)
    finally:
        for fd in fds:
            os.close(fd)
    return True


def import_file(store: BlockStore, v: Version, path: bytes, claim: Any) -> None:
    """See :meth:`Cache.import_file` (runs in a fetch thread; any doubt and nothing is cached)."""
    from manyfiles.errors import ManyfilesError
    from manyfiles.s3.integrity import SIZE_ONLY, Digest, claim_for

    if claim is None:
        claim = claim_for(S3Origin.etag_of(v.validator), {}, v.size, None)
    if claim.method == SIZE_ONLY or claim.pending:
        return
    writer = store.fills.writer(v)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size != v.size:
                writer.abort()
                return
            digest = Digest(claim, v.size, lambda off, n: os.pread(f.fileno(), n, off))
            pos = 0
            while pos < v.size:
                data = f.read(CHUNK)
                if not data:
                    break
                digest.stream(data)
                writer.write(pos, data)
                pos += len(data)
        if pos != v.size:
            writer.abort()
            return
        digest.check()
    except (OSError, ManyfilesError):
        writer.abort()
        return
    writer.seal(claim.method, claim.to_record())
