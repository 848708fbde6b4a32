"""Options and error handling shared by every command.

``instrumented`` adds ``--profile FILE`` (viztracer) and ``--trace FILE`` (I/O
operation log) to a command; ``run_main`` maps manyfiles errors to one-line
messages and exit codes the same way for every standalone script.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from manyfiles._units import parse_size
from manyfiles.errors import ManyfilesError


def instrumented(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: give a click command ``--profile FILE`` and ``--trace FILE``."""

    @click.option(
        "--profile",
        "profile_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Write a viztracer profile (open with vizviewer or Perfetto).",
    )
    @click.option(
        "--trace",
        "trace_file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Log every I/O operation to FILE (see `manyfiles trace summary`).",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, profile_file: str | None, trace_file: str | None, **kwargs: Any) -> Any:
        with contextlib.ExitStack() as stack:
            if trace_file:
                from manyfiles.iotrace import tracing

                stack.enter_context(tracing(trace_file))
            if profile_file:
                from manyfiles.profiling import profile

                stack.enter_context(profile(profile_file))
            result = fn(*args, **kwargs)
        if trace_file and profile_file and profile_file.endswith(".json"):
            # Both asked: put the I/O operations into the profile too, one timeline.
            from manyfiles.trace import export_chrome, load

            export_chrome(load([trace_file]), profile_file, merge=profile_file)
        return result

    return wrapper


CLUSTER_HELP = ("Run on a Dask cluster: tcp://HOST:8786 (a running scheduler) or local:N (N worker "
                "processes here); needs manyfiles[dask]. See docs/scale-out.md.")


def cluster_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: ``--cluster ADDRESS`` (also ``$MANYFILES_CLUSTER``), passed on as ``cluster=``.

    The value is checked by the library (``manyfiles.scale.executor.parse_cluster``) before any
    work: a malformed one, or the [dask] extra missing, is a one-line usage error (exit 2).
    """
    return click.option("--cluster", metavar="ADDRESS", default=None, envvar="MANYFILES_CLUSTER",
                        help=CLUSTER_HELP)(fn)


def echo_cluster(prog: str, report: object) -> None:
    """After a job ran on a cluster: one stderr line per worker (shards, items, rate)."""
    lines = report.worker_lines() if hasattr(type(report), "worker_lines") else []
    for line in lines:
        click.echo(f"{prog}: {line}", err=True)


def fail(prog: str, message: str, code: int = 1) -> None:
    """Print ``prog: message`` on stderr and exit with ``code``."""
    click.echo(f"{prog}: {message}", err=True)
    sys.exit(code)


def run_main(command: click.Command, prog: str) -> None:
    """Run a click command as a standalone script with manyfiles' error mapping."""
    from manyfiles import _testing

    _testing.apply_environ()  # the one bridge for subprocess tests (kill points); unset in production
    try:
        # standalone_mode=False returns the callback's value (our commands return
        # their exit code) or the code of a click Exit.
        code = command.main(prog_name=prog, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo(f"{prog}: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ManyfilesError as exc:
        fail(prog, str(exc), exc.exit_code)
    except KeyboardInterrupt:
        click.echo(f"{prog}: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        # `fastls | head`: the reader went away; that is not an error of ours.
        sys.stderr.close()
        sys.exit(0)
    sys.exit(code if isinstance(code, int) else 0)


class Size(click.ParamType):
    """A byte count option: ``4096``, ``64K``, ``1.5M``, ``1GiB`` (usage error, exit 2, if malformed)."""

    name = "size"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value), self.minimum)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
