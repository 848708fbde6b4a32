"""``s3push``: bulk upload of files and folders to S3, every file checked end to end;
``s3push --abort-stale s3://bucket/prefix/ --older-than AGE``.

Parses options, calls :func:`manyfiles.push.push` (or :func:`manyfiles.push.abort_stale`) and
renders: the shared progress display, JSON lines with ``--json``, the plan with ``-n``, one line
per failure and a summary line.  No loop over files here: the library does the work.
"""

from __future__ import annotations

import re

import click

from manyfiles.cli._common import (
    Size,
    aws_options,
    cluster_option,
    dry_run_option,
    echo_cluster,
    echo_json,
    echo_summary_json,
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
from manyfiles.errors import EXIT_FAILED, FailureLines, UsageError, shown

EPILOG = """\b
Examples:
  s3push ./shards/ s3://bucket/shards/    the folder's contents under shards/
  s3push ./shards s3://bucket/data/       keeps the name: data/shards/...
  s3push a.bin b.bin s3://bucket/in/ --exclude '*.tmp' -j 128
  s3push ./ckpt/ s3://bucket/ckpt/ -n     what would be sent, and how
  s3push ./ds/ s3://bucket/ds/ --sync --delete -n    what a mirror would do
  find . -type f -print0 | s3push --files-from - ./ s3://b/ds/
  s3push --abort-stale s3://bucket/ckpt/ --older-than 1d

\b
Exit status (docs/cli.md): 0 every file is in the bucket, checked; 1 some
failed or were refused (one line each: a name that is not UTF-8 or holds a
newline, a file that kept changing while read, a missing SRC), or the run
stopped (no such bucket, credentials refused); 2 usage error; 130
interrupted (run it again: started multipart uploads resume).
"""

_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``90``, ``30m``, ``12h``, ``7d``, ``2w`` as seconds (UsageError otherwise)."""
    m = _AGE.match(text.strip())
    if m is None:
        raise UsageError(f"--older-than {text}: expected a number and a unit (s, m, h, d, w), e.g. 7d")
    return float(m.group(1)) * _UNIT[m.group(2)]


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@version_option("s3push")
@click.argument("paths", nargs=-1, metavar="SRC... DEST")
@jobs_option("Requests in flight (PUTs and parts).", default=64)
@filter_options("Only files whose name matches GLOB (a path relative to SRC if it has '/'; repeatable).",
                "Skip files matching GLOB, by the same rule (repeatable; wins over --include).")
@files_from_option("Only the files listed in FILE ('-': stdin), one a line or NUL-terminated, relative "
                   "to SRC (one folder).")
@click.option("--part-size", type=Size(minimum=5 << 20), default="16MiB", show_default=True,
              help="Multipart part size (at least 5 MiB, S3's minimum).")
@click.option("--multipart-threshold", type=Size(), default="16MiB", show_default=True,
              help="Files larger than this go as multipart uploads; smaller ones as one PUT.")
@click.option("--checksum", type=click.Choice(["auto", "crc64nvme", "crc32c", "md5"]), default="auto",
              show_default=True, help="What every body carries for the server to check "
                                      "(auto: CRC64NVME with awscrt, else Content-MD5).")
@click.option("--follow-symlinks", is_flag=True, help="Upload what symlinks point to (default: skip them).")
@click.option("--retries", type=click.IntRange(0, 100), default=5, show_default=True,
              help="Retries per request on 5xx, SlowDown, resets and refused bodies.")
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Where the resume journal lives [default: $XDG_STATE_HOME/manyfiles/s3push].")
@click.option("--sync", is_flag=True,
              help="Upload only what is missing under the prefix or differs from its object "
                   "(one folder SRC).")
@click.option("--compare", "compare_by", type=click.Choice(["checksum", "size-mtime", "size"]),
              default="checksum", show_default=True,
              help="With --sync: how a file and its object are found the same.")
@click.option("--delete", is_flag=True,
              help="With --sync: then remove the objects under the prefix that no file has (-n shows them).")
@click.option("--max-delete", type=click.IntRange(0), default=1000, show_default=True, metavar="N",
              help="With --delete: refuse (before any change) to delete more than N objects.")
@click.option("--abort-stale", "abort_stale", default=None, metavar="s3://BUCKET/PREFIX",
              help="Instead of uploading: abort the multipart uploads under this prefix older than "
                   "--older-than.")
@click.option("--older-than", default="1d", show_default=True, metavar="AGE",
              help="With --abort-stale: the age (s, m, h, d, w) from which an upload is stale.")
@dry_run_option("List and plan only: print each file's key and how it would go; nothing is sent.")
@json_option("Print one JSON event a line on stdout, then the summary.")
@quiet_option()
@memo_option
@progress_option
@cluster_option
@aws_options
@timeout_options
@instrumented
def command(paths: tuple[str, ...], jobs: int, include: tuple[str, ...], exclude: tuple[str, ...],
            files_from: str | None, part_size: int, multipart_threshold: int, checksum: str,
            follow_symlinks: bool, retries: int,
            state_dir: str | None, sync: bool, compare_by: str, delete: bool, max_delete: int,
            abort_stale: str | None, older_than: str, dry_run: bool, as_json: bool,
            quiet: bool, memo: bool, progress: bool | None, aws_profile: str | None, region: str | None,
            endpoint_url: str | None, path_style: bool | None, no_sign_request: bool, connect_timeout: float,
            read_timeout: float, stall_timeout: float, cluster: str | None) -> int:
    """Upload files and folders (SRC...) to DEST (s3://bucket/prefix/).

    SRC/ puts the folder's contents under the prefix, SRC keeps its name.  Files up to
    --multipart-threshold go as one PUT (-j at once), larger ones as multipart uploads
    with parallel parts.  Every body carries a checksum the server verifies, every answer
    is checked, a file that changes while read is read again, then reported; no partial
    object is ever visible.  Killed, the same command run again resumes the multipart
    uploads it started.  Symlinks are skipped unless --follow-symlinks.
    """
    from manyfiles.push import abort_stale as abort_uploads
    from manyfiles.push import push

    prog = prog_name()
    settings, retry = s3_connection(aws_profile=aws_profile, region=region, endpoint_url=endpoint_url,
                                    path_style=path_style, no_sign_request=no_sign_request,
                                    connect_timeout=connect_timeout, read_timeout=read_timeout,
                                    stall_timeout=stall_timeout, retries=retries)
    lines = FailureLines(prog)
    if abort_stale is not None:
        if paths:
            raise UsageError("--abort-stale takes no SRC or DEST: s3push --abort-stale s3://bucket/prefix/")
        result = abort_uploads(abort_stale, parse_age(older_than), dry_run=dry_run, settings=settings,
                               retry=retry)
        for rec in result.aborted:
            if as_json:
                echo_json({"event": "would-abort" if dry_run else "aborted", **rec})
            elif dry_run:
                click.echo(f"{shown(rec['key'])}\t{rec['upload_id']}")
        if as_json:
            echo_summary_json(result)
        elif not quiet:
            click.echo(f"{prog}: {result.summary()}", err=True)
        return 0
    if len(paths) < 2:
        raise UsageError("s3push needs SRC... and DEST (s3://bucket/prefix/)")
    *sources, dest = paths
    if not dest.startswith("s3://"):
        raise UsageError(f"DEST must be an s3:// URL, not {shown(dest)}")
    for src in sources:
        if src.startswith("s3://"):
            raise UsageError(f"{src}: SRC is a local file or folder (s3pull downloads)")
        if src == "":
            raise _missing()
    show_progress = resolve_progress(progress, quiet=quiet or dry_run, as_json=as_json)

    def on_event(rec: dict) -> None:
        kind = rec["event"]
        if kind == "failed":
            if as_json:
                echo_json(rec)
            else:
                line = lines.add(rec["path"], rec["reason"], rec.get("code", ""))
                if line is not None:
                    click.echo(line, err=True)
        elif as_json:
            echo_json(rec)
        elif kind == "plan":
            how = rec["how"]
            if how == "multipart":
                how = f"multipart {rec['parts']} x {rec['part_size']}"
            click.echo(f"{shown(rec['key'])}\t{rec['size']}\t{how}")

    report = push(sources, dest, jobs=jobs, include=include, exclude=exclude, dry_run=dry_run,
                  settings=settings, cluster=cluster or None,
                  progress=show_progress, on_event=None if cluster else on_event, part_size=part_size,
                  multipart_threshold=multipart_threshold, checksum=checksum, follow_symlinks=follow_symlinks,
                  retry=retry, state_dir=state_dir, sync=sync, compare_by=compare_by, delete=delete,
                  max_delete=max_delete, files_from=files_from, memo=memo)
    if cluster:         # (the workers sent no events: the failures come with the report)
        for f in report.failures:
            on_event({"event": "failed", "path": f.path, "reason": f.reason, "code": f.code})
    if as_json:
        echo_summary_json(report)
    else:
        for line in lines.rest():
            click.echo(line, err=True)
        if not quiet and (report.listed or report.ok):    # nothing listed: the failure lines say it all
            click.echo(f"{prog}: {report.summary()}" + (f"; {len(report.failures):,} failed"
                                                          if report.failures else ""), err=True)
        if not quiet:
            echo_cluster(prog, report)
    return 0 if report.ok else EXIT_FAILED


def _missing() -> Exception:
    from manyfiles.errors import NotFound

    return NotFound("'': No such file or directory")


def main() -> None:
    run_main(command, "s3push")
