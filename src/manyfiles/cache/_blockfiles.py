"""The block-cache protocol: what the write-behind (``Fills``, _fills.py) and the space keeper
(``Space``, _space.py) use of a cache directory's file layer.

:class:`~manyfiles.cache._store.BlockStore` is that layer; the :class:`~manyfiles.cache.Cache` builds
the write-behind and the space over it, from (files, index, counters).  Naming the protocol here, not
the class, keeps the layer below them: ``_store`` imports neither of them, and neither imports
``_store`` (tests/test_imports.py: no circle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from manyfiles.cache._counters import Counters
    from manyfiles.cache._index import Fill, Index, Version
    from manyfiles.cache._packs import Packs


class Watermarks(Protocol):
    """What the write-behind asks of the space keeper (``Space``) after its writes."""

    def to_watermarks(self) -> None: ...


class BlockFiles(Protocol):
    """A cache directory's files: its index, packs and counters, the whole files and blocks, the
    temp files that become them, and the degraded state (a failed disk: no fills for a while)."""

    root: str
    block_size: int
    index: Index
    packs: Packs
    counters: Counters
    space: Watermarks

    def nblocks(self, size: int) -> int: ...
    def held_whole(self, objid: bytes, size: int) -> bool: ...
    def whole_path(self, objid: bytes) -> str: ...
    def temp_path(self, suffix: str = "") -> str: ...
    def install(self, tmp: str, final: str) -> None: ...
    def write_block(self, version: Version, index: int, data: bytes | memoryview, checked: bool) -> Fill: ...
    def unlink_block(self, objid: bytes, index: int) -> None: ...
    def unlink_files(self, objid: bytes, size: int) -> None: ...
    def remove_object(self, objid: bytes, size: int) -> None: ...
    def degraded(self) -> bool: ...
    def degrade(self, exc: BaseException) -> None: ...
