"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# -- running in parallel (pytest-xdist: `make test` runs -n auto --dist loadgroup --no-loadscope-reorder)
#
# Tests that share an expensive session fixture form one group, which one worker runs whole, so that
# the fixture is built once: the Dask cluster (and the tests that kill its workers), the wheel and
# venvs of tests/packaging/test_install.py, the [all] venv of the notebooks.  The groups go first,
# the longest first; the other workers take the rest test by test meanwhile.
#
# The groups are assigned here by path, with a scheduler of our own, not by xdist_group marks:
# xdist (3.8) groups by rewriting item._nodeid, which pytest 9.2 no longer reads (the marks are
# silently ignored).  Collection stops with an error when a test uses one of these fixtures from
# outside its group (it would build a second one).
XDIST_GROUPS = {
    "tests/packaging/test_notebooks_all.py": "notebooks",   # all_venv
    "tests/scale/": "dask",                                   # dask_client
    "tests/s3/test_pull_cluster.py": "dask",
    "tests/push/test_push_cluster.py": "dask",
    "tests/packaging/test_install.py": "venvs",              # nocc_wheel, bare_venv, boto_venv
    "tests/netns/": "netns",                                  # netfaults: the multi-host lab
}
GROUP_ORDER = ("notebooks", "netns", "dask", "venvs")
GROUP_FIXTURES = {"all_venv": "notebooks", "dask_client": "dask", "nocc_wheel": "venvs", "bare_venv": "venvs",
                  "boto_venv": "venvs", "netfaults": "netns"}


def xdist_group(nodeid: str) -> str | None:
    """The group of the test ``nodeid`` (relative to the repository), None for a test on its own."""
    return next((g for prefix, g in XDIST_GROUPS.items() if nodeid.startswith(prefix)), None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for fixture in GROUP_FIXTURES.keys() & set(getattr(item, "fixturenames", ())):
            if xdist_group(item.nodeid) != GROUP_FIXTURES[fixture]:
                raise pytest.UsageError(f"{item.nodeid} uses {fixture} but is not in the "
                                        f"{GROUP_FIXTURES[fixture]!r} group: add its path to XDIST_GROUPS "
                                        "in tests/conftest.py")

    def rank(item: pytest.Item) -> int:
        group = xdist_group(item.nodeid)
        return GROUP_ORDER.index(group) if group else len(GROUP_ORDER)

    items.sort(key=rank)  # stable: within a rank, the order pytest (or pytest-randomly) chose


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadgroup`` with the groups above: each group is one unit of work, every other test
    its own, handed out in collection order (with --no-loadscope-reorder)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return GroupScheduling(config, log)


# -- the tests' temporary folders on a tmpfs of the run's own (as root, where mount works)
#
# The suite writes journals, caches and trees with fsync and creates and deletes ~10^6 files; on
# this project's machines the root filesystem is ext4, where each fsync waits for the disk and each
# creation after many deletions scans the recently freed inodes.  Neither is what a test checks (a
# kill -9 leaves the page cache as it is, on any filesystem), and they made the kill -9 cases of
# shard ~2.4x slower.  Tests that need a filesystem of their own (full, read-only, out of inodes)
# still mount one (small_tmpfs, roomy_dir).  MANYFILES_TESTS_ON_DISK=1, or --basetemp, keeps the disk.
TMPFS_PREFIX = "manyfiles-tests-"


@pytest.hookimpl(tryfirst=True)      # before pytest's own tmp_path factory reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    import subprocess
    import tempfile

    if (hasattr(config, "workerinput") or config.option.basetemp or os.geteuid() != 0
            or os.environ.get("MANYFILES_TESTS_ON_DISK") == "1"):
        return                           # an xdist worker takes its folder under the controller's
    _unmount_left_behind(Path(tempfile.gettempdir()))
    where = Path(tempfile.mkdtemp(prefix=f"{TMPFS_PREFIX}{os.getpid()}-"))
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12g,mode=0700", "tmpfs", str(where)],
                      capture_output=True).returncode == 0:
        config.option.basetemp = str(where / "run")
        config.stash[_TMPFS] = where
    else:
        where.rmdir()


_TMPFS = pytest.StashKey[Path]()


def pytest_unconfigure(config: pytest.Config) -> None:
    where = config.stash.get(_TMPFS, None)
    if where is not None:
        _unmount(where)


def _unmount(where: Path) -> None:
    import subprocess

    # lazily: a test's own mounts below it go with it, and a process still in it does not stop us
    if subprocess.run(["umount", "-l", str(where)], capture_output=True).returncode == 0:
        where.rmdir()


def _unmount_left_behind(tmp: Path) -> None:
    """The tmpfs of a run that was killed (its pid gone) still holds its memory: release it."""
    for path in tmp.glob(f"{TMPFS_PREFIX}*"):
        pid = path.name[len(TMPFS_PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and os.path.ismount(path):
            _unmount(path)


@pytest.fixture
def run_cli(tmp_path: Path):
    """Run a console script of ours as a real subprocess; returns CompletedProcess (bytes).
    ``faults``: options of the launcher in tests/faults.py (``["--kill-at", "move:3"]``), which
    then runs the script with those faults installed."""
    import subprocess

    from faults import LAUNCHER

    bindir = Path(sys.executable).parent

    def run(script: str, *args: str | bytes, input: bytes | None = None, env: dict | None = None,
            cwd: str | os.PathLike | None = None, timeout: float = 300,
            faults: list[str] | None = None) -> subprocess.CompletedProcess:
        full_env = dict(os.environ)
        full_env.update(env or {})
        launcher = [sys.executable, LAUNCHER, *faults, "--"] if faults else []
        return subprocess.run([*launcher, str(bindir / script), *args], input=input, capture_output=True,
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


@pytest.fixture
def roomy_dir(tmp_path: Path):
    """A folder on a filesystem of its own (a 256 MiB tmpfs, where the tests may mount one: as root)
    for a cache opened with its default watermarks -- the forms that take no options: s3pull
    --cache, $MANYFILES_CACHE_DIR, fsspec's chained URLs -- so that what a test fills stays however
    full the disk is (the default min_free is 10% of the filesystem).  Elsewhere: a folder of tmp_path."""
    import subprocess

    path = tmp_path / "roomy"
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)],
                             capture_output=True).returncode == 0
    yield path
    if mounted:
        subprocess.run(["umount", "-l", str(path)], check=True)


S3_TESTS = Path(__file__).resolve().parent / "s3"   # s3util: the S3 fixtures' helpers (FaultProxy, Bucket)
if str(S3_TESTS) not in sys.path:
    sys.path.insert(0, str(S3_TESTS))


@pytest.fixture(scope="session")
def moto_direct():
    """moto's S3 server for the session (one per xdist worker), shared by the s3, cache and ml tests;
    every test takes its own bucket, most behind their own fault proxy (``s3util.Bucket``)."""
    from s3util import moto_endpoint

    with moto_endpoint() as url:
        yield url


@pytest.fixture(scope="module")
def table_tree(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The glob table's names (tests/globcases.py) at the root and again in sub/: the tree that
    fastls, walk and fastrm must each select from exactly as the table says."""
    from globcases import make_files

    root = tmp_path_factory.mktemp("globtree")
    make_files(root)
    (root / "sub").mkdir()
    make_files(root / "sub")
    return os.fsencode(root)


@pytest.fixture(scope="session")
def dask_client():
    """One real Dask cluster for the scale-out tests: a LocalCluster of 2 worker processes, started
    on first use (~1-3 s) the way ``--cluster local:2`` starts one."""
    import logging

    import distributed

    from manyfiles.scale._dask import LOCAL_QUIET, SPAWN_ENV, dask, worker_environ

    # A killed worker's nanny starts a new one; but 15 s (Dask's lost-worker-timeout) after each
    # loss, the cluster closes that worker's nanny for good unless a worker of that name is up at
    # that instant.  A second kill of the same worker just before then (kill tests run back to
    # back) left the cluster at one worker for the rest of the session.  Read when a worker is
    # lost, so it is set for the session, not around the start.
    dask.config.set({"distributed.deploy.lost-worker-timeout": "1 hour"})
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
