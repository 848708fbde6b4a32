"""``fastrm`` / ``manyfiles rm``: parallel deletion, one worker per directory.

Examples:
    fastrm /scratch/run-42                       remove the tree (8 workers)
    fastrm -j 32 --progress /nfs/scratch/old     more workers for a high-latency file system
    fastrm --dry-run -o - /scratch/run-42        print what would be removed
    fastrm --glob '*.tmp' --exclude keep /data   remove matching entries only; /data stays
    fastrm --force-root /mnt/scratch             empty a mount root (the mount point stays)

Symlinks are never followed (``link`` and ``link/`` remove the link).  ``/`` is always
refused, a mount root without ``--force-root`` too.  Exit status: 0 everything removed,
1 something could not be removed (each one reported as ``fastrm: PATH: reason``; the
rest is still removed), 2 usage error or refused argument, 130 interrupted.
"""

from __future__ import annotations

import contextlib
import sys
from typing import BinaryIO

import click

from manyfiles.cli._common import cluster_option, echo_cluster, instrumented, run_main


def _show(path: str) -> str:
    """One printable line for any path: control characters and undecodable bytes escaped."""
    out = []
    for ch in path:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape'd byte from a non-UTF-8 name
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 32 or code == 127:
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{code:02x}"))
        elif ch == "\\":
            out.append("\\\\")
        else:
            out.append(ch)
    return "".join(out)


EPILOG = """\b
Examples:
  fastrm /scratch/run-42                      remove the tree (8 workers)
  fastrm -j 32 --progress /nfs/scratch/old    more workers for a high-latency file system
  fastrm -n -o - /scratch/run-42              print what would be removed
  fastrm --glob '*.tmp' --exclude keep /data  remove matching entries only; /data stays
  fastrm --force-root /mnt/scratch            empty a mount root (the mount point stays)
  fastrm --cluster tcp://sched:8786 /nfs/old  subtrees removed by Dask workers, then the top

\b
Symlinks are never followed ('link' and 'link/' remove the link). '/' is always refused.
Exit: 0 all removed, 1 something could not be removed (one 'fastrm: PATH: reason' line
each; the rest is still removed), 2 usage error or refused argument, 130 interrupted.
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("paths", nargs=-1, required=True, type=click.Path())
@click.option("-n", "--dry-run", is_flag=True, help="Remove nothing; count (and with -o list) what would go.")
@click.option(
    "--glob",
    "include",
    multiple=True,
    metavar="PATTERN",
    help="Only remove entries matching PATTERN (name, or relative path if it has '/'); "
    "a matching directory goes whole; PATH itself stays. Repeatable.",
)
@click.option(
    "--exclude",
    multiple=True,
    metavar="PATTERN",
    help="Keep entries matching PATTERN (a kept directory is not entered). Repeatable.",
)
@click.option(
    "-j",
    "--workers",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Worker threads; each owns one directory at a time.",
)
@click.option("--progress", is_flag=True, help="Progress bar with rate and ETA (only on a terminal).")
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
@cluster_option
@instrumented
def command(
    paths: tuple[str, ...],
    dry_run: bool,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    workers: int,
    progress: bool,
    output: str | None,
    null: bool,
    force_root: bool,
    cross_mounts: bool,
    retries: int,
    missing_ok: bool,
    verbose: bool,
    cluster: str | None,
) -> int:
    """Remove PATH(s) and everything below them, in parallel across directories."""
    from manyfiles.remove import remove_tree

    with contextlib.ExitStack() as stack:
        sink: BinaryIO | None = None
        if output is not None:  # written by the removal itself, as it goes
            sink = sys.stdout.buffer if output == "-" else stack.enter_context(open(output, "wb"))
        report = remove_tree(
            list(paths),
            workers=workers,
            dry_run=dry_run,
            include=include or None,
            exclude=exclude or None,
            force_root=force_root,
            cross_mounts=cross_mounts,
            missing_ok=missing_ok,
            retries=retries,
            output=sink,
            sep=b"\0" if null else b"\n",
            progress=progress and sys.stderr.isatty(),
            cluster=cluster,
        )
    prog = click.get_current_context().find_root().info_name or "fastrm"
    for f in report.failures:
        click.echo(f"{prog}: {_show(f.path)}: {f.reason}", err=True)
    if verbose or dry_run:
        click.echo(f"{prog}: {report.summary()}", err=True)
        echo_cluster(prog, report)
    return 0 if report.ok else 1


def main() -> None:
    """Entry point of the ``fastrm`` script."""
    run_main(command, "fastrm")
