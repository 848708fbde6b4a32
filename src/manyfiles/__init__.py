"""manyfiles: move data when there are too many files.

The public API is re-exported here lazily, so ``import manyfiles`` stays cheap
(the CLI's start-up time matters when listing is ~0.2 s of work).

Example:
    >>> import manyfiles as mf
    >>> mf.count("/data/flat")          # doctest: +SKIP
    1000000
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    # listing (fastls)
    "listdir": "manyfiles.listing",
    "iter_entries": "manyfiles.listing",
    "count": "manyfiles.listing",
    "walk": "manyfiles.listing",
    "Entry": "manyfiles.listing",
    "BACKENDS": "manyfiles.listing",
    "scan": "manyfiles.listing.table",
    "ListingTable": "manyfiles.listing.table",
    # sharding
    "ShardedDir": "manyfiles.shard",
    "Layout": "manyfiles.shard",
    # deletion
    "remove_tree": "manyfiles.remove",
    "purge": "manyfiles.remove",
    # read cache
    "open": "manyfiles.cache",
    "Cache": "manyfiles.cache",
    # training data through the cache
    "Dataset": "manyfiles.ml.dataset",
    "IterableDataset": "manyfiles.ml.dataset",
    # profiling and I/O tracing
    "profile": "manyfiles.trace.profiling",
    "tracing": "manyfiles.trace.iotrace",
    # what this installation can do
    "info": "manyfiles._info",
    # errors
    "ManyfilesError": "manyfiles.errors",
    "UsageError": "manyfiles.errors",
    "MissingExtra": "manyfiles.errors",
    "NotFound": "manyfiles.errors",
    "AccessDenied": "manyfiles.errors",
    "CredentialsError": "manyfiles.errors",
    "UnsafeKey": "manyfiles.errors",
    "TransferError": "manyfiles.errors",
    "ObjectChanged": "manyfiles.errors",
    "IntegrityError": "manyfiles.errors",
    "PartialFailure": "manyfiles.errors",
    "Stalled": "manyfiles.errors",
}

# subpackages reachable as attributes (``mf.s3.pull(...)``) without importing them first
_SUBMODULES = ("cache", "errors", "listing", "mirror", "ml", "push", "remove", "s3", "shard", "table",
               "trace")

__all__ = [*sorted(_EXPORTS), *_SUBMODULES, "__version__"]


# The same pair as manyfiles._core.lazy.lazy_exports builds for the subpackages, written out here:
# importing that helper module too costs ~0.25 ms of every fastls start-up.
def __getattr__(name: str) -> object:  # (no typing import: it is ~7 ms of fastls' start-up)
    if name in _SUBMODULES:
        return importlib.import_module(f"manyfiles.{name}")  # the import sets the attribute
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'manyfiles' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
