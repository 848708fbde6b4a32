"""Bulk S3 downloads that pick an engine per object size (``s3pull``).

Public API:

* :func:`pull` -- download ``s3://bucket/prefix`` (wildcards allowed) into a folder;
  returns a :class:`PullReport` (``dry_run=True``: a :class:`PullPlan` to ``execute()``).
* :func:`plan` -- the dry run: what :func:`pull` would fetch, by which engine.
* :func:`verify` -- re-hash every file a pull installed against the check it passed.
* :func:`iter_objects` / :func:`get_objects` -- the same transfer into memory,
  ``(key, bytes)`` pairs or a dict, for notebooks.
* :func:`fetch_objects` / :class:`Fetcher` -- many known objects (or byte ranges of them) of one
  bucket, fetched concurrently into memory, each checked, under the retry policy and stall watch.
* :func:`list` -- the objects under a prefix (key, size, ETag, mtime) as an :class:`ObjectTable`,
  downloading nothing.
* :class:`ClientSettings` -- profile, region, endpoint, unsigned requests.

Example:
    >>> from manyfiles import s3
    >>> report = s3.pull("s3://bucket/shards/", "/data/shards", progress=True)  # doctest: +SKIP
    >>> blobs = s3.get_objects("s3://bucket/labels/*.json")                    # doctest: +SKIP
    >>> s3.verify("/data/shards").raise_for_failures()                         # doctest: +SKIP
"""

from __future__ import annotations

from manyfiles.s3.client import ClientSettings
from manyfiles.s3.fetcher import Fetcher, FetchResult, fetch_objects
from manyfiles.s3.keys import UnsafeKey, local_relpath, parse_url
from manyfiles.s3.pull import Event, PullConfig, PullPlan, get_objects, iter_objects, plan, pull
from manyfiles.s3.report import PullReport, VerifyReport
from manyfiles.s3.retry import RetryPolicy
from manyfiles.s3.routing import STRATEGIES
from manyfiles.s3.table import ObjectTable, list_table
from manyfiles.s3.verify import verify

Report = PullReport   # the name before reports shared a base
list = list_table

__all__ = [
    "STRATEGIES",
    "ClientSettings",
    "Event",
    "FetchResult",
    "Fetcher",
    "ObjectTable",
    "PullConfig",
    "PullPlan",
    "PullReport",
    "Report",
    "RetryPolicy",
    "UnsafeKey",
    "VerifyReport",
    "fetch_objects",
    "get_objects",
    "iter_objects",
    "list",
    "local_relpath",
    "parse_url",
    "plan",
    "pull",
    "verify",
]
