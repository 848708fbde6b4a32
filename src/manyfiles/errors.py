"""Exceptions raised by manyfiles.

    ManyfilesError            base of everything manyfiles raises on purpose
     +-- UsageError           bad arguments or configuration (CLI exit 2)
     +-- PartialFailure       a bulk operation finished, some items failed (exit 1)

OSError and botocore errors are converted at the module boundary that calls
them, keeping the original as ``__cause__``.
"""

from __future__ import annotations


class ManyfilesError(Exception):
    """Base class for errors raised by manyfiles."""

    exit_code = 1


class UsageError(ManyfilesError):
    """Bad arguments or configuration."""

    exit_code = 2


class PartialFailure(ManyfilesError):
    """A bulk operation completed but some items failed; ``failures`` lists them."""

    def __init__(self, message: str, failures: list | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []


def describe_oserror(exc: OSError) -> str:
    """One-line reason for an OSError, without the path (callers print the path)."""
    return exc.strerror or str(exc)
