"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


@pytest.fixture
def run_cli(tmp_path: Path):
    """Run a console script of ours as a real subprocess; returns CompletedProcess (bytes)."""
    import subprocess

    bindir = Path(sys.executable).parent

    def run(script: str, *args: str | bytes, input: bytes | None = None, env: dict | None = None,
            cwd: str | os.PathLike | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(env or {})
        return subprocess.run([str(bindir / script), *args], input=input, capture_output=True,
                              env=full_env, cwd=cwd, timeout=timeout)

    return run


UNPRIVILEGED = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _run_unprivileged(cmd: list[str], check: bool = True):
    """Run ``cmd`` as user nobody when we are root (root ignores permission bits).

    Returns the stdout text when ``check`` (asserting exit 0), else the CompletedProcess.
    """
    import subprocess

    prefix = UNPRIVILEGED if os.geteuid() == 0 else []
    proc = subprocess.run(prefix + cmd, capture_output=True, text=True, timeout=300)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture
def run_unprivileged():
    """``run_unprivileged(cmd, check=True)``: see :func:`_run_unprivileged`."""
    return _run_unprivileged


@pytest.fixture
def world_readable_tmp(tmp_path_factory: pytest.TempPathFactory):
    """A scratch dir that user nobody can reach (pytest's tmp dirs are 0700); permissions
    are restored afterwards so cleanup works."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="manyfiles-test-", dir="/tmp"))
    root.chmod(0o777)
    yield root
    for dirpath, dirnames, _ in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def dask_client():
    """One real Dask cluster for the scale-out tests: a LocalCluster of 2 worker processes, started
    on first use (~1-3 s) the way ``--cluster local:2`` starts one."""
    import logging

    import distributed

    from manyfiles.scale._dask import LOCAL_QUIET, SPAWN_ENV, dask, worker_environ

    with dask.config.set({SPAWN_ENV: worker_environ()}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           silence_logs=logging.CRITICAL, **LOCAL_QUIET)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture
def wait_for_two(dask_client):
    """Call after killing a worker: returns once the cluster has 2 workers again (the nanny
    starts a new one), and checks it again after the test."""

    def wait() -> None:
        dask_client.wait_for_workers(2, timeout=60)

    yield wait
    wait()


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """``mount(size, nr_inodes) -> Path``: a real, small tmpfs (a disk that fills, runs out of inodes
    or is read-only), unmounted after the test.  Needs root (mount -t tmpfs), as on CI here."""
    import subprocess

    mounts: list[Path] = []

    def mount(size: str = "4m", nr_inodes: int = 1000) -> Path:
        where = tmp_path / f"tmpfs{len(mounts)}"
        where.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},nr_inodes={nr_inodes}", "tmpfs",
                            str(where)], capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)
