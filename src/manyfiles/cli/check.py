"""``manyfiles check SRC s3://bucket/prefix/``: compare a folder with a prefix, moving nothing
(like ``rclone check``).

Parses options, calls :func:`manyfiles.mirror.check` and renders: one line per difference on
stdout (``missing-remote``, ``missing-local``, ``differing``; ``--json``: one object each), notes
and the summary on stderr; exit 0 when both sides are the same, 1 on any difference or failure.
"""

from __future__ import annotations

import json
import sys

import click

from manyfiles.cli._common import (
    aws_options,
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
)
from manyfiles.errors import EXIT_FAILED, FailureLines, UsageError, shown
from manyfiles.mirror.options import BY

EPILOG = """\b
Examples:
  manyfiles check ./run1 s3://bucket/runs/run1/
  manyfiles check ./run1 s3://bucket/runs/run1/ --compare size --json | jq .
  manyfiles check s3://bucket/data/ ./data --compare size-mtime

\b
Output: one line per difference on stdout, TAB-separated:
  missing-remote PATH          a file with no object
  missing-local  PATH          an object with no file
  differing      PATH  WHY     both there, not the same (size, md5...)
then one summary line on stderr.  Names not compared (symlinks, special
files, names that are not UTF-8, keys that are no safe path) are notes.

\b
--compare: checksum (default) hashes each file of the same size against the
object's own check (its MD5 ETag from the listing, else one HEAD: the
full-object checksum, or the multipart ETag); size-mtime: same size and the
copy not older than its source (the first argument); size: sizes only.

\b
Exit status (docs/cli.md): 0 both sides hold the same; 1 any difference, a
file or object that could not be compared, or the run stopped (no such
bucket, credentials refused); 2 usage error (neither argument an s3:// URL,
SRC a file, an unknown --aws-profile).
"""


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("source")
@click.argument("dest")
@click.option("--compare", "by", type=click.Choice(BY), default="checksum", show_default=True,
              help="How two files of the same name are compared.")
@filter_options("Only names matching GLOB (a path relative to the folder if it has '/'; repeatable).",
                "Skip names matching GLOB, by the same rule (repeatable; wins over --include).")
@jobs_option("Files hashed and HEADs sent at once.", default=16, maximum=256)
@click.option("--retries", type=click.IntRange(0, 100), default=5, show_default=True,
              help="Retries per request on 5xx, SlowDown and network errors.")
@json_option("Print one JSON object per difference (and note), then the summary.")
@quiet_option("No summary, no notes (differences still go to stdout, errors to stderr).")
@memo_option
@progress_option
@aws_options
@timeout_options
@instrumented
def command(source: str, dest: str, by: str, include: tuple[str, ...], exclude: tuple[str, ...], jobs: int,
            retries: int, as_json: bool, quiet: bool, memo: bool, progress: bool | None,
            aws_profile: str | None, region: str | None, endpoint_url: str | None, path_style: bool | None,
            no_sign_request: bool,
            connect_timeout: float, read_timeout: float, stall_timeout: float) -> int:
    """Compare the folder SRC with s3://bucket/prefix/ (either order), moving nothing.

    Every file under SRC and every object under the prefix is matched by name (the
    key is the prefix plus the path); pairs are compared by --compare.  Symlinks
    are never followed; SRC/.s3pull (s3pull's state) is not compared.
    """
    from manyfiles.mirror import check

    remote_first = source.startswith("s3://")
    if remote_first == dest.startswith("s3://"):
        raise UsageError("give one folder and one s3://bucket/prefix/ (manyfiles check SRC s3://...)")
    local, url = (dest, source) if remote_first else (source, dest)
    if not local:
        raise UsageError("'': the empty path names no folder")
    settings, retry = s3_connection(aws_profile=aws_profile, region=region, endpoint_url=endpoint_url,
                                    path_style=path_style, no_sign_request=no_sign_request,
                                    connect_timeout=connect_timeout, read_timeout=read_timeout,
                                    stall_timeout=stall_timeout, retries=retries)
    shown_progress = resolve_progress(progress, quiet=quiet, as_json=as_json)
    result = check(local, url, by=by, source="remote" if remote_first else "local", include=include,
                   exclude=exclude, settings=settings, retry=retry, workers=jobs, progress=shown_progress,
                   memo=memo)
    _render(prog_name(), result, as_json=as_json, quiet=quiet)
    return 0 if result.equal else EXIT_FAILED


def _render(prog: str, result, *, as_json: bool, quiet: bool) -> None:
    out = sys.stdout
    if as_json:
        for kind, e in result.differences():
            out.write(json.dumps({"event": kind, **e.to_dict()}, ensure_ascii=False) + "\n")
        for e in result.skipped:
            out.write(json.dumps({"event": "skipped", **e.to_dict()}, ensure_ascii=False) + "\n")
        for f in result.failures:
            out.write(json.dumps({"event": "failed", "path": f.path, "code": f.code, "reason": f.reason},
                                 ensure_ascii=False) + "\n")
        out.write(json.dumps({"event": "summary", **result.to_dict()}, ensure_ascii=False) + "\n")
        out.flush()
        return
    for kind, e in result.differences():
        out.write(f"{kind}\t{shown(e.path)}" + (f"\t{e.why}" if kind == "differing" else "") + "\n")
    out.flush()
    lines = FailureLines(prog)
    for f in result.failures:
        line = lines.add(f.path, f.reason, f.code)
        if line is not None:
            click.echo(line, err=True)
    for line in lines.rest():
        click.echo(line, err=True)
    if quiet:
        return
    notes = FailureLines(prog)
    for e in result.skipped:
        line = notes.add(e.path or e.key, f"not compared: {e.why}", e.why)
        if line is not None:
            click.echo(line.replace(f"{prog}: ", f"{prog}: note: ", 1), err=True)
    for line in notes.rest():
        click.echo(line.replace(f"{prog}: ", f"{prog}: note: ", 1), err=True)
    if result.remote_objects == 0 and result.local_files and not result.failures:
        # S3's missing path, as s3pull says it: nothing under the prefix at all
        click.echo(f"{prog}: {result.url}: no object matched; {result.local_files:,} files missing remote",
                   err=True)
        return
    click.echo(f"{prog}: {result.summary()}", err=True)


def main() -> None:
    run_main(command, "manyfiles check")
