"""``manyfiles trace``: read the I/O logs written by ``--trace FILE``.

Examples:
    manyfiles trace summary run.mftrace              per-op counts, bytes, latency table
    manyfiles trace summary run.mftrace --json       the same as JSON
    manyfiles trace export --chrome run.mftrace      run.mftrace.json for Perfetto / vizviewer
    manyfiles trace export --chrome run.mftrace --merge profile.json
                                                     add the I/O events to a --profile of the same run

Worker processes' files (``FILE.worker-<pid>``) are merged in automatically.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles.cli._common import GROUP_OPTIONS, echo_json, json_option, run_main

if TYPE_CHECKING:
    from manyfiles.trace import Summary

COLUMNS = ("op", "count", "errors", "entries", "bytes", "ops/s", "throughput", "p50", "p95", "p99", "max",
           "busy")


# a directory: usage error (exit 2); missing or unreadable: found when read (exit 1), as every path
_TRACE_FILE = click.Path(dir_okay=False, readable=False)


@click.group(**GROUP_OPTIONS)
def command() -> None:
    """Summarize or export I/O traces written with --trace."""


@command.command()
@click.argument("files", nargs=-1, required=True, type=_TRACE_FILE)
@json_option("Print the summary as one JSON line.")
@click.option("--no-workers", is_flag=True, help="Do not merge FILE.worker-* files.")
def summary(files: tuple[str, ...], as_json: bool, no_workers: bool) -> int:
    """Per-operation counts, bytes, throughput and latency percentiles of FILE(s)."""
    from manyfiles.trace import load, summarize

    checkpoint("command")  # every command passes here once parsed, before any work
    s = summarize(load(files, workers=not no_workers))
    if as_json:
        echo_json(s.to_dict())
    else:
        _render(s)
    return 0


@command.command()
@click.argument("files", nargs=-1, required=True, type=_TRACE_FILE)
@click.option("--chrome", is_flag=True, default=True, help="Chrome trace-event JSON (the default format).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Output file (default: FIRST_FILE.json, or the --merge profile itself).")
@click.option("--merge", "merge", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Add the I/O events to this viztracer JSON profile (rewritten in place unless -o).")
@click.option("--no-workers", is_flag=True, help="Do not merge FILE.worker-* files.")
def export(files: tuple[str, ...], chrome: bool, output: str | None, merge: str | None,
           no_workers: bool) -> int:
    """Write FILE(s) as Chrome-trace JSON (async events; opens in Perfetto)."""
    from manyfiles.trace import export_chrome, load

    checkpoint("command")
    traces = load(files, workers=not no_workers)
    out = output or merge or f"{files[0]}.json"
    n = export_chrome(traces, out, merge=merge)
    for note in traces.notes:
        click.echo(f"manyfiles trace: {note}", err=True)
    click.echo(f"{n} I/O records -> {out}", err=True)
    return 0


def _ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.1f} µs"


def _render(s: Summary) -> None:
    from rich.console import Console
    from rich.filesize import decimal
    from rich.table import Table

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            # rich exits 1 here; a closed output ends every verb the same way (run_main: 141)
            raise BrokenPipeError

    console = _Console()
    if not console.is_terminal:
        console = _Console(width=150)  # a log file or pipe: no wrapping of the table
    title = (f"I/O trace: {s.records:,} operations, {s.processes} process(es), {s.threads} thread(s), "
             f"{_ns(s.span_ns)}")
    table = Table(title=title, title_justify="left")
    for name in COLUMNS:
        table.add_column(name, justify="left" if name == "op" else "right", no_wrap=True)
    for o in s.ops:
        table.add_row(o.op, f"{o.count:,}", f"{o.errors:,}" if o.errors else "",
                      f"{o.entries:,}" if o.entries else "", decimal(o.bytes) if o.bytes else "",
                      f"{o.ops_per_s:,.0f}", f"{decimal(int(o.bytes_per_s))}/s" if o.bytes else "",
                      _ns(o.p50_ns), _ns(o.p95_ns), _ns(o.p99_ns), _ns(o.max_ns), _ns(o.busy_ns))
    console.print(table)
    for o in s.ops:
        if o.results:
            failed = ", ".join(f"{k} x{v}" for k, v in sorted(o.results.items(), key=lambda kv: -kv[1]))
            console.print(f"{o.op} failures: {failed}", highlight=False)
    if s.dropped:
        console.print(f"[yellow]{s.dropped:,} records dropped[/] (the writer could not keep up, "
                      "or the trace file could not be written)")
    for note in s.notes:
        print(f"manyfiles trace: {note}", file=sys.stderr)


def main() -> None:
    run_main(command, "manyfiles trace")
