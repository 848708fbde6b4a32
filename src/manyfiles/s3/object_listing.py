"""Object sources: a streaming ListObjectsV2 walk, or a manifest file.

Both yield :class:`ObjectInfo` records one page at a time, so downloads start
while the listing continues.  Sizes come from the listing (no HEAD per object);
manifest lines may carry them (``key<TAB>size[<TAB>etag]``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import NamedTuple

from manyfiles._core.progress import StallWatch
from manyfiles._core.retry import retrying
from manyfiles.errors import ManyfilesError, TransferError
from manyfiles.s3.client import ClientSettings
from manyfiles.s3.keys import S3Url
from manyfiles.s3.retry import RetryPolicy, classify, listing_error
from manyfiles.s3.sigv4 import query_string
from manyfiles.trace import iotrace


class ObjectInfo(NamedTuple):
    key: str
    size: int | None      # None: unknown (manifest without sizes)
    etag: str | None      # without the quotes
    mtime: float | None = None    # LastModified, seconds since the epoch (list_objects_lean(mtime=True))


def _strip_etag(etag: str | None) -> str | None:
    return etag.strip('"') if etag else None


def list_objects(settings: ClientSettings, url: S3Url, *, page_size: int = 1000,
                 retry: RetryPolicy | None = None, client=None) -> Iterator[ObjectInfo]:
    """Yield every object under ``url`` (filtered by its wildcard pattern), page by page."""
    retry = retry or RetryPolicy()
    client = client or settings.client(pool=2)
    kwargs = {"Bucket": url.bucket, "Prefix": url.prefix, "MaxKeys": page_size}
    while True:
        page = _list_page(client, url, kwargs, retry)
        for obj in page.get("Contents", ()):
            key = obj["Key"]
            if url.pattern is None or url.matches(key):
                yield ObjectInfo(key, int(obj["Size"]), _strip_etag(obj.get("ETag")))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return
        kwargs["ContinuationToken"] = token


def list_objects_lean(settings: ClientSettings, url: S3Url, *, page_size: int = 1000,
                      retry: RetryPolicy | None = None,
                      start_after: str | None = None, mtime: bool = False,
                      delimiter: str | None = None, watch: StallWatch | None = None) -> Iterator[ObjectInfo]:
    """:func:`list_objects` without botocore: hand-signed ListObjectsV2 over http.client.

    Saves the ~0.3 s of CPU that building a botocore client costs, which is most of a
    small pull's start-up.  Keys come URL-encoded (``encoding-type=url``) so that any
    byte survives the XML.  ``mtime``: parse LastModified too.  ``delimiter`` (``"/"``): one
    level only, as ``ls`` shows it; its common prefixes ("folders") come first in each page, as
    records with ``size`` and ``etag`` None and the key ending in the delimiter.  ``watch``: a run's
    stall watch, moved by every page and told every retry.
    """
    import xml.etree.ElementTree as ET
    from urllib.parse import unquote_plus

    from manyfiles.s3.engines.socket_client import SocketClient
    from manyfiles.s3.sigv4 import Route

    retry = retry or RetryPolicy()
    where = f"s3://{url.bucket}/{url.prefix}"
    try:
        route = Route(settings, url.bucket)
    except Exception as exc:     # no credentials, no region...
        raise listing_error(where, classify(exc)) from exc
    # a region redirect is followed by the client (once), and the route it moved is what the
    # engines started after this page use
    client = SocketClient(route, settings.read_timeout, connect_timeout=settings.connect_timeout)
    params = {"list-type": "2", "prefix": url.prefix, "max-keys": str(page_size), "encoding-type": "url"}
    if start_after:         # keys after this one (s3pull --cluster lists key ranges in parallel)
        params["start-after"] = start_after
    if delimiter:
        params["delimiter"] = delimiter
    ns = ""
    while True:
        qs = query_string(params)
        t0 = time.monotonic_ns()
        try:
            body = retrying(lambda qs=qs: _traced_page(client, url, qs), retry, classify=client._classify,
                            on_retry=None if watch is None else lambda err: watch.failed(str(err)))
        except TransferError as err:
            raise listing_error(where, err) from err
        if watch is not None:
            watch.moving = True
        tr = iotrace.TRACER
        root = ET.fromstring(body)
        if not ns and root.tag.startswith("{"):
            ns = root.tag[: root.tag.index("}") + 1]
        contents = root.findall(f"{ns}Contents")
        if delimiter:
            for p in root.findall(f"{ns}CommonPrefixes"):
                key = unquote_plus(p.findtext(f"{ns}Prefix") or "")
                if url.pattern is None or url.matches(key):
                    yield ObjectInfo(key, None, None)
        if tr is not None:
            tr.record("s3.list", f"{url.bucket}/{url.prefix}", len(contents), len(body), t0,
                      time.monotonic_ns() - t0, 200)
        for c in contents:
            key = unquote_plus(c.findtext(f"{ns}Key") or "")
            if url.pattern is None or url.matches(key):
                yield ObjectInfo(key, int(c.findtext(f"{ns}Size") or 0), _strip_etag(c.findtext(f"{ns}ETag")),
                                 _timestamp(c.findtext(f"{ns}LastModified")) if mtime else None)
        token = root.findtext(f"{ns}NextContinuationToken")
        if root.findtext(f"{ns}IsTruncated") != "true" or not token:
            client.close()
            return
        params["continuation-token"] = token


def _timestamp(text: str | None) -> float | None:
    """``2024-05-01T12:00:00.123Z`` (S3's LastModified) -> seconds since the epoch."""
    if not text:
        return None
    import calendar

    try:
        whole = calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                                 int(text[14:16]), int(text[17:19]), 0, 0, 0))
        frac = text[19:].rstrip("Z")
        return whole + (float(frac) if frac.startswith(".") else 0.0)
    except ValueError:
        return None


def _traced_page(client, url: S3Url, qs: str) -> bytes:
    tr = iotrace.TRACER
    t0 = time.monotonic_ns()
    try:
        return client.request_body("GET", client.ep.path_prefix or "/", qs)
    except Exception as exc:
        if tr is not None:
            status = getattr(exc, "status", 0) or -1
            tr.record("s3.list", f"{url.bucket}/{url.prefix}", 0, 0, t0, time.monotonic_ns() - t0, status)
        raise


def _list_page(client, url: S3Url, kwargs: dict, retry: RetryPolicy) -> dict:
    def page() -> dict:
        tr = iotrace.TRACER
        t0 = time.monotonic_ns()
        try:
            out = client.list_objects_v2(**kwargs)
        except Exception as exc:
            if tr is not None:
                tr.record("s3.list", f"{url.bucket}/{url.prefix}", 0, 0, t0, time.monotonic_ns() - t0,
                          classify(exc).status or -1)
            raise
        if tr is not None:
            n = len(out.get("Contents", ()))
            tr.record("s3.list", f"{url.bucket}/{url.prefix}", n, 0, t0, time.monotonic_ns() - t0, 200)
        return out

    try:
        return retrying(page, retry, classify=classify)
    except TransferError as err:
        raise listing_error(f"s3://{url.bucket}/{url.prefix}", err) from err


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
