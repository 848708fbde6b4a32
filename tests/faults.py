"""The faults the crash-safety tests inject, from the test side: the library knows nothing of them.

* **Kill and hold** at a named checkpoint (``manyfiles._core.checkpoints``): the process SIGKILLs
  itself, or stops until the test says go, the n-th time it reaches the point.  ``journal`` is
  reached with the record about to be written: the kill writes half of it first (a torn record).
* **Fake d_types**: the C core reads every d_type as one value (0 = DT_UNKNOWN as sshfs and NFSv3
  send, 200 = garbage), through its ``_dents._set_fake_dtype``, so the fstatat fallback runs here.
* **A failing disk** under s3pull's data writes: ``os.pwrite`` itself writes half of each buffer
  (``short``) or fails the n-th write with EIO (``EIO:n``).
* **No C removal walk**: fastrm's Python engine runs, as where the core is not built.

In-process, call the functions below: each returns a :class:`Fault`, which takes it away when
called or at the end of its ``with`` block.  A real CLI in a subprocess (killed with -9, held on
an fd event then signalled) starts through this file as a launcher, which installs the faults,
then calls the console script's own entry point::

    python tests/faults.py --kill-at move:3 -- shard apply DIR
    python tests/faults.py --hold-at command:1:READY_FD:GO_FD -- fastls -r DIR

:func:`command` builds that argv.  In a Dask worker, ``client.run(faults.kill_worker_at, "tree", 3,
workers=[victim])`` installs the hook in that worker only (the one its nanny starts next is clean).
"""

from __future__ import annotations

import argparse
import errno
import itertools
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from manyfiles._core import checkpoints

LAUNCHER = str(Path(__file__).resolve())


class Fault:
    """An installed fault: call it, or leave its ``with`` block, to take it away."""

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo = undo

    def __call__(self) -> None:
        self._undo()

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self._undo()


def die() -> None:
    """SIGKILL this process: the crash of the kill tests (no cleanup, no flush)."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_at(point: str, n: int = 1) -> Fault:
    """SIGKILL this process the ``n``-th time it reaches ``point`` (counted over all its threads)."""
    count = itertools.count(1)  # next() on it is atomic under the GIL

    def hook(*context: object) -> None:
        if next(count) == n:
            if point == "journal":
                fd, record = context
                os.write(fd, record[: len(record) // 2])  # a torn record, then the crash
            elif point == "pack-append":
                fd, views, offset = context
                record = b"".join(bytes(v) for v in views)
                os.pwrite(fd, record[: len(record) // 2], offset)   # a torn append, then the crash
            die()

    checkpoints.add(point, hook)
    return Fault(lambda: checkpoints.remove(point))


def kill_worker_at(point: str, n: int = 1) -> None:
    """:func:`kill_at`, for ``dask.distributed.Client.run`` in one worker (nothing to send back)."""
    kill_at(point, n)


def hold_at(point: str, n: int, ready_fd: int, go_fd: int) -> Fault:
    """The ``n``-th time ``point`` is reached: write one byte to ``ready_fd`` (the test's event),
    then block until ``go_fd`` is written to or closed.  A signal sent meanwhile lands there."""
    count = itertools.count(1)

    def hook(*context: object) -> None:
        if next(count) == n:
            os.write(ready_fd, b"h")
            os.read(go_fd, 1)

    checkpoints.add(point, hook)
    return Fault(lambda: checkpoints.remove(point))


def fake_dtype(value: int) -> Fault:
    """The C core reads every d_type as ``value`` in this interpreter."""
    from manyfiles import _dents

    _dents._set_fake_dtype(value)
    return Fault(lambda: _dents._set_fake_dtype(None))


def write_fault(kind: str, n: int = 0) -> Fault:
    """``os.pwrite`` misbehaves as a failing disk does: ``short`` writes at most half of each buffer
    (a short write the caller must continue), ``EIO`` fails the ``n``-th write of the process."""
    if kind not in ("short", "EIO"):
        raise ValueError(f"write fault is short or EIO:N, not {kind!r}")
    real = os.pwrite
    count = itertools.count(1)

    def pwrite(fd: int, data, offset: int) -> int:
        if kind == "short":
            return real(fd, memoryview(data)[: max(1, len(data) // 2)], offset)
        if next(count) == n:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, data, offset)

    os.pwrite = pwrite

    def undo() -> None:
        os.pwrite = real

    return Fault(undo)


def python_remove_engine() -> Fault:
    """fastrm removes with its Python engine, as where the C core has no removal walk."""
    from manyfiles.remove import _walker

    native = _walker.NATIVE
    _walker.NATIVE = False

    def undo() -> None:
        _walker.NATIVE = native

    return Fault(undo)


# -- the launcher of a real CLI with faults ------------------------------------------------------


def command(script: str, *args: str, kill_at: str | None = None, hold_at: str | None = None,
            fake_dtype: int | None = None, write_fault: str | None = None,
            python_remove: bool = False) -> list[str]:
    """The argv that runs console script ``script`` (a name, or a path in the venv's bin) with
    ``args`` and these faults (launcher syntax: ``kill_at="move:3"``, ``write_fault="EIO:3"``...)."""
    options = [*(("--kill-at", kill_at) if kill_at else ()), *(("--hold-at", hold_at) if hold_at else ()),
               *(("--fake-dtype", str(fake_dtype)) if fake_dtype is not None else ()),
               *(("--write-fault", write_fault) if write_fault else ()),
               *(("--python-remove",) if python_remove else ())]
    return [sys.executable, LAUNCHER, *options, "--", script, *args]


def _point(spec: str) -> tuple[str, int]:
    point, _, n = spec.partition(":")
    return point, int(n or 1)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="faults.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-at", metavar="POINT[:N]", help="SIGKILL at the N-th POINT (default 1)")
    parser.add_argument("--hold-at", metavar="POINT:N:READY_FD:GO_FD", help="hold at the N-th POINT")
    parser.add_argument("--fake-dtype", type=int, metavar="N", help="every d_type reads as N")
    parser.add_argument("--write-fault", metavar="short|EIO:N", help="os.pwrite misbehaves")
    parser.add_argument("--python-remove", action="store_true", help="no C removal walk")
    parser.add_argument("script", help="a console script of manyfiles (name or path)")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if opts.kill_at:
        kill_at(*_point(opts.kill_at))
    if opts.hold_at:
        point, n, ready, go = opts.hold_at.split(":")
        hold_at(point, int(n), int(ready), int(go))
    if opts.fake_dtype is not None:
        fake_dtype(opts.fake_dtype)
    if opts.write_fault:
        kind, _, n = opts.write_fault.partition(":")
        write_fault(kind, int(n or 0))
    if opts.python_remove:
        python_remove_engine()
    from importlib.metadata import entry_points

    name = Path(opts.script).name
    (entry,) = entry_points(group="console_scripts", name=name)
    if not entry.value.startswith("manyfiles."):
        parser.error(f"{name} is not a console script of manyfiles")
    sys.argv = [opts.script, *opts.args]  # as the script's own launcher sets them
    sys.path[0] = str(Path(sys.executable).parent)  # its directory, not tests/
    entry.load()()


if __name__ == "__main__":
    main(sys.argv[1:])
