"""Moved to :mod:`manyfiles._core.report`; this alias stays until cache/ and s3/objects.py import it there.

An alias, not a copy: ``manyfiles._report`` *is* that module (module state and monkeypatching agree).
"""

import sys

from manyfiles._core import report

sys.modules[__name__] = report
