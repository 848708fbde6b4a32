"""``fastrm`` / ``manyfiles rm``: parallel deletion, one worker per directory.

Examples:
    fastrm /scratch/run-42                       remove the tree (8 workers)
    fastrm -j 32 /nfs/scratch/old                more workers for a high-latency file system
    fastrm -n -o - /scratch/run-42               print what would be removed
    fastrm --include '*.tmp' --exclude keep /data   remove matching entries only; /data stays
    find /scratch -name 'ckpt-*' -print0 | fastrm --files-from -   remove what find found
    fastrm --force-root /mnt/scratch             empty a mount root (the mount point stays)

Symlinks are never followed (``link`` and ``link/`` remove the link).  ``/`` is always
refused, a mount root without ``--force-root`` too.  Exit status (docs/cli.md): 0 everything
removed, 1 something could not be removed (a missing or unreadable PATH too; one
``fastrm: PATH: reason`` line each, a long run of one kind shortened, then the summary; the
rest is still removed), 2 usage error or refused argument (``FILE/``: not a directory),
130 interrupted.
"""

from __future__ import annotations

import contextlib
import sys
from typing import BinaryIO

import click

from manyfiles.cli._common import (
    cluster_option,
    dry_run_option,
    echo_cluster,
    echo_failures,
    echo_summary_json,
    files_from_option,
    filter_options,
    instrumented,
    jobs_option,
    json_option,
    prog_name,
    progress_option,
    quiet_option,
    resolve_progress,
    run_main,
    version_option,
)
from manyfiles.errors import FailureLines

EPILOG = """\b
Examples:
  fastrm /scratch/run-42                 remove the tree (8 workers)
  fastrm -j 32 /nfs/scratch/old          more workers for a high-latency disk
  fastrm -n -o - /scratch/run-42         print what would be removed
  fastrm --include '*.tmp' --exclude keep /data
                                         remove matching entries; /data stays
  find /scratch -name 'ckpt-*' -print0 | fastrm --files-from -
                                         remove what find found
  fastrm --force-root /mnt/scratch       empty a mount root (the mount point
                                         stays)
  fastrm --cluster tcp://sched:8786 /nfs/old
                                         subtrees removed by Dask workers,
                                         then the top

\b
Symlinks are never followed ('link' and 'link/' remove the link). '/' is
always refused. In a sharded tree (see 'shard --help') .manyfiles-shard.json,
the layout record, is one of the files removed, and counted in the "would
remove" line.
Exit: 0 all removed; 1 something could not be removed, PATH missing or not
readable (one 'fastrm: PATH: reason' line each, a long run shortened, then
the summary; the rest is still removed); 2 usage error or refused argument
('FILE/': not a directory); 130 interrupted; 141 the output (-o -) was
closed before the end.
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@version_option("fastrm")
@click.argument("paths", nargs=-1, type=click.Path(readable=False))  # the removal finds what it cannot read
@dry_run_option("Remove nothing; count (and with -o list) what would go.")
@filter_options(
    "Only remove entries matching GLOB (name, or relative path if it has '/'); a matching directory goes "
    "whole; PATH itself stays. Repeatable.",
    "Keep entries matching GLOB (a kept directory is not entered). Repeatable.",
)
@files_from_option("Also remove the paths listed in FILE, one a line or NUL-terminated ('-': stdin).")
@jobs_option("Worker threads; each owns one directory at a time.", default=8, maximum=1024,
             old=("--workers",))
@progress_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default=None,
    help="Write every removed path to FILE ('-' for stdout), one per line.",
)
@click.option("-0", "--null", is_flag=True, help="With --output: end each path with NUL instead of newline.")
@click.option(
    "--force-root",
    is_flag=True,
    help="Allow a mount root: empty it, keep the mount point. '/' is refused regardless.",
)
@click.option("--cross-mounts", is_flag=True, help="Descend into file systems mounted inside the tree.")
@click.option(
    "--retries",
    type=click.IntRange(0, 100),
    default=5,
    show_default=True,
    help="Re-clean and retry a directory that is not empty (concurrent writer, NFS .nfsXXXX).",
)
@click.option("-f", "--force", "missing_ok", is_flag=True, help="Ignore PATHs that do not exist (rm -f).")
@click.option("-v", "--verbose", is_flag=True, help="Print a summary line on stderr.")
@quiet_option("Nothing on stderr but errors (no progress, no dry-run summary).")
@json_option("JSON lines on stdout: one summary object (counts and failures) at the end.")
@cluster_option
@instrumented
def command(
    paths: tuple[str, ...],
    dry_run: bool,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    files_from: str | None,
    jobs: int,
    progress: bool | None,
    output: str | None,
    null: bool,
    force_root: bool,
    cross_mounts: bool,
    retries: int,
    missing_ok: bool,
    verbose: bool,
    quiet: bool,
    as_json: bool,
    cluster: str | None,
) -> int:
    """Remove PATH(s) and everything below them, in parallel across directories."""
    from manyfiles.remove import remove_tree

    targets: list[str | bytes] = list(paths)
    if files_from is not None:
        from manyfiles._core.files_from import read_names

        targets += read_names(files_from)
    elif not paths:
        raise click.UsageError("give PATH(s) or --files-from")
    if as_json and output == "-":
        raise click.UsageError("--json and -o -: both want stdout; write -o to a file")
    with contextlib.ExitStack() as stack:
        sink: BinaryIO | None = None
        if output is not None:  # written by the removal itself, as it goes
            sink = sys.stdout.buffer if output == "-" else stack.enter_context(open(output, "wb"))
        report = remove_tree(
            targets,
            workers=jobs,
            dry_run=dry_run,
            include=include or None,
            exclude=exclude or None,
            force_root=force_root,
            cross_mounts=cross_mounts,
            missing_ok=missing_ok,
            retries=retries,
            output=sink,
            sep=b"\0" if null else b"\n",
            progress=resolve_progress(progress, quiet=quiet, as_json=as_json),
            cluster=cluster,
        )
    prog = prog_name()
    echo_failures(prog, report.failures)
    if as_json:
        echo_summary_json(report)
    elif (verbose or dry_run or _counts_more(report)) and not quiet:
        # after failures the summary says what was removed all the same, and how many failed
        click.echo(f"{prog}: {report.summary()}{_failed(report)}"
                   f"{'' if include or exclude else _markers(report, targets)}", err=True)
        echo_cluster(prog, report)
    return 0 if report.ok else 1


def _counts_more(report: object) -> bool:
    """Failures are followed by the summary when their lines were shortened (a read-only tree):
    the summary then says what was removed all the same and how many failed in all."""
    return FailureLines.shortens(report.failures)  # type: ignore[attr-defined]


def _failed(report: object) -> str:
    n = len(report.failures)  # type: ignore[attr-defined]
    return f"; {n:,} could not be removed" if n else ""


def _markers(report: object, targets: list[str | bytes]) -> str:
    """A dry run over sharded trees says which of the files it counts is shard's layout record."""
    if not getattr(report, "dry_run", False):
        return ""
    import os

    from manyfiles.shard.sharded_dir import DESCRIPTOR

    n = sum(1 for t in targets if os.path.isfile(os.path.join(os.fsencode(t), DESCRIPTOR)))
    if not n:
        return ""
    what = "a sharded tree" if n == 1 else f"{n} sharded trees"
    return f" (incl. {n} {DESCRIPTOR.decode()}: the layout record of {what}, see 'shard --help')"


def main() -> None:
    """Entry point of the ``fastrm`` script."""
    run_main(command, "fastrm")
