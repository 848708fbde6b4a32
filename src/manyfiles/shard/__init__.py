"""Hashed prefix trees (``ab/cd/<name>``): the ShardedDir API and crash-safe migration.

Example:
    >>> from manyfiles.shard import ShardedDir, Layout, apply, revert   # doctest: +SKIP
    >>> report = apply("/data/flat", Layout(levels=(2, 2)), workers=4)
    >>> ShardedDir("/data/flat").path_for("cat.jpg")
    '/data/flat/8b/1a/cat.jpg'
    >>> revert("/data/flat")

``apply``/``revert``/``reshard`` are resumable: after a crash, run the same call again.
"""

from manyfiles.shard.layout import HASHES, KEYS, Layout, parse_levels
from manyfiles.shard.migrate import (
    MigrationReport,
    Plan,
    Status,
    VerifyReport,
    apply,
    plan,
    reshard,
    revert,
    status,
    verify,
)
from manyfiles.shard.sharded_dir import BucketStats, MigrationInProgress, ShardedDir

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
