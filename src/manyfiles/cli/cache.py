"""``manyfiles cache``: warm, inspect and maintain a persistent read cache.

Examples:
    manyfiles cache warm s3://bucket/train/ -j 32          fetch a prefix into the cache
    manyfiles cache warm --files-from list.txt /nfs/data   paths/URLs from a file, plus a folder
    manyfiles cache warm --cluster tcp://sched:8786 s3://bucket/train/   each node warms its own cache
    manyfiles cache stats --json                           entries, bytes, hits, misses, evictions
    manyfiles cache evict --to 100G                        LRU down to 100 GB
    manyfiles cache evict -n --older-than 7d               what would go; nothing is removed
    manyfiles cache verify                                 check every cached file, repair the index
    manyfiles cache verify --complete                      ... and fetch and check partly cached objects
    manyfiles cache clear                                  remove everything

The cache directory is --dir, else $MANYFILES_CACHE_DIR, else ~/.cache/manyfiles.
"""

from __future__ import annotations

import errno
import functools
import itertools
import os
from collections.abc import Callable, Iterable
from typing import Any

import click

from manyfiles._core.checkpoints import reached as checkpoint
from manyfiles.cli._common import (
    GROUP_OPTIONS,
    Directory,
    Size,
    cluster_option,
    dry_run_option,
    echo_cluster,
    echo_failures,
    echo_json,
    echo_summary_json,
    files_from_option,
    instrumented,
    jobs_option,
    json_option,
    prog_name,
    progress_option,
    quiet_option,
    resolve_progress,
    retry_base,
    timeout_options,
)
from manyfiles.errors import NotFound, from_oserror, shown

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}




class Duration(click.ParamType):
    """``90``, ``30m``, ``12h``, ``7d`` -> seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        text = str(value).strip().lower()
        unit = text[-1:] if text[-1:] in _DURATION_UNITS else "s"
        try:
            n = float(text[:-1] if text[-1:] in _DURATION_UNITS else text)
        except ValueError:
            self.fail(f"{value!r} is not a duration like 90, 30m, 12h or 7d", param, ctx)
        if n < 0:
            self.fail("must not be negative", param, ctx)
        return n * _DURATION_UNITS[unit]


#: the file every cache directory holds (written when the cache is made; docs/cache.md)
CACHE_DESCRIPTOR = "manyfiles-cache.json"


def existing_cache(directory: str) -> None:
    """Raise unless ``directory`` may hold a cache: only ``warm`` makes one, the verbs that read or
    trim a cache never do.  A missing or empty folder holds none (exit 1, as a missing path); a
    folder of other things is the cache's own refusal (exit 2, naming what is there)."""
    try:
        os.stat(os.path.join(directory, CACHE_DESCRIPTOR))
    except FileNotFoundError:
        if not os.path.isdir(directory):
            raise NotFound(f"{shown(directory)}: no cache there ({os.strerror(errno.ENOENT)})") from None
        if not os.listdir(directory):
            raise NotFound(f"{shown(directory)}: no cache there (an empty folder)") from None
    except OSError as exc:
        raise from_oserror(exc, directory) from exc


def cache_options(fn: Callable[..., Any] | None = None, *, creates: bool = False) -> Any:
    """``--dir`` and the S3 connection options, turned into a ``cache`` argument; ``creates``: the
    verb makes the cache when the directory holds none (else :func:`existing_cache` refuses)."""
    if fn is None:
        return functools.partial(cache_options, creates=creates)

    @click.option("--dir", "cache_dir", type=Directory(), default=None,
                  help="Cache directory (default: $MANYFILES_CACHE_DIR or ~/.cache/manyfiles).")
    @click.option("--max-size", type=Size(), default=None, help="Evict LRU entries beyond this size.")
    @click.option("--min-free", type=Size(), default=None,
                  help="Keep this much free on the cache's filesystem (default: 10% of it).")
    @click.option("--aws-profile", default=None, metavar="NAME", help="AWS credentials profile.")
    @click.option("--region", default=None, help="AWS region (default: from the profile/environment).")
    @click.option("--endpoint-url", default=None, metavar="URL",
                  help="Custom S3 endpoint (default: $AWS_ENDPOINT_URL).")
    @click.option("--no-sign-request", is_flag=True, help="Anonymous S3 requests (public buckets).")
    @click.option("--strict", is_flag=True,
                  help="Never use cached bytes that no check covered (fetch and check the object whole).")
    @timeout_options
    @functools.wraps(fn)
    def wrapper(*args: Any, cache_dir: str | None, max_size: int | None, min_free: int | None,
                aws_profile: str | None, region: str | None, endpoint_url: str | None, no_sign_request: bool,
                strict: bool, connect_timeout: float, read_timeout: float, stall_timeout: float,
                **kwargs: Any) -> Any:
        from manyfiles.cache import Cache, default_dir
        from manyfiles.s3 import ClientSettings, RetryPolicy

        settings = ClientSettings(profile=aws_profile, region=region, endpoint_url=endpoint_url,
                                  no_sign=no_sign_request, connect_timeout=connect_timeout,
                                  read_timeout=read_timeout)
        extra: dict[str, Any] = {} if min_free is None else {"min_free": min_free}
        base = retry_base()
        extra["retry"] = RetryPolicy(base=RetryPolicy.base if base is None else base,
                                     stall_timeout=stall_timeout)
        directory = cache_dir or default_dir()
        checkpoint("command")  # every command passes here once parsed, before any work
        if not creates:
            existing_cache(directory)
        with Cache(directory, max_size=max_size, settings=settings, strict=strict, **extra) as cache:
            return fn(*args, cache=cache, **kwargs)

    return wrapper


@click.group(**GROUP_OPTIONS)
def command() -> None:
    """A persistent local read cache for files and S3 objects (see docs/cache.md)."""


@command.command()
@click.argument("sources", nargs=-1)
@files_from_option("Also warm the paths/URLs listed in FILE, one a line or NUL-terminated ('-': stdin).")
@jobs_option("Objects fetched at once.", default=16, maximum=1024)
@progress_option
@quiet_option("No progress, no summary (failures still go to stderr).")
@json_option("Print the report as one JSON line.")
@cluster_option
@instrumented
@cache_options(creates=True)
def warm(sources: tuple[str, ...], files_from: str | None, jobs: int, progress: bool | None, quiet: bool,
         as_json: bool, cluster: str | None, cache: Any) -> int:
    """Fetch SOURCES (files, folders, s3://bucket/key, s3://bucket/prefix/) into the cache.

    Entries already complete are only validated (one listing page per 1000 S3 objects, or a
    HEAD / stat each).  Exit 1 if anything failed (one line each on stderr).
    """
    if not sources and files_from is None:
        raise click.UsageError("nothing to warm: give SOURCES or --files-from")
    srcs: Iterable[str] = sources
    if files_from is not None:
        from manyfiles._core.files_from import read_names

        srcs = list(itertools.chain(sources, map(os.fsdecode, read_names(files_from))))
    if any(s.startswith("s3://") for s in srcs):
        # the [s3] extra and the AWS profile are the command's, not one source's: a missing one
        # is a usage error (one line, exit 2) before anything is fetched, not a failure per source
        cache.settings.resolved()
    report = cache.warm(srcs, jobs=jobs, cluster=cluster,
                        progress=resolve_progress(progress, quiet=quiet, as_json=as_json))
    _print_failures(report.failures)
    _print_report(report, as_json, quiet)
    if not (as_json or quiet):
        echo_cluster("manyfiles cache", report)
    return 0 if report.ok else 1


@command.command()
@json_option("Print the statistics as one JSON object.")
@cache_options
def stats(as_json: bool, cache: Any) -> int:
    """Entries, bytes, hits, misses, hit ratio, evictions (all processes, since creation)."""
    s = cache.stats()
    if as_json:
        echo_json(s.to_dict())
    else:
        click.echo(str(s))
    return 0


@command.command()
@click.argument("sources", nargs=-1)
@click.option("--to", "to_size", type=Size(), default=None,
              help="Evict least recently used entries down to SIZE.")
@click.option("--older-than", type=Duration(), default=None,
              help="Evict entries not used for this long (90, 30m, 12h, 7d).")
@dry_run_option("Say how many entries and bytes would go; remove nothing.")
@quiet_option("No summary.")
@json_option("Print the report as one JSON line.")
@instrumented
@cache_options
def evict(sources: tuple[str, ...], to_size: int | None, older_than: float | None, dry_run: bool, quiet: bool,
          as_json: bool, cache: Any) -> int:
    """Evict SOURCES' entries, or by --to / --older-than; with neither, apply --max-size/--min-free."""
    if sources and (to_size is not None or older_than is not None):
        raise click.UsageError("give SOURCES or --to/--older-than, not both")
    report = cache.evict(list(sources) if sources else None, to_size=to_size, older_than=older_than,
                         dry_run=dry_run)
    _print_report(report, as_json, quiet)
    return 0


@command.command()
@click.option("--complete", is_flag=True,
              help="First fetch (whole, checked) every object held in part or unverified.")
@progress_option
@quiet_option("No progress, no summary when the cache was sound.")
@json_option("Print the report as one JSON line.")
@instrumented
@cache_options
def verify(complete: bool, progress: bool | None, quiet: bool, as_json: bool, cache: Any) -> int:
    """Check every cached file (a block's header and CRC-32, a whole file against its object's
    checksum or ETag); remove what is wrong or orphaned, fix the index.

    Exit 0 when every object is verified or unverifiable (nothing to check it against: SSE-KMS
    objects without a checksum, local files); 1 when wrong data was found (and dropped), an
    object holds unverified blocks (--complete checks them) or could not be checked (one line
    each on stderr).
    """
    progress = resolve_progress(progress, quiet=quiet, as_json=as_json)
    report = cache.verify(complete=complete, progress=progress)
    _print_failures(report.failures)
    _print_report(report, as_json, quiet and report.ok)
    return 0 if report.ok else 1


@command.command()
@dry_run_option("Say how many entries and bytes would go; remove nothing.")
@quiet_option("No summary.")
@json_option("Print the report as one JSON line.")
@instrumented
@cache_options
def clear(dry_run: bool, quiet: bool, as_json: bool, cache: Any) -> int:
    """Remove every entry and block (the directory stays a cache)."""
    report = cache.clear(dry_run=dry_run)
    _print_report(report, as_json, quiet)
    return 0


def _print_failures(failures: list) -> None:
    echo_failures(prog_name(), failures)


def _print_report(report: Any, as_json: bool, quiet: bool) -> None:
    if as_json:
        echo_summary_json(report)
    elif not quiet:
        click.echo(report.summary())
