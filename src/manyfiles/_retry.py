"""Moved to :mod:`manyfiles._core.retry`; this alias stays until cache/ and s3/objects.py import it there.

An alias, not a copy: ``manyfiles._retry`` *is* that module (module state and monkeypatching agree).
"""

import sys

from manyfiles._core import retry

sys.modules[__name__] = retry
