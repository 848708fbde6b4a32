"""Write-through: ``mf.open(path_or_url, "wb")`` writes to the origin, never only to the cache.

A local path is written to a temporary file next to it, fsynced and renamed over the
target on close; an S3 object is spooled to a temporary file and uploaded on close
(:func:`manyfiles.s3.upload.upload`: one PUT with Content-MD5 up to 64 MiB, a multipart
upload above).  Then the cache entry of that source is invalidated.  Leaving a ``with`` block by an exception
abandons the write: the target keeps its old content.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
from collections.abc import Callable
from typing import Any

from manyfiles.cache._origin import FileOrigin, S3Origin
from manyfiles.errors import from_oserror


class WriteThrough(io.RawIOBase):
    """A writable file whose content reaches the origin on ``close()`` (not before)."""

    def __init__(self, origin: FileOrigin | S3Origin, on_commit: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.name = origin.display
        self._origin = origin
        self._on_commit = on_commit
        self._md5 = hashlib.md5(usedforsecurity=False)
        if isinstance(origin, FileOrigin):
            folder, base = os.path.split(origin.path)
            tag = b"%d-%s" % (os.getpid(), os.urandom(4).hex().encode())
            self._tmp = os.path.join(folder, b".%s.%s.mf-tmp" % (base, tag))
            try:
                # mode 0o666 & ~umask, as open() would; an existing target's mode is kept on commit
                fd = os.open(self._tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
                with contextlib.suppress(FileNotFoundError):
                    os.fchmod(fd, os.stat(origin.path).st_mode & 0o7777)
            except OSError as exc:
                raise from_oserror(exc, origin.display) from exc
            self._file = os.fdopen(fd, "w+b")
        else:
            self._tmp = None
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()/abort()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        n = self._file.write(b)
        self._md5.update(b)
        return n

    def abort(self) -> None:
        """Drop what was written; the origin is left as it was."""
        if self.closed:
            return
        self._file.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
        super().close()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._commit()
        except BaseException:
            self.abort()
            raise
        super().close()
        if self._on_commit is not None:
            self._on_commit()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def _commit(self) -> None:
        f = self._file
        f.flush()
        origin = self._origin
        if isinstance(origin, FileOrigin):
            try:
                os.fsync(f.fileno())
                f.close()
                os.rename(self._tmp, origin.path)
            except OSError as exc:
                raise from_oserror(exc, origin.display) from exc
            return
        from manyfiles.s3.upload import upload

        size = f.tell()
        f.seek(0)
        upload(origin.settings, origin.bucket, origin.key, f, size, md5=self._md5.digest())
        f.close()
