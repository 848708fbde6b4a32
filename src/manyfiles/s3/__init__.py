"""Bulk S3 downloads that pick an engine per object size (``s3pull``).

Public API:

* :func:`pull` -- download ``s3://bucket/prefix`` (wildcards allowed) into a folder;
  returns a :class:`Report`.
* :func:`iter_objects` / :func:`get_objects` -- the same transfer into memory,
  ``(key, bytes)`` pairs or a dict, for notebooks.
* :class:`ClientSettings` -- profile, region, endpoint, unsigned requests.

Example:
    >>> from manyfiles import s3
    >>> report = s3.pull("s3://bucket/shards/", "/data/shards")          # doctest: +SKIP
    >>> blobs = s3.get_objects("s3://bucket/labels/*.json")             # doctest: +SKIP
"""

from __future__ import annotations

from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import UnsafeKey, local_relpath, parse_url
from manyfiles.s3.plan import STRATEGIES
from manyfiles.s3.pull import Event, PullConfig, Report, get_objects, iter_objects, pull
from manyfiles.s3.retry import RetryPolicy

__all__ = [
    "STRATEGIES",
    "ClientSettings",
    "Event",
    "PullConfig",
    "Report",
    "RetryPolicy",
    "UnsafeKey",
    "get_objects",
    "iter_objects",
    "local_relpath",
    "parse_url",
    "pull",
]
