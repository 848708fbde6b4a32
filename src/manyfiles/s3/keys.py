"""S3 URLs, key patterns and the key -> local path mapping.  Pure functions, no I/O.

S3 keys are arbitrary UTF-8 strings chosen by whoever wrote the bucket, so they are
never trusted as paths: :func:`local_relpath` either returns a relative path that
cannot leave the destination or raises :class:`UnsafeKey` with a one-line reason.

Example:
    >>> parse_url("s3://bucket/data/*.json")
    S3Url(bucket='bucket', prefix='data/', pattern='data/*.json', base='data/')
    >>> local_relpath("data/a/b.json", "data/")
    'a/b.json'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from manyfiles._core import glob as _glob
from manyfiles.errors import UnsafeKey, UsageError

NAME_MAX = 255          # bytes per path segment (Linux)
PATH_MAX = 4095         # bytes for the relative path
STATE_DIR = ".s3pull"   # our bookkeeping under DEST; keys may not write into it

_WILDCARD = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class S3Url:
    """A parsed ``s3://bucket/prefix`` source.

    ``prefix`` is what the listing asks S3 for (everything before the first
    wildcard), ``pattern`` the full glob keys must match (None without wildcards),
    ``base`` the part stripped from keys to form local paths (up to the last ``/``
    before any wildcard, like ``aws s3 cp --recursive`` and s5cmd).  The pattern follows the
    one glob rule set (:mod:`manyfiles._core.glob`), matched against the whole key: ``*`` also
    matches ``/``.
    """

    bucket: str
    prefix: str
    pattern: str | None
    base: str

    def matches(self, key: str) -> bool:
        if not key.startswith(self.prefix):
            return False
        return self.pattern is None or _glob.compile(self.pattern).match(key, rel=key)


def _split(url: str) -> tuple[str, str]:
    """``s3://bucket/rest`` -> (bucket, rest); UsageError for anything else."""
    if not isinstance(url, str) or not url.startswith("s3://"):
        raise UsageError(f"{url}: not an s3:// URL")
    try:
        url.encode("utf-8")
    except UnicodeEncodeError:   # bytes from argv that are not UTF-8 (os.fsdecode surrogates)
        shown = url.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        raise UsageError(f"{shown}: not UTF-8 (S3 keys are UTF-8 text)") from None
    bucket, _, path = url[5:].partition("/")
    if not bucket or _WILDCARD.search(bucket):
        raise UsageError(f"{url}: missing or invalid bucket name")
    return bucket, path


def parse_url(url: str) -> S3Url:
    """Parse ``s3://bucket[/prefix]``; raises UsageError for anything else."""
    bucket, path = _split(url)
    m = _WILDCARD.search(path)
    if m is None:
        prefix, pattern = path, None
    else:
        prefix, pattern = path[: m.start()], path
    base = prefix[: prefix.rfind("/") + 1]
    return S3Url(bucket, prefix, pattern, base)


def parse_object_url(url: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``(bucket, key)`` for one object: the key is taken as it is (no
    wildcards); UsageError when it is empty or a folder (ends with ``/``).

    Example:
        >>> parse_object_url("s3://bucket/data/a*.json")
        ('bucket', 'data/a*.json')
    """
    bucket, key = _split(url)
    if not key or key.endswith("/"):
        raise UsageError(f"{url}: not an object key")
    return bucket, key


def local_relpath(key: str, base: str = "") -> str:
    """Map ``key`` (minus ``base``) to a safe relative path, or raise UnsafeKey.

    Rejected: empty names, absolute keys, ``.``/``..`` and empty segments, keys
    ending in ``/`` (directory markers), NUL bytes, segments over NAME_MAX bytes,
    paths over PATH_MAX bytes, and anything inside our ``.s3pull`` state folder.
    Nothing is silently rewritten, so two keys can never map to the same path.
    """
    rel = key[len(base):] if base and key.startswith(base) else key
    if not rel:
        raise UnsafeKey("empty name")
    if "\0" in rel:
        raise UnsafeKey("NUL byte in key")
    if rel.startswith("/"):
        raise UnsafeKey("absolute key")
    if rel.endswith("/"):
        raise UnsafeKey("key ends with '/' (directory marker)")
    parts = rel.split("/")
    for seg in parts:
        if seg == "":
            raise UnsafeKey("empty path segment ('//')")
        if seg in (".", ".."):
            raise UnsafeKey(f"'{seg}' path segment")
        if len(seg.encode("utf-8", "surrogateescape")) > NAME_MAX:
            raise UnsafeKey(f"path segment longer than {NAME_MAX} bytes")
    if len(rel.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise UnsafeKey(f"path longer than {PATH_MAX} bytes")
    if parts[0] == STATE_DIR:
        raise UnsafeKey(f"'{STATE_DIR}' is reserved for s3pull's state")
    return rel


def make_filter(include: tuple[str, ...] | list[str] = (), exclude: tuple[str, ...] | list[str] = ()):
    """A predicate on relative paths: must match one ``include`` (if any), no ``exclude``.

    The one glob rule set of every manyfiles tool (:mod:`manyfiles._core.glob`, as fastls and
    fastrm): a pattern without ``/`` is tested on the file name, one with ``/`` on the path
    relative to the source prefix (there ``*`` also matches ``/``: ``*/tmp/*``).
    """
    inc = _glob.compile(include) if include else None
    exc = _glob.compile(exclude) if exclude else None
    if inc is None and exc is None:
        return None

    def keep(rel: str) -> bool:
        name = rel.rpartition("/")[2]
        if inc is not None and not inc.match(name, rel):
            return False
        return exc is None or not exc.match(name, rel)

    return keep
