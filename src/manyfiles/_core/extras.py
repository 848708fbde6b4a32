"""Optional dependencies: which extra installs what, and one way to import them.

The core (fastls, shard, fastrm, traces) needs only click and rich.  Everything
else comes with an extra (``pip install "manyfiles[s3]"``); code that needs one
imports it through :func:`require`, so a missing extra is one line that names
the ``pip install`` to run (:class:`~manyfiles.errors.MissingExtra`, CLI exit 2)
instead of a ModuleNotFoundError traceback.

Example:
    >>> boto3 = require("s3", "boto3", feature="S3 access")      # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from manyfiles.errors import MissingExtra

# extra -> the distributions it installs directly (what `manyfiles info` checks);
# keep in step with [project.optional-dependencies] in pyproject.toml.
EXTRAS: dict[str, tuple[str, ...]] = {
    "s3": ("boto3",),
    "async": ("aioboto3",),
    "profile": ("viztracer",),
    "getdents": ("getdents",),
    "checksums": ("awscrt",),
    "obstore": ("obstore",),
    "dask": ("distributed",),
    "demo": ("moto", "flask"),
    "arrow": ("pyarrow",),
    "notebooks": ("ipykernel", "nbclient", "matplotlib", "pandas"),
    "fsspec": ("fsspec",),
}


def require(extra: str, module: str, feature: str) -> ModuleType:
    """Import ``module`` (e.g. ``"botocore.config"``), or raise MissingExtra naming ``extra``.

    ``feature`` is what the user asked for, as they would name it ("S3 access",
    "--profile-out"); the message reads ``FEATURE needs the [EXTRA] extra (MODULE is not
    installed): pip install "manyfiles[EXTRA]"``.
    """
    _check_extra(extra)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        # exc.name is the module really missing (botocore when boto3 is there without it)
        raise MissingExtra(extra, feature, exc.name or module) from exc


def require_installed(extra: str, module: str, feature: str) -> None:
    """Like :func:`require` without importing ``module`` (a cheap up-front check)."""
    if module in _FOUND:      # found once: hot paths (every cache open of an S3 URL) ask again
        return
    _check_extra(extra)
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(extra, feature, module)
    _FOUND.add(module)


_FOUND: set[str] = set()


def _check_extra(extra: str) -> None:
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}")


def version_of(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None."""
    from importlib import metadata  # here: importing it costs every command's start-up ~15 ms

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed() -> dict[str, dict[str, str | None]]:
    """``{extra: {distribution: version or None}}`` for every extra."""
    return {extra: {d: version_of(d) for d in dists} for extra, dists in EXTRAS.items()}
