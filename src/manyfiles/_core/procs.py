"""Processes: whether one is alive (the files a killed process left behind are removed once it is not)."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive?  (One that exists but is not ours to signal counts as alive.)"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
