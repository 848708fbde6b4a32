"""The I/O trace writer's old path: the module is :mod:`manyfiles.trace.iotrace`.

An alias, not a copy (the active tracer is module state): ``manyfiles.iotrace`` *is* that module.
Kept for users' imports (``from manyfiles.iotrace import tracing``); the package imports it from
manyfiles.trace.
"""

import sys

from manyfiles.trace import iotrace

sys.modules[__name__] = iotrace
