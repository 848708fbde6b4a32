"""The profiler's old path: the module is :mod:`manyfiles.trace.profiling` (``mf.profile``).

An alias, not a copy (whether a profile is running is module state): ``manyfiles.profiling``
*is* that module.  Kept for users' imports (``from manyfiles.profiling import profile``).
"""

import sys

from manyfiles.trace import profiling

sys.modules[__name__] = profiling
