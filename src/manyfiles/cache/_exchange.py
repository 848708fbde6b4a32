"""Exchange with ``s3pull --cache``: hand out what the cache holds checked, take in what s3pull checked.

Only checked bytes cross in either direction: :func:`export` hands out an object held whole (or
every block of it checked per part), never unverified blocks; :func:`import_file` installs a
downloaded file as the object's whole file only after hashing it again against the object's
claim (nothing is cached when there is none to hash it against).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from manyfiles.cache._format import HEADER_SIZE
from manyfiles.cache._index import Version
from manyfiles.cache._origin import Head, S3Origin
from manyfiles.cache._store import BlockStore

CHUNK = 4 << 20


def export(cache: Any, src: Any, etag: str, size: int, write: Callable[[bytes], Any]) -> bool:
    """See :meth:`Cache.export`."""
    origin = cache.origin(src)
    v = cache.validated(origin, Head(S3Origin.validator(etag, size), size))
    store: BlockStore = cache._store
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
        queued = store.fills.queued_whole(v.objid)         # checked, not on disk yet
        if queued is not None:
            write(bytes(queued))
        elif not _export_blocks(store, origin, v, write):
            return False
    store.note_access(v.objid, v.validated_at)
    store.count(hits=store.nblocks(size) if size else 0, hit_bytes=size, object_hits=1)
    return True


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
