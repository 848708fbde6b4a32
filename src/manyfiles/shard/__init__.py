"""Hashed prefix trees (``ab/cd/<name>``): the ShardedDir API and crash-safe migration.

Example:
    >>> from manyfiles.shard import ShardedDir, Layout, apply, plan, revert   # doctest: +SKIP
    >>> p = plan("/data/flat", Layout(levels=(2, 2)))     # what would move where; nothing moves
    >>> report = p.execute(workers=4, progress=True)      # or apply("/data/flat", workers=4)
    >>> ShardedDir("/data/flat").path_for("cat.jpg")
    '/data/flat/8b/1a/cat.jpg'
    >>> revert("/data/flat").raise_for_failures()

``apply``/``revert``/``reshard`` are resumable: after a crash, run the same call again.
Modules: ``layout`` (names -> buckets, pure), ``sharded_dir`` (ShardedDir), ``scan`` (the
root listing), ``migrate`` (plan, apply, revert, reshard), ``_phases`` (their journaled
phases), ``_rounds`` (the rounds of moves, a task per top bucket), ``_engine`` (a run's state: lock,
journal, counters, pool, the move itself), ``journal`` (journal and lock), ``verify`` (verify, status),
``_cluster`` (the rounds on Dask).
"""

from manyfiles.shard.layout import HASHES, KEYS, Layout, parse_levels
from manyfiles.shard.migrate import MigrationReport, Plan, apply, plan, reshard, revert
from manyfiles.shard.sharded_dir import BucketStats, MigrationInProgress, ShardedDir
from manyfiles.shard.verify import Status, VerifyReport, status, verify

__all__ = [
    "HASHES",
    "KEYS",
    "BucketStats",
    "Layout",
    "MigrationInProgress",
    "MigrationReport",
    "Plan",
    "ShardedDir",
    "Status",
    "VerifyReport",
    "apply",
    "parse_levels",
    "plan",
    "reshard",
    "revert",
    "status",
    "verify",
]
