"""The cache directory's on-disk format: descriptor, block files, names.  No threads, no SQLite.

    DIR/
      manyfiles-cache.json     descriptor: format version, block size (written last, by link)
      index.sqlite             metadata (WAL): entries, LRU times, counters (see _index.py)
      blocks/ab/cd/<objid>.w   one object version whole: exactly its bytes, nothing else
      blocks/ab/cd/<objid>.<n> block n of a partly cached version (shard layout, key = objid's hex)
      tmp/<pid>-<tid>-<n>      a fill in progress; renamed into blocks/ once complete (and checked)

A *whole file* holds an object version that passed its whole-object check (the S3 checksum,
MD5 or multipart ETag, or, for a local file, one read of the whole file): a reader reads it as
a plain file.  What it passed, and what ``cache verify`` re-hashes it against, is in the index.

A *block file* is a 64-byte header followed by the payload.  The header names the object
version (``objid``) and the block's place in it, carries the CRC-32 of the payload, so every
block can be checked on its own, without the index, and says whether the payload passed a
check of the origin's (``FLAG_CHECKED``: a part checksum, or a local file's) or came from a
ranged GET that nothing could check (then the object is completed and checked whole in the
background, see _complete.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import time
import zlib
from typing import Any, NamedTuple

from manyfiles.errors import UsageError
from manyfiles.shard.layout import Layout
from manyfiles.trace import iotrace

FORMAT = "manyfiles-cache/1"
DESCRIPTOR = "manyfiles-cache.json"
INDEX = "index.sqlite"
BLOCKS = "blocks"
TMP = "tmp"
OWN_NAMES = frozenset({DESCRIPTOR, INDEX, INDEX + "-wal", INDEX + "-shm", INDEX + "-journal", BLOCKS, TMP,
                       "listings.sqlite", "listings.sqlite-wal", "listings.sqlite-shm"})   # _kept.py

SIZE_ONLY = "size-only"        # the whole-object check of an object with nothing to check against

MiB = 1 << 20
DEFAULT_BLOCK_SIZE = 4 * MiB
MIN_BLOCK_SIZE = 64 << 10
MAX_BLOCK_SIZE = 64 * MiB

MAGIC = b"MFCBLK01"
_HEADER = struct.Struct("<8sHHIQQQQ16s")
FLAG_CHECKED = 1                      # the payload passed a check of the origin's (see above)
HEADER_SIZE = _HEADER.size            # 64
_VERSION = 1

# objid hex -> ab/cd/<name>: the first characters of the (uniform) hex id pick the folders
LAYOUT = Layout(levels=(2, 2), key="prefix")


def object_id(source: bytes, validator: bytes) -> bytes:
    """16 bytes naming one version of one source: a changed source gets new block names."""
    return hashlib.blake2b(source + b"\0" + validator, digest_size=16).digest()


def block_relpath(objid: bytes, index: int) -> str:
    """``blocks/ab/cd/<hex>.<index>`` relative to the cache dir."""
    return f"{BLOCKS}/{LAYOUT.relpath(f'{objid.hex()}.{index}')}"


def whole_relpath(objid: bytes) -> str:
    """``blocks/ab/cd/<hex>.w`` (the whole object) relative to the cache dir."""
    return f"{BLOCKS}/{LAYOUT.relpath(f'{objid.hex()}.w')}"


class BlockHeader(NamedTuple):
    crc: int
    index: int
    offset: int
    length: int
    object_size: int
    objid: bytes
    flags: int = 0

    @property
    def checked(self) -> bool:
        return bool(self.flags & FLAG_CHECKED)


def pack_header(objid: bytes, index: int, offset: int, payload: bytes | memoryview,
                object_size: int, flags: int = 0) -> bytes:
    return _HEADER.pack(MAGIC, _VERSION, flags, zlib.crc32(payload), index, offset, len(payload), object_size,
                        objid)


def unpack_header(raw: bytes) -> BlockHeader | None:
    """The header, or None if ``raw`` is not one of ours (short, wrong magic or version)."""
    if len(raw) < HEADER_SIZE:
        return None
    magic, version, flags, crc, index, offset, length, size, objid = _HEADER.unpack_from(raw)
    if magic != MAGIC or version != _VERSION:
        return None
    return BlockHeader(crc, index, offset, length, size, objid, flags)


def crc_ok(header: BlockHeader, payload: bytes | memoryview) -> bool:
    return len(payload) == header.length and zlib.crc32(payload) == header.crc


# -- descriptor ------------------------------------------------------------------------------------

def check_block_size(block_size: int) -> int:
    if not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE:
        raise UsageError(f"block size {block_size}: must be between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}")
    return block_size


def read_descriptor(root: str) -> dict | None:
    """The descriptor of the cache at ``root``; None if there is none; UsageError if foreign."""
    path = os.path.join(root, DESCRIPTOR)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 16)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not str(doc.get("format", "")).startswith("manyfiles-cache/"):
        raise UsageError(f"{root}: {DESCRIPTOR} is not a manyfiles cache descriptor; refusing to use it")
    if doc["format"] != FORMAT:
        raise UsageError(f"{root}: cache format {doc['format']} is not supported by this version "
                         f"(which reads {FORMAT}); use another directory, or delete this one")
    return doc


def create_descriptor(root: str, block_size: int) -> dict:
    """Write the descriptor unless another process just did; return the one that won."""
    doc = {"format": FORMAT, "block_size": block_size, "layout": LAYOUT.levels_str}
    tmp = os.path.join(root, TMP, f"{os.getpid()}-descriptor")
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, sort_keys=True) + "\n")
    try:
        os.link(tmp, os.path.join(root, DESCRIPTOR))   # atomic, and never replaces a winner's
    except FileExistsError:
        doc = read_descriptor(root) or doc
    finally:
        os.unlink(tmp)
    return doc


def foreign_entries(root: str) -> list[str]:
    """Names in ``root`` that a cache directory does not contain (there must be none to adopt it)."""
    try:
        return sorted(n for n in os.listdir(root) if n not in OWN_NAMES)
    except FileNotFoundError:
        return []


def open_dir(root: str, block_size: int | None) -> dict:
    """The descriptor of the cache at ``root``, made a cache first if it is missing or empty
    (``block_size``: its block size then; given for an existing cache, it must be that cache's)."""
    os.makedirs(root, exist_ok=True)
    desc = read_descriptor(root)
    if desc is None:
        foreign = foreign_entries(root)
        if foreign:
            shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            raise UsageError(f"{root}: not a manyfiles cache and not empty ({shown}); refusing to use it")
        os.makedirs(os.path.join(root, TMP), exist_ok=True)
        os.makedirs(os.path.join(root, BLOCKS), exist_ok=True)
        desc = create_descriptor(root, check_block_size(block_size or DEFAULT_BLOCK_SIZE))
    if block_size is not None and block_size != desc["block_size"]:
        raise UsageError(f"{root}: the cache was created with block size {desc['block_size']}, "
                         f"not {block_size}")
    os.makedirs(os.path.join(root, TMP), exist_ok=True)
    return desc


def trace(op: str, path: Any, offset: int, length: int, t0: int, result: int = 0) -> None:
    tr = iotrace.TRACER
    if tr is not None:
        tr.record(op, path, offset, length, t0, time.monotonic_ns() - t0, result)


def write_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    """``pwrite`` every byte of ``data`` at ``offset`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n
