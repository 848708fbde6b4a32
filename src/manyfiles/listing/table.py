"""A directory listing as a table: :func:`scan` -> :class:`ListingTable` (``to_pandas()``, ``to_arrow()``).

For notebooks and data work: ``mf.scan("/data/flat").to_pandas()`` is the table of a folder
(``recursive=True``: of a tree), read with the C walker.  Columns are kept per column, not
per row: the walker hands over one batch per directory and the batch becomes columns at
once (names stay the str objects the walker made; types one string of letters; inodes,
sizes and mtimes machine arrays that Arrow takes without copying).  No row object exists
unless you iterate.

Columns: ``path`` (the directory's path joined with the name, as :func:`manyfiles.walk`
gives it), ``name``, ``type`` (``f d l b c p s ?``), ``inode``, and with ``stat=True``
``size`` (bytes; lstat: a symlink's own size) and ``mtime`` (seconds since the epoch,
float).  Names and paths are ``str`` decoded like ``os.listdir`` (surrogate escapes for
bytes that are not UTF-8, so ``os.fsencode`` gives the exact bytes back).  Arrow strings
must be valid UTF-8: in ``to_arrow()`` such a name shows with U+FFFD and the table gets an
extra ``path_bytes`` column (binary; the exact path where it differs, else null).

Example:
    >>> import manyfiles as mf
    >>> df = mf.scan("/data/flat", stat=True, progress=True).to_pandas()   # doctest: +SKIP
    >>> df["size"].describe()                                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from array import array
from collections import namedtuple
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

from manyfiles import listing
from manyfiles._core.extras import require
from manyfiles._core.progress import ProgressArg, check_progress
from manyfiles._core.report import Failure
from manyfiles.listing._tree import _walk_shown

_NAME, _TYPE, _INODE = itemgetter(0), itemgetter(1), itemgetter(2)
ARROW_FEATURE = "ListingTable.to_arrow()"
PANDAS_FEATURE = "ListingTable.to_pandas()"


class Row(namedtuple("Row", "path name type inode size mtime", defaults=(None, None))):
    """One row of a :class:`ListingTable` (``size``/``mtime`` None without ``stat=True``)."""

    __slots__ = ()


class ListingTable:
    """The entries :func:`scan` found, column by column.

    ``len(t)``, ``iter(t)`` (:class:`Row` tuples), ``t.column(name)``, ``t.to_pandas()``,
    ``t.to_arrow()``; ``t.failures`` lists the directories that could not be read
    (:class:`~manyfiles._core.report.Failure`), ``t.seconds`` the time the scan took.
    """

    def __init__(self, root: str, *, stat: bool) -> None:
        self.root = root
        self.stat = stat
        self.names: list[str] = []
        self.types: list[str] = []          # one string of type letters per directory batch
        self.inodes = array("Q")
        self.sizes = array("q")
        self.mtimes = array("d")
        self._dirs: list[tuple[str, int]] = []   # (directory path, entries in it), in row order
        self._paths: list[str] | None = None
        self.failures: list[Failure] = []
        self.directories = 0
        self.seconds = 0.0

    # -- filling (scan) ---------------------------------------------------------------------------

    def _add(self, d: listing.DirListing) -> None:
        entries = d.entries
        if not entries:
            return
        self.names.extend(map(_NAME, entries))
        self.types.append("".join(map(_TYPE, entries)))
        self.inodes.extend(map(_INODE, entries))
        self._dirs.append((d.path, len(entries)))
        if self.stat:
            for st in d.stats:  # None: the entry vanished between the listing and its lstat
                self.sizes.append(-1 if st is None else st.st_size)
                self.mtimes.append(float("nan") if st is None else st.st_mtime)

    # -- reading ----------------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        return ("path", "name", "type", "inode", *(("size", "mtime") if self.stat else ()))

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        failed = f", {len(self.failures):,} failed" if self.failures else ""
        columns = ", ".join(self.columns)
        return f"<ListingTable {self.root!r}: {len(self):,} entries, columns {columns}{failed}>"

    @property
    def ok(self) -> bool:
        return not self.failures

    def paths(self) -> list[str]:
        """The ``path`` column (made on first use: one join per entry)."""
        if self._paths is None:
            paths: list[str] = []
            names = self.names
            start = 0
            for directory, n in self._dirs:
                prefix = directory if directory.endswith("/") else directory + "/"
                paths.extend([prefix + name for name in names[start:start + n]])
                start += n
            self._paths = paths
        return self._paths

    def column(self, name: str) -> Any:
        """One column: a list (``path``, ``name``, ``type``) or an ``array.array`` (the numbers).

        A ``size`` of -1 (``mtime`` NaN) marks an entry that vanished before its lstat.
        """
        if name == "path":
            return self.paths()
        if name == "name":
            return self.names
        if name == "type":
            return list("".join(self.types))
        if name == "inode":
            return self.inodes
        if self.stat and name == "size":
            return self.sizes
        if self.stat and name == "mtime":
            return self.mtimes
        raise KeyError(f"no column {name!r}; columns: {', '.join(self.columns)}")

    def __iter__(self) -> Iterator[Row]:
        stats = (self.sizes, self.mtimes) if self.stat else ()
        types = "".join(self.types)
        return map(Row, self.paths(), self.names, types, self.inodes, *stats)

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` (needs pandas, not pyarrow).  Names keep their surrogate escapes:
        with one that is not UTF-8, ``path``/``name`` are ``object`` columns."""
        pd = require("notebooks", "pandas", PANDAS_FEATURE)
        types = _pandas_types(pd, "".join(self.types))
        data: dict[str, Any] = {"path": _pandas_text(pd, self.paths()), "name": _pandas_text(pd, self.names),
                                "type": types, "inode": _numpy(self.inodes)}
        if self.stat:
            data["size"] = _numpy(self.sizes)
            data["mtime"] = pd.to_datetime(_numpy(self.mtimes), unit="s")
        return pd.DataFrame(data)

    def to_arrow(self) -> Any:
        """A ``pyarrow.Table`` (needs the ``[arrow]`` extra); see the module docstring for non-UTF-8 names."""
        pa = require("arrow", "pyarrow", ARROW_FEATURE)
        pc = require("arrow", "pyarrow.compute", ARROW_FEATURE)
        names, name_bytes = _arrow_strings(pa, self.names)
        paths, path_bytes = _arrow_strings(pa, self.paths())
        cols: dict[str, Any] = {
            "path": paths,
            "name": names,
            "type": pa.array(self.column("type"), pa.string()).dictionary_encode(),
            "inode": _arrow_numbers(pa, pa.uint64(), self.inodes),
        }
        if self.stat:
            cols["size"] = _arrow_numbers(pa, pa.int64(), self.sizes)
            seconds = _arrow_numbers(pa, pa.float64(), self.mtimes)
            seconds = pc.if_else(pc.is_nan(seconds), pa.scalar(None, pa.float64()), seconds)  # vanished: null
            micros = pc.cast(pc.multiply(seconds, 1e6), pa.int64(), safe=False)
            cols["mtime"] = micros.cast(pa.timestamp("us"))
        if path_bytes is not None or name_bytes is not None:
            cols["path_bytes"] = path_bytes if path_bytes is not None else pa.nulls(len(self), pa.binary())
        return pa.table(cols)

    def raise_for_failures(self) -> None:
        """Raise :class:`~manyfiles.errors.PartialFailure` if some directory could not be read."""
        if self.failures:
            from manyfiles.errors import PartialFailure

            raise PartialFailure(f"{len(self.failures):,} directories could not be read; first: "
                                 f"{self.failures[0]}", self.failures, self)

    def _repr_html_(self) -> str:
        import html

        def cell(value: object) -> str:  # a name that is not UTF-8 shows its bytes as \xNN escapes
            return html.escape(os.fsencode(str(value)).decode("utf-8", "backslashreplace"))

        head = "".join(f"<th>{c}</th>" for c in self.columns)
        width = len(self.columns)
        rows = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row[:width]) + "</tr>"
                       for row, _ in zip(self, range(10), strict=False))
        more = f"<p>... {len(self) - 10:,} more rows</p>" if len(self) > 10 else ""
        failed = f", {len(self.failures):,} directories failed" if self.failures else ""
        return (f"<div><b>ListingTable</b> {html.escape(self.root)}: {len(self):,} entries in "
                f"{self.directories:,} directories, {self.seconds:.2f} s{failed}"
                f"<table><tr>{head}</tr>{rows}</table>{more}</div>")


def _pandas_text(pd: Any, texts: list[str]) -> Any:
    """pandas' default text column, or ``object`` when a name holds surrogate escapes (pandas 3's
    Arrow-backed ``str`` cannot hold them; object columns keep the exact name)."""
    default = pd.Series(["x"]).dtype
    try:
        if getattr(default, "storage", None) == "pyarrow":   # pandas 3: one pa.array, ~7x faster
            import pyarrow as pa

            return pd.Series(pa.array(texts, pa.large_string()), dtype=default)
        return pd.Series(texts)
    except (UnicodeError, ValueError):   # pa.ArrowInvalid is a ValueError
        return pd.Series(texts, dtype=object)


def _pandas_types(pd: Any, letters: str) -> Any:
    """The type letters as a Categorical, from codes (no Python object per entry)."""
    import numpy as np

    lut = np.full(256, -1, np.int8)
    for code, letter in enumerate(listing.TYPE_LETTERS):
        lut[ord(letter)] = code
    codes = lut[np.frombuffer(letters.encode("ascii"), np.uint8)]
    return pd.Categorical.from_codes(codes, categories=list(listing.TYPE_LETTERS))


def _numpy(values: array) -> Any:
    import numpy as np

    return np.frombuffer(values, dtype=values.typecode) if len(values) else np.array([], values.typecode)


def _arrow_numbers(pa: Any, kind: Any, values: array) -> Any:
    """An Arrow array over the ``array.array``'s own memory (no copy)."""
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


def _arrow_strings(pa: Any, texts: list[str]) -> tuple[Any, Any]:
    """(string array, binary array of the exact bytes or None): surrogate escapes are not UTF-8."""
    try:
        return pa.array(texts, pa.string()), None
    except (UnicodeEncodeError, pa.ArrowException):
        shown = [os.fsencode(t).decode("utf-8", "replace") for t in texts]
        exact = [None if s == t else os.fsencode(t) for s, t in zip(shown, texts, strict=True)]
        return pa.array(shown, pa.string()), pa.array(exact, pa.binary())


def scan(
    path: str | os.PathLike = ".",
    *,
    recursive: bool = False,
    stat: bool = False,
    filter: listing.Filter = listing.NO_FILTER,
    progress: ProgressArg = False,
    **tree_options: Any,
) -> ListingTable:
    """List ``path`` (``recursive=True``: the whole tree) into a :class:`ListingTable`.

    ``stat=True`` adds ``size`` and ``mtime`` (one lstat per entry, in the walker's caller).
    ``filter`` and the other options (``threads``, ``max_depth``, ``follow_symlinks``,
    ``one_filesystem``, ``prune``, ``bufsize``, ``backend``) are :func:`manyfiles.walk`'s.
    ``progress``: True or a callable taking a Snapshot (``done`` = entries so far).
    A root that cannot be listed raises ``OSError``; other unreadable directories are in
    ``table.failures``.  Every argument is checked before anything is read.
    """
    check_progress(progress)
    root = os.fspath(path)
    if isinstance(root, bytes):
        raise TypeError("scan() takes a str or os.PathLike path (names come back as str, as os.listdir's)")
    if not recursive:
        if "max_depth" in tree_options:
            raise TypeError("scan(): max_depth needs recursive=True")
        tree_options["max_depth"] = 0
    t0 = time.monotonic()
    table = ListingTable(root, stat=stat)
    listings = listing.walk(root, stat=stat, filter=filter, **tree_options)
    if progress:
        listings = _walk_shown(listings, progress, "scan")
    with _gc_paused():
        for d in listings:
            if d.error is not None:
                if d.depth == 0:
                    raise d.error
                table.failures.append(Failure.from_oserror(d.path, d.error))
                continue
            table.directories += 1
            table._add(d)
    table.seconds = time.monotonic() - t0
    return table


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic GC off while the walker makes an Entry tuple per name: those tuples only trigger
    collections that find nothing to free (~40 % of a flat scan's time), and pile up into the
    big ones that walk every object so far."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


__all__ = ["ListingTable", "Row", "scan"]
