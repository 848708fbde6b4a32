"""Object sources: a streaming ListObjectsV2 walk (the bucket's store), or a manifest file.

Both yield :class:`~manyfiles.s3.store.ObjectInfo` records one page at a time, so downloads start
while the listing continues.  Sizes come from the listing (no HEAD per object);
manifest lines may carry them (``key<TAB>size[<TAB>etag]``).
"""

from __future__ import annotations

from collections.abc import Iterator

from manyfiles._core.progress import StallWatch
from manyfiles.errors import ManyfilesError, TransferError
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import S3Url
from manyfiles.s3.retry import RetryPolicy, classify, listing_error
from manyfiles.s3.store import ObjectInfo, store_for


def _strip_etag(etag: str | None) -> str | None:
    return etag.strip('"') if etag else None


def list_objects(settings: ClientSettings, url: S3Url, *, page_size: int = 1000,
                 retry: RetryPolicy | None = None, start_after: str | None = None, mtime: bool = False,
                 delimiter: str | None = None, watch: StallWatch | None = None) -> Iterator[ObjectInfo]:
    """Every object under ``url`` (filtered by its wildcard pattern), page by page, through the
    bucket's store (:meth:`~manyfiles.s3.store.S3Store.list`: ``mtime``, ``delimiter``,
    ``start_after``, ``watch`` as there).  A listing that fails raises the run-stopping error of
    :func:`~manyfiles.s3.retry.listing_error` (NotFound, AccessDenied, CredentialsError...)."""
    where = f"s3://{url.bucket}/{url.prefix}"
    try:
        store = store_for(settings, url.bucket, retry=retry or RetryPolicy())
        for info in store.list(url.prefix, delimiter=delimiter, start_after=start_after, page_size=page_size,
                               mtime=mtime, watch=watch):
            if url.pattern is None or url.matches(info.key):
                yield info
    except TransferError as err:
        raise listing_error(where, err) from err
    except ManyfilesError:      # a profile that is not configured (UsageError)...
        raise
    except Exception as exc:     # no credentials, no region...
        raise listing_error(where, classify(exc)) from exc


list_objects_lean = list_objects    # its name while a boto3 listing existed beside it


def read_manifest(path: str, url: S3Url) -> Iterator[ObjectInfo]:
    """Yield the keys of a manifest: one key a line, optionally ``key<TAB>size[<TAB>etag]``.

    ``path`` ``"-"`` is stdin; NUL-terminated records (keys with newlines) are detected
    (:func:`manyfiles._core.files_from.read_names`).  Keys are full keys in ``url.bucket``; blank
    lines are ignored.  A key that does not start with the source prefix is still downloaded
    (the manifest is explicit).
    """
    from manyfiles._core.files_from import read_names

    for lineno, raw in enumerate(read_names(path), 1):  # NotFound / AccessDenied name the file
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ManyfilesError(f"{path}:{lineno}: not UTF-8 (S3 keys are)") from None
        key, _, rest = line.partition("\t")
        size: int | None = None
        etag: str | None = None
        if rest:
            size_s, _, etag_s = rest.partition("\t")
            try:
                size = int(size_s)
            except ValueError:
                raise ManyfilesError(f"{path}:{lineno}: bad size {size_s!r}") from None
            etag = _strip_etag(etag_s) or None
        yield ObjectInfo(key, size, etag)
