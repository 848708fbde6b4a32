"""Running a command where a permission check applies, also as root (the suite runs as root in CI)."""

from __future__ import annotations

import os
import shutil


def not_root_cmd() -> list[str]:
    """A prefix that makes a real permission check apply: as root, drop the DAC-override capabilities."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "running as root: setpriv (util-linux) is needed for the permission-denied tests"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
