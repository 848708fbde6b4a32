"""Moved to :mod:`manyfiles._core.progress`; this alias stays until cache/ and s3/objects.py import it there.

An alias, not a copy: ``manyfiles._progress`` *is* that module (module state and monkeypatching agree).
"""

import sys

from manyfiles._core import progress

sys.modules[__name__] = progress
