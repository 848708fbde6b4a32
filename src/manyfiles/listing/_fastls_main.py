"""The ``fastls`` console script: its most common invocations without importing click.

``find /usr`` takes ~0.13 s on a warm tree of 150k entries, and importing click (with
typing, inspect, ...) takes ~20 ms of that budget.  So ``fastls [-r] [-c] [-0] [--json]
PATH...`` (the flags as separate words, paths that do not start with ``-``) is parsed here
and run directly; any other argument list (``--help``, other options, usage errors), and a
run whose default progress display is on (stderr a terminal; stdout not, or a count), goes to the click
command in :mod:`manyfiles.cli.ls`, which stays the reference: a test checks that
both parse every fast form to the same request.
"""

from __future__ import annotations

import os
import sys

# flag -> (ListRequest field, value); the long and short spellings of manyfiles.cli.ls
FAST_FLAGS: dict[str, tuple[str, object]] = {
    "-r": ("recursive", True),
    "--recursive": ("recursive", True),
    "-c": ("count_only", True),
    "--count": ("count_only", True),
    "-0": ("sep", b"\0"),
    "--null": ("sep", b"\0"),
    "--json": ("format", "json"),
}


def parse_fast(argv: list[str]) -> dict[str, object] | None:
    """ListRequest fields for a fast-path argument list, or None (then click parses it)."""
    fields: dict[str, object] = {}
    paths: list[str] = []
    for arg in argv:
        if arg in FAST_FLAGS:
            name, value = FAST_FLAGS[arg]
            fields[name] = value
        elif arg.startswith("-") or not arg:
            return None
        else:
            paths.append(arg)
    fields["paths"] = tuple(paths) or (".",)
    return fields


def main() -> None:
    """Entry point of the ``fastls`` script."""
    fields = parse_fast(sys.argv[1:])
    from manyfiles.listing._fastls_core import progress_fits

    if fields is not None and fields.get("format") != "json" and progress_fits(
            bool(fields.get("count_only")), os.isatty(2), os.isatty(1)):
        fields = None  # the default progress display is on: the click command renders it
    if fields is not None:
        from manyfiles import listing

        if listing.default_backend() != "dents":
            fields = None  # no C core: the click command says so (and it is no fast path anyway)
    if fields is None:
        from manyfiles.cli.ls import main as click_main

        click_main()
        return
    from manyfiles._core.checkpoints import reached as checkpoint
    from manyfiles.listing import _fastls_core as fastls  # the job without the report (no dataclasses import)

    request = fastls.ListRequest(**fields)  # type: ignore[arg-type]
    try:
        checkpoint("command")  # as every command, once parsed (cli._common.run_main's commands)
        report = fastls.list_to(request, sys.stdout.fileno())
        if request.count_only:
            lines = fastls.count_lines(report, len(request.paths) > 1, request.format == "json")
            out = "".join(line + "\n" for line in lines)
            sys.stdout.buffer.write(os.fsencode(out))
            sys.stdout.flush()
    except BrokenPipeError:  # `fastls | head`: stopped before the end (as cli._common.run_main)
        from manyfiles._core.exits import exit_closed_output

        exit_closed_output()
    except KeyboardInterrupt:
        print("fastls: interrupted", file=sys.stderr)
        sys.exit(130)
    for line in fastls.failure_lines(report):
        print(line, file=sys.stderr)
    sys.exit(fastls.exit_code(report, request.paths))
