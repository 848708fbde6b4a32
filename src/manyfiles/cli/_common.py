"""Options and error handling shared by every command.

``instrumented`` adds ``--profile-out FILE`` (viztracer) and ``--trace FILE`` (I/O
operation log) to a command; the shared option set (``-j/--jobs``, ``-n/--dry-run``,
``--include/--exclude``, ``--json``, ``-q``, ``--progress/--no-progress``, ``--files-from``)
is one decorator each here, with :func:`deprecated_alias` for the spellings they replace
(docs/cli.md).

Exit codes and error lines are decided here, once for every command (the table is in
docs/cli.md): :func:`run_main` turns whatever a command raises into one ``prog: message``
line on stderr and its exit code (:func:`exit_code`); :func:`echo_failures` prints a run's
failures, a long run of the same error shortened (:class:`~manyfiles.errors.FailureLines`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import click

from manyfiles import __version__
from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles._core.exits import exit_closed_output
from manyfiles._core.units import parse_size
from manyfiles.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    FailureLines,
    ManyfilesError,
    UsageError,
    from_oserror,
)


def instrumented(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: give a click command ``--profile-out FILE`` (viztracer) and ``--trace FILE``.

    ``--profile FILE`` stays one release as a hidden, deprecated spelling of ``--profile-out``
    (AWS users read ``--profile NAME`` as a credentials profile; s3pull's is ``--aws-profile``).
    """

    @click.option(
        "--profile-out",
        "profile_file",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="FILE",
        help="Write a viztracer profile of the run (open with vizviewer or Perfetto).",
    )
    @deprecated_alias("profile_file", "--profile-out", "--profile", type=click.Path(dir_okay=False))
    @click.option(
        "--trace",
        "trace_file",
        type=click.Path(dir_okay=False),
        default=None,
        metavar="FILE",
        help="Log every I/O operation to FILE (read it with: manyfiles trace summary FILE).",
    )
    @functools.wraps(fn)
    def wrapper(*args: Any, profile_file: str | None, trace_file: str | None, **kwargs: Any) -> Any:
        if profile_file:  # a missing [profile] extra: one line, before the trace file is created
            from manyfiles._core.extras import require_installed
            from manyfiles.trace.profiling import FEATURE

            require_installed("profile", "viztracer", FEATURE)
        with contextlib.ExitStack() as stack:
            if trace_file:
                from manyfiles.trace.iotrace import tracing

                stack.enter_context(tracing(trace_file))
            if profile_file:
                from manyfiles.trace.profiling import profile

                stack.enter_context(profile(profile_file))
            checkpoint("command")  # every command passes here once parsed, before any work
            result = fn(*args, **kwargs)
        if trace_file and profile_file and profile_file.endswith(".json"):
            # Both asked: put the I/O operations into the profile too, one timeline.
            from manyfiles.trace import export_chrome, load

            export_chrome(load([trace_file]), profile_file, merge=profile_file)
        return result

    return wrapper


# -- the shared option set (docs/cli.md has the table of options x verbs) -----------------------------

_GIVEN = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)


def prog_name(ctx: click.Context | None = None) -> str:
    """The name errors and notes start with: the script (``fastrm``) or ``manyfiles``."""
    ctx = ctx or click.get_current_context()
    return ctx.find_root().info_name or ctx.command_path


def deprecation_line(prog: str, old: str, new: str) -> str:
    """The one stderr line an old spelling prints: ``fastls: --threads is deprecated, use -j/--jobs``."""
    return f"{prog}: {old} is deprecated, use {new}"


def deprecated_alias(name: str, new: str, *decls: str, **attrs: Any) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: a hidden old spelling (``decls``, e.g. ``"-w", "--workers"``) of the option whose
    parameter is ``name`` (spelled ``new`` today).  Its value goes to ``name``; using it prints
    :func:`deprecation_line` once on stderr.  Both spellings together are a usage error, whatever
    their values (a ``multiple=True`` option collects both instead).  ``attrs``: the click attributes
    of the old option (its type, ``is_flag``, ``multiple``...), usually the new one's."""
    key = f"{name}__{decls[-1].lstrip('-').replace('-', '_')}"
    old = "/".join(decls)

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(key)
            ctx = click.get_current_context()
            if ctx.get_parameter_source(key) in _GIVEN:
                if attrs.get("multiple"):
                    kwargs[name] = (*kwargs[name], *value)
                elif ctx.get_parameter_source(name) in _GIVEN:   # the one line is the refusal
                    raise click.UsageError(f"{old} and {new} mean the same: give {new} only")
                else:
                    kwargs[name] = value
                click.echo(deprecation_line(prog_name(ctx), old, new), err=True)
            return fn(*args, **kwargs)

        return click.option(*decls, key, hidden=True, expose_value=True, **attrs)(wrapper)

    return decorate


def _shared(*decorators: Callable[[Callable[..., Any]], Any]) -> Callable[[Callable[..., Any]], Any]:
    """Apply ``decorators`` as if stacked in this order above the function."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return decorate


def jobs_option(help: str, *, default: int | None, maximum: int = 4096, old: tuple[str, ...] = (),
                show_default: bool = True) -> Callable[[Callable[..., Any]], Any]:
    """``-j/--jobs N``: the verb's parallelism (``help`` says of what), passed as ``jobs``.
    ``old``: the verb's former spelling, kept hidden and deprecated (e.g. ``("--threads",)``)."""
    kind = click.IntRange(1, maximum)
    decorators = [click.option("-j", "--jobs", "jobs", type=kind, default=default, show_default=show_default,
                               metavar="N", help=help)]
    if old:
        decorators.append(deprecated_alias("jobs", "-j/--jobs", *old, type=kind, default=None))
    return _shared(*decorators)


def dry_run_option(help: str, *, old: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Any]:
    """``-n/--dry-run``: change nothing, say what would change; passed as ``dry_run``."""
    decorators = [click.option("-n", "--dry-run", "dry_run", is_flag=True, help=help)]
    if old:
        decorators.append(deprecated_alias("dry_run", "-n/--dry-run", *old, is_flag=True))
    return _shared(*decorators)


def filter_options(include_help: str, exclude_help: str) -> Callable[[Callable[..., Any]], Any]:
    """``--include GLOB`` / ``--exclude GLOB`` (repeatable; exclude wins), passed as ``include``
    and ``exclude``; ``--glob`` is the deprecated spelling of ``--include``.  The glob rules
    are the one set of :mod:`manyfiles._core.glob`."""
    return _shared(
        click.option("--include", "include", multiple=True, metavar="GLOB", help=include_help),
        deprecated_alias("include", "--include", "--glob", multiple=True, metavar="GLOB"),
        click.option("--exclude", "exclude", multiple=True, metavar="GLOB", help=exclude_help),
    )


def json_option(help: str) -> Callable[[Callable[..., Any]], Any]:
    """``--json``: JSON lines on stdout (records, then one ``{"event": "summary", ...}``), as
    ``as_json``."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def quiet_option(help: str = "Nothing on stderr but errors (no progress, no summary).") \
        -> Callable[[Callable[..., Any]], Any]:
    """``-q/--quiet``, passed as ``quiet``."""
    return click.option("-q", "--quiet", "quiet", is_flag=True, help=help)


def memo_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--no-memo``, passed as ``memo`` (True unless given): the checksum memo of a comparison by
    checksum (docs/s3push.md "The checksum memo")."""
    return click.option("--no-memo", "memo", is_flag=True, flag_value=False, default=True,
                        help="Read and hash every file compared by checksum: do not trust the checksum "
                             "memo ($XDG_STATE_HOME/manyfiles/checksums) for files unchanged since they "
                             "were hashed.")(fn)


def progress_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--progress/--no-progress``, passed as ``progress``: True, False or None (auto: see
    :func:`resolve_progress`)."""
    return click.option("--progress/--no-progress", "progress", default=None,
                        help="Live progress on stderr: a bar on a terminal, a line every 5 s in a log "
                             "[default: on when stderr is a terminal, unless --json or -q].")(fn)


def resolve_progress(flag: bool | None, *, quiet: bool = False, as_json: bool = False,
                     isatty: Callable[[], bool] | None = None) -> bool:
    """The ``progress=`` a verb passes to the library.  An explicit ``--progress`` or
    ``--no-progress`` wins; the default (``flag`` None) is on when stderr is a terminal and
    neither ``--json`` nor ``-q`` was given."""
    if flag is not None:
        return flag
    if quiet or as_json:
        return False
    tty = isatty if isatty is not None else _stderr_isatty
    return tty()


def _stderr_isatty() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


def files_from_option(help: str, *, old: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Any]:
    """``--files-from FILE|-``: names one a line (or NUL-terminated, detected), ``-`` = stdin;
    passed as ``files_from`` (read with :func:`manyfiles._core.files_from.read_names`)."""
    kind = click.Path(exists=True, dir_okay=False, allow_dash=True)  # a missing list: usage error, exit 2
    decorators = [click.option("--files-from", "files_from", type=kind, default=None, metavar="FILE|-",
                               help=help)]
    if old:
        decorators.append(deprecated_alias("files_from", "--files-from", *old, type=kind, default=None))
    return _shared(*decorators)


def echo_json(record: dict[str, Any]) -> None:
    """One JSON line on stdout."""
    click.echo(json.dumps(record, ensure_ascii=False, default=str))


def echo_summary_json(report: Any, **extra: Any) -> None:
    """The last ``--json`` line of a verb: ``{"event": "summary", ...report.to_dict()}``."""
    echo_json({"event": "summary", **report.to_dict(), **extra})


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


def timeout_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``--connect-timeout``, ``--read-timeout`` and ``--stall-timeout`` (seconds), passed as
    ``connect_timeout``, ``read_timeout`` and ``stall_timeout``: the S3 verbs' network timeouts
    (``ClientSettings``) and the retry policy's stall timeout (docs/s3pull.md, "Network errors
    and stalls")."""
    from manyfiles._core.retry import CONNECT_TIMEOUT, READ_TIMEOUT, RetryPolicy

    seconds = click.FloatRange(min=0, min_open=True)
    return _shared(
        click.option("--connect-timeout", type=seconds, default=CONNECT_TIMEOUT, show_default=True,
                     metavar="SECONDS", help="Seconds a connection to the endpoint may take."),
        click.option("--read-timeout", type=seconds, default=READ_TIMEOUT, show_default=True,
                     metavar="SECONDS", help="Seconds an answer may keep us waiting for its next byte."),
        click.option("--stall-timeout", type=seconds, default=RetryPolicy.stall_timeout, show_default=True,
                     metavar="SECONDS",
                     help="Stop (exit 1) when nothing has moved for this long; until then network errors "
                          "are retried (an endpoint that never answered: half as long)."),
    )(fn)


def aws_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The S3 connection options of the verbs that talk to a bucket (s3pull, check), passed as
    ``aws_profile``, ``region``, ``endpoint_url``, ``path_style`` and ``no_sign_request``."""
    return _shared(
        click.option("--aws-profile", default=None, metavar="NAME",
                     help="AWS credentials profile (as AWS_PROFILE)."),
        click.option("--region", default=None, help="AWS region (default: from the profile/environment)."),
        click.option("--endpoint-url", default=None, metavar="URL",
                     help="Custom S3 endpoint (default: $AWS_ENDPOINT_URL); implies path-style addressing."),
        click.option("--path-style/--virtual-style", "path_style", default=None,
                     help="Force the addressing style (default: path-style iff a custom endpoint is set)."),
        click.option("--no-sign-request", is_flag=True, help="Anonymous requests (public buckets)."),
    )(fn)


def s3_connection(*, aws_profile: str | None, region: str | None, endpoint_url: str | None,
                  path_style: bool | None, no_sign_request: bool, connect_timeout: float, read_timeout: float,
                  stall_timeout: float, retries: int) -> tuple[Any, Any]:
    """``(ClientSettings, RetryPolicy)`` of an S3 verb's options (:func:`aws_options`,
    :func:`timeout_options`, ``--retries``; the backoff base from ``MANYFILES_RETRY_BASE``)."""
    from manyfiles.s3 import ClientSettings, RetryPolicy

    settings = ClientSettings(profile=aws_profile, region=region, endpoint_url=endpoint_url,
                              no_sign=no_sign_request, path_style=path_style, connect_timeout=connect_timeout,
                              read_timeout=read_timeout)
    base = retry_base()
    retry = RetryPolicy(attempts=retries + 1, base=RetryPolicy.base if base is None else base,
                        stall_timeout=stall_timeout)
    return settings, retry


#: a documented setting (docs/cli.md): the base of s3pull's and the cache's S3 retry backoff
ENV_RETRY_BASE = "MANYFILES_RETRY_BASE"


def retry_base() -> float | None:
    """Seconds from ``MANYFILES_RETRY_BASE``, or None when it is unset (RetryPolicy's own base).

    The first retry waits up to this long (full jitter), each next one up to twice as long, capped.
    A value that is not a number >= 0 is a usage error, before anything runs.
    """
    text = os.environ.get(ENV_RETRY_BASE, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"{ENV_RETRY_BASE}={text!r}: expected a number of seconds >= 0")
    return value


def fail(prog: str, message: str, code: int = EXIT_FAILED) -> None:
    """Print ``prog: message`` on stderr and exit with ``code``."""
    click.echo(f"{prog}: {message}", err=True)
    sys.exit(code)


def version_option(prog: str) -> Callable[[Callable[..., Any]], Any]:
    """``--version``: ``PROG, version X.Y.Z`` (every entry point has it)."""
    return click.version_option(__version__, "--version", prog_name=prog,
                                message="%(prog)s, version %(version)s")


# -- errors: one line each, one exit code table --------------------------------------------------------


def exit_code(exc: BaseException) -> int:
    """The exit code for an exception that ends a command (the table in docs/cli.md).

    A manyfiles error carries its class's code (``UsageError`` and its ``MissingExtra`` and
    ``WrongKind``: 2; everything else: 1); click's usage errors are 2; Ctrl-C is 130; an OSError
    that no library boundary converted counts as its :func:`~manyfiles.errors.from_oserror` class.
    """
    if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
        return EXIT_INTERRUPTED
    if isinstance(exc, click.UsageError):
        return EXIT_USAGE
    if isinstance(exc, click.ClickException):
        return exc.exit_code
    if isinstance(exc, ManyfilesError):
        return exc.exit_code
    if isinstance(exc, OSError):
        return from_oserror(exc).exit_code
    return EXIT_FAILED


def error_line(prog: str, exc: BaseException) -> str:
    """The one stderr line for an exception that ends a command (no usage block, no traceback)."""
    if isinstance(exc, (KeyboardInterrupt, click.exceptions.Abort)):
        return f"{prog}: interrupted"
    if isinstance(exc, click.UsageError):
        where = exc.ctx.command_path if exc.ctx is not None else prog
        return f"{prog}: {_first_line(exc.format_message())} (see '{where} --help')"
    if isinstance(exc, click.ClickException):
        return f"{prog}: {_first_line(exc.format_message())}"
    if isinstance(exc, OSError) and not isinstance(exc, ManyfilesError):
        return f"{prog}: {from_oserror(exc)}"
    return f"{prog}: {_first_line(str(exc))}"


def _first_line(text: str) -> str:
    return " ".join(text.split()) or "error"


def run_main(command: click.Command, prog: str) -> None:
    """Run a click command as a standalone script: its exit code, or one ``prog: message`` line on
    stderr and the code of :func:`exit_code` (a usage error: 2, with no usage block)."""
    quiet_library_logs()
    try:
        # click's main() without its error handling (which prints usage blocks, and a blank line
        # before an Abort): the callback's value is our commands' exit code
        with command.make_context(prog, sys.argv[1:]) as ctx:
            code = command.invoke(ctx)
    except BrokenPipeError:
        # `s3pull --json | head -1`: the reader went away before the end; the verb stopped there
        exit_closed_output()
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, click.ClickException, click.exceptions.Abort, ManyfilesError) as exc:
        _exit_with(prog, exc)
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            exit_closed_output()
        # a disk or permission error no library boundary converted: still one line, no traceback
        _exit_with(prog, exc)
    try:
        sys.stdout.flush()      # the last of the output: a reader gone by now still means 141
    except BrokenPipeError:
        exit_closed_output()
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def quiet_library_logs() -> None:
    """Log records of the libraries we call go nowhere: a command's stderr is its own lines (one
    per error).  Without this, a Dask client that loses its scheduler logs a traceback there
    (``distributed`` adds its stderr handler only when the root logger has none)."""
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


def _exit_with(prog: str, exc: BaseException) -> None:
    with contextlib.suppress(OSError):  # stderr itself may be gone
        click.echo(error_line(prog, exc), err=True)
    sys.exit(exit_code(exc))


#: the settings of every group: ``shard`` alone is a usage error ("Missing command", exit 2) with
#: any click version (click 8.2 made a bare group print its help and exit 2, 8.1 exit 0)
GROUP_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}
GROUP_OPTIONS: dict[str, Any] = {"no_args_is_help": False, "context_settings": GROUP_SETTINGS}


def echo_failures(prog: str, failures: Iterable[Any], show: Callable[[str], str] | None = None) -> None:
    """Every failure (``path``, ``reason``, ``code``) on stderr, a long run of one kind shortened
    (:class:`~manyfiles.errors.FailureLines`); ``show`` makes a path printable."""
    for line in FailureLines(prog).lines(failures, show):
        click.echo(line, err=True)


class Directory(click.ParamType):
    """A directory argument: a path that, if it exists, is a directory.  A file there is a usage
    error (``WrongKind``: ``prog: PATH: Not a directory``, exit 2) before anything runs; whether
    it exists and may be read is the library's to find (exit 1), as for every path a verb acts on.
    The empty path names nothing (not the current directory): ``prog: '': No such file or
    directory``, exit 1, before anything runs."""

    name = "directory"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from manyfiles.errors import NotFound, WrongKind, shown

        path = os.fsdecode(value)
        if not path:
            raise NotFound(f"{shown(path)}: {os.strerror(errno.ENOENT)}")
        if os.path.exists(path) and not os.path.isdir(path):
            raise WrongKind(f"{shown(path)}: {os.strerror(errno.ENOTDIR)}")
        return path


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
