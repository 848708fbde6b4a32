"""The fsspec filesystem ``manyfiles``: S3 objects and local/NFS files read through the cache.

Registered through the ``fsspec.specs`` entry point, so every library that takes an fsspec URL
or filesystem reads through a persistent :class:`~manyfiles.cache.Cache`::

    fs = fsspec.filesystem("manyfiles", cache="/scratch/mf-cache")
    pq.read_table("s3://bucket/table/", filesystem=fs)
    pd.read_csv("manyfiles://s3://bucket/a.csv", storage_options={"cache": "/scratch/mf-cache"})
    load_dataset("parquet", data_files="manyfiles://s3://bucket/train/*.parquet", storage_options=...)

It answers as s3fs does (docs/ml.md lists the differences that remain, tests/ml/test_s3fs_parity.py
checks them): paths are ``bucket/key`` (``s3://``, ``s3a://``, ``manyfiles://`` in front are
taken off), names come back as ``bucket/key``; local paths are absolute (``/data/x``, ``file://``).
Read only: ``ls``, ``info``, ``find``/``glob``/``walk``/``du``, ``open`` (a seekable file whose reads
are served from the cache's blocks), ``cat_file``/``cat_ranges``, ``modified``.

Validation by listing: ``ls`` and ``find`` get every object's ETag and size from ListObjectsV2
(1,000 objects a request); an ``open``/``cat`` of a listed object then sends no HEAD and reads
exactly that version.  Like s3fs, listings are kept (``listings_expiry_time``, ``invalidate_cache()``);
an object not listed is validated by one HEAD.  Every listing is also kept in the cache directory:
when S3 cannot be reached, the filesystem answers from there (``offline``, docs/ml.md "Offline").

Errors, one family: missing things raise :class:`FileNotFoundError`, an unreachable endpoint a
:class:`ConnectionError` (a :class:`TimeoutError` when it did not answer in time), refusals
:class:`PermissionError`, anything else :class:`OSError`, each with the URL in the message.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat as _stat
import time
from datetime import datetime, timezone
from typing import Any

from manyfiles._core.extras import require
from manyfiles.cache import Cache, default_dir
from manyfiles.errors import (
    AccessDenied,
    ManyfilesError,
    NotFound,
    ObjectChanged,
    OfflineMiss,
    UsageError,
)
from manyfiles.ml._source import CacheRef

_fsspec = require("fsspec", "fsspec", "the manyfiles fsspec filesystem")
from fsspec.spec import AbstractBufferedFile  # noqa: E402 - after the extra's check

try:
    from fsspec.implementations.chained import ChainedFileSystem as _FsBase  # fsspec >= 2025.x
except ImportError:  # older fsspec: everything but the chained "manyfiles::s3://..." form
    _FsBase = _fsspec.AbstractFileSystem

_PREFIXES = ("manyfiles://", "manyfiles::", "s3://", "s3a://")


def _read_only(path: str) -> PermissionError:
    return PermissionError(errno.EROFS, "the manyfiles filesystem is read-only (a cache); "
                           "write to the origin", path)


def fsspec_error(exc: BaseException, where: str) -> BaseException:
    """``exc`` as the one family of errors of the fsspec boundary (see the module docstring)."""
    if isinstance(exc, (FileNotFoundError, ConnectionError, PermissionError)) and where in str(exc):
        return exc
    text = str(exc) if where in str(exc) else f"{where}: {exc}"
    if isinstance(exc, (NotFound, FileNotFoundError)):
        return FileNotFoundError(errno.ENOENT, text)
    from manyfiles.s3.retry import origin_unreachable  # (on an error's path: S3's import paid only here)

    gone = origin_unreachable(exc, where)
    if gone is not None:
        return gone
    if isinstance(exc, (AccessDenied, PermissionError)):
        return PermissionError(errno.EACCES, text)
    if isinstance(exc, OSError):
        return exc
    return OSError(errno.EIO, text)


def _boundary(method: Any) -> Any:
    """Errors of ``method(self, path, ...)`` leave as :func:`fsspec_error` makes them."""

    @functools.wraps(method)
    def wrapper(self: ManyfilesFileSystem, path: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, path, *args, **kwargs)
        except (ManyfilesError, OSError) as exc:
            if isinstance(exc, (ValueError, IsADirectoryError, NotADirectoryError)):
                raise
            err = fsspec_error(exc, self._shown(path))
            if err is exc:
                raise
            raise err from exc

    return wrapper


class ManyfilesFileSystem(_FsBase):
    """fsspec's view of S3 objects and local files, read through a manyfiles cache (read only).

    Args:
        cache: the cache directory (or a :class:`~manyfiles.cache.Cache`); default
            ``$MANYFILES_CACHE_DIR``, else ``~/.cache/manyfiles`` (libraries that pass no options
            still read through the cache).
        endpoint_url, region, profile, anon: the S3 connection (default: the AWS configuration),
            or ``settings`` (a :class:`manyfiles.s3.ClientSettings`).
        ttl: seconds the validation of an object that no listing gave stays trusted (the cache's
            ``ttl``; default 0: one HEAD per open).
        offline: None (default): when S3 cannot be reached, answer from the cache (kept listings,
            the versions validated last; warned once per process); True: never ask S3; False:
            never fall back.
        target_protocol, target_options, fo: what fsspec passes in the chained form
            (``manyfiles::s3://...``); s3fs-style ``target_options`` (``endpoint_url``,
            ``client_kwargs={"endpoint_url", "region_name"}``, ``anon``, ``profile``) are understood.
        listings_expiry_time, use_listings_cache: fsspec's, for ``ls``/``find`` results.
    """

    protocol = "manyfiles"
    root_marker = ""

    def __init__(self, cache: Cache | str | os.PathLike | None = None, *, settings: Any = None,
                 endpoint_url: str | None = None, region: str | None = None, profile: str | None = None,
                 anon: bool = False, ttl: float | None = None, offline: bool | None = None,
                 target_protocol: str | None = None, target_options: dict | None = None,
                 fo: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if target_protocol not in (None, "s3", "s3a", "file", "local"):
            raise UsageError(f"manyfiles::{target_protocol}: only s3:// objects and local paths go through "
                             "the manyfiles cache")
        if offline is not None and not isinstance(offline, bool):
            raise UsageError(f"offline={offline!r}: give True, False or None")
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
        self.offline = offline
        self._cache_ref = CacheRef.of(default_dir() if cache is None else cache, settings)
        # bucket/key -> (etag, size, listed at, mtime): what ls/find validated
        self._listed: dict[str, tuple[str | None, int, float, float | None]] = {}
        self._resolved: tuple[int, Any] | None = None
        self.expiry = kwargs.get("listings_expiry_time")

    # -- paths -----------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = _fsspec.utils.stringify_path(path)
        for _ in range(2):              # manyfiles://s3://bucket/key
            for prefix in _PREFIXES:
                if path.startswith(prefix):
                    path = path[len(prefix):]
        if path.startswith("file://"):
            path = path[len("file://"):]
        if path.startswith("/"):
            return path.rstrip("/") or "/"
        return path.rstrip("/")

    def unstrip_protocol(self, name: str) -> str:
        return f"manyfiles://{self._strip_protocol(name)}"

    @staticmethod
    def _local(path: str) -> bool:
        return path.startswith("/")

    def _url(self, path: str) -> str:
        """The cache's name of ``path``: ``s3://bucket/key`` or an absolute local path."""
        path = self._strip_protocol(path)
        return path if self._local(path) else f"s3://{path}"

    def _shown(self, path: Any) -> str:
        try:
            return self._url(path)
        except Exception:
            return str(path)

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        bucket, _, key = path.partition("/")
        return bucket, key

    @property
    def cache(self) -> Cache:
        return self._cache_ref.get()

    def _settings(self) -> Any:
        if self._resolved is None or self._resolved[0] != os.getpid():
            self._resolved = (os.getpid(), self.settings.resolved())
        return self._resolved[1]

    # -- listings --------------------------------------------------------------------------------

    def _file_info(self, name: str, etag: str | None, size: int, mtime: float | None) -> dict:
        info: dict[str, Any] = {"Key": name, "Size": size}
        if etag is not None:
            info["ETag"] = f'"{etag}"'
        if mtime is not None:
            info["LastModified"] = datetime.fromtimestamp(mtime, timezone.utc)
        info.update({"type": "file", "size": size, "name": name})
        return info

    @staticmethod
    def _dir_info(name: str) -> dict:
        return {"Key": name, "Size": 0, "StorageClass": "DIRECTORY", "type": "directory", "size": 0,
                "name": name}

    def _list(self, bucket: str, prefix: str, delimiter: str | None, offline: bool | None = None
              ) -> list[dict]:
        """Infos of the objects (and, with a delimiter, the "folders") under ``prefix``, sorted by name
        (``offline``: this listing's, default the filesystem's)."""
        from manyfiles.s3.keys import S3Url

        listing = self.cache.list_objects(S3Url(bucket, prefix, None, prefix), settings=self._settings(),
                                          delimiter=delimiter,
                                          offline=self.offline if offline is None else offline)
        at = listing.listed_at
        out = []
        for o in listing.objects:
            name = f"{bucket}/{o.key}"
            if o.size is None:
                out.append(self._dir_info(name.rstrip("/")))
            else:
                self._listed[name] = (o.etag, o.size, at, o.mtime)
                out.append(self._file_info(name, o.etag, o.size, o.mtime))
        out.sort(key=lambda i: i["name"])
        return out

    def _lsdir(self, path: str, refresh: bool = False) -> list[dict]:
        if not refresh:
            with contextlib.suppress(KeyError):     # (fsspec's DirCache expires entries itself)
                return self.dircache[path]
        bucket, key = self._split(path)
        files = self._list(bucket, key + "/" if key else "", "/")
        if files:
            self.dircache[path] = files
        return files

    @_boundary
    def ls(self, path: str, detail: bool = False, refresh: bool = False, **kwargs: Any) -> list:
        path = self._strip_protocol(path)
        if self._local(path):
            files = self._local_ls(path)
        elif path == "":
            files = self._buckets()
        else:
            files = self._lsdir(path, refresh)
            if not files and "/" in path:
                with contextlib.suppress(FileNotFoundError, NotFound):
                    files = self._lsdir(self._parent(path), refresh)
                files = [o for o in files if o["name"].rstrip("/") == path and o["type"] != "directory"]
                if not files:
                    raise FileNotFoundError(errno.ENOENT, f"{self._url(path)}: no such object or prefix")
            if detail:
                return files
        return files if detail else sorted(o["name"] for o in files)

    def _buckets(self) -> list[dict]:
        with contextlib.suppress(KeyError):
            return self.dircache[""]
        from manyfiles.s3.retry import classify
        from manyfiles.s3.store import list_buckets

        try:
            names = list_buckets(self._settings())
        except Exception as exc:
            err = classify(exc)
            if err.status in (401, 403):
                return []               # as s3fs: no permission to list buckets
            raise ManyfilesError(f"s3://: {err}") from exc
        files = [{"Key": n, "Size": 0, "StorageClass": "BUCKET", "size": 0, "type": "directory", "name": n}
                 for n in sorted(names)]
        self.dircache[""] = files
        return files

    def _local_ls(self, path: str) -> list[dict]:
        if not os.path.isdir(path):
            return [self.info(path)]
        with os.scandir(path) as it:
            return sorted((self._local_info(e.path, e.stat()) for e in it), key=lambda i: i["name"])

    @staticmethod
    def _local_info(path: str, st: os.stat_result) -> dict:
        kind = "directory" if _stat.S_ISDIR(st.st_mode) else "file" if _stat.S_ISREG(st.st_mode) else "other"
        return {"name": path, "size": st.st_size, "type": kind, "mtime": st.st_mtime}

    @_boundary
    def find(self, path: str, maxdepth: int | None = None, withdirs: bool = False, detail: bool = False,
             **kwargs: Any) -> Any:
        """Every file under ``path``: for S3 one flat listing (1,000 objects a request), the
        "folders" derived from the keys as s3fs does; with ``maxdepth``, fsspec's walk."""
        path = self._strip_protocol(path)
        if self._local(path) or maxdepth:
            if not self._local(path) and not path:
                raise ValueError("Cannot traverse all of S3")
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail, **kwargs)
        bucket, key = self._split(path)
        if not bucket:
            raise ValueError("Cannot traverse all of S3")
        out = self._list(bucket, key + "/" if key else "", None)
        if not out and key:
            try:
                out = [self.info(path)]
            except FileNotFoundError:
                out = []
        dirs: dict[str, dict] = {}
        for o in out:
            par = o["name"].rsplit("/", 1)[0]
            while "/" in par and par not in dirs:
                if len(path) <= len(par):
                    dirs[par] = self._dir_info(par)
                par = par.rsplit("/", 1)[0]
        self._keep_folders(out, dirs)
        if withdirs:
            out = sorted(out + list(dirs.values()), key=lambda x: x["name"])
        if detail:
            return {o["name"]: o for o in out}
        return [o["name"] for o in out]

    def _keep_folders(self, files: list[dict], dirs: dict[str, dict]) -> None:
        """Keep the listing of each folder of a flat listing (``dirs``) as s3fs keeps it (its files but
        placeholders, and its sub-folders), unless one is kept: ``ls``/``info`` of them ask nothing."""
        if not self.dircache.use_listings_cache:
            return
        folders: dict[str, list[dict]] = {d: [] for d in dirs if d not in self.dircache}
        for o in [*files, *dirs.values()]:
            entries = folders.get(o["name"].rsplit("/", 1)[0])
            if entries is not None and not o["name"].endswith("/"):
                entries.append(o)
        for folder, entries in folders.items():
            self.dircache[folder] = sorted(entries, key=lambda x: x["name"])

    @_boundary
    def info(self, path: str, **kwargs: Any) -> dict:
        path = self._strip_protocol(path)
        if self._local(path):
            return self._local_info(path, os.stat(path))
        if path == "":
            return {"name": path, "size": 0, "type": "directory"}
        bucket, key = self._split(path)
        cached = self._from_listings(path)
        if cached is not None:
            return cached
        if not key:
            self._list(bucket, "", "/")          # a missing bucket: NotFound
            return {"name": bucket, "type": "directory", "size": 0, "StorageClass": "DIRECTORY",
                    "VersionId": None}
        offline = self.cache.offline_reason(f"s3://{path}", settings=self._settings(), offline=self.offline)
        if offline is not None and self._kept_folder(bucket, key):    # no HEAD asked with retries offline
            return {"name": path, "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}
        try:
            size, etag, mtime = self.cache.head(f"s3://{path}", settings=self._settings(),
                                                offline=self.offline)
        except OfflineMiss:
            if self._kept_folder(bucket, key):
                return {"name": path, "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}
            raise
        except NotFound as exc:
            if "no such bucket" in str(exc):
                raise
        else:           # as s3fs gives a HEAD's answer
            info = {"ETag": f'"{etag}"', "LastModified": datetime.fromtimestamp(mtime, timezone.utc)
                    if mtime is not None else "", "size": size, "name": path, "type": "file"}
            return info
        if self._list(bucket, key + "/", "/"):
            return {"name": path, "type": "directory", "size": 0, "StorageClass": "DIRECTORY"}
        raise FileNotFoundError(errno.ENOENT, f"{self._url(path)}: no such object or prefix")

    def _kept_folder(self, bucket: str, key: str) -> bool:
        """Does the cache keep a listing of ``key`` as a folder with something in it (offline answers)?"""
        try:
            return bool(self._list(bucket, key + "/", "/", offline=True))
        except NotFound:
            return False

    def _from_listings(self, path: str) -> dict | None:
        """``path``'s info from the listings this filesystem keeps, as s3fs answers from its dircache: a
        folder listed itself, an entry of its folder's listing (FileNotFoundError when that listing
        has no such entry), or a file that a ``find`` listed."""
        if not self.dircache.use_listings_cache:
            return None
        entries = self._ls_from_cache(path)
        if entries is not None:
            return next((o for o in entries if o["name"] == path), None) or {"name": path, "size": 0,
                                                                              "type": "directory"}
        listed = self._fresh(path)
        if listed is not None:
            return self._file_info(path, listed[0], listed[1], listed[3])
        return None

    def _fresh(self, name: str) -> tuple | None:
        listed = self._listed.get(name)
        if listed is None or not self.dircache.use_listings_cache:
            return None
        if self.expiry is not None and time.time() - listed[2] > self.expiry:
            del self._listed[name]
            return None
        return listed

    def modified(self, path: str) -> datetime:
        """When the object was last modified (a datetime); IsADirectoryError for a folder or bucket."""
        info = self.info(path)
        if self._local(self._strip_protocol(path)) and info["type"] == "file":
            return datetime.fromtimestamp(info["mtime"], timezone.utc)
        if "LastModified" not in info:
            raise IsADirectoryError(errno.EISDIR, f"{self._shown(path)}: a folder has no modified time")
        return info["LastModified"]

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget listings (all, or of ``path`` and below): the next open validates again."""
        if path is None:
            self._listed.clear()
            self.dircache.clear()
            return
        path = self._strip_protocol(path)
        for u in [u for u in self._listed if u == path or u.startswith(path + "/")]:
            del self._listed[u]
        for k in [k for k in self.dircache if k == path or k.startswith(path + "/")]:
            self.dircache.pop(k, None)
        self.dircache.pop(self._parent(path), None)

    # -- reading ---------------------------------------------------------------------------------

    def _reader_kwargs(self, path: str) -> dict:
        if self._local(path):
            return {"ttl": self.ttl}
        listed = self._fresh(path)
        if listed is None or listed[0] is None:
            return {"ttl": self.ttl, "settings": self.settings, "offline": self.offline}
        return {"etag": listed[0], "size": listed[1], "listed_at": listed[2], "settings": self.settings,
                "offline": self.offline}

    def _raw(self, path: str, head: dict | None = None) -> Any:
        """The cache's raw reader of ``path`` (at its listed version when a listing gave it, or at the
        version of ``head``, an info a HEAD just gave)."""
        url = self._url(path)
        kwargs = self._reader_kwargs(path)
        if head is not None and "etag" not in kwargs and head.get("ETag"):
            kwargs.update(etag=head["ETag"].strip('"'), size=head["size"], listed_at=time.time())
            kwargs.pop("ttl", None)
        try:
            return self.cache.reader(url, **kwargs)
        except ObjectChanged:       # changed since it was listed: forget the listing, read the new one
            self._listed.pop(path, None)
            return self.cache.reader(url, ttl=self.ttl, settings=self.settings, offline=self.offline)

    @_boundary
    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
              cache_options: dict | None = None, **kwargs: Any) -> Any:
        if mode != "rb":
            raise _read_only(path)
        path = self._strip_protocol(path)
        info = head = None if self._local(path) else self._from_listings(path)
        if info is None and not self._local(path) and not self.ttl:
            info = head = self.info(path)   # the HEAD that validates it (s3fs's too): no other request
        raw = self._raw(path, head)
        if info is None:
            info = (self._local_info(path, os.fstat(raw.fileno())) if self._local(path)
                    else self._file_info(path, None, raw.size, None))
        return ManyfilesFile(self, path, raw, info, block_size=block_size,
                             cache_type=kwargs.get("cache_type", "none"), cache_options=cache_options)

    @_boundary
    def cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        raw = self._raw(path)
        try:
            size = raw.size if hasattr(raw, "size") else os.fstat(raw.fileno()).st_size
            start = 0 if start is None else max(0, start + size) if start < 0 else start
            end = size if end is None else max(0, end + size) if end < 0 else min(end, size)
            if end <= start:
                return b""
            return _pread(raw, start, end - start)
        finally:
            raw.close()

    def cat_ranges(self, paths: list, starts: Any, ends: Any, max_gap: int | None = None,
                   on_error: str = "return", **kwargs: Any) -> list:
        """Byte ranges of files (fsspec's semantics), each file opened once (its ranges served from
        the cache's blocks)."""
        if isinstance(starts, int):
            starts = [starts] * len(paths)
        if isinstance(ends, int) or ends is None:
            ends = [ends] * len(paths)
        if not len(paths) == len(starts) == len(ends):
            raise ValueError("cat_ranges: paths, starts and ends differ in length")
        out: list = [None] * len(paths)
        for i, p in enumerate(paths):
            try:
                out[i] = self.cat_file(p, starts[i], ends[i])
            except Exception as exc:
                if on_error == "raise":
                    raise
                out[i] = exc
        return out

    # -- read only -------------------------------------------------------------------------------

    def _refuse(self, path: Any = "", *args: Any, **kwargs: Any) -> None:
        raise _read_only(str(path))

    pipe_file = put_file = rm_file = rm = mkdir = makedirs = rmdir = cp_file = mv = touch = _refuse


class ManyfilesFile(AbstractBufferedFile):
    """A file of the filesystem: fsspec's buffered file (``.path``, ``.fs``, ``info()``, seek
    rules) whose ranges come from the cache's reader (cached blocks, or GETs pinned to the version)."""

    def __init__(self, fs: ManyfilesFileSystem, path: str, raw: Any, info: dict, *, block_size: int | None,
                 cache_type: str, cache_options: dict | None) -> None:
        self._reader = raw
        size = raw.size if hasattr(raw, "size") else os.fstat(raw.fileno()).st_size
        super().__init__(fs, path, mode="rb", block_size=block_size or "default", cache_type=cache_type,
                         cache_options=cache_options, size=size)
        self.details = info

    def _fetch_range(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        return _pread(self._reader, start, end - start) if end > start else b""

    def close(self) -> None:
        super().close()
        self._reader.close()


def _pread(raw: Any, start: int, n: int) -> bytes:
    """``n`` bytes at ``start`` of a cache reader (fewer only at the end)."""
    raw.seek(start)
    parts = []
    while n > 0:
        chunk = raw.read(n)
        if not chunk:
            break
        parts.append(chunk)
        n -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)
