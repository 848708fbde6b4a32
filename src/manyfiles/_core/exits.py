"""How every entry point leaves when its output was closed by the reader (``| head``).

The verb stops there, prints nothing and exits :data:`~manyfiles.errors.EXIT_CLOSED_OUTPUT`
(141, 128 + SIGPIPE), as ``ls``, ``find``, ``git``, s5cmd and rclone do when SIGPIPE stops
them: a pull, a removal or a listing cut short must not look done (exit 0), and is not a
failure of the data either (docs/cli.md).  No click here: the click-free ``fastls`` uses it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

from manyfiles.errors import EXIT_CLOSED_OUTPUT


def exit_closed_output() -> NoReturn:
    """Exit 141 quietly: what is still buffered for stdout or stderr goes nowhere (flushing it at
    exit would only raise again, and a closed pipe has no reader to tell)."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(devnull, stream.fileno())
        os.close(devnull)
    sys.exit(EXIT_CLOSED_OUTPUT)
