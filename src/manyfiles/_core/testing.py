"""Test-only knobs: plain module settings that tests set and production code reads where it acts.

Rules (shared by every tool; add a knob here rather than reading the environment elsewhere):

* one module attribute per knob; its default is the production behaviour;
* tests set it (``monkeypatch.setattr(_testing, "kill_at", ("move", 3))``); production code
  reads it at call time (once per operation in hot paths), never copies it at import time
  and never reads the environment for it;
* subprocess tests (a real CLI killed with -9) cannot reach into the child process: for them,
  and only for them, the environment variable ``MANYFILES_TESTING`` holds ``knob=value``
  pairs separated by commas.  The command-line entry point (``cli._common.run_main``) applies
  it with :func:`apply_environ`; importing the library never reads it.

Example:
    >>> configure("kill_at=move:3")
    >>> kill_at
    ('move', 3)
    >>> configure("kill_at=")
    >>> kill_at is None
    True
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

ENV = "MANYFILES_TESTING"

#: shard: SIGKILL this process the n-th time it reaches the named point
#: ("move", "mkdir", "journal" (half-way through writing a record), "finish", ...);
#: a cluster listing shard: "tree" (after a walker call, its part file not yet committed); a
#: cluster fastrm shard: "remove" (at a progress report, mid-removal).
kill_at: tuple[str, int] | None = None

#: the C core (manyfiles._dents) reads every d_type as this value: 0 (DT_UNKNOWN) behaves as
#: sshfs, NFSv3 READDIR and XFS ftype=0 do, so the fstatat fallback is exercised on any
#: filesystem; an out-of-range value (e.g. 200) exercises the guard against garbage d_types.
#: Read by the C core itself at the start of each call (from sys.modules: never imported by it).
fake_dtype: int | None = None

#: fastrm: "python" runs the Python engine (manyfiles.remove._executor) even where the C walker
#: is built, so that the tests check both engines on the same cases; None = the C walker if built.
remove_engine: str | None = None

#: s3pull: its data writes (``os.pwrite`` into temp files) misbehave as a failing disk would:
#: ``("short", 0)`` writes at most half of each buffer (a short write the caller must continue),
#: ``("EIO", n)`` fails the n-th write of the process with EIO.  Read once per write.
write_fault: tuple[str, int] | None = None

#: every tool: stop the n-th time the named killpoint is reached until the test says go
#: (``"move:3:R:G"``: at the 3rd ``move``, write one byte to fd R, then block reading fd G).
#: The test holds a real process mid-run on an event (the byte), not on a sleep; closing or
#: writing G releases it, and a signal sent meanwhile (Ctrl-C) lands exactly there.  The point
#: ``command`` is reached by every command once its options are parsed, before any work.
hold_at: tuple[str, int, int, int] | None = None

_counters: dict[str, Iterator[int]] = {}


def _parse_write_fault(value: str) -> tuple[str, int] | None:
    if not value:
        return None
    kind, _, n = value.partition(":")
    if kind not in ("short", "EIO"):
        raise ValueError(f"{ENV}: write_fault is short or EIO:N, not {value!r}")
    return kind, int(n or 0)


def pwrite(fd: int, data, offset: int) -> int:
    """``os.pwrite`` as ``write_fault`` says (the caller checked that it is set)."""
    import errno

    kind, n = write_fault or ("", 0)
    if kind == "short":
        return os.pwrite(fd, memoryview(data)[: max(1, len(data) // 2)], offset)
    if kind == "EIO" and next(_counters.setdefault("write_fault", itertools.count(1))) == n:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return os.pwrite(fd, data, offset)


def _parse_kill_at(value: str) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, n = value.partition(":")
    return point, int(n or 1)


def _parse_hold_at(value: str) -> tuple[str, int, int, int] | None:
    if not value:
        return None
    point, n, ready, go = value.split(":")
    return point, int(n or 1), int(ready), int(go)


_PARSERS: dict[str, Callable[[str], Any]] = {
    "kill_at": _parse_kill_at,
    "fake_dtype": lambda value: int(value) if value else None,
    "remove_engine": lambda value: value or None,
    "write_fault": _parse_write_fault,
    "hold_at": _parse_hold_at,
}


def configure(spec: str) -> None:
    """Set knobs from ``"knob=value,knob=value"``; an unknown knob is an error."""
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, value = item.partition("=")
        if name not in _PARSERS:
            raise ValueError(f"{ENV}: unknown knob {name!r} (known: {', '.join(sorted(_PARSERS))})")
        globals()[name] = _PARSERS[name](value)
        if name in ("kill_at", "write_fault", "hold_at"):
            _counters.clear()


def apply_environ() -> None:
    """The bridge for subprocess tests: apply ``$MANYFILES_TESTING`` (called by the CLI entry only)."""
    spec = os.environ.get(ENV)
    if spec:
        configure(spec)


def reached(point: str) -> bool:
    """True the n-th time ``point`` is reached when ``kill_at`` is ``(point, n)``."""
    if kill_at is None or kill_at[0] != point:
        return False
    counter = _counters.setdefault(point, itertools.count(1))
    return next(counter) == kill_at[1]  # itertools.count is atomic under the GIL


def killpoint(point: str) -> None:
    """SIGKILL this process here if ``kill_at`` asks for it, or hold it here if ``hold_at`` does
    (a no-op in production)."""
    if kill_at is not None and reached(point):
        die()
    if hold_at is not None and hold_at[0] == point:
        counter = _counters.setdefault(f"hold:{point}", itertools.count(1))
        if next(counter) == hold_at[1]:
            hold(hold_at[2], hold_at[3])


def hold(ready_fd: int, go_fd: int) -> None:
    """Say "held" on ``ready_fd`` and wait until ``go_fd`` is written to or closed."""
    os.write(ready_fd, b"h")
    os.read(go_fd, 1)


def die() -> None:
    """SIGKILL this process: the crash of the kill tests (no cleanup, no flush)."""
    os.kill(os.getpid(), signal.SIGKILL)
