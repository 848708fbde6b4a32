"""``s3pull``: bulk S3 download that picks an engine per object size.

Parses options, calls :func:`manyfiles.s3.pull` and renders its events (rich
progress on a TTY, JSON lines with ``--json``, a plan with ``--dry-run``, an end
summary).  No loop over objects here: the library does the work.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

import click

from manyfiles.cli._common import cluster_option, echo_cluster, instrumented, run_main
from manyfiles.s3.plan import STRATEGIES

EPILOG = """\b
Examples:
  s3pull s3://bucket/images/ ./images
  s3pull 's3://bucket/logs/2026-*/*.json' ./logs --exclude '*/tmp/*'
  s3pull s3://bucket/ ./data --manifest keys.txt --strategy threads
  s3pull s3://bucket/shards/ ./shards --dry-run
  s3pull s3://public-bucket/x ./x --no-sign-request --region us-west-2

\b
--aws-profile selects the AWS credentials profile; --profile FILE is, as for every
manyfiles command, a viztracer profile of the run.
"""

MAX_ERROR_LINES = 20
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class Size(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        v = str(value).strip().lower().removesuffix("ib").removesuffix("b")
        unit = v[-1:] if v[-1:] in _UNITS and v[-1:] else ""
        try:
            n = int(float(v[: len(v) - len(unit)]) * _UNITS[unit])
        except ValueError:
            self.fail(f"{value!r} is not a size like 8M or 16MiB", param, ctx)
        if n <= 0:
            self.fail("must be positive", param, ctx)
        return n


def _fmt_bytes(n: float) -> str:
    from rich.filesize import decimal

    return decimal(int(n))


@click.command(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EPILOG)
@click.argument("source")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--strategy", type=click.Choice(list(STRATEGIES)),
              default="auto", show_default=True, help="Engine; auto routes each object by its listed size.")
@click.option("-j", "--concurrency", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="Connections in flight, shared by all engines.")
@click.option("--processes", type=click.IntRange(0, 256), default=0,
              help="Worker processes for --strategy processes (default: CPU count).")
@click.option("--include", multiple=True, metavar="GLOB",
              help="Only paths (relative to the prefix) matching.")
@click.option("--exclude", multiple=True, metavar="GLOB", help="Skip paths matching (wins over --include).")
@click.option("--manifest", type=click.Path(dir_okay=False), default=None,
              help="Download the keys listed in FILE (one a line, optionally key<TAB>size<TAB>etag).")
@click.option("--layout", type=click.Choice(["folder", "sharded"]), default="folder", show_default=True,
              help="folder: key -> path; sharded: hashed sub-folders (manyfiles shard layout).")
@click.option("--part-size", type=Size(), default="8MiB", show_default=True, help="Ranged GET part size.")
@click.option("--retries", type=click.IntRange(0, 100), default=5, show_default=True,
              help="Retries per object or part on 5xx, SlowDown, resets and short bodies.")
@click.option("--no-verify", is_flag=True,
              help="Skip the content checks (MD5/ETag, checksums); sizes are still checked.")
@click.option("--verify-existing", is_flag=True,
              help="Re-hash the files a previous run finished against their recorded checks; "
                   "refetch on mismatch.")
@click.option("--fsync", is_flag=True, help="fsync each file and its folder before it counts as done.")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="Read through this manyfiles cache: objects it holds at the listed ETag are copied "
                   "from it, the others fill it (see docs/cache.md).")
@click.option("--dry-run", is_flag=True, help="List and plan only: print each object's engine.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON event a line on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar, no summary (errors still go to stderr).")
@click.option("--aws-profile", default=None, metavar="NAME", help="AWS credentials profile (as AWS_PROFILE).")
@click.option("--region", default=None, help="AWS region (default: from the profile/environment).")
@click.option("--endpoint-url", default=None, metavar="URL",
              help="Custom S3 endpoint (default: $AWS_ENDPOINT_URL); implies path-style addressing.")
@click.option("--path-style/--virtual-style", "path_style", default=None,
              help="Force the addressing style (default: path-style iff a custom endpoint is set).")
@click.option("--no-sign-request", is_flag=True, help="Anonymous requests (public buckets).")
@cluster_option
@instrumented
def command(source: str, dest: str, strategy: str, concurrency: int, processes: int,
            include: tuple[str, ...], exclude: tuple[str, ...], manifest: str | None, layout: str,
            part_size: int, retries: int, no_verify: bool, verify_existing: bool, fsync: bool, dry_run: bool,
            as_json: bool,
            quiet: bool, cache_dir: str | None, aws_profile: str | None,
            region: str | None, endpoint_url: str | None, path_style: bool | None,
            no_sign_request: bool, cluster: str | None) -> int:
    """Download every object under SOURCE (s3://bucket/prefix, wildcards allowed) into DEST.

    By default objects under 24 MiB are fetched whole by the "lean" thread pool
    (raw sockets, hand-signed GETs) and larger ones in parallel 8 MiB ranged
    parts (see --dry-run).  A re-run skips what is
    already there and resumes large objects part by part; failed objects are listed
    in DEST/.s3pull/failures.tsv and make the exit code 1.
    """
    from manyfiles.s3 import ClientSettings, RetryPolicy, pull

    settings = ClientSettings(profile=aws_profile, region=region, endpoint_url=endpoint_url,
                              no_sign=no_sign_request, path_style=path_style)
    retry = RetryPolicy(attempts=retries + 1, base=float(os.environ.get("MANYFILES_RETRY_BASE", "0.1")))
    view = _View(as_json=as_json, dry_run=dry_run, quiet=quiet)
    with view, contextlib.ExitStack() as stack:
        cache = None
        if cache_dir:
            from manyfiles.cache import Cache

            cache = stack.enter_context(Cache(cache_dir, settings=settings.resolved()))
        on_cluster = {"cluster": cluster} if cluster else {}
        report = pull(source, dest, strategy=strategy, concurrency=concurrency, processes=processes,
                      include=include, exclude=exclude, manifest=manifest, layout=layout, dry_run=dry_run,
                      settings=settings, on_event=None if cluster else view.on_event, retry=retry,
                      part_size=part_size, verify=not no_verify, verify_existing=verify_existing, fsync=fsync,
                      cache=cache, **on_cluster)
    view.summary(report)
    if not (as_json or quiet):
        echo_cluster("s3pull", report)
    return 0 if report.ok else 1


class _View:
    """Renders events: JSON lines, dry-run plan lines, or a rich progress bar on a TTY."""

    def __init__(self, *, as_json: bool, dry_run: bool, quiet: bool) -> None:
        self.as_json, self.dry_run, self.quiet = as_json, dry_run, quiet
        self.progress = None
        self.total_bytes = 0
        self.total_objects = 0
        self.done_objects = 0
        self.failed = 0
        self._out = sys.stdout
        if not (as_json or dry_run or quiet) and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(TextColumn("[bold]s3pull"), BarColumn(), DownloadColumn(),
                                     TransferSpeedColumn(), TextColumn("{task.fields[objs]} objects"),
                                     TimeRemainingColumn(), console=Console(stderr=True), transient=True)
            self.bytes_task = self.progress.add_task("bytes", total=None, objs="0/0")

    def __enter__(self) -> _View:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()

    def _json(self, obj: dict) -> None:
        self._out.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def on_event(self, ev) -> None:
        kind = ev.kind
        if self.as_json:
            if kind != "bytes":
                rec = {"event": kind, "key": ev.key, "size": ev.size}
                if ev.engine:
                    rec["engine"] = ev.engine
                if kind == "plan" and ev.value:
                    rec["part_size"] = ev.value
                elif kind in ("failed", "retry", "skip"):
                    rec["reason"] = ev.value
                elif kind == "done":
                    rec["path"] = ev.value
                elif kind == "listed":
                    rec = {"event": kind, "objects": ev.value}
                self._json(rec)
            return
        if self.dry_run:
            if kind == "plan":
                how = f"ranged/{ev.value >> 20}MiB" if ev.value else ev.engine
                size = "?" if ev.size is None else str(ev.size)
                self._out.write(f"{how}\t{size}\t{ev.key}\n")
            elif kind == "skip":
                self._out.write(f"skip\t{ev.size}\t{ev.key}\t({ev.value})\n")
            elif kind == "failed":
                click.echo(f"s3pull: {ev.key}: {ev.value}", err=True)
            return
        if kind == "failed":
            self.failed += 1
            if self.failed <= MAX_ERROR_LINES:
                line = f"s3pull: {ev.key}: {ev.value}"
                if self.failed == MAX_ERROR_LINES:
                    line += " (further failures only in the failures file)"
                if self.progress is not None:
                    self.progress.console.print(line, markup=False, highlight=False)
                else:
                    click.echo(line, err=True)
        if self.progress is None:
            return
        if kind == "bytes":
            self.progress.advance(self.bytes_task, ev.value)
        elif kind == "plan":
            self.total_bytes += ev.size or 0
            self.total_objects += 1
            self.progress.update(self.bytes_task, total=self.total_bytes,
                                 objs=f"{self.done_objects}/{self.total_objects}")
        elif kind in ("done", "failed"):
            self.done_objects += 1
            self.progress.update(self.bytes_task, objs=f"{self.done_objects}/{self.total_objects}")

    def summary(self, report) -> None:
        engines = {k: {"objects": v[0], "bytes": v[1]} for k, v in sorted(report.engines.items())}
        planned = {k: {"objects": v[0], "bytes": v[1]} for k, v in sorted(report.planned.items())}
        if self.as_json:
            self._json({"event": "summary", "listed": report.listed, "done": report.done,
                        "skipped": report.skipped, "failed": len(report.failures), "bytes": report.bytes,
                        "seconds": round(report.elapsed, 3), "retries": report.retries,
                        "resumed_parts": report.resumed_parts, "engines": engines, "planned": planned,
                        "budget": report.budget, "failures_file": report.failures_file,
                        "verified": dict(sorted(report.verified.items())), "notes": report.notes,
                        "dry_run": report.dry_run})
            self._out.flush()
            return
        if self.quiet and report.ok:
            return
        err = click.get_text_stream("stderr")
        if report.dry_run:
            plan = ", ".join(f"{k} {v['objects']} ({_fmt_bytes(v['bytes'])})" for k, v in planned.items())
            err.write(f"s3pull: dry run: {report.listed} listed, {report.skipped} already present, "
                      f"would fetch: {plan or 'nothing'}; budget {report.budget}\n")
            return
        secs = max(report.elapsed, 1e-9)
        used = ", ".join(f"{k} {v['objects']}" for k, v in engines.items()) or "none"
        err.write(f"s3pull: {report.done} downloaded ({_fmt_bytes(report.bytes)}) in {report.elapsed:.2f} s, "
                  f"{_fmt_bytes(report.bytes / secs)}/s, {report.done / secs:.0f} objects/s; "
                  f"{report.skipped} skipped, {len(report.failures)} failed, {report.retries} retries"
                  + (f", {report.resumed_parts} parts resumed" if report.resumed_parts else "")
                  + f"; engines: {used} ({report.budget})\n")
        if report.verified:
            checks = ", ".join(f"{k} {v}" for k, v in sorted(report.verified.items()))
            err.write(f"s3pull: verified: {checks}\n")
        for note in report.notes:
            err.write(f"s3pull: note: {note}\n")
        if report.failures:
            err.write(f"s3pull: {len(report.failures)} object(s) failed; list in {report.failures_file}\n")


def main() -> None:
    run_main(command, "s3pull")
