"""Running a command with its stderr on a pseudo-terminal: what a user sees of the progress display."""

from __future__ import annotations

import os
import pty
import select
import subprocess


def stderr_on_a_terminal(argv: list[str], *, env: dict[str, str] | None = None, exit_code: int = 0) -> bytes:
    """Run ``argv`` with stderr on a pseudo-terminal (stdout to /dev/null); what it drew there.

    The command must exit with ``exit_code``; the terminal is 120 columns wide.
    """
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stderr=slave, stdout=subprocess.DEVNULL,
                            env={**os.environ, **(env or {}), "COLUMNS": "120"})
    os.close(slave)
    seen = b""
    while select.select([master], [], [], 60)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == exit_code, seen
    return seen
