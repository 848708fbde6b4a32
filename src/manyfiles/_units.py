"""Moved to :mod:`manyfiles._core.units`; this alias stays until cache/ and s3/objects.py import it there.

An alias, not a copy: ``manyfiles._units`` *is* that module (module state and monkeypatching agree).
"""

import sys

from manyfiles._core import units

sys.modules[__name__] = units
