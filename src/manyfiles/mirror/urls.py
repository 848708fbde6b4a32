""":func:`check`: :func:`~manyfiles.mirror.comparison.compare` from an ``s3://bucket/prefix/`` URL."""

from __future__ import annotations

import os
from collections.abc import Iterable

from manyfiles._core.progress import ProgressArg
from manyfiles._core.retry import RetryPolicy
from manyfiles.errors import UsageError
from manyfiles.mirror.comparison import Comparison, compare
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import parse_url


def check(local_root: str | os.PathLike, url: str, *, by: str = "checksum", source: str = "local",
          include: Iterable[str] = (), exclude: Iterable[str] = (), settings: ClientSettings | None = None,
          retry: RetryPolicy | None = None,
          workers: int = 16, progress: ProgressArg = False,
          memo: bool | str | os.PathLike = True) -> Comparison:
    """Compare the folder ``local_root`` with ``s3://bucket/prefix/`` (a folder: no wildcards) by
    ``by`` (``"checksum"``, ``"size-mtime"``, ``"size"``; ``source``: the side a copy would go
    from, ``"local"`` or ``"remote"``); nothing is moved.  ``memo``: the checksum memo (False: read
    every file).  See :func:`compare`.

    Example:
        >>> c = check("/data/run1", "s3://bucket/runs/run1/")      # doctest: +SKIP
        >>> c.equal
        True
    """
    from manyfiles.s3.store import store_for

    parsed = parse_url(url)
    if parsed.pattern is not None:
        raise UsageError(f"{url}: wildcards are not compared; give the folder (s3://bucket/prefix/) and "
                         "--include/--exclude")
    store = store_for((settings or ClientSettings()).resolved(), parsed.bucket, retry=retry)
    return compare(local_root, store, parsed.prefix, by=by, source=source, include=include, exclude=exclude,
                   workers=workers, progress=progress, memo=memo)


__all__ = ["check"]
