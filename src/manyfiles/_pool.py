"""Moved to :mod:`manyfiles._core.pool`; this alias stays until cache/ and s3/objects.py import it there.

An alias, not a copy: ``manyfiles._pool`` *is* that module (module state and monkeypatching agree).
"""

import sys

from manyfiles._core import pool

sys.modules[__name__] = pool
