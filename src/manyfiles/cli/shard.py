"""``shard``: move a flat folder into a hashed prefix tree (ab/cd/<name>) in place, and back.

\b
Examples:
    shard apply /data/images --plan --csv moves.csv   # what would move where; nothing moves
    shard apply /data/images --workers 4              # flat -> ab/cd/<name>, resumable after kill -9
    shard apply /data/objects --key prefix --levels 2 # names are already hashes: git-style 3f/3f2a...
    shard verify /data/images                         # every file where its hash says?
    shard status /data/images                         # layout, interrupted migration, estimated count
    shard reshard /data/images --levels 1             # change the layout (revert + apply, resumable)
    shard revert /data/images                         # tree -> flat
    shard apply /nfs/images --cluster tcp://sched:8786 # top buckets moved by Dask workers
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from manyfiles import shard as mig
from manyfiles._report import Failure
from manyfiles.cli._common import cluster_option, echo_cluster, instrumented, run_main
from manyfiles.shard import HASHES, KEYS, Layout, parse_levels

PROG = "shard"
_SHOW = 10  # items of each kind listed before "... and N more"


def _show(name: bytes | str) -> str:
    """A printable name: non-UTF-8 bytes as \\xNN, newlines escaped."""
    raw = os.fsencode(name)
    return raw.decode("utf-8", "backslashreplace").replace("\n", "\\n")


def _layout(levels: str | None, hash_: str | None, key: str | None) -> Layout | None:
    if levels is None and hash_ is None and key is None:
        return None
    return Layout(levels=parse_levels(levels or "2:2"), hash=hash_ or "md5", key=key or "hash")


def _warn_list(title: str, items: list[Any], root: str) -> None:
    for item in items[:_SHOW]:
        if isinstance(item, tuple):
            name, why = item
            click.echo(f"{PROG}: {_show(os.path.join(os.fsencode(root), name))}: {why}", err=True)
        else:
            click.echo(f"{PROG}: {_show(os.path.join(os.fsencode(root), item))}: {title}", err=True)
    if len(items) > _SHOW:
        click.echo(f"{PROG}: ... and {len(items) - _SHOW} more ({title})", err=True)


def _warn_failures(failures: list[Failure]) -> None:
    """One ``shard: PATH: reason`` line per failure, at most _SHOW of each kind (code)."""
    shown: dict[str, int] = {}
    for f in failures:
        shown[f.code] = shown.get(f.code, 0) + 1
        if shown[f.code] <= _SHOW:
            click.echo(f"{PROG}: {_show(f.path)}: {f.reason}", err=True)
    for code, n in shown.items():
        if n > _SHOW:
            click.echo(f"{PROG}: ... and {n - _SHOW:,} more ({code or 'error'})", err=True)


def _report(rep: mig.MigrationReport, quiet: bool) -> int:
    """Exit 0 when everything found was moved (files created after the last rescan and left
    flat are a warning, named with their count); 1 when something failed or is in the way."""
    _warn_list("left in place", rep.skipped, rep.root)
    _warn_failures(rep.failures)
    if rep.left_flat:
        click.echo(f"{PROG}: {rep.root}: {rep.left_flat:,} files were created during the run and left flat; "
                   f"run `shard apply {rep.root}` again to move them", err=True)
    if not quiet:
        click.echo(rep.summary())
        echo_cluster(PROG, rep)
    return 0 if rep.ok else 1


def _progress(quiet: bool) -> bool:
    return not quiet and sys.stderr.isatty()


_levels_opt = click.option("--levels", default=None, metavar="W[:W...]",
                           help="Characters per directory level, e.g. 2:2 (default), 1, 2:2:2, 1:2.")
_hash_opt = click.option("--hash", "hash_", type=click.Choice(HASHES), default=None,
                         help="Hash of the name's bytes that picks the buckets (default md5).")
_key_opt = click.option("--key", type=click.Choice(KEYS), default=None,
                        help="'prefix': use the name's own first characters (names that are hashes/UUIDs).")
_workers_opt = click.option("--workers", "-w", type=click.IntRange(1, 256), default=None,
                            help="Parallel workers, each owning whole top buckets "
                                 "[default: 1 on tmpfs, 4 elsewhere].")
_quiet_opt = click.option("--quiet", "-q", is_flag=True, help="No summary line and no progress bar.")
_dir_arg = click.argument("directory", type=click.Path(file_okay=False, path_type=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__)
def command() -> None:
    pass


@command.command()
@_dir_arg
@_levels_opt
@_hash_opt
@_key_opt
@_workers_opt
@click.option("--plan", "dry_run", is_flag=True, help="Dry run: counts per bucket; nothing is moved.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None,
              help="With --plan: write the moves (source,destination) to this CSV file.")
@_quiet_opt
@cluster_option
@instrumented
def apply(directory: str, levels: str | None, hash_: str | None, key: str | None, workers: int | None,
          dry_run: bool, csv_path: str | None, quiet: bool, cluster: str | None) -> int:
    """Move the files of flat DIRECTORY into its hashed tree, in place (resumable)."""
    layout = _layout(levels, hash_, key)
    if dry_run:
        if cluster:
            raise click.UsageError("--plan lists on this machine; drop --cluster")
        return _plan(directory, layout, csv_path)
    if csv_path:
        raise click.UsageError("--csv needs --plan")
    rep = mig.apply(directory, layout, workers=workers, progress=_progress(quiet), cluster=cluster)
    return _report(rep, quiet)


def _plan(directory: str, layout: Layout | None, csv_path: str | None) -> int:
    p = mig.plan(directory, layout)
    s = p.stats
    click.echo(f"plan for {p.root} ({p.layout.describe()}):")
    click.echo(f"  files to move        {len(p.moves):,}")
    click.echo(f"  buckets              {s.buckets:,} (files per bucket: min {s.min}, max {s.max}, "
               f"mean {s.mean:.1f}, stddev {s.stddev:.1f})")
    if p.per_bucket:
        fullest = sorted(p.per_bucket.items(), key=lambda kv: -kv[1])[:3]
        click.echo("  fullest buckets      " + ", ".join(f"{_show(b)} ({n})" for b, n in fullest))
    if p.collisions:
        click.echo(f"  named like a bucket  {len(p.collisions):,} (set aside first, then moved)")
    if p.skipped:
        click.echo(f"  left in place        {len(p.skipped):,}")
    if csv_path:
        p.write_csv(csv_path)
        click.echo(f"  moves written to     {csv_path}")
    if p.blocking:
        names = ", ".join(_show(b) for b in p.blocking[:_SHOW])
        click.echo(f"{PROG}: {p.root}: subdirectories named like buckets ({names}): apply would refuse",
                   err=True)
        return 1
    return 0


@command.command()
@_dir_arg
@_workers_opt
@_quiet_opt
@cluster_option
@instrumented
def revert(directory: str, workers: int | None, quiet: bool, cluster: str | None) -> int:
    """Move every file of the tree back into DIRECTORY and remove the buckets (resumable)."""
    rep = mig.revert(directory, workers=workers, progress=_progress(quiet), cluster=cluster)
    return _report(rep, quiet)


@command.command()
@_dir_arg
@_levels_opt
@_hash_opt
@_key_opt
@_workers_opt
@_quiet_opt
@cluster_option
@instrumented
def reshard(directory: str, levels: str | None, hash_: str | None, key: str | None, workers: int | None,
            quiet: bool, cluster: str | None) -> int:
    """Change the layout of sharded DIRECTORY (revert + apply as one resumable operation)."""
    rep = mig.reshard(directory, _layout(levels, hash_, key), workers=workers, progress=_progress(quiet),
                      cluster=cluster)
    return _report(rep, quiet)


@command.command()
@_dir_arg
@click.option("--expect", type=int, default=None, help="Also fail unless exactly this many files are found.")
@instrumented
def verify(directory: str, expect: int | None) -> int:
    """Check that every file sits where its name says: no strays, temp files or duplicates."""
    rep = mig.verify(directory, expected=expect, progress=_progress(False))
    _warn_failures(rep.failures)
    _warn_list("directory that is not a bucket (left alone)", rep.foreign, rep.root)
    click.echo(rep.summary())
    return 0 if rep.ok else 1


@command.command()
@_dir_arg
@instrumented
def status(directory: str) -> int:
    """Layout, any interrupted migration, files left at the top, estimated file count."""
    st = mig.status(directory)
    click.echo(f"directory        {st.root}")
    click.echo(f"layout           {st.layout.describe() if st.layout else 'not sharded'}")
    click.echo(f"top-level files  {st.flat_files:,}")
    if st.layout:
        click.echo(f"files (est.)     ~{st.estimate:,}")
    if st.journal:
        op = st.journal.get("op")
        total = st.journal.get("total")
        of = f" of {total:,}" if isinstance(total, int) else ""
        state = (f"running (pid {st.running_pid})" if st.running_pid
                 else f"interrupted: run `shard {op} {st.root}` to finish")
        click.echo(f"migration        {op}, {st.done:,}{of} files done, {state}")
    return 0


def main() -> None:
    run_main(command, PROG)
