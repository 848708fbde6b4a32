"""``shard``: move a flat folder into a hashed prefix tree (ab/cd/<name>) in place, and back.

The group's help is :data:`HELP` (plain text: click prints it as written).
"""

from __future__ import annotations

import functools
import os
from typing import Any

import click

from manyfiles import shard as mig
from manyfiles.cli._common import (
    GROUP_OPTIONS,
    Directory,
    cluster_option,
    dry_run_option,
    echo_cluster,
    echo_failures,
    echo_json,
    echo_summary_json,
    instrumented,
    jobs_option,
    json_option,
    progress_option,
    quiet_option,
    resolve_progress,
    run_main,
    version_option,
)
from manyfiles.errors import shown
from manyfiles.shard import HASHES, KEYS, Layout, parse_levels

HELP = """shard: move a flat folder into a hashed prefix tree (ab/cd/<name>) in place, and back.

\b
Examples:
    shard apply /data/images -n --csv moves.csv
        what would move where (--csv -: on stdout); nothing moves
    shard apply /data/images -j 4
        flat -> ab/cd/<name>, resumable after kill -9
    shard apply /data/objects --key prefix --levels 2
        names are already hashes: git-style 3f/3f2a...
    shard verify /data/images           every file where its hash says?
    shard status /data/images           layout, interrupted migration, count
    shard reshard /data/images --levels 1
        change the layout (revert + apply, resumable)
    shard revert /data/images           tree -> flat
    shard verify /data/images --json    the report as one JSON line
    shard apply /nfs/images --cluster tcp://sched:8786
        top buckets moved by Dask workers

\b
A sharded DIRECTORY holds one file of ours at its top, .manyfiles-shard.json:
the layout record that ShardedDir, verify and revert read (fastls lists and
counts it, fastrm removes it with the tree; revert removes it). While a
migration runs, or after one was interrupted, .manyfiles-shard.journal and
.manyfiles-shard.lock are there too.

\b
Exit status: 0 done; 1 something failed or is in the way (one line each, a
long run shortened), DIRECTORY missing or not readable, or another shard
command is running there; 2 usage error or DIRECTORY not a directory; 130
interrupted; 141 the output was closed before the end ('| head').
"""

PROG = "shard"
_SHOW = 10  # items of each kind listed before "... and N more"


def _layout(levels: str | None, hash_: str | None, key: str | None) -> Layout | None:
    if levels is None and hash_ is None and key is None:
        return None
    return Layout(levels=parse_levels(levels or "2:2"), hash=hash_ or "md5", key=key or "hash")


def _warn_list(title: str, items: list[Any], root: str) -> None:
    for item in items[:_SHOW]:
        if isinstance(item, tuple):
            name, why = item
            click.echo(f"{PROG}: {shown(os.path.join(os.fsencode(root), name))}: {why}", err=True)
        else:
            click.echo(f"{PROG}: {shown(os.path.join(os.fsencode(root), item))}: {title}", err=True)
    if len(items) > _SHOW:
        click.echo(f"{PROG}: ... and {len(items) - _SHOW} more ({title})", err=True)


def _warn_failures(failures: list[Any]) -> None:
    """One ``shard: PATH: reason`` line per failure, a long run of one kind shortened."""
    echo_failures(PROG, failures)


def _report(rep: mig.MigrationReport, quiet: bool, as_json: bool) -> int:
    """Exit 0 when everything found was moved (files created after the last rescan and left
    flat are a warning, named with their count); 1 when something failed or is in the way."""
    _warn_list("left in place", rep.skipped, rep.root)
    _warn_failures(rep.failures)
    if rep.left_flat:
        click.echo(f"{PROG}: {rep.root}: {rep.left_flat:,} files were created during the run and left flat; "
                   f"run `shard apply {rep.root}` again to move them", err=True)
    if as_json:
        echo_summary_json(rep)
    elif not quiet:
        click.echo(rep.summary())
        echo_cluster(PROG, rep)
    return 0 if rep.ok else 1


_levels_opt = click.option("--levels", default=None, metavar="W[:W...]",
                           help="Characters per directory level, e.g. 2:2 (default), 1, 2:2:2, 1:2.")
_hash_opt = click.option("--hash", "hash_", type=click.Choice(HASHES), default=None,
                         help="Hash of the name's bytes that picks the buckets (default md5).")
_key_opt = click.option("--key", type=click.Choice(KEYS), default=None,
                        help="'prefix': use the name's own first characters (names that are hashes/UUIDs).")
_jobs_opt = jobs_option("Parallel workers, each owning whole top buckets [default: 1 on tmpfs, 4 elsewhere].",
                        default=None, maximum=256, old=("-w", "--workers"), show_default=False)
_quiet_opt = quiet_option("No summary line and no progress bar (errors still go to stderr).")
_json_opt = json_option("Print the report as one JSON line on stdout (instead of the summary).")
_dir_arg = click.argument("directory", type=Directory())


@click.group(help=HELP, **GROUP_OPTIONS)
@version_option(PROG)
def command() -> None:
    pass


@command.command()
@_dir_arg
@_levels_opt
@_hash_opt
@_key_opt
@_jobs_opt
@dry_run_option("Plan only: counts per bucket (and --csv); nothing is moved.", old=("--plan",))
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="With -n: write the moves (source,destination) to this CSV file ('-': stdout, "
                   "the plan then goes to stderr).")
@progress_option
@_quiet_opt
@_json_opt
@cluster_option
@instrumented
def apply(directory: str, levels: str | None, hash_: str | None, key: str | None, jobs: int | None,
          dry_run: bool, csv_path: str | None, progress: bool | None, quiet: bool, as_json: bool,
          cluster: str | None) -> int:
    """Move the files of flat DIRECTORY into its hashed tree, in place (resumable)."""
    layout = _layout(levels, hash_, key)
    if dry_run:
        if cluster:
            raise click.UsageError("-n/--dry-run lists on this machine; drop --cluster")
        return _plan(directory, layout, csv_path, as_json)
    if csv_path:
        raise click.UsageError("--csv needs -n/--dry-run")
    rep = mig.apply(directory, layout, workers=jobs, cluster=cluster,
                    progress=resolve_progress(progress, quiet=quiet, as_json=as_json))
    return _report(rep, quiet, as_json)


def _plan(directory: str, layout: Layout | None, csv_path: str | None, as_json: bool) -> int:
    to_stdout = csv_path == "-"
    if to_stdout and as_json:
        raise click.UsageError("--json and --csv -: both want stdout; write --csv to a file")
    p = mig.plan(directory, layout)
    if to_stdout:
        p.write_csv_to(click.get_binary_stream("stdout"))
    elif csv_path:
        p.write_csv(csv_path)
    if as_json:
        echo_summary_json(p, **({"csv": csv_path} if csv_path else {}))
        return 1 if p.blocking else 0
    s = p.stats
    say = functools.partial(click.echo, err=to_stdout)     # the CSV has stdout to itself
    say(f"plan for {p.root} ({p.layout.describe()}):")
    say(f"  files to move        {len(p.moves):,}")
    say(f"  buckets              {s.buckets:,} (files per bucket: min {s.min}, max {s.max}, "
        f"mean {s.mean:.1f}, stddev {s.stddev:.1f})")
    if p.per_bucket:
        fullest = sorted(p.per_bucket.items(), key=lambda kv: -kv[1])[:3]
        say("  fullest buckets      " + ", ".join(f"{shown(b)} ({n})" for b, n in fullest))
    if p.collisions:
        say(f"  named like a bucket  {len(p.collisions):,} (set aside first, then moved)")
    if p.skipped:
        say(f"  left in place        {len(p.skipped):,}")
    if csv_path and not to_stdout:
        say(f"  moves written to     {csv_path}")
    if p.blocking:
        names = ", ".join(shown(b) for b in p.blocking[:_SHOW])
        click.echo(f"{PROG}: {p.root}: subdirectories named like buckets ({names}): apply would refuse",
                   err=True)
        return 1
    return 0


_dry_move = dry_run_option("Count the files that would move; nothing is moved.")


@command.command()
@_dir_arg
@_jobs_opt
@_dry_move
@progress_option
@_quiet_opt
@_json_opt
@cluster_option
@instrumented
def revert(directory: str, jobs: int | None, dry_run: bool, progress: bool | None, quiet: bool, as_json: bool,
           cluster: str | None) -> int:
    """Move every file of the tree back into DIRECTORY and remove the buckets (resumable)."""
    rep = mig.revert(directory, workers=jobs, dry_run=dry_run, cluster=cluster,
                     progress=resolve_progress(progress, quiet=quiet, as_json=as_json))
    return _report(rep, quiet, as_json)


@command.command()
@_dir_arg
@_levels_opt
@_hash_opt
@_key_opt
@_jobs_opt
@_dry_move
@progress_option
@_quiet_opt
@_json_opt
@cluster_option
@instrumented
def reshard(directory: str, levels: str | None, hash_: str | None, key: str | None, jobs: int | None,
            dry_run: bool, progress: bool | None, quiet: bool, as_json: bool, cluster: str | None) -> int:
    """Change the layout of sharded DIRECTORY (revert + apply as one resumable operation)."""
    rep = mig.reshard(directory, _layout(levels, hash_, key), workers=jobs, dry_run=dry_run, cluster=cluster,
                      progress=resolve_progress(progress, quiet=quiet, as_json=as_json))
    return _report(rep, quiet, as_json)


@command.command()
@_dir_arg
@click.option("--expect", type=int, default=None, help="Also fail unless exactly this many files are found.")
@progress_option
@quiet_option("No summary line when everything is in place, no progress (problems still go to stderr).")
@_json_opt
@instrumented
def verify(directory: str, expect: int | None, progress: bool | None, quiet: bool, as_json: bool) -> int:
    """Check that every file sits where its name says: no strays, temp files or duplicates."""
    rep = mig.verify(directory, expected=expect,
                     progress=resolve_progress(progress, quiet=quiet, as_json=as_json))
    _warn_failures(rep.failures)
    if not quiet:
        _warn_list("directory that is not a bucket (left alone)", rep.foreign, rep.root)
    if as_json:
        echo_summary_json(rep)
    elif not (quiet and rep.ok):
        click.echo(rep.summary())
    return 0 if rep.ok else 1


@command.command()
@_dir_arg
@_json_opt
@instrumented
def status(directory: str, as_json: bool) -> int:
    """Layout, any interrupted migration, files left at the top, estimated file count."""
    st = mig.status(directory)
    if as_json:
        echo_json({"root": st.root, "layout": st.layout.describe() if st.layout else None,
                   "flat_files": st.flat_files, "estimate": st.estimate if st.layout else None,
                   "migration": (st.journal or {}).get("op"), "done": st.done, "running_pid": st.running_pid})
        return 0
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
