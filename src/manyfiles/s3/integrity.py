"""What an object's bytes must hash to, and the hashing of what was written, in order.

Every object ends with one *check* over all its bytes, chosen from what the server says:

=================  ==========================================================================
method             expected value
=================  ==========================================================================
``crc64nvme``      ``x-amz-checksum-crc64nvme`` (FULL_OBJECT); needs ``manyfiles[checksums]``
``crc32c``         ``x-amz-checksum-crc32c``, full object or ``-N`` composite; needs awscrt
``crc32``          ``x-amz-checksum-crc32`` (zlib), full object or composite
``md5``            the ETag of a single-part, non-KMS, non-SSE-C object
``multipart-md5``  the ETag ``md5(md5(part 1) + ... + md5(part N))-N``
``sha256``/``sha1``  ``x-amz-checksum-sha256`` / ``-sha1``, full object or composite
``size-only``      only for SSE-KMS/SSE-C objects without a checksum, or --no-checksum (``why``)
=================  ==========================================================================

The cheapest available check wins (CRCs cost a few percent of MD5's CPU); every method covers
every byte.  Per-part methods (multipart ETags, composite checksums) need the part sizes, which
one ``HEAD ?partNumber=1`` gives (:func:`part_layout`).  :func:`object_claim` is the one rule
every reader applies: it never falls back to a size check silently.  A multipart ETag whose part
sizes cannot be learned gets a *pending* claim (``layout_searched``, no parts): the whole object
is hashed at the part sizes uploaders use (:func:`candidate_part_sizes`, :class:`LayoutSearch`)
and passes only if one of them reproduces the ETag (method ``multipart-md5``, counted as
``multipart-md5-searched``).  An object that allows no check at all (no checksum, an ETag that
is neither an MD5 nor a multipart ETag, not encrypted) is refused (:class:`Unverifiable`).

:class:`Digest` hashes what was *written*: engines report each byte range after every byte of
it reached the target.  Ranges may finish in any order (ranged GETs on several threads).  CRCs
combine (``crc(A + B)`` from ``crc(A)``, ``crc(B)`` and ``len(B)``; awscrt does it), so with a
CRC every range is hashed by the thread that writes it, as it streams, and the pieces are
combined in order at the end: nothing is read back and nothing is serial.  MD5 and SHA do not
combine: each check unit (the object, or one part) is hashed strictly in order; the range at the
unit's frontier is hashed from the buffer in hand while it streams, the others are read back
from the target (page cache) when the frontier reaches them.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import importlib.util
import re
import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from manyfiles.errors import IntegrityError
from manyfiles.s3.layouts import MiB, candidate_part_sizes, etag_parts, uniform_parts

SIZE_ONLY = "size-only"
SEARCHED = "-searched"       # suffix of the kind of a multipart check whose part sizes were searched
# Why an object may be checked by size only (recorded; anything else is a weaker check than promised)
NO_CHECKSUM = "no-checksum"  # the caller asked for no content check (--no-checksum, verify=False)
ENCRYPTED = "encrypted"      # SSE-KMS / SSE-C without a checksum: the ETag is not an MD5
SIZE_ONLY_REASONS = (NO_CHECKSUM, ENCRYPTED)
_MD5 = re.compile(r"^[0-9a-f]{32}$")
_CHECKSUMS = ("crc64nvme", "crc32c", "crc32", "sha256", "sha1")
_NEEDS_CRT = ("crc64nvme", "crc32c")
READ_BACK = 1 << 20
_UNSET = object()

# CRC32C and CRC64NVME: awscrt (manyfiles[checksums]; hardware-accelerated, and the only one that
# combines the CRCs of ranges) is imported when first needed: loading it costs ~40 ms of CPU (its
# TLS library seeds an entropy pool), most of a small pull's start-up.  Until then, whole bodies are
# hashed by the C core's plain CRCs (manyfiles._dents, same values; fine for small objects).
_CRT_INSTALLED = importlib.util.find_spec("awscrt") is not None
try:
    from manyfiles import _dents as _native
except ImportError:  # pragma: no cover - the C core was not built
    _native = None


def have_crt() -> bool:
    """Whether CRC32C / CRC64NVME checksums can be checked (awscrt or the C core)."""
    return _CRT_INSTALLED or _native is not None


_crt_module = None    # awscrt.checksums once its import completed


def _crt():
    """awscrt.checksums (imported on first use), or None if it is not installed."""
    global _crt_module
    if _crt_module is None and _CRT_INSTALLED:
        # the import statement waits for another thread's import of it to complete (never
        # sys.modules, which holds a module still being initialised)
        from awscrt import checksums

        _crt_module = checksums
    return _crt_module


NATIVE_MAX = 1 << 20   # larger bodies load awscrt: its CRCs run ~10x faster than the C core's tables


def _crc_fn(alg: str, size: int | None):
    """The function computing CRC ``alg`` (crc32c, crc64nvme) over ``size`` bytes: awscrt's once it
    is loaded, the C core's for bodies up to NATIVE_MAX (or any body without awscrt), else awscrt's
    (loaded now)."""
    crt = _crt_module
    small = size is not None and size <= NATIVE_MAX
    if crt is None and _native is not None and (small or not _CRT_INSTALLED):
        return getattr(_native, alg)
    return getattr(crt or _crt(), alg)


class _Crc:
    __slots__ = ("fn", "n", "value")

    def __init__(self, fn, n: int, value: int = 0) -> None:
        self.fn, self.n, self.value = fn, n, value

    def update(self, data) -> None:
        self.value = self.fn(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.n, "big")

    def copy(self) -> _Crc:
        return _Crc(self.fn, self.n, self.value)


_COMBINE = {"crc32": "combine_crc32", "crc32c": "combine_crc32c", "crc64nvme": "combine_crc64nvme"}


def combiner(method: str):
    """``combine(crc1, crc2, len2)`` for a CRC method when awscrt has it (0.2x+), else None."""
    name = _COMBINE.get(method)
    crt = _crt() if name else None
    return getattr(crt, name, None) if crt is not None else None


def new_hash(alg: str, size: int | None = None):
    """A hashlib-like object (update, digest, copy) for ``alg``, to hash ``size`` bytes (None: unknown)."""
    if alg in ("md5", "multipart-md5"):
        return hashlib.md5(usedforsecurity=False)
    if alg == "crc32":
        return _Crc(zlib.crc32, 4)
    if alg == "crc32c":
        return _Crc(_crc_fn("crc32c", size), 4)
    if alg == "crc64nvme":
        return _Crc(_crc_fn("crc64nvme", size), 8)
    return hashlib.new(alg)


@dataclass(frozen=True)
class Claim:
    """The check an object's bytes must pass.

    ``parts`` holds the part sizes for per-part methods (empty: one unit, the whole object);
    ``note`` says why a better check could not be used (e.g. awscrt missing).
    """

    method: str
    value: str | None = None
    parts: tuple[int, ...] = ()
    composite: bool = False
    note: str = ""
    why: str = ""                   # size-only: why that is all (NO_CHECKSUM, ENCRYPTED)
    layout_searched: bool = False   # multipart-md5 whose part sizes are (to be) found by a search

    @property
    def kind(self) -> str:
        """What reports count: the method, ``multipart-md5-searched`` for the layout search."""
        return self.method + SEARCHED if self.layout_searched else self.method

    @property
    def pending(self) -> bool:
        """A layout search that has not run yet: the bytes are hashed by a :class:`LayoutSearch`."""
        return self.layout_searched and not self.parts

    def strengthened(self, etag: str | None) -> Claim:
        """A weak record's check as it should have been: a layout search for a multipart ETag
        (its bytes are on disk to search), else itself."""
        if self.weak and etag_parts(etag) > 1:
            return Claim("multipart-md5", etag, (), layout_searched=True)
        return self

    @property
    def weak(self) -> bool:
        """A size-only check without a reason that allows one (what older runs recorded for an
        object whose multipart layout they could not learn): weaker than promised."""
        return self.method == SIZE_ONLY and self.why not in SIZE_ONLY_REASONS

    def to_record(self) -> dict:
        rec: dict = {"m": self.method}
        if self.value:
            rec["c"] = self.value
        if self.parts:
            rec["p"] = list(self.parts) if len(set(self.parts[:-1])) > 1 else [self.parts[0], len(self.parts),
                                                                                sum(self.parts)]
            rec["u"] = len(set(self.parts[:-1])) <= 1
        if self.composite:
            rec["x"] = 1
        if self.why:
            rec["w"] = self.why
        if self.layout_searched:
            rec["f"] = 1
        return rec

    @classmethod
    def from_record(cls, rec: dict) -> Claim:
        """The check a state record says its file passed; a record without one (written before
        checks were recorded) gets the check its ETag allows."""
        if "m" not in rec:
            return claim_for(rec.get("e"), {}, rec["s"], None)
        parts: tuple[int, ...] = ()
        p = rec.get("p")
        if p:
            parts = tuple(uniform_parts(p[2], p[0])) if rec.get("u") else tuple(p)
        return cls(rec["m"], rec.get("c"), parts, bool(rec.get("x")), why=rec.get("w", ""),
                   layout_searched=bool(rec.get("f")))


def encrypted(headers: Mapping[str, str]) -> bool:
    """SSE-KMS, DSSE-KMS and SSE-C objects have ETags that are not the MD5 of their bytes."""
    sse = headers.get("x-amz-server-side-encryption", "")
    return sse.startswith("aws:kms") or "x-amz-server-side-encryption-customer-algorithm" in headers


def claim_for(etag: str | None, headers: Mapping[str, str], size: int | None,
              parts: tuple[int, ...] | None) -> Claim:
    """The cheapest full check for an object, from its ETag and response headers (lower-case keys).

    ``parts``: the part sizes, when known (needed by multipart ETags and composite checksums).
    """
    note = ""
    for alg in _CHECKSUMS:
        want = headers.get(f"x-amz-checksum-{alg}")
        if not want:
            continue
        if alg in _NEEDS_CRT and not have_crt():
            note = f"{alg} checksum not checked: pip install 'manyfiles[checksums]'"
            continue
        n = want.rpartition("-")[2] if "-" in want else ""
        kind = headers.get("x-amz-checksum-type", "").upper()
        multipart = etag_parts(etag) > 1 or len(parts or ()) > 1
        # S3 keeps SHA checksums of multipart objects per part only; a CRC32/CRC32C may be
        # either, and a HEAD that names neither "-N" nor the type (moto's) leaves it open:
        # then the next check decides (the multipart ETag), never a guess that fails good bytes
        if not n and not kind and multipart and alg in ("crc32", "crc32c"):
            continue
        composite = bool(n) or kind == "COMPOSITE" or (multipart and alg in ("sha1", "sha256"))
        if composite:
            if not parts or (n.isdigit() and int(n) != len(parts)):
                continue   # needs the part layout
            return Claim(alg, want, parts, True, note)
        return Claim(alg, want, (), False, note)
    if etag and not encrypted(headers):
        if _MD5.match(etag):
            return Claim("md5", etag, (), False, note)
        n = etag_parts(etag)
        if n and parts and len(parts) == n:
            return Claim("multipart-md5", etag, parts, False, note)
    return Claim(SIZE_ONLY, None, (), False, note)


class Unverifiable(IntegrityError):
    """An object whose bytes nothing can check (no checksum; an ETag that is neither an MD5 nor a
    multipart ETag; not encrypted): refused rather than installed on a size check."""

    code = "unverifiable"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


def object_claim(etag: str | None, headers: Mapping[str, str], size: int | None,
                 layout: tuple[int, ...] | None, *, verify: bool = True) -> Claim:
    """The check an object's bytes must pass: the one rule of every reader (s3pull's engines, the cache).

    :func:`claim_for` on the answer's headers; then size-only only when the caller asked for no
    check (``verify=False``) or the object is SSE-KMS/SSE-C without a checksum; a multipart ETag
    without its part sizes (``layout`` None or ``()``: unknown or unusable) gets a pending layout
    search; anything else raises :class:`Unverifiable`.
    """
    if not verify:
        return Claim(SIZE_ONLY, why=NO_CHECKSUM)
    claim = claim_for(etag, headers, size, layout or None)
    if claim.method != SIZE_ONLY:
        return claim
    if encrypted(headers):
        return Claim(SIZE_ONLY, note=claim.note, why=ENCRYPTED)
    n = etag_parts(etag)
    if n > 1 and size is not None:
        return Claim("multipart-md5", etag, (), note=claim.note, layout_searched=True)
    if n == 1 and size is not None:      # a one-part upload: that part is the whole object
        return Claim("multipart-md5", etag, (size,), note=claim.note)
    raise Unverifiable(f"nothing to check the bytes against: no checksum and the ETag {etag!r} is neither an "
                       "MD5 nor a multipart ETag (--no-checksum accepts a size check)")


class _Unit:
    __slots__ = ("busy", "end", "frontier", "h", "pending", "pieces", "start")

    def __init__(self, start: int, end: int, h) -> None:
        self.start, self.end, self.frontier, self.h = start, end, start, h
        self.pending: dict[int, int] = {}
        self.pieces: dict[int, tuple[int, int]] = {}    # CRC of each range: offset -> (value, length)
        self.busy = False


class Digest:
    """Hashes one object's written bytes in check units and checks them against a :class:`Claim`.

    Sequential writers call :meth:`stream`; ranged writers call :meth:`claim_feed` before a
    range (a feed to hash while streaming, or None), :meth:`written` after every byte of it is
    in the target, :meth:`release` if it failed.  ``read_back(offset, n)`` returns bytes already
    written.
    """

    def __init__(self, claim: Claim, size: int | None, read_back: Callable[[int, int], bytes] | None = None):
        self.claim, self.size, self.read_back = claim, size, read_back
        self.lock = threading.Lock()
        self.units: list[_Unit] = []
        self.active = claim.method != SIZE_ONLY
        self._combine: object = _UNSET   # looked up by the first ranged writer (see combine)
        if self.active:
            sizes = claim.parts or ((size or 0,) if size is not None else ())
            pos = 0
            for s in sizes:
                self.units.append(_Unit(pos, pos + s, new_hash(claim.method, s)))
                pos += s
            if not sizes:    # size unknown: one open-ended unit, streamed
                self.units.append(_Unit(0, -1, new_hash(claim.method)))
        self._starts = [u.start for u in self.units]
        self._pos = 0
        self._ui = 0

    @property
    def combine(self):
        """CRCs: every range hashed on its own, combined at the end (awscrt's combine), or None.
        Looked up by ranged writers only: a whole body streamed in order never loads awscrt."""
        if self._combine is _UNSET:
            self._combine = combiner(self.claim.method)
        return self._combine

    # -- sequential (whole-object GETs) ------------------------------------------------------
    def stream(self, data) -> None:
        if not self.active:
            return
        mv = memoryview(data)
        while len(mv):
            u = self.units[self._ui] if self._ui < len(self.units) else None
            if u is None:
                raise IntegrityError("more bytes than the parts of the object hold")
            room = len(mv) if u.end < 0 else u.end - self._pos
            take = mv[:room]
            u.h.update(take)
            self._pos += len(take)
            u.frontier = self._pos
            mv = mv[len(take):]
            if self._pos == u.end:
                self._ui += 1

    # -- ranged writers ----------------------------------------------------------------------
    def _unit(self, offset: int) -> _Unit:
        i = bisect.bisect_right(self._starts, offset) - 1
        if i >= 0:
            u = self.units[i]
            if offset < u.end or u.end < 0:
                return u
        raise IntegrityError(f"offset {offset} outside the object")

    def claim_feed(self, offset: int):
        """A hasher to feed while writing the range at ``offset``: always for a CRC (its own
        piece), else only if the range is next in its unit."""
        if not self.active:
            return None
        if self.combine is not None:
            return new_hash(self.claim.method)
        u = self._unit(offset)
        with self.lock:
            if u.busy or u.frontier != offset:
                return None
            u.busy = True
        return u.h.copy()

    def written(self, offset: int, n: int, feed=None) -> None:
        """Bytes ``offset .. offset+n`` are in the target (hashed in ``feed`` if it was claimed)."""
        if not self.active or n == 0:
            return
        u = self._unit(offset)
        if self.combine is not None:
            if feed is None:     # a part an earlier run wrote: hash it back now
                feed = new_hash(self.claim.method)
                self._read_into(feed, offset, offset + n)
            with self.lock:
                u.pieces[offset] = (feed.value, n)
            return
        if feed is not None:
            with self.lock:
                u.h = feed
                u.frontier = offset + n
        else:
            with self.lock:
                u.pending[offset] = n
                if u.busy:
                    return      # the unit's owner hashes it when its frontier gets there
                u.busy = True
        self._drain(u)

    def release(self, offset: int) -> None:
        """A claimed range failed: give the unit back."""
        if not self.active or self.combine is not None:
            return
        u = self._unit(offset)
        self._drain(u)

    def _drain(self, u: _Unit) -> None:
        while True:
            with self.lock:
                n = u.pending.pop(u.frontier, None)
                if n is None:
                    u.busy = False
                    return
                at = u.frontier
            try:
                self._read_into(u.h, at, at + n)
            except IntegrityError:
                with self.lock:
                    u.busy = False
                raise
            with self.lock:
                u.frontier = at + n

    def _read_into(self, h, start: int, end: int) -> None:
        pos = start
        while pos < end:
            k = min(READ_BACK, end - pos)
            data = self.read_back(pos, k)
            if len(data) != k:
                raise IntegrityError(f"read back {len(data)} of {k} bytes at offset {pos}")
            h.update(data)
            pos += k

    def _combine_pieces(self, u: _Unit) -> None:
        """A CRC unit's value from its pieces, in order; they must cover it exactly."""
        value, pos = 0, u.start
        for offset in sorted(u.pieces):
            piece, n = u.pieces[offset]
            if offset != pos:
                break
            value = piece if pos == u.start else self.combine(value, piece, n)
            pos += n
        if pos != u.end:
            raise IntegrityError(f"bytes {pos}-{u.end - 1} were never hashed")
        u.h.value, u.frontier = value, pos

    # -- the verdict -----------------------------------------------------------------------------
    def check(self) -> str:
        """Raise IntegrityError unless every byte was hashed and matches; returns the method."""
        c = self.claim
        if not self.active:
            return c.method
        if self._combine is not _UNSET and self.combine is not None:   # ranged writers were here
            for u in self.units:
                if u.pieces or u.frontier == u.start != u.end:
                    self._combine_pieces(u)
        for u in self.units:
            if u.end >= 0 and u.frontier != u.end:
                raise IntegrityError(f"bytes {u.frontier}-{u.end - 1} were never hashed")
        if c.method == "md5":
            got = self.units[0].h.hexdigest()
        elif c.method == "multipart-md5":
            got = hashlib.md5(b"".join(u.h.digest() for u in self.units), usedforsecurity=False).hexdigest()
            got += f"-{len(self.units)}"
        elif c.composite:
            outer = new_hash(c.method)
            outer.update(b"".join(u.h.digest() for u in self.units))
            got = base64.b64encode(outer.digest()).decode() + f"-{len(self.units)}"
            if "-" not in (c.value or ""):
                got = got.rpartition("-")[0]
        else:
            got = base64.b64encode(self.units[0].h.digest()).decode()
        if got != c.value:
            raise IntegrityError(f"{c.method} of the bytes written does not match the server's "
                                 f"({got} != {c.value})")
        return c.method


class LayoutSearch:
    """Hashes a multipart object streamed in order at every candidate part size at once; its
    :meth:`check` passes when one reproduces the ETag, and :attr:`claim` is then the found layout.

    The fallback for a multipart object whose layout cannot be learned (``HEAD ?partNumber=1``
    unusable, or contradicting the listing): the same interface as a sequential :class:`Digest`.
    """

    active = True

    def __init__(self, claim: Claim, size: int | None) -> None:
        self.claim, self.size = claim, size
        self.n = etag_parts(claim.value)
        self._cands = [[p, 0, hashlib.md5(usedforsecurity=False), []]
                       for p in candidate_part_sizes(size or 0, self.n)]
        self._pos = 0

    def stream(self, data) -> None:
        mv = memoryview(data)
        self._pos += len(mv)
        for cand in self._cands:
            p, filled, h, digests = cand
            view = mv
            while len(view):
                take = view[: p - filled]
                h.update(take)
                filled += len(take)
                view = view[len(take):]
                if filled == p:
                    digests.append(h.digest())
                    h, filled = hashlib.md5(usedforsecurity=False), 0
            cand[1], cand[2] = filled, h

    def check(self) -> str:
        """Raise IntegrityError unless a candidate layout reproduces the ETag; returns the method."""
        if self.size is not None and self._pos != self.size:
            raise IntegrityError(f"hashed {self._pos} of {self.size} bytes")
        for p, filled, h, digests in self._cands:
            parts = [*digests, h.digest()] if filled else digests
            if len(parts) == self.n and hashlib.md5(b"".join(parts), usedforsecurity=False).hexdigest() \
                    + f"-{self.n}" == self.claim.value:
                self.claim = Claim("multipart-md5", self.claim.value, tuple(uniform_parts(self._pos, p)),
                                   note=self.claim.note, layout_searched=True)
                return self.claim.method
        tried = ", ".join(f"{p / MiB:g}" for p, *_ in self._cands) or "none fits"
        raise IntegrityError(f"multipart ETag not reproduced at any known part size (MiB: {tried}); its "
                             "part sizes could not be learned (HEAD ?partNumber=1)")


def digest_for(claim: Claim, size: int | None, read_back: Callable[[int, int], bytes] | None = None):
    """The hasher of ``claim``: a :class:`LayoutSearch` for a pending one, else a :class:`Digest`
    (both: ``stream``, ``check``, ``claim`` after the check)."""
    return LayoutSearch(claim, size) if claim.pending else Digest(claim, size, read_back)


def search_layout(claim: Claim, size: int, read_back: Callable[[int, int], bytes]) -> Claim:
    """Run a layout search over bytes already written (read back in order); returns the found claim."""
    search = LayoutSearch(claim, size)
    pos = 0
    while pos < size:
        data = read_back(pos, min(READ_BACK, size - pos))
        if not data:
            break
        search.stream(data)
        pos += len(data)
    search.check()
    return search.claim


def check_or_search(digest, size: int, read_back: Callable[[int, int], bytes] | None) -> Claim:
    """``digest.check()``, and the claim that passed.  When a multipart ETag fails at the part sizes
    a HEAD gave, the HEAD may be what lied: the bytes (read back) are searched at the part sizes
    uploaders use, and pass if one reproduces the ETag; otherwise the first failure is raised."""
    try:
        digest.check()
        return digest.claim
    except IntegrityError as failed:
        claim = digest.claim
        if claim.method != "multipart-md5" or claim.layout_searched or read_back is None:
            raise
        try:
            return search_layout(replace(claim, parts=(), layout_searched=True), size, read_back)
        except (IntegrityError, OSError):
            raise failed from None


def rehash_file(fd: int, size: int, claim: Claim) -> Claim:
    """Check an installed file (open ``fd``) against a recorded claim (a pending one: a layout
    search); returns the claim it passed, raises IntegrityError."""
    import os

    d = digest_for(claim, size, lambda off, n: os.pread(fd, n, off))
    pos = 0
    while True:
        data = os.pread(fd, READ_BACK, pos)
        if not data:
            break
        d.stream(data)
        pos += len(data)
    if pos != size:
        raise IntegrityError(f"file has {pos} bytes, {size} expected")
    d.check()
    return d.claim
