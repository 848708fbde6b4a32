"""The on-disk format of an I/O trace (``--trace FILE``), written by :mod:`manyfiles.trace.iotrace`.

A trace file is a header followed by self-contained blocks, one per flush of the
in-memory buffer::

    file    = b"MFTRACE\\x02"  u32 header_len  header(JSON, UTF-8)  block*
    block   = b"MFB\\x02"  u32 payload_len  u32 crc32(payload)  payload
    payload = marshal (version 4) of the tuple
              (n, dropped_total, last, {tid: thread name}, flat)
    flat    = n records back to back, FIELDS values each:
              op, path (str or bytes), offset, length, start_ns, dur_ns, result, tid

The record fields stay Python objects end to end: the hot path appends them to a
list, and the writer hands that list to ``marshal.dumps``, one C call that costs
~3x less than packing columns with struct/array (measured: ~130 vs ~430 ns per
record), and lets ``marshal.loads`` read it back just as fast.  marshal's format 4
has been stable since Python 3.4; the header records it.  marshal is not meant for
untrusted input: a trace file is data your own run wrote, and the CRC rejects
accidental damage before anything is unmarshalled.

Every block is written with one ``write()``: a process killed at any moment leaves
whole blocks followed by at most one torn block, which the CRC (or the length
running past the end of the file) detects; readers keep everything before it.
Times are CLOCK_MONOTONIC nanoseconds, shared by every process on the machine.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from typing import Any

from manyfiles.errors import WrongKind, shown

FILE_MAGIC = b"MFTRACE\x02"
BLOCK_MAGIC = b"MFB\x02"
MARSHAL_VERSION = 4
WORKER_SUFFIX = ".worker-"
"""Worker processes write ``FILE.worker-<pid>`` next to the parent's ``FILE``."""
FIELDS = 8
"""Values per record in the writer's flat buffer: op, path, offset, length, start_ns, dur_ns,
result, thread (a threading.Thread, or a ``get_ident()`` int for threads threading does not know)."""

_HEAD = struct.Struct("<4sII")   # block magic, payload length, crc32
_U32 = struct.Struct("<I")
_INT_FIELDS = (2, 3, 4, 5, 6)    # offset, length, start_ns, dur_ns, result


def encode_header(info: dict[str, Any]) -> bytes:
    raw = json.dumps({**info, "marshal": MARSHAL_VERSION}, sort_keys=True).encode()
    return FILE_MAGIC + _U32.pack(len(raw)) + raw


def encode_block(flat: list, dropped: int, known: dict[int, tuple[int, str]], last: bool = False) -> bytes:
    """Pack the records in ``flat`` (modified in place) into one block.

    ``known`` maps a thread ident to ``(native_id, name)``, for records that carry a bare ident.
    """
    n = len(flat) // FIELDS
    threads = flat[FIELDS - 1::FIELDS]
    tid_of: dict[Any, int] = {}
    names: dict[int, str] = {}
    for t in set(threads):
        if isinstance(t, int):
            tid, name = known.get(t, (t & 0x7FFFFFFF, ""))
        else:
            tid, name = t.native_id or (t.ident or 0) & 0x7FFFFFFF, t.name
        tid_of[t] = tid
        names[tid] = name
    flat[FIELDS - 1::FIELDS] = list(map(tid_of.__getitem__, threads))
    try:
        payload = marshal.dumps((n, dropped, last, names, flat), MARSHAL_VERSION)
    except ValueError:
        _sanitize(flat)   # a caller passed a Path, None, a float...: keep the records
        payload = marshal.dumps((n, dropped, last, names, flat), MARSHAL_VERSION)
    return _HEAD.pack(BLOCK_MAGIC, len(payload), zlib.crc32(payload)) + payload


def _sanitize(flat: list) -> None:
    flat[0::FIELDS] = [str(op) for op in flat[0::FIELDS]]
    flat[1::FIELDS] = [p if isinstance(p, str | bytes) else _path_str(p) for p in flat[1::FIELDS]]
    for i in _INT_FIELDS:
        flat[i::FIELDS] = [v if type(v) is int else _int(v) for v in flat[i::FIELDS]]


def _path_str(p: Any) -> str | bytes:
    try:
        return os.fspath(p)
    except TypeError:
        return str(p)


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return 0


# --- reading -------------------------------------------------------------------------------------------


class Block:
    """The records of one block, as columns (``ops[i]``, ``start_ns[i]``, ... belong together)."""

    # A plain class, not a dataclass: this module is imported when tracing starts, and
    # dataclasses pulls in inspect (tens of ms on a loaded machine).
    __slots__ = ("dropped", "dur_ns", "last", "length", "offset", "ops", "paths", "result", "start_ns",
                 "threads", "tids")

    def __init__(self, flat: list, dropped: int, last: bool, threads: dict[int, str]) -> None:
        self.ops: list[str] = flat[0::FIELDS]
        self.paths: list[bytes] = [p.encode("utf-8", "surrogateescape") if isinstance(p, str) else p
                                   for p in flat[1::FIELDS]]
        self.offset: list[int] = flat[2::FIELDS]
        self.length: list[int] = flat[3::FIELDS]
        self.start_ns: list[int] = flat[4::FIELDS]
        self.dur_ns: list[int] = flat[5::FIELDS]
        self.result: list[int] = flat[6::FIELDS]
        self.tids: list[int] = flat[7::FIELDS]
        self.dropped = dropped      # records dropped by the writer so far (cumulative)
        self.last = last            # written by close(): the file was closed cleanly
        self.threads = threads      # tid -> thread name

    def __len__(self) -> int:
        return len(self.ops)


class RawTrace:
    """One trace file: its header, its blocks and how it ended."""

    __slots__ = ("blocks", "complete", "header", "path", "torn_bytes")

    def __init__(self, path: str, header: dict[str, Any], blocks: list[Block], complete: bool,
                 torn_bytes: int) -> None:
        self.path = path
        self.header = header
        self.blocks = blocks
        self.complete = complete        # the writer closed it cleanly (last block present)
        self.torn_bytes = torn_bytes    # trailing bytes ignored (a write cut short by a kill)


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _not_regular(path: str | os.PathLike, mode: int) -> WrongKind | None:
    for test, kind in _KINDS:
        if test(mode):
            return WrongKind(f"{shown(os.fsdecode(path))}: {kind}, not a trace file")
    return None


def read_file(path: str | os.PathLike) -> RawTrace:
    """Decode a trace file; raises ValueError if it is not one, WrongKind for what is not a regular
    file (a FIFO would block the read for ever, a device never end)."""
    with contextlib.suppress(OSError):     # (what cannot be stat'ed fails at the open)
        refused = _not_regular(path, os.stat(path).st_mode)
        if refused is not None:
            raise refused
    # O_NONBLOCK: a FIFO swapped in after the check must not block the open either
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        refused = _not_regular(path, os.fstat(f.fileno()).st_mode)
        if refused is not None:
            raise refused
        data = f.read()
    if not data.startswith(FILE_MAGIC) or len(data) < len(FILE_MAGIC) + 4:
        if data.startswith(FILE_MAGIC[:7]):
            raise ValueError("a manyfiles trace of another format version")
        raise ValueError("not a manyfiles trace (bad magic)")
    pos = len(FILE_MAGIC)
    (hlen,) = _U32.unpack_from(data, pos)
    pos += 4
    try:
        header = json.loads(data[pos:pos + hlen])
    except ValueError as exc:
        raise ValueError("not a manyfiles trace (bad header)") from exc
    if header.get("marshal", MARSHAL_VERSION) > MARSHAL_VERSION:
        raise ValueError(f"records in marshal format {header['marshal']}; this Python reads up to "
                         f"{MARSHAL_VERSION}")
    pos += hlen
    blocks = []
    for block, end in _iter_blocks(data, pos):
        blocks.append(block)
        pos = end
    complete = bool(blocks) and blocks[-1].last
    return RawTrace(os.fspath(path), header, blocks, complete, len(data) - pos)


def _iter_blocks(data: bytes, pos: int) -> Iterator[tuple[Block, int]]:
    size = len(data)
    while pos + _HEAD.size <= size:
        magic, plen, crc = _HEAD.unpack_from(data, pos)
        start = pos + _HEAD.size
        if magic != BLOCK_MAGIC or start + plen > size:
            return
        payload = data[start:start + plen]
        if zlib.crc32(payload) != crc:
            return
        try:
            n, dropped, last, names, flat = marshal.loads(payload)
        except (ValueError, EOFError, TypeError):
            return
        if len(flat) != n * FIELDS:
            return
        yield Block(flat, dropped, bool(last), names), start + plen
        pos = start + plen
