"""Training data through the cache, for the tools ML users already use.

Public API:

* :class:`Dataset` -- map-style, over an S3 prefix or a local/NFS folder, in key order
  (``len``, ``ds[i]``, iteration, ``keys``); ``mf.Dataset``.
* :class:`IterableDataset` -- sharded by ``DataLoader`` worker and distributed rank, shuffled by
  seed and epoch, ``prefetch`` objects ahead; ``mf.IterableDataset``.
* :class:`Sample` -- ``(key, data)``, what both give without a ``transform``.
* :class:`ManyfilesFileSystem` -- the fsspec filesystem of protocol ``manyfiles`` (the ``[fsspec]``
  extra): ``fsspec.filesystem("manyfiles", cache=DIR)``, for pandas, pyarrow, datasets, xarray.

Guide and caveats: docs/ml.md.
"""

from __future__ import annotations

from manyfiles._core.lazy import lazy_exports

_EXPORTS = {
    "Dataset": "manyfiles.ml.dataset",
    "IterableDataset": "manyfiles.ml.dataset",
    "Sample": "manyfiles.ml.dataset",
    "ManyfilesFileSystem": "manyfiles.ml.filesystem",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
