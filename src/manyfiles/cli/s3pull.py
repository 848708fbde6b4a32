"""``s3pull``: bulk S3 download that picks an engine per object size; ``s3pull verify DEST``.

Parses options, calls :func:`manyfiles.s3.pull` (or :func:`manyfiles.s3.verify`) and renders:
the shared progress display on a TTY, JSON lines with ``--json``, the plan with
``--dry-run``, failure lines and one summary line.  No loop over objects here: the library
does the work.
"""

from __future__ import annotations

import contextlib
import json
import sys

import click

from manyfiles.cli._common import (
    Directory,
    Size,
    aws_options,
    cluster_option,
    deprecated_alias,
    dry_run_option,
    echo_cluster,
    files_from_option,
    filter_options,
    instrumented,
    jobs_option,
    json_option,
    memo_option,
    prog_name,
    progress_option,
    quiet_option,
    resolve_progress,
    run_main,
    s3_connection,
    timeout_options,
    version_option,
)
from manyfiles.errors import EXIT_FAILED, FailureLines, shown
from manyfiles.mirror.options import BY, MAX_DELETE
from manyfiles.s3.routing import CANDIDATES, STRATEGIES

EPILOG = """\b
Examples:
  s3pull s3://bucket/images/ ./images
  s3pull 's3://bucket/logs/2026-*/*.json' ./logs --exclude '*/tmp/*'
  s3pull s3://bucket/ ./data --files-from keys.txt --strategy threads
  aws s3api list-objects-v2 ... | s3pull s3://bucket/ ./data --files-from -
  s3pull s3://bucket/shards/ ./shards -n
  s3pull s3://public-bucket/x ./x --no-sign-request --region us-west-2
  s3pull verify ./images     re-hash every installed file (s3pull verify -h)

\b
--aws-profile NAME selects the AWS credentials profile; --profile-out FILE
is, as for every manyfiles command, a viztracer profile of the run.

\b
Exit status (docs/cli.md): 0 every object is in DEST; 1 some failed (one
line each, a long run shortened, all in DEST/.s3pull/failures.tsv), the run
stopped (no such bucket, credentials refused, disk full, nothing moved for
--stall-timeout), or SOURCE matched no object; 2 usage error (an unknown
--aws-profile, a malformed AWS config file, an endpoint that is no http(s)
URL, the [s3] extra missing, DEST not a directory); 130 interrupted; 141 the
output was closed before the end ('--json | head': the pull stopped there;
run it again to finish).
"""


class _PullOrVerify(click.Command):
    """``s3pull SOURCE DEST`` and ``s3pull verify DEST``: a SOURCE is always an s3:// URL, so the
    word ``verify`` in its place can only mean the verify command."""

    def make_context(self, info_name, args, parent=None, **extra):
        if args and args[0] == "verify":
            return verify_command.make_context(f"{info_name} verify", args[1:], parent=parent, **extra)
        return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context):
        if ctx.command is not self:
            return ctx.command.invoke(ctx)
        return super().invoke(ctx)


@click.command(cls=_PullOrVerify, context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@version_option("s3pull")
@click.argument("source")
@click.argument("dest", type=Directory())
@click.option("--strategy", type=click.Choice([*STRATEGIES, *CANDIDATES]), metavar="ENGINE",
              default="auto", show_default=True,
              help=f"Engine ({', '.join([*STRATEGIES, *CANDIDATES])}); auto routes each object by its listed "
                   "size.")
@jobs_option("Connections in flight, shared by all engines.", default=64, old=("--concurrency",))
@click.option("--processes", type=click.IntRange(0, 256), default=0,
              help="Worker processes for --strategy processes (default: CPU count).")
@filter_options("Only files whose name matches GLOB (a path relative to the prefix if it has '/'; "
                "repeatable).",
                "Skip files matching GLOB, by the same rule (repeatable; wins over --include).")
@files_from_option("Download the keys listed in FILE ('-': stdin), one a line (or NUL-terminated), "
                   "optionally key<TAB>size<TAB>etag.", old=("--manifest",))
@click.option("--layout", type=click.Choice(["folder", "sharded"]), default="folder", show_default=True,
              help="folder: key -> path; sharded: hashed sub-folders (manyfiles shard layout).")
@click.option("--part-size", type=Size(minimum=1), default=None,
              help="Ranged GET part size [default: by object size, about 8 ranges per core, 8-128 MiB each].")
@click.option("--retries", type=click.IntRange(0, 100), default=5, show_default=True,
              help="Retries per object or part on 5xx, SlowDown and short bodies (network errors: "
                   "see --stall-timeout).")
@click.option("--no-checksum", is_flag=True,
              help="Skip the content checks (MD5/ETag, checksums); sizes are still checked.")
@deprecated_alias("no_checksum", "--no-checksum", "--no-verify", is_flag=True)
@click.option("--etag-only", is_flag=True,
              help="Check content against the ETag (MD5) only: do not ask the server for its checksums "
                   "(x-amz-checksum-mode).")
@click.option("--verify-existing", is_flag=True,
              help="Re-hash the files a previous run finished against their recorded checks; "
                   "refetch on mismatch.")
@click.option("--fsync", is_flag=True, help="fsync each file and its folder before it counts as done.")
@click.option("--cache", "cache_dir", type=Directory(), default=None,
              help="Read through this manyfiles cache: objects it holds at the listed ETag are copied "
                   "from it (and checked), the others fill it (see docs/cache.md).")
@click.option("--sync", is_flag=True,
              help="Mirror SOURCE (a folder, ending in '/'): fetch only objects missing or differing in DEST "
                   "(by --compare); files s3pull installed and left unchanged are kept unhashed.")
@click.option("--compare", "compare_by", type=click.Choice(BY), default="checksum", show_default=True,
              help="With --sync: how a file of the same size is found the same (checksum: its bytes against "
                   "the object's MD5 ETag or checksum; size-mtime: not older than the object; size).")
@click.option("--delete", is_flag=True,
              help="With --sync: remove files under DEST that no object has (after every object was fetched; "
                   "-n lists them; never outside DEST, never through a symlink).")
@click.option("--max-delete", type=click.IntRange(-1), default=MAX_DELETE, show_default=True,
              metavar="N",
              help="With --delete: refuse the whole run if it would delete more than N files (-1: no limit).")
@dry_run_option("List and plan only: print each object's engine; nothing is written.")
@json_option("Print one JSON event a line on stdout, then the summary.")
@quiet_option("No progress bar, no summary (errors still go to stderr).")
@memo_option
@progress_option
@aws_options
@timeout_options
@cluster_option
@instrumented
def command(source: str, dest: str, strategy: str, jobs: int, processes: int,
            include: tuple[str, ...], exclude: tuple[str, ...], files_from: str | None, layout: str,
            part_size: int, retries: int, no_checksum: bool, etag_only: bool, verify_existing: bool,
            fsync: bool, cache_dir: str | None, sync: bool, compare_by: str, delete: bool, max_delete: int,
            dry_run: bool,
            as_json: bool, quiet: bool, memo: bool, progress: bool | None, aws_profile: str | None,
            region: str | None, endpoint_url: str | None,
            path_style: bool | None, no_sign_request: bool, connect_timeout: float, read_timeout: float,
            stall_timeout: float, cluster: str | None) -> int:
    """Download every object under SOURCE (s3://bucket/prefix, wildcards allowed) into DEST.

    By default objects under 64 MiB are fetched whole by the "lean" thread pool
    (raw sockets, hand-signed GETs) and larger ones in parallel ranged parts
    (8-128 MiB by object size; see -n).  Every byte written is checked against the object's
    MD5/ETag or checksum before it is installed.  A re-run skips what is already
    there and resumes large objects part by part; failed objects are listed in
    DEST/.s3pull/failures.tsv and make the exit code 1.
    """
    from manyfiles.s3 import pull

    if no_checksum and etag_only:
        raise click.UsageError("--no-checksum and --etag-only exclude each other: --no-checksum checks "
                               "no content, --etag-only checks it against the ETag")
    if not sync and (delete or compare_by != "checksum"):
        raise click.UsageError(f"{'--delete' if delete else '--compare'} needs --sync")
    if sync and (cluster or files_from or layout != "folder"):
        raise click.UsageError("--sync mirrors a folder on this machine: not with --cluster, --files-from "
                               "or --layout sharded")
    settings, retry = s3_connection(aws_profile=aws_profile, region=region, endpoint_url=endpoint_url,
                                    path_style=path_style, no_sign_request=no_sign_request,
                                    connect_timeout=connect_timeout, read_timeout=read_timeout,
                                    stall_timeout=stall_timeout, retries=retries)
    view = _View(prog_name(), as_json=as_json, dry_run=dry_run, quiet=quiet, progress=progress)
    with contextlib.ExitStack() as stack:
        cache = None
        if cache_dir:
            from manyfiles.cache import Cache

            cache = stack.enter_context(Cache(cache_dir, settings=settings.resolved()))
        options = dict(strategy=strategy, concurrency=jobs, processes=processes, include=include,
                       exclude=exclude, layout=layout, dry_run=dry_run, settings=settings,
                       on_event=None if cluster else view.on_event, progress=view.progress, retry=retry,
                       part_size=part_size, verify=not no_checksum, checksum_mode=not etag_only,
                       verify_existing=verify_existing, fsync=fsync, cache=cache)
        if sync:
            from manyfiles.mirror import pull_sync

            report = pull_sync(source, dest, compare_by=compare_by, delete=delete,
                               max_delete=None if max_delete < 0 else max_delete, memo=memo, **options)
        else:
            report = pull(source, dest, manifest=files_from, **options,
                          **({"cluster": cluster} if cluster else {}))
    view.deletions(report)
    if report.ok and getattr(report, "listed", None) == 0 and files_from is None:
        # like s5cmd's "no object found": an empty prefix is S3's missing path (exit 1), not a success
        if as_json:
            view.summary(report)
        filters = " and the --include/--exclude filters" if include or exclude else ""
        click.echo(f"{prog_name()}: {source}: no object matched{filters}; nothing "
                   f"{'would be ' if dry_run else ''}downloaded", err=True)
        return EXIT_FAILED
    view.summary(report)
    if not (as_json or quiet):
        echo_cluster(view.prog, report)
    return 0 if report.ok else 1


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("dest", type=Directory())
@jobs_option("Files hashed at once.", default=4, maximum=256)
@json_option("Print one JSON line per failure, then the summary.")
@quiet_option("No progress, no summary when everything passed.")
@progress_option
@instrumented
def verify_command(dest: str, jobs: int, as_json: bool, quiet: bool, progress: bool | None) -> int:
    """Re-hash every file a pull installed in DEST against the check it passed when written.

    Reads DEST/.s3pull/state.jsonl; nothing is written or fetched.  Files missing,
    changed (size, type, a symlink) or whose bytes no longer match are listed; the
    exit code is then 1.  Run the pull again (with --verify-existing) to repair them.
    """
    from manyfiles.s3 import verify

    view = _View("s3pull verify", as_json=as_json, dry_run=False, quiet=quiet, progress=progress)
    report = verify(dest, workers=jobs, progress=view.progress)
    for f in report.failures:
        view.on_failure(f.path, f"{f.code}: {f.reason}", {"event": "failed", "key": f.path, "code": f.code,
                                                           "reason": f.reason}, f.code)
    view.summary(report)
    return 0 if report.ok else 1


class _View:
    """Renders events: JSON lines, dry-run plan lines, failure lines, the summary.  The live
    display is the shared one (``progress=True``): see ``resolve_progress``."""

    def __init__(self, prog: str, *, as_json: bool, dry_run: bool, quiet: bool,
                 progress: bool | None) -> None:
        self.prog, self.as_json, self.dry_run, self.quiet = prog, as_json, dry_run, quiet
        # a dry run prints its plan on stdout: no bar by default there either
        self.progress = resolve_progress(progress, quiet=quiet or dry_run, as_json=as_json)
        self.lines = FailureLines(prog)
        self._out = sys.stdout

    def _json(self, obj: dict) -> None:
        self._out.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def on_failure(self, key: str, reason: str, record: dict, code: str = "") -> None:
        if self.as_json:
            self._json(record)
            return
        # a long run of one kind is counted (the failures file lists them all)
        line = self.lines.add(key, reason, code)
        if line is not None:
            click.echo(line, err=True)

    def on_event(self, ev) -> None:
        kind = ev.kind
        if kind == "failed":
            engine = {"engine": ev.engine} if ev.engine else {}
            self.on_failure(ev.key, ev.value, {"event": kind, "key": ev.key, "size": ev.size, **engine,
                                               "reason": ev.value})
        elif self.as_json:
            if kind != "bytes":
                rec = {"event": kind, "key": ev.key, "size": ev.size}
                if ev.engine:
                    rec["engine"] = ev.engine
                if kind == "plan" and ev.value:
                    rec["part_size"] = ev.value
                elif kind in ("retry", "skip"):
                    rec["reason"] = ev.value
                elif kind == "done":
                    rec["path"] = ev.value
                elif kind == "listed":
                    rec = {"event": kind, "objects": ev.value}
                elif kind == "stall":
                    rec = {"event": kind, "seconds": round(ev.value.seconds, 1), "error": ev.value.error}
                self._json(rec)
        elif self.dry_run:
            if kind == "plan":
                how = f"ranged/{ev.value >> 20}MiB" if ev.value else ev.engine
                size = "?" if ev.size is None else str(ev.size)
                self._out.write(f"{how}\t{size}\t{ev.key}\n")
            elif kind == "skip":
                self._out.write(f"skip\t{ev.size}\t{ev.key}\t({ev.value})\n")

    def deletions(self, report) -> None:
        """A sync's deleted files (a dry run's: would delete): a JSON record or a plan line each."""
        for path in getattr(report, "deletions", ()):
            if self.as_json:
                self._json({"event": "delete", "path": path, "dry_run": self.dry_run})
            elif self.dry_run:
                self._out.write(f"delete\t\t{shown(path)}\n")

    def summary(self, report) -> None:
        if self.as_json:
            record = report.to_dict()
            record.pop("objects", None)     # a plan's objects went out as "plan" events
            self._json({"event": "summary", **record})
            self._out.flush()
            return
        for line in self.lines.rest():
            click.echo(line, err=True)
        if self.quiet and report.ok:
            return
        err = click.get_text_stream("stderr")
        err.write(f"{self.prog}: {report.summary()}\n")
        for note in getattr(report, "notes", ()):
            err.write(f"{self.prog}: note: {note}\n")
        if report.failures and getattr(report, "failures_file", None):
            err.write(f"{self.prog}: {len(report.failures)} object(s) failed; "
                      f"list in {report.failures_file}\n")


def main() -> None:
    run_main(command, "s3pull")
