"""Options and error handling shared by every command.

``instrumented`` adds ``--profile-out FILE`` (viztracer) and ``--trace FILE`` (I/O
operation log) to a command; the shared option set (``-j/--jobs``, ``-n/--dry-run``,
``--include/--exclude``, ``--json``, ``-q``, ``--progress/--no-progress``, ``--files-from``)
is one decorator each here, with :func:`deprecated_alias` for the spellings they replace
(docs/cli.md); ``run_main`` maps manyfiles errors to one-line
messages and exit codes the same way for every standalone script.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from manyfiles._units import parse_size
from manyfiles.errors import ManyfilesError


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
    :func:`deprecation_line` once on stderr.  Both spellings with different values are a usage
    error (a ``multiple=True`` option collects both instead).  ``attrs``: the click attributes of the
    old option (its type, ``is_flag``, ``multiple``...), usually the new one's."""
    key = f"{name}__{decls[-1].lstrip('-').replace('-', '_')}"
    old = "/".join(decls)

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if ctx.get_parameter_source(param.name or "") in _GIVEN:
            click.echo(deprecation_line(prog_name(ctx), old, new), err=True)
        return value

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(key)
            ctx = click.get_current_context()
            if ctx.get_parameter_source(key) in _GIVEN:
                if attrs.get("multiple"):
                    kwargs[name] = (*kwargs[name], *value)
                elif ctx.get_parameter_source(name) in _GIVEN and kwargs[name] != value:
                    raise click.UsageError(f"{old} and {new} mean the same: give {new} only")
                else:
                    kwargs[name] = value
            return fn(*args, **kwargs)

        return click.option(*decls, key, hidden=True, expose_value=True, callback=warn, **attrs)(wrapper)

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
    are the one set of :mod:`manyfiles._glob`."""
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
    passed as ``files_from`` (read with :func:`manyfiles._files_from.read_names`)."""
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
