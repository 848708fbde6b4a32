"""``s3pull --sync [--delete]``: make a folder the mirror of a prefix, as a plan step of a pull.

list -> plan -> execute -> report:

1. **list and plan** (:func:`~manyfiles.mirror.comparison.compare`, ``source="remote"``): the folder
   walked, the prefix listed once.  A file is kept when s3pull's state says it installed this
   version of the object (same key, size and ETag, the file unchanged since: no hashing), else by
   the ``compare_by`` rule: ``checksum`` (same size and the file's bytes pass the object's own
   check), ``size-mtime`` (same size and the file not older than the object), ``size``.
2. **execute**: :func:`manyfiles.s3.pull` fetches exactly the objects missing or differing
   (``objects=``: no second listing), with everything a pull does (engines, checks, state,
   resume after kill -9); then, with ``delete``, the files under DEST that no object has are
   removed (:func:`~manyfiles.mirror.delete.delete_local`: never outside DEST, never through a
   symlink, only regular files) -- only if every object was fetched.
3. **report**: the pull's :class:`~manyfiles.s3.report.PullReport`; the kept objects count as
   ``skipped``, the removed files as ``deleted`` (``deletions``: their paths).

Guards, all before anything is written: more deletions than ``max_delete`` (default 1,000) refuse
the whole run; a prefix with no object never deletes (a typo in SOURCE would empty DEST).  A
run killed at any point is completed by running it again: the comparison is made anew.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from manyfiles._core.progress import ProgressArg
from manyfiles.errors import ManyfilesError, UsageError
from manyfiles.mirror.comparison import Comparison, Entry, compare
from manyfiles.mirror.delete import delete_local
from manyfiles.mirror.options import BY, MAX_DELETE
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import parse_url
from manyfiles.s3.report import PullReport


class TooManyDeletions(ManyfilesError):
    """A sync would delete more local files than its ``max_delete`` allows: nothing was done."""


def check_deletions(n: int, sources: int, max_delete: int | None, *, empty_source: str,
                    too_many: Callable[[int, int], str]) -> None:
    """The two guards of a mirror's ``n`` deletions, before anything changes: a source with nothing in
    it (``sources`` == 0: a mistyped prefix or folder) never empties the other side, and more than
    ``max_delete`` raises :class:`TooManyDeletions` with ``too_many(n, max_delete)``."""
    if n and sources == 0:
        raise ManyfilesError(empty_source)
    if max_delete is not None and n > max_delete:
        raise TooManyDeletions(too_many(n, max_delete))


def pull_sync(source: str, dest: str | os.PathLike, *, compare_by: str = "checksum", delete: bool = False,
              max_delete: int | None = MAX_DELETE, include: Iterable[str] = (), exclude: Iterable[str] = (),
              dry_run: bool = False, settings: ClientSettings | None = None, progress: ProgressArg = False,
              on_event: Callable[[Any], None] | None = None, workers: int = 16,
              memo: bool | str | os.PathLike = True, **pull_options: Any) -> PullReport:
    """Mirror ``source`` (``s3://bucket/prefix/``: a folder) into ``dest``: fetch what is missing or
    differs, keep what is the same (``compare_by``: ``checksum``, ``size-mtime``, ``size``), and
    with ``delete`` remove files no object has (refused beyond ``max_delete``; None: no limit).
    ``dry_run``: the plan (a PullPlan; ``deletions`` the files that would go).  ``workers``: files
    hashed at once; ``memo``: the checksum memo of DEST (False: every file is read; see
    :func:`~manyfiles.mirror.compare`).  The other keyword arguments go to
    :func:`manyfiles.s3.pull`.  See the module docstring.

    Example:
        >>> r = pull_sync("s3://bucket/data/", "/data", delete=True)     # doctest: +SKIP
        >>> r.done, r.skipped, r.deleted
        (3, 11997, 2)
    """
    from manyfiles.s3 import pull
    from manyfiles.s3.store import ObjectInfo, store_for

    url = _check(source, compare_by, max_delete, pull_options)
    settings = (settings or ClientSettings()).resolved()
    root = os.path.abspath(dest)
    if not os.path.isdir(root):       # nothing to keep or delete: a plain pull (it checks DEST)
        return pull(source, dest, include=include, exclude=exclude, dry_run=dry_run, settings=settings,
                    progress=progress, on_event=on_event, **pull_options)
    retry = pull_options.get("retry")
    store = store_for(settings, url.bucket, retry=retry, verify=pull_options.get("verify", True),
                      checksum_mode=pull_options.get("checksum_mode", True))
    seen = _compare(root, store, url.prefix, compare_by, include, exclude, workers, progress,
                    rehash=pull_options.get("verify_existing", False), memo=memo)
    fetch = [ObjectInfo(e.key, e.remote_size, e.etag)
             for e in sorted([*seen.missing_local, *seen.differing, *(e for e in seen.skipped if e.key)],
                             key=lambda e: e.key)]
    deletions = [e.path for e in seen.missing_remote] if delete else []
    check_deletions(len(deletions), seen.remote_objects, max_delete,
                    empty_source=f"{source}: no object matched; nothing deleted (a prefix with no object "
                                 f"never empties {dest})",
                    too_many=lambda n, limit: f"{dest}: the sync would delete {n:,} files, more than "
                                              f"--max-delete {limit:,}; nothing was fetched or deleted "
                                              "(raise --max-delete if that is meant, or check SOURCE)")
    report = pull(source, dest, objects=fetch, dry_run=dry_run, settings=settings, progress=progress,
                  on_event=on_event, **pull_options)
    report.listed += len(seen.same)
    report.skipped += len(seen.same)
    for f in seen.failures:
        report.add_failure(f.path, f.reason, f.code)
    if deletions:
        if report.failures and not dry_run:
            report.notes.append(f"not deleting {len(deletions):,} files: some objects failed (run again)")
        else:
            gone = delete_local(root, deletions, dry_run=dry_run)
            report.deleted = gone.deleted
            report.deletions = deletions
            report.failures.extend(gone.failures)
    return report


def _check(source: str, compare_by: str, max_delete: int | None, pull_options: dict[str, Any]):
    url = parse_url(source)
    if url.pattern is not None or (url.prefix and not url.prefix.endswith("/")):
        raise UsageError(f"{source}: --sync mirrors a folder: end SOURCE with '/' (no wildcards; "
                         "--include/--exclude select)")
    if compare_by not in BY:
        raise UsageError(f"compare_by must be one of {', '.join(BY)}, not {compare_by!r}")
    if max_delete is not None and (isinstance(max_delete, bool) or not isinstance(max_delete, int)
                                   or max_delete < 0):
        raise UsageError(f"max_delete must be an integer >= 0 or None, not {max_delete!r}")
    for name, why in (("manifest", "a sync lists the prefix"), ("cluster", "a sync runs on this machine"),
                      ("plan", "a sync makes its own plan"), ("objects", "a sync decides the objects")):
        if pull_options.get(name) is not None:
            raise UsageError(f"{name}=: not with a sync ({why})")
    if pull_options.get("layout", "folder") != "folder":
        raise UsageError("a sync mirrors keys as paths: layout='folder' only")
    return url


def _compare(root: str, store: Any, prefix: str, by: str, include: Iterable[str], exclude: Iterable[str],
             workers: int, progress: ProgressArg, rehash: bool, memo: bool | str | os.PathLike) -> Comparison:
    """The comparison, with s3pull's state as the record of what it installed (``rehash``:
    ``--verify-existing``, every recorded file hashed against its recorded check)."""
    from manyfiles.s3.state import State

    state = State(root)
    state.open(create=False)
    try:
        def known(e: Entry) -> bool:
            path = os.path.join(root, e.path)
            return bool(state.done) and state.is_done(e.key, e.remote_size, e.etag, path, verify=rehash)

        return compare(root, store, prefix, by=by, source="remote", include=include, exclude=exclude,
                       workers=workers, known=known, progress=progress, memo=False if rehash else memo)
    finally:
        state.release()


__all__ = ["MAX_DELETE", "TooManyDeletions", "pull_sync"]
