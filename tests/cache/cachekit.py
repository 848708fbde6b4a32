"""Helpers for the cache tests: deterministic payloads, subprocess runners (the S3 fault proxy is
tests/s3/s3util.FaultProxy, see conftest.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap


def blob(n: int, seed: str = "") -> bytes:
    """``n`` deterministic pseudo-random bytes (a block in the wrong place changes the content)."""
    return random.Random(f"blob:{seed}").randbytes(n)


def run_python(code: str, env: dict | None = None, timeout: float = 120, expect_killed: bool = False) -> dict:
    """Run ``code`` in a new interpreter; it must print one JSON object last.  Returns it.
    ``expect_killed``: it ends by SIGKILLing itself."""
    import signal

    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    assert proc.returncode == (-signal.SIGKILL if expect_killed else 0), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cli(*args: str, env: dict | None = None, input: bytes | None = None, timeout: float = 120):
    """``manyfiles ARGS`` as a subprocess; returns the CompletedProcess (text).  A ``cache`` verb
    gets ``--min-free 0`` unless ARGS give one: what these tests fill stays, however full the disk
    they run on (the default keeps 10% of the filesystem free: tests/cache/test_cache_space.py's)."""
    exe = os.path.join(os.path.dirname(sys.executable), "manyfiles")
    if args[:1] == ("cache",) and "--min-free" not in args:
        args = (*args[:2], "--min-free", "0", *args[2:])
    return subprocess.run([exe, *args], capture_output=True, env={**os.environ, **(env or {})},
                          input=input, timeout=timeout)


def held(cache) -> list[str]:
    """What ``cache`` holds on disk, by name: its files under blocks/ (``<objid>.w`` whole files,
    ``<objid>.<n>`` blocks) and ``<objid>.pack`` for each object the index names a record of in a
    pack (objects up to 1 MiB are held whole that way)."""
    files = [f for _, _, names in os.walk(os.path.join(cache.dir, "blocks")) for f in names]
    conn = cache._store.index._conn()
    return sorted(files + [row[0].hex() + ".pack" for row in conn.execute("SELECT objid FROM packed")])


def whole_name(objid: bytes, size: int) -> str:
    """The name :func:`held` gives an object held whole: a record in a pack up to 1 MiB, else a file."""
    from manyfiles.cache._packs import PACK_MAX_OBJECT

    return objid.hex() + (".pack" if size <= PACK_MAX_OBJECT else ".w")
