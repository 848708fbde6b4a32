"""A persistent local read cache for files (local, NFS) and S3 objects.

Epoch 2 of a training job reads from local SSD instead of the network; the cache
survives restarts and is shared by every thread and process of the node.

Public API:

* :func:`open` -- ``mf.open(path_or_url, "rb", cache=...)``: a seekable binary reader,
  through a cache or not; ``"wb"`` writes through to the origin.
* :class:`Cache` -- one cache directory: ``open``, ``get_bytes``, ``warm``, ``stats``,
  ``evict``, ``verify``, ``clear``, ``invalidate``.
* :class:`CacheStats`, :class:`WarmReport`, :class:`VerifyReport`, :class:`EvictReport`.

Design and guarantees: docs/cache.md.

Example:
    >>> import manyfiles as mf
    >>> cache = mf.Cache("/scratch/mf-cache", max_size=500 << 30)               # doctest: +SKIP
    >>> report = cache.warm(["s3://bucket/train/"], jobs=32)                    # doctest: +SKIP
    >>> data = cache.get_bytes("s3://bucket/train/00001.jpg")                  # doctest: +SKIP
    >>> print(cache.stats())                                                    # doctest: +SKIP
"""

from __future__ import annotations

from manyfiles.cache._cache import (
    Cache,
    CacheStats,
    EvictReport,
    VerifyReport,
    WarmReport,
    default_dir,
    open,
    shared_cache,
)

__all__ = ["Cache", "CacheStats", "EvictReport", "VerifyReport", "WarmReport", "default_dir", "open",
           "shared_cache"]
