"""The fsspec filesystem ``manyfiles``: S3 objects and local/NFS files read through the cache.

Registered through the ``fsspec.specs`` entry point, so every library that takes an fsspec URL
or filesystem reads through a persistent :class:`~manyfiles.cache.Cache`::

    fs = fsspec.filesystem("manyfiles", cache="/scratch/mf-cache")
    pq.read_table("s3://bucket/table/", filesystem=fs)
    pd.read_csv("manyfiles://s3://bucket/a.csv", storage_options={"cache": "/scratch/mf-cache"})
    fsspec.open("manyfiles::s3://bucket/key", manyfiles={"cache": DIR})   # (fsspec resolves s3fs too)

Paths are ``s3://bucket/key`` URLs or local paths (in the chained form, the bare ``bucket/key``
of the ``s3`` link).  Read only: ``ls``, ``info``, ``find``/``glob``/``walk``, ``open`` (a seekable
reader whose ranged reads are served from the cache's blocks), ``cat_file``/``cat_ranges``.

Validation by listing: ``ls`` and ``find`` get every object's ETag and size from ListObjectsV2
(1,000 objects a request); an ``open``/``cat`` of a listed object then sends no HEAD and reads
exactly that version (cached blocks, or GETs pinned to its ETag).  Like s3fs, listings are kept
(``listings_expiry_time`` seconds, default: until ``invalidate_cache()``); an object not listed
is validated by one HEAD (``ttl``: the cache's TTL for those).  Writing raises a one-line
PermissionError: write to the origin.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as _stat
import time
from typing import Any

from manyfiles._core.extras import require
from manyfiles.cache import Cache
from manyfiles.errors import NotFound, ObjectChanged, UsageError
from manyfiles.ml._source import CacheRef

_fsspec = require("fsspec", "fsspec", "the manyfiles fsspec filesystem")
try:
    from fsspec.implementations.chained import ChainedFileSystem as _FsBase  # fsspec >= 2025.x
except ImportError:  # older fsspec: everything but the chained "manyfiles::s3://..." form
    _FsBase = _fsspec.AbstractFileSystem

_S3 = "s3://"


def _read_only(path: str) -> PermissionError:
    return PermissionError(errno.EROFS, "the manyfiles filesystem is read-only (a cache); "
                           "write to the origin", path)


class ManyfilesFileSystem(_FsBase):
    """fsspec's view of S3 objects and local files, read through a manyfiles cache (read only).

    Args:
        cache: the cache directory (or a :class:`~manyfiles.cache.Cache`).  Required.
        endpoint_url, region, profile, anon: the S3 connection (default: the AWS configuration),
            or ``settings`` (a :class:`manyfiles.s3.ClientSettings`).
        ttl: seconds the validation of an object that no listing gave stays trusted (the cache's
            ``ttl``; default 0: one HEAD per open).
        target_protocol, target_options, fo: what fsspec passes in the chained form
            (``manyfiles::s3://...``); s3fs-style ``target_options`` (``endpoint_url``,
            ``client_kwargs={"endpoint_url", "region_name"}``, ``anon``, ``profile``) are understood.
        listings_expiry_time, use_listings_cache: fsspec's, for ``ls``/``find`` results.
    """

    protocol = "manyfiles"
    root_marker = ""

    def __init__(self, cache: Cache | str | os.PathLike | None = None, *, settings: Any = None,
                 endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                 anon: bool = False, ttl: float | None = None, target_protocol: str | None = None,
                 target_options: dict | None = None, fo: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if cache is None:
            raise UsageError('the manyfiles filesystem reads through a cache: give cache=DIR '
                             '(fsspec.filesystem("manyfiles", cache=DIR))')
        if target_protocol not in (None, "s3", "s3a", "file", "local"):
            raise UsageError(f"manyfiles::{target_protocol}: only s3:// objects and local paths go through "
                             "the manyfiles cache")
        self._bare_s3 = target_protocol in ("s3", "s3a")
        opts = dict(target_options or {})
        client_kwargs = opts.pop("client_kwargs", {}) or {}
        if opts.get("key") or opts.get("secret"):
            raise UsageError("manyfiles: credentials come from the AWS configuration (environment, profile), "
                             "not key=/secret=")
        if settings is None:
            from manyfiles.s3 import ClientSettings

            settings = ClientSettings(
                profile=profile or opts.get("profile"),
                region=region or client_kwargs.get("region_name") or opts.get("region_name"),
                endpoint_url=endpoint_url or opts.get("endpoint_url") or client_kwargs.get("endpoint_url"),
                no_sign=bool(anon or opts.get("anon")))
        self.settings = settings
        self.ttl = ttl
        self._cache_ref = CacheRef.of(cache, settings)
        # url -> (etag, size, listed at, mtime): what ls/find validated
        self._listed: dict[str, tuple[str | None, int, float, float | None]] = {}
        self._client: tuple[int, Any] | None = None
        self._resolved: tuple[int, Any] | None = None
        self.expiry = kwargs.get("listings_expiry_time")

    # -- paths -----------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = _fsspec.utils.stringify_path(path)
        for prefix in ("manyfiles://", "manyfiles::"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        if path.startswith("s3a://"):
            path = _S3 + path[6:]
        if path.startswith(_S3):
            return _S3 + path[len(_S3):].rstrip("/")
        return path.rstrip("/") or ("/" if path.startswith("/") else "")

    def unstrip_protocol(self, name: str) -> str:
        return f"manyfiles://{self._url(name)}"

    def _url(self, path: str) -> str:
        """The cache's name of ``path``: ``s3://bucket/key`` or an absolute local path."""
        path = self._strip_protocol(path)
        if path.startswith(_S3):
            return path
        if self._bare_s3:
            return _S3 + path.lstrip("/")
        return os.path.abspath(path)

    def _name(self, url: str) -> str:
        """``url`` as this filesystem's callers write paths (bare ``bucket/key`` in the chained form)."""
        return url[len(_S3):] if self._bare_s3 and url.startswith(_S3) else url

    @property
    def cache(self) -> Cache:
        return self._cache_ref.get()

    def _settings(self) -> Any:
        if self._resolved is None or self._resolved[0] != os.getpid():
            self._resolved = (os.getpid(), self.settings.resolved())
        return self._resolved[1]

    # -- listings --------------------------------------------------------------------------------

    def _remember(self, url: str, etag: str | None, size: int, at: float, mtime: float | None) -> dict:
        self._listed[url] = (etag, size, at, mtime)
        return self._file_info(url, etag, size, mtime)

    def _file_info(self, url: str, etag: str | None, size: int, mtime: float | None) -> dict:
        info: dict[str, Any] = {"name": self._name(url), "size": size, "type": "file"}
        if etag is not None:
            info["ETag"] = etag
        if mtime is not None:
            info["mtime"] = mtime
            info["LastModified"] = mtime
        return info

    def _dir_info(self, url: str) -> dict:
        return {"name": self._name(url.rstrip("/")), "size": 0, "type": "directory"}

    def _s3_list(self, url: str, *, delimiter: str | None) -> tuple[list[dict], bool]:
        """Infos under the "folder" ``url`` (one level with a delimiter); also whether anything was there."""
        from manyfiles.s3.keys import S3Url
        from manyfiles.s3.object_listing import list_objects_lean

        bucket, _, prefix = url[len(_S3):].partition("/")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        at = time.time()
        out = []
        for obj in list_objects_lean(self._settings(), S3Url(bucket, prefix, None, prefix), mtime=True,
                                     delimiter=delimiter):
            where = f"{_S3}{bucket}/{obj.key}"
            if obj.size is None:
                out.append(self._dir_info(where))
            elif not (obj.key.endswith("/") and not obj.size):          # not a "folder" marker
                out.append(self._remember(where, obj.etag, obj.size, at, obj.mtime))
        return out, bool(out)

    def ls(self, path: str, detail: bool = True, refresh: bool = False, **kwargs: Any) -> list:
        url = self._url(path)
        key = self._name(url)
        entries = None
        if not refresh:
            with contextlib.suppress(KeyError):     # (fsspec's DirCache expires entries itself)
                entries = self.dircache[key]
        if entries is None:
            if url.startswith(_S3):
                entries, found = self._s3_list(url, delimiter="/")
                if not found:
                    entries = [self.info(path)]     # a file: fsspec's ls of a file is its info
                    if entries[0]["type"] == "directory":
                        entries = []
                else:
                    self.dircache[key] = entries
            else:
                entries = self._local_ls(url)
        return entries if detail else [e["name"] for e in entries]

    def _local_ls(self, path: str) -> list[dict]:
        try:
            if not os.path.isdir(path):
                return [self.info(path)]
            with os.scandir(path) as it:
                return sorted((self._local_info(e.path, e.stat()) for e in it), key=lambda i: i["name"])
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, path) from None

    @staticmethod
    def _local_info(path: str, st: os.stat_result) -> dict:
        kind = "directory" if _stat.S_ISDIR(st.st_mode) else "file" if _stat.S_ISREG(st.st_mode) else "other"
        return {"name": path, "size": st.st_size, "type": kind, "mtime": st.st_mtime}

    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        """Every file under ``path`` (one flat listing for S3: 1,000 objects a request); ``include``/
        ``exclude``: manyfiles glob filters on paths relative to ``path``."""
        url = self._url(path)
        if not url.startswith(_S3):
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        from manyfiles.s3.keys import make_filter

        keep = make_filter(tuple(kwargs.get("include", ())), tuple(kwargs.get("exclude", ())))
        infos, found = self._s3_list(url, delimiter=None)
        base = url.rstrip("/") + "/"
        out: dict[str, dict] = {}
        if not found:
            try:
                one = self.info(path)
            except FileNotFoundError:
                one = None
            if one is not None and one["type"] == "file":
                out[one["name"]] = one
        for info in infos:
            rel = self._url(info["name"])[len(base):]
            depth = rel.count("/") + 1
            if keep is not None and not keep(rel):
                continue
            if maxdepth is not None and depth > maxdepth:
                continue
            out[info["name"]] = info
            if withdirs:
                parts = rel.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = self._dir_info(base + "/".join(parts[:i]))
                    out.setdefault(d["name"], d)
        names = sorted(out)
        return {n: out[n] for n in names} if detail else names

    def info(self, path: str, **kwargs: Any) -> dict:
        url = self._url(path)
        if not url.startswith(_S3):
            try:
                return self._local_info(url, os.stat(url))
            except FileNotFoundError:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
        listed = self._fresh(url)
        if listed is not None:
            return self._file_info(url, listed[0], listed[1], listed[3])
        bucket, _, key = url[len(_S3):].partition("/")
        if not key:
            return self._dir_info(url)
        head = self._head(bucket, key)
        if head is not None:
            return self._file_info(url, *head)
        _, found = self._probe_dir(url)
        if found:
            return self._dir_info(url)
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)

    def _fresh(self, url: str) -> tuple | None:
        listed = self._listed.get(url)
        if listed is None or not self.dircache.use_listings_cache:
            return None
        if self.expiry is not None and time.time() - listed[2] > self.expiry:
            del self._listed[url]
            return None
        return listed

    def _head(self, bucket: str, key: str) -> tuple[str, int, float] | None:
        """(etag, size, mtime) from one HEAD, None for no such object."""
        from manyfiles.s3.retry import classify

        try:
            head = self._boto3().head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            err = classify(exc)
            if err.status == 404:
                return None
            raise OSError(errno.EIO, f"s3://{bucket}/{key}: {err}") from exc
        mtime = head.get("LastModified")
        return (head.get("ETag", "").strip('"'), int(head["ContentLength"]),
                mtime.timestamp() if mtime is not None else None)

    def _probe_dir(self, url: str) -> tuple[list, bool]:
        from manyfiles.s3.keys import S3Url
        from manyfiles.s3.object_listing import list_objects_lean

        bucket, _, prefix = url[len(_S3):].partition("/")
        prefix = prefix.rstrip("/") + "/"
        for _ in list_objects_lean(self._settings(), S3Url(bucket, prefix, None, prefix), page_size=1):
            return [], True
        return [], False

    def _boto3(self) -> Any:
        if self._client is None or self._client[0] != os.getpid():
            self._client = (os.getpid(), self._settings().client(pool=16))
        return self._client[1]

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget listings (all, or of ``path`` and below): the next open validates again."""
        if path is None:
            self._listed.clear()
            self.dircache.clear()
            return
        url = self._url(path)
        for u in [u for u in self._listed if u == url or u.startswith(url.rstrip("/") + "/")]:
            del self._listed[u]
        name = self._name(url)
        for k in [k for k in self.dircache if k == name or k.startswith(name.rstrip("/") + "/")]:
            self.dircache.pop(k, None)
        self.dircache.pop(self._parent(name), None)

    # -- reading ---------------------------------------------------------------------------------

    def _reader_kwargs(self, url: str) -> dict:
        if not url.startswith(_S3):
            return {"ttl": self.ttl}
        listed = self._fresh(url)
        if listed is None or listed[0] is None:
            return {"ttl": self.ttl, "settings": self.settings}
        return {"etag": listed[0], "size": listed[1], "listed_at": listed[2], "settings": self.settings}

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict | None = None, **kwargs: Any) -> Any:
        if mode != "rb":
            raise _read_only(path)
        url = self._url(path)
        try:
            return self._open_url(url)
        except NotFound:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None

    def _open_url(self, url: str) -> Any:
        kw = self._reader_kwargs(url)
        try:
            f = self.cache.open(url, "rb", **kw)
        except ObjectChanged:       # changed since it was listed: forget the listing, read the new one
            self._listed.pop(url, None)
            f = self.cache.open(url, "rb", ttl=self.ttl, settings=self.settings)
        f.size = f.raw.size if hasattr(f, "raw") else os.fstat(f.fileno()).st_size
        return f

    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        url = self._url(path)
        if start is None and end is None:
            kw = self._reader_kwargs(url)
            try:
                return self.cache.get_bytes(url, **kw)
            except ObjectChanged:
                self._listed.pop(url, None)
                return self.cache.get_bytes(url, ttl=self.ttl, settings=self.settings)
            except NotFound:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path) from None
        with self._open(path) as f:
            return _read_range(f, start, end)

    def cat_ranges(self, paths: list, starts: Any, ends: Any, max_gap: int | None = None,
                   on_error: str = "return", **kwargs: Any) -> list:
        """Byte ranges of files, each file opened once (its ranges served from the cache's blocks)."""
        if isinstance(starts, int):
            starts = [starts] * len(paths)
        if isinstance(ends, int) or ends is None:
            ends = [ends] * len(paths)
        if not len(paths) == len(starts) == len(ends):
            raise ValueError("cat_ranges: paths, starts and ends differ in length")
        out: list = [None] * len(paths)
        by_path: dict[str, list[int]] = {}
        for i, p in enumerate(paths):
            by_path.setdefault(p, []).append(i)
        for p, indexes in by_path.items():
            try:
                with self._open(p) as f:
                    for i in indexes:
                        out[i] = _read_range(f, starts[i], ends[i])
            except Exception as exc:
                if on_error == "raise":
                    raise
                for i in indexes:
                    out[i] = exc
        return out

    # -- read only -------------------------------------------------------------------------------

    def _refuse(self, path: Any = "", *args: Any, **kwargs: Any) -> None:
        raise _read_only(str(path))

    pipe_file = put_file = rm_file = rm = mkdir = makedirs = rmdir = cp_file = mv = touch = _refuse


def _read_range(f: Any, start: int | None, end: int | None) -> bytes:
    size = f.size
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else min(end, size)
    if end <= start:
        return b""
    f.seek(start)
    return f.read(end - start)
