"""``fastls``: list huge directories fast (getdents64 with a 1 MiB buffer)."""

from __future__ import annotations

import os
import sys

import click

from manyfiles import fastls, listing
from manyfiles._core import native as _native
from manyfiles.cli._common import (
    Directory,
    Size,
    cluster_option,
    files_from_option,
    filter_options,
    instrumented,
    jobs_option,
    prog_name,
    progress_option,
    quiet_option,
    resolve_progress,
    run_main,
    version_option,
)
from manyfiles.listing.fastls import exit_code, failure_lines, progress_fits

EPILOG = """\b
Examples:
  fastls /data/flat                 names, unsorted, as the kernel gives them
  fastls --count /data/flat         count without creating a name per entry
  fastls -r --type f -0 /data | xargs -0 ...
  fastls -r --json --long /data     a JSON object per entry, with size, mtime
  fastls --include '*.jpg' --exclude 'tmp*' /data/flat
  find /data -name 'run-*' -print0 | fastls -c --files-from -
                                    count inside each folder find listed
  fastls -r -c --cluster tcp://sched:8786 /nfs/data   count on a Dask cluster

Exit status: 0 if every path was listed; 1 if some could not be (missing, no
permission: one 'fastls: PATH: reason' line each, a long run shortened); 2 on a
usage error or a PATH that is not a directory (the other PATHs are still listed);
130 interrupted; 141 the output was closed before the end ('| head'). A sharded
tree's .manyfiles-shard.json is listed and counted like any other file (see
'shard --help').
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@version_option("fastls")
@click.argument("paths", nargs=-1, type=click.Path(path_type=str, readable=False))  # unreadable: exit 1
@click.option("-r", "--recursive", is_flag=True, help="List subdirectories too (in parallel).")
@click.option("--max-depth", type=click.IntRange(min=0), default=None, help="With -r: how deep to go.")
@click.option("-L", "--follow", is_flag=True, help="Follow symlinks to directories (cycles are detected).")
@click.option("-c", "--count", "count_only", is_flag=True, help="Print the number of entries only.")
@click.option("--sort", is_flag=True, help="Sort by name (bytes order). Holds every name in memory.")
@click.option("-0", "--null", is_flag=True, help="End names with NUL instead of newline.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines: path, name, type, inode (+ size, mtime).")
@click.option("-l", "--long", "long_", is_flag=True, help="Show type, size and mtime (one lstat per entry).")
@filter_options("Only names matching GLOB (a relative path if it has '/'; repeatable).",
                "Skip names matching GLOB (repeatable; wins over --include).")
@click.option(
    "--type",
    "types",
    multiple=True,
    type=click.Choice(["f", "d", "l", "b", "c", "p", "s"]),
    help="Only entries of this type (repeatable). Unknown d_type is resolved with fstatat.",
)
@click.option(
    "--bufsize",
    type=Size(minimum=listing.MIN_BUFSIZE),
    default="1M",
    show_default=True,
    help="getdents64 buffer (e.g. 64K, 1M; at least 280 bytes).",
)
@jobs_option("Directories read at once with -r (native threads; more help on a cold disk or NFS).",
             default=listing.DEFAULT_THREADS, old=("--threads",))
@click.option(
    "--backend",
    type=click.Choice(listing.BACKENDS),
    default=None,
    help=f"Listing backend (default: {_native.default_backend_note()}).",
)
@files_from_option("Also list the directories named in FILE, one a line or NUL-terminated ('-': stdin).")
@progress_option
@quiet_option("Nothing on stderr but errors (no progress, no C-core fallback note).")
@cluster_option
@click.option("--parts-dir", type=Directory(), default=None,
              help="With --cluster: where workers write the listing's parts (a folder every worker and this "
                   "machine see; default: a temp folder here, enough for local:N).")
@instrumented
def command(
    paths: tuple[str, ...],
    recursive: bool,
    max_depth: int | None,
    follow: bool,
    count_only: bool,
    sort: bool,
    null: bool,
    as_json: bool,
    long_: bool,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    types: tuple[str, ...],
    bufsize: int,
    jobs: int,
    backend: str | None,
    files_from: str | None,
    progress: bool | None,
    quiet: bool,
    cluster: str | None,
    parts_dir: str | None,
) -> int:
    """List the entries of each directory in PATHS (default: the current directory)."""
    if backend is None and not quiet:
        _native.warn_fallback(click.get_current_context().command_path)
    if files_from is not None:
        from manyfiles._core.files_from import read_names

        paths = (*paths, *map(os.fsdecode, read_names(files_from)))
        if not paths:
            return 0  # an empty list names nothing to list (not the current directory)
    request = build_request(paths, recursive, max_depth, follow, count_only, sort, null, as_json, long_,
                            include, exclude, types, bufsize, jobs, backend)
    def fits() -> bool:
        return progress_fits(count_only, sys.stderr.isatty(), sys.stdout.isatty())

    show = resolve_progress(progress, quiet=quiet, as_json=as_json, isatty=fits)
    report = fastls.run(request, sys.stdout.fileno(), progress=show, cluster=cluster, parts_dir=parts_dir)
    if count_only:
        for line in fastls.count_lines(report, len(request.paths) > 1, request.format == "json"):
            click.echo(line)
    for line in failure_lines(report, prog_name()):
        click.echo(line, err=True)
    return exit_code(report, request.paths)


def build_request(
    paths: tuple[str, ...],
    recursive: bool,
    max_depth: int | None,
    follow: bool,
    count_only: bool,
    sort: bool,
    null: bool,
    as_json: bool,
    long_: bool,
    include: tuple[str, ...],
    exclude: tuple[str, ...],
    types: tuple[str, ...],
    bufsize: int,
    jobs: int,
    backend: str | None,
    **_other: object,
) -> fastls.ListRequest:
    """The options, parsed, as the library's request (also what the click-free fast path must build)."""
    return fastls.ListRequest(
        paths=paths or (".",),
        recursive=recursive,
        max_depth=max_depth,
        follow_symlinks=follow,
        count_only=count_only,
        sort=sort,
        format="json" if as_json else "long" if long_ else "names",
        stat=long_,
        sep=b"\0" if null else b"\n",
        filter=listing.Filter(include=include, exclude=exclude, types="".join(types)),
        bufsize=bufsize,
        threads=jobs,
        backend=backend,
    )


def main() -> None:
    """Entry point of the ``fastls`` script (``manyfiles.listing._fastls_main`` handles the common
    invocations without importing click, and everything else here)."""
    run_main(command, "fastls")
