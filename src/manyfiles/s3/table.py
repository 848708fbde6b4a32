"""A bucket listing as a table: ``manyfiles.s3.list(prefix)`` (:func:`list_table`) -> :class:`ObjectTable`.

What a user reached for a boto3 paginator for: every object under a prefix with its size, ETag
and modification time, from ListObjectsV2 pages (1,000 objects a request), downloading nothing.
Wildcards and ``include``/``exclude`` follow s3pull's rules (:func:`~manyfiles.s3.keys.parse_url`,
:func:`~manyfiles.s3.keys.make_filter`).

Example:
    >>> from manyfiles import s3
    >>> objects = s3.list("s3://bucket/train/*.jpg")          # doctest: +SKIP
    >>> objects.to_pandas()["size"].sum()                      # doctest: +SKIP
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Iterator
from typing import Any

from manyfiles._core.extras import require
from manyfiles._core.progress import ProgressArg, check_progress, progress_for
from manyfiles._core.units import format_size
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import make_filter, parse_url
from manyfiles.s3.object_listing import ObjectInfo, list_objects_lean

COLUMNS = ("key", "size", "etag", "mtime")
SHOWN_ROWS_HTML = 20


class ObjectTable:
    """The objects a listing found: ``len(t)``, ``iter(t)`` (:class:`ObjectInfo` rows: key, size,
    etag, mtime), ``t.column(name)``, ``t.to_pandas()``, ``t.to_arrow()``; ``t.bucket``,
    ``t.seconds`` (the listing's wall time), ``t.listed_at`` (when it started)."""

    def __init__(self, bucket: str, rows: list[ObjectInfo], *, seconds: float, listed_at: float) -> None:
        self.bucket = bucket
        self.rows = rows
        self.seconds = seconds
        self.listed_at = listed_at

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[ObjectInfo]:
        return iter(self.rows)

    def __getitem__(self, i: int) -> ObjectInfo:
        return self.rows[i]

    @property
    def total_bytes(self) -> int:
        return sum(r.size or 0 for r in self.rows)

    def column(self, name: str) -> list[Any]:
        if name not in COLUMNS:
            raise KeyError(f"{name!r}: the columns are {', '.join(COLUMNS)}")
        i = COLUMNS.index(name)
        return [r[i] for r in self.rows]

    def to_pandas(self) -> Any:
        """A DataFrame: key (str), size (int64), etag (str), mtime (UTC timestamps)."""
        pd = require("notebooks", "pandas", "ObjectTable.to_pandas()")
        df = pd.DataFrame({"key": self.column("key"), "size": self.column("size"),
                           "etag": self.column("etag"),
                           "mtime": pd.to_datetime(self.column("mtime"), unit="s", utc=True)})
        return df.astype({"size": "int64"})

    def to_arrow(self) -> Any:
        pa = require("arrow", "pyarrow", "ObjectTable.to_arrow()")
        micros = [None if t is None else int(t * 1e6) for t in self.column("mtime")]
        return pa.table({"key": pa.array(self.column("key"), pa.string()),
                         "size": pa.array(self.column("size"), pa.int64()),
                         "etag": pa.array(self.column("etag"), pa.string()),
                         "mtime": pa.array(micros, pa.timestamp("us", tz="UTC"))})

    def __repr__(self) -> str:
        return (f"<ObjectTable s3://{self.bucket}: {len(self):,} objects, {format_size(self.total_bytes)}, "
                f"listed in {self.seconds:.2f} s>")

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{c}</th>" for c in COLUMNS)
        body = "".join(
            f"<tr><td style='text-align:left'>{html.escape(r.key)}</td><td>{r.size:,}</td>"
            f"<td>{html.escape(r.etag or '')}</td>"
            f"<td>{_when(r.mtime)}</td></tr>"
            for r in self.rows[:SHOWN_ROWS_HTML])
        more = len(self) - SHOWN_ROWS_HTML
        tail = f"<p>... and {more:,} more</p>" if more > 0 else ""
        return (f"<div><b>ObjectTable</b> s3://{html.escape(self.bucket)}: {len(self):,} objects, "
                f"{html.escape(format_size(self.total_bytes))}<table><tr>{head}</tr>{body}</table>{tail}</div>")


def _when(mtime: float | None) -> str:
    return "" if mtime is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(mtime))


def list_table(source: str, *, include: Iterable[str] = (), exclude: Iterable[str] = (),
         settings: ClientSettings | None = None, progress: ProgressArg = False) -> ObjectTable:
    """Every object under ``source`` (``s3://bucket/prefix``, wildcards allowed) with its size,
    ETag and modification time: one ListObjectsV2 request per 1,000 objects, no HEAD, no GET.

    ``include``/``exclude``: glob patterns as for s3pull (a name, or a path relative to the prefix).
    "Folder" markers (keys ending in ``/`` with no content) are left out.
    """
    check_progress(progress)
    url = parse_url(source)
    keep = make_filter(tuple(include), tuple(exclude))
    settings = (settings or ClientSettings()).resolved()
    rows = []
    t0, at = time.monotonic(), time.time()
    with progress_for(progress, "s3 list", unit="objects") as p:
        for info in list_objects_lean(settings, url, mtime=True):
            if info.key.endswith("/") and not info.size:
                continue
            if keep is not None and not keep(info.key.removeprefix(url.base)):
                continue
            rows.append(info)
            p.add(1, bytes=info.size or 0)
    return ObjectTable(url.bucket, rows, seconds=time.monotonic() - t0, listed_at=at)
