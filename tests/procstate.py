"""What this process holds, counted so that other threads of the test process cannot change it.

A whole-process count (``len(os.listdir("/proc/self/fd"))``) also sees what the session's other
threads open and close at the same moment: the Dask cluster's scheduler and its monitor, the
moto servers, proxies.  Those made the leak checks fail at random; these helpers count only
the descriptors into one tree and only the threads with one name.
"""

from __future__ import annotations

import os
from pathlib import Path


def fds_into(root: str | os.PathLike) -> dict[int, str]:
    """The descriptors of this process open on ``root`` or anything below it: fd -> path."""
    root = os.path.realpath(root)
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:      # closed since the listing (by another thread, or listdir's own)
            continue
        if target == root or target.startswith(root + "/"):
            out[int(fd)] = target
    return out


def threads_named(prefix: str) -> list[str]:
    """The names of this process's threads (kernel ``comm``) that start with ``prefix``."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):     # ended since the listing
            continue
        if name.startswith(prefix):
            names.append(name)
    return names
