"""Exceptions raised by manyfiles.

    ManyfilesError              base of everything manyfiles raises on purpose (CLI exit 1)
     +-- UsageError             bad arguments or configuration (exit 2)
     |    +-- MissingExtra      a feature needs an optional dependency: says which extra to install
     |    +-- WrongKind         a path of the wrong kind: a file where a directory is needed, or the reverse
     +-- NotFound               a path, bucket or key that does not exist
     |    +-- OfflineMiss       offline, and no validated version cached (also a FileNotFoundError)
     +-- AccessDenied           permission denied by the filesystem or the server
     +-- CredentialsError       no credentials, or the server refused them
     +-- UnsafeKey              a name/key that cannot be written under the destination
     +-- TransferError          one transfer failed; ``retryable`` says if trying again can help
     |    +-- ObjectChanged     the object changed while we read it (ETag/precondition)
     |    +-- IntegrityError    the bytes written do not match the checksum they must have
     |    +-- OriginUnreachable refused, unreachable, DNS (also a ConnectionError)
     |         +-- OriginTimeout    ... it did not answer in time (also a TimeoutError)
     +-- PartialFailure         a bulk operation finished, some items failed (``failures``)
     +-- Stalled                nothing moved for the stall timeout: the endpoint and the last error

    OfflineWarning (a UserWarning): reads are served from the cache because the origin cannot be reached

OSError and botocore errors are converted at the module boundary that calls
them, keeping the original as ``__cause__`` (``raise NotFound(...) from exc``);
:func:`from_oserror` does it for OSError.

The exit codes of every command (docs/cli.md has the table): :data:`EXIT_OK`, :data:`EXIT_FAILED`
(a runtime failure, partial ones included: missing paths, permissions, full disks, the server),
:data:`EXIT_USAGE` (the command line cannot be run as given), :data:`EXIT_INTERRUPTED`,
:data:`EXIT_CLOSED_OUTPUT`.  An exception's code is its class's ``exit_code``; a report's is
:func:`exit_code_of`.  Every name in a message is written by :func:`shown` (one line, whatever it holds).
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Iterable

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130      # 128 + SIGINT, the shell's convention
EXIT_CLOSED_OUTPUT = 141    # 128 + SIGPIPE: stdout closed before the end (`| head`), as ls, find, git


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


class WrongKind(UsageError):
    """A path of the wrong kind: a file where a directory is needed (or a directory where a file is)."""


class NotFound(ManyfilesError):
    """A path, bucket or key that does not exist."""


class OfflineMiss(NotFound, FileNotFoundError):
    """The origin cannot be reached (or ``offline=True``) and the cache holds no validated version of the
    object: nothing can be served.  A :class:`FileNotFoundError` too, for the fsspec boundary."""


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


class OriginUnreachable(TransferError, ConnectionError):
    """The origin (an S3 endpoint) cannot be reached: connection refused, no route, name not resolved.
    A :class:`ConnectionError` too, for the fsspec boundary; never retried (the caller decided)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class OriginTimeout(OriginUnreachable, TimeoutError):
    """The origin did not answer in time (a :class:`TimeoutError` too)."""


class OfflineWarning(UserWarning):
    """Reads are served from the cache, at the versions validated last, because the origin cannot be
    reached (warned once per process)."""


class PartialFailure(ManyfilesError):
    """A bulk operation completed but some items failed; ``failures`` lists them, ``report`` has the rest."""

    def __init__(self, message: str, failures: list | None = None, report: object | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []
        self.report = report


class Stalled(ManyfilesError):
    """A run in which nothing moved for its stall timeout (an endpoint that went away, or never
    answered); the message names the endpoint and the last error (docs/s3pull.md)."""


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def shown(name: str | bytes) -> str:
    """A path or key as error lines print it: one printable line, the same rule for every tool.

    Control characters become ``\\n``, ``\\t``, ``\\r`` or ``\\xNN``, other characters that do not
    print (U+2028) ``\\uNNNN``, bytes that are not UTF-8 ``\\xNN`` and a backslash ``\\\\`` (so
    nothing is ambiguous); the empty name is ``''``.

    Example:
        >>> shown("a\\nb"), shown(b"x\\xffy"), shown("")
        ('a\\\\nb', 'x\\\\xffy', "''")
    """
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    if not name:
        return "''"
    if name.isprintable() and "\\" not in name:
        return name
    out = []
    for ch in name:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:  # a byte of a non-UTF-8 name (surrogateescape)
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif not ch.isprintable():  # controls, and separators such as U+2028 (a line break to some)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def describe_oserror(exc: OSError) -> str:
    """One-line reason for an OSError, without the path (callers print the path)."""
    return exc.strerror or str(exc)


_BY_ERRNO: dict[int, type[ManyfilesError]] = {
    _errno.ENOENT: NotFound,
    _errno.ENOTDIR: WrongKind,
    _errno.EISDIR: WrongKind,
    _errno.EACCES: AccessDenied,
    _errno.EPERM: AccessDenied,
    _errno.EROFS: AccessDenied,
}


def from_oserror(exc: OSError, path: str | bytes | None = None) -> ManyfilesError:
    """The manyfiles error for ``exc`` (``PATH: reason``), to be raised ``from exc``."""
    where = path if path is not None else exc.filename
    message = f"{shown(where)}: {describe_oserror(exc)}" if where is not None else describe_oserror(exc)
    return _BY_ERRNO.get(exc.errno or 0, ManyfilesError)(message)


#: the errno names (``Failure.code``) that say a path was of the wrong kind
WRONG_KIND_CODES = frozenset({"ENOTDIR", "EISDIR"})


def exit_code_of(failures: Iterable[object], arguments: Iterable[str] = ()) -> int:
    """The exit code of a run that reported ``failures`` (items with ``path`` and ``code``).

    0 when nothing failed; 2 (usage) when one of the ``arguments`` themselves was of the wrong
    kind (``fastls FILE``: the other arguments were still done); 1 otherwise.
    """
    failed: list = list(failures)
    if not failed:
        return EXIT_OK
    named = {a.rstrip("/") or "/" for a in arguments}
    if any(f.code in WRONG_KIND_CODES and (f.path.rstrip("/") or "/") in named for f in failed):
        return EXIT_USAGE
    return EXIT_FAILED


#: failure lines printed of one kind before the rest of that kind is only counted
SHOWN_LINES = 10


class FailureLines:
    """The stderr lines of a run's failures: ``prog: PATH: reason`` each, and no flood.  After
    ``limit`` lines of one kind (``code``, else the reason) the rest of that kind is counted;
    :meth:`rest` gives one ``prog: ... and N more: reason`` line per such kind, which the
    commands print just before their summary.  (No click here: the click-free fastls uses it.)

    Example:
        >>> lines = FailureLines("fastrm", limit=1)
        >>> [lines.add(p, "Permission denied", "EACCES") for p in ("a", "b", "c")]
        ['fastrm: a: Permission denied', None, None]
        >>> lines.rest()
        ['fastrm: ... and 2 more: Permission denied']
    """

    def __init__(self, prog: str, limit: int = SHOWN_LINES) -> None:
        self.prog, self.limit = prog, limit
        self.seen: dict[str, int] = {}
        self.reasons: dict[str, str] = {}

    def add(self, path: str, reason: str, code: str = "") -> str | None:
        """The line to print now for this failure (the path as :func:`shown` writes it), or None
        when its kind already had ``limit``."""
        return self._line(shown(path), reason, code)

    def _line(self, text: str, reason: str, code: str) -> str | None:
        kind = code or reason
        n = self.seen[kind] = self.seen.get(kind, 0) + 1
        self.reasons.setdefault(kind, reason)
        return f"{self.prog}: {text}: {reason}" if n <= self.limit else None

    @staticmethod
    def shortens(failures: Iterable[object], limit: int = SHOWN_LINES) -> bool:
        """Would the lines of ``failures`` be shortened (more than ``limit`` of one kind)?"""
        seen: dict[str, int] = {}
        for f in failures:
            kind = f.code or f.reason  # type: ignore[attr-defined]
            seen[kind] = seen.get(kind, 0) + 1
            if seen[kind] > limit:
                return True
        return False

    def rest(self) -> list[str]:
        """``prog: ... and N more: reason`` for each kind that had more than ``limit``."""
        return [f"{self.prog}: ... and {n - self.limit:,} more: {self.reasons[kind]}"
                for kind, n in self.seen.items() if n > self.limit]

    def lines(self, failures: Iterable[object], show: object = None) -> list[str]:
        """Every line for ``failures`` (``path``, ``reason``, ``code``), the counts at the end;
        ``show`` (a callable) writes a path instead of :func:`shown`."""
        out = []
        for f in failures:
            text = show(f.path) if callable(show) else shown(f.path)  # type: ignore[attr-defined]
            line = self._line(text, f.reason, f.code)  # type: ignore[attr-defined]
            if line is not None:
                out.append(line)
        return out + self.rest()
