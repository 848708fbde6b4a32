"""Hashed prefix layout: where a name lives in the tree.  Pure functions, no I/O.

A name ``Foo.png`` lives at ``<b1>/<b2>/Foo.png`` where the bucket names come from the
hex digest of the name's bytes (``key="hash"``) or from the name's own first characters
(``key="prefix"``, for names that already are hashes or UUIDs, as in git's objects/).
The leaf keeps the original name, so reverting needs no index and names never collide.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from dataclasses import dataclass

from manyfiles.errors import UsageError

HASHES = ("md5", "sha1", "sha256", "blake2b")
KEYS = ("hash", "prefix")
FORMAT = "manyfiles-shard/1"
#: Root entries and leaf temp files whose names start with this belong to manyfiles.
RESERVED_PREFIX = b".manyfiles-"

_HEX = frozenset(string.hexdigits.lower().encode())
_DIGEST_HEX = {"md5": 32, "sha1": 40, "sha256": 64, "blake2b": 128}
_PAD = b"_"


def parse_levels(spec: str | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """``"2:2"`` -> ``(2, 2)``; widths are characters of the key per directory level."""
    if isinstance(spec, str):
        try:
            levels = tuple(int(p) for p in spec.split(":"))
        except ValueError:
            raise UsageError(f"--levels {spec!r}: expected widths like 2:2 or 1:2") from None
    else:
        levels = tuple(int(p) for p in spec)
    if not 1 <= len(levels) <= 4 or any(not 1 <= w <= 8 for w in levels):
        raise UsageError(f"levels {spec!r}: 1 to 4 levels, each 1 to 8 characters wide")
    return levels


def check_name(name: bytes) -> None:
    """Refuse names that cannot be a directory entry (or are ours)."""
    if not name or name in (b".", b"..") or b"/" in name or b"\0" in name:
        raise UsageError(f"{os.fsdecode(name)!r}: not a valid file name")
    if name.startswith(RESERVED_PREFIX):
        raise UsageError(f"{os.fsdecode(name)!r}: names starting with .manyfiles- are reserved")


@dataclass(frozen=True)
class Layout:
    """How names map to bucket directories.

    Example:
        >>> Layout().relpath("Foo.png")
        'f8/65/Foo.png'
        >>> Layout(levels=(1,), key="prefix").relpath(b"3f2a")
        b'3/3f2a'
    """

    levels: tuple[int, ...] = (2, 2)
    hash: str = "md5"
    key: str = "hash"

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", parse_levels(self.levels))
        if self.key not in KEYS:
            raise UsageError(f"--key {self.key!r}: expected one of {', '.join(KEYS)}")
        if self.hash not in HASHES:
            raise UsageError(f"--hash {self.hash!r}: expected one of {', '.join(HASHES)}")
        if self.key == "hash" and sum(self.levels) > _DIGEST_HEX[self.hash]:
            raise UsageError(f"levels {self.levels_str}: wider than the {self.hash} digest")
        # usedforsecurity=False: this is a spread function, and FIPS builds refuse md5 otherwise.
        # Not a dataclass field: reports serialize layouts field by field.
        ctor = getattr(hashlib, self.hash)
        object.__setattr__(self, "_digest", lambda b: ctor(b, usedforsecurity=False).hexdigest().encode())

    @property
    def levels_str(self) -> str:
        return ":".join(str(w) for w in self.levels)

    def describe(self) -> str:
        source = f"{self.hash} of the name" if self.key == "hash" else "the name's own characters"
        return f"levels {self.levels_str}, buckets from {source}"

    # -- mapping -----------------------------------------------------------------------------------

    def buckets(self, name: bytes) -> tuple[bytes, ...]:
        """Bucket directory names, top first, for the name ``name`` (bytes)."""
        key = self._digest(name) if self.key == "hash" else name  # type: ignore[operator]
        out = []
        pos = 0
        for width in self.levels:
            part = key[pos:pos + width]
            pos += width
            if len(part) < width:
                part = part + _PAD * (width - len(part))
            if part.strip(b".") == b"":
                # "." and ".." are not directories we may create
                part = _PAD * width
            out.append(part)
        return tuple(out)

    def bucket_rel(self, name: bytes) -> bytes:
        """``b"ab/cd"`` for ``name``."""
        return b"/".join(self.buckets(name))

    def relpath(self, name: str | bytes) -> str | bytes:
        """Path of ``name`` relative to the root (same type as ``name``)."""
        raw = os.fsencode(name)
        check_name(raw)
        rel = self.bucket_rel(raw) + b"/" + raw
        return rel if isinstance(name, bytes) else os.fsdecode(rel)

    def bucket_globs(self) -> tuple[str, ...] | None:
        """Per level, a glob (manyfiles._core.glob) matching exactly the names :meth:`is_bucket`
        accepts there, so that the C walker enters only bucket directories; None for
        ``key="prefix"``, whose widths count bytes where a glob's ``?`` counts characters."""
        if self.key != "hash":
            return None
        return tuple("[0-9a-f]" * width for width in self.levels)

    def is_bucket(self, part: bytes, level: int) -> bool:
        """Could ``part`` be a bucket directory name at depth ``level`` (0 = top)?"""
        if len(part) != self.levels[level]:
            return False
        if self.key == "hash":
            return all(c in _HEX for c in part)
        return not part.startswith(RESERVED_PREFIX) and b"/" not in part

    # -- descriptor --------------------------------------------------------------------------------

    def to_json(self) -> bytes:
        doc = {"format": FORMAT, "levels": list(self.levels), "hash": self.hash, "key": self.key}
        return (json.dumps(doc, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Layout:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} descriptor")
        return cls(levels=tuple(doc["levels"]), hash=doc["hash"], key=doc["key"])
