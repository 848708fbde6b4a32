"""The read paths need no boto3 and no botocore (issue 26): every S3 request goes through the store.

Each tool runs in a real process configured by AWS_* variables alone, where importing boto3 or
botocore raises: a meta-path finder installed first (before manyfiles is imported) answers both
packages with a loader that refuses to load them. The packages stay *findable* (the ``[s3]`` extra
is installed, ``require_installed`` passes, as on a user's machine); only an import fails, so a
read path that still builds a boto3 client, pages with a boto3 paginator or classifies an error
through botocore fails the run. (Without the extra installed at all the S3 verbs exit 2:
tests/cli/test_exit_codes.py, ``missing-extra``.)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from s3util import CREDS

# installed before anything else in the child; ``sys.argv[1:]`` then names what to run
BLOCKER = """\
import importlib.abc, importlib.machinery, sys
class Refused(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"{spec.name} imported on a read path", name=spec.name)
    def exec_module(self, module):
        raise AssertionError("unreachable")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("boto3", "botocore"):
            return importlib.machinery.ModuleSpec(name, Refused())
        return None
sys.meta_path.insert(0, Block())
"""

CLI = BLOCKER + """\
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

CODE = BLOCKER + "exec(sys.argv[1])\n"


def _env(endpoint: str, tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(CREDS, AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1",
               AWS_CONFIG_FILE=str(tmp_path / "no-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"), MANYFILES_RETRY_BASE="0.01")
    return env


def _script(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def _cli(env: dict[str, str], script: str, *args: str) -> subprocess.CompletedProcess:
    """Our console script ``script`` with ``args``, boto3 and botocore unimportable."""
    return subprocess.run([sys.executable, "-c", CLI, _script(script), *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _python(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, boto3 and botocore unimportable."""
    return subprocess.run([sys.executable, "-c", CODE, code], env=env, capture_output=True, text=True,
                          timeout=300)


def _objects(put, prefix: str, n: int) -> dict[str, bytes]:
    return {f"{i}.bin": put(f"{prefix}{i}.bin", os.urandom(700 + i)) for i in range(n)}


def test_the_blocker_blocks(moto_server, tmp_path):
    """The wrapper really makes boto3 and botocore unimportable (else the tests below prove nothing)."""
    env = _env(moto_server, tmp_path)
    r = _python(env, "import botocore.session")
    assert r.returncode == 1 and "ImportError: botocore imported on a read path" in r.stderr, r.stderr
    r = _python(env, "import importlib.util; assert importlib.util.find_spec('boto3') is not None")
    assert r.returncode == 0, r.stderr


def test_s3pull_runs_without_boto3(moto_server, bucket, tmp_path):
    name, put = bucket
    data = _objects(put, "p/", 12)
    dest = tmp_path / "dest"
    env = _env(moto_server, tmp_path)
    r = _cli(env, "s3pull", f"s3://{name}/p/", str(dest))
    assert r.returncode == 0, r.stderr
    assert {p.name: p.read_bytes() for p in dest.glob("*.bin")} == data
    # and a second run lists, compares and skips everything, still without boto3
    r = _cli(env, "s3pull", f"s3://{name}/p/", str(dest), "--json")
    assert r.returncode == 0, r.stderr
    assert '"skipped": 12' in r.stdout, r.stdout


def test_cache_warm_and_open_run_without_boto3(moto_server, bucket, tmp_path):
    name, put = bucket
    data = _objects(put, "c/", 6)
    cache = tmp_path / "cache"
    env = _env(moto_server, tmp_path)
    r = _cli(env, "manyfiles", "cache", "warm", "--dir", str(cache), f"s3://{name}/c/")
    assert r.returncode == 0, r.stderr
    # mf.open through the cache (a HEAD validates each entry, ttl=0) and straight from S3
    code = ("import hashlib, manyfiles as mf\n"
            f"for i in range(6):\n"
            f"    with mf.open(f's3://{name}/c/{{i}}.bin', cache={str(cache)!r}, ttl=0) as f:\n"
            "        a = f.read()\n"
            f"    with mf.open(f's3://{name}/c/{{i}}.bin') as f:\n"
            "        b = f.read()\n"
            "    assert a == b\n"
            "    print(hashlib.sha256(a).hexdigest())\n")
    r = _python(env, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [hashlib.sha256(data[f"{i}.bin"]).hexdigest() for i in range(6)]
    r = _cli(env, "manyfiles", "cache", "stats", "--dir", str(cache), "--json")
    assert r.returncode == 0, r.stderr



def test_errors_are_classified_without_botocore(moto_server, tmp_path):
    """A full disk, a reset, a short read: classified in words without importing botocore (which
    once was imported for every error that was not already ours)."""
    code = ("import errno\nfrom manyfiles.s3.retry import classify\n"
            "for exc in (OSError(errno.ENOSPC, 'No space left on device'),\n"
            "            ConnectionResetError(104, 'reset'), ValueError('short')):\n"
            "    err = classify(exc)\n"
            "    print(type(err).__name__, err.retryable)\n"
            "import sys; print('botocore' in sys.modules)\n")
    r = _python(_env(moto_server, tmp_path), code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["LocalError False", "NetworkError True", "TransferError True", "False"]


def test_the_ml_readers_run_without_boto3(moto_server, bucket, tmp_path):
    """A Dataset over the prefix, and the fsspec filesystem: a listing, an info of one object that
    was not listed (one HEAD), a read, a missing object, the root (the buckets: ListBuckets)."""
    name, put = bucket
    data = _objects(put, "m/", 5)
    cache = str(tmp_path / "cache")
    code = ("import hashlib, fsspec, manyfiles as mf\n"
            f"ds = mf.Dataset('s3://{name}/m/', cache={cache!r})\n"
            "got = sorted((s.key, hashlib.sha256(s.data).hexdigest()) for s in ds)\n"
            "print(len(got), *(h for _, h in got))\n"
            f"fs = fsspec.filesystem('manyfiles', cache={cache!r})\n"
            f"info = fs.info('s3://{name}/m/3.bin')\n"
            "print(info['type'], info['size'])\n"
            f"print(sorted(p.rsplit('/', 1)[1] for p in fs.ls('s3://{name}/m/', detail=False)))\n"
            f"print(hashlib.sha256(fs.cat_file('s3://{name}/m/4.bin')).hexdigest())\n"
            f"print(fs.exists('s3://{name}/m/nosuch.bin'))\n"
            f"print({name!r} in fs.ls('s3://', detail=False))\n")
    r = _python(_env(moto_server, tmp_path), code)
    assert r.returncode == 0, r.stderr
    digest = {k: hashlib.sha256(v).hexdigest() for k, v in data.items()}
    assert r.stdout.splitlines() == [
        " ".join(["5", *(digest[f"{i}.bin"] for i in range(5))]),
        f"file {len(data['3.bin'])}",
        str(sorted(data)),
        digest["4.bin"],
        "False",
        "True",
    ]
