"""Exceptions raised by manyfiles.

    ManyfilesError              base of everything manyfiles raises on purpose (CLI exit 1)
     +-- UsageError             bad arguments or configuration (exit 2)
     |    +-- MissingExtra      a feature needs an optional dependency: says which extra to install
     +-- NotFound               a path, bucket or key that does not exist
     +-- AccessDenied           permission denied by the filesystem or the server
     +-- CredentialsError       no credentials, or the server refused them
     +-- UnsafeKey              a name/key that cannot be written under the destination
     +-- TransferError          one transfer failed; ``retryable`` says if trying again can help
     |    +-- ObjectChanged     the object changed while we read it (ETag/precondition)
     |    +-- IntegrityError    the bytes written do not match the checksum they must have
     +-- PartialFailure         a bulk operation finished, some items failed (``failures``)

OSError and botocore errors are converted at the module boundary that calls
them, keeping the original as ``__cause__`` (``raise NotFound(...) from exc``);
:func:`from_oserror` does it for OSError.
"""

from __future__ import annotations

import errno as _errno


class ManyfilesError(Exception):
    """Base class for errors raised by manyfiles."""

    exit_code = 1


class UsageError(ManyfilesError):
    """Bad arguments or configuration."""

    exit_code = 2


class MissingExtra(UsageError):
    """A feature needs an optional dependency; the message names the ``pip install`` line."""

    def __init__(self, extra: str, feature: str, missing: str | None = None) -> None:
        what = f" ({missing} is not installed)" if missing else ""
        super().__init__(f'{feature} needs the [{extra}] extra{what}: pip install "manyfiles[{extra}]"')
        self.extra = extra


class NotFound(ManyfilesError):
    """A path, bucket or key that does not exist."""


class AccessDenied(ManyfilesError):
    """The filesystem or the server refused access."""


class CredentialsError(ManyfilesError):
    """No credentials were found, or the server rejected them."""


class UnsafeKey(ManyfilesError, ValueError):
    """A key or name that cannot be written under the destination; str() is the reason."""


class TransferError(ManyfilesError):
    """A transfer failed; ``retryable`` says whether trying again can help, ``status`` the HTTP status."""

    def __init__(self, message: str, *, retryable: bool, status: int = 0) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


class ObjectChanged(TransferError):
    """The object's ETag changed while we were reading it (IfMatch failed)."""

    def __init__(self, message: str = "object changed during download (ETag mismatch)") -> None:
        super().__init__(message, retryable=False, status=412)


class IntegrityError(TransferError):
    """The bytes received or written do not match the checksum or length they must have."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)


class PartialFailure(ManyfilesError):
    """A bulk operation completed but some items failed; ``failures`` lists them, ``report`` has the rest."""

    def __init__(self, message: str, failures: list | None = None, report: object | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []
        self.report = report


def describe_oserror(exc: OSError) -> str:
    """One-line reason for an OSError, without the path (callers print the path)."""
    return exc.strerror or str(exc)


_BY_ERRNO: dict[int, type[ManyfilesError]] = {
    _errno.ENOENT: NotFound,
    _errno.ENOTDIR: NotFound,
    _errno.EACCES: AccessDenied,
    _errno.EPERM: AccessDenied,
    _errno.EROFS: AccessDenied,
}


def from_oserror(exc: OSError, path: str | bytes | None = None) -> ManyfilesError:
    """The manyfiles error for ``exc`` (``PATH: reason``), to be raised ``from exc``."""
    where = path if path is not None else exc.filename
    if isinstance(where, bytes):
        where = where.decode("utf-8", "surrogateescape")
    message = f"{where}: {describe_oserror(exc)}" if where is not None else describe_oserror(exc)
    return _BY_ERRNO.get(exc.errno or 0, ManyfilesError)(message)
