"""The job lease (manyfiles.scale.lease) on a real 2-process LocalCluster, with real client
processes killed (SIGKILL) or frozen (SIGSTOP) mid-job: their shards stop; in process, nothing lapses.
The s3pull form (DEST, then a local rerun byte for byte) is in tests/s3/test_pull_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import cloudpickle
import leasejobs
import pytest
from leasejobs import LapseJob, TickJob

from clusterutil import shards_running, wait_for
from manyfiles.errors import UsageError
from manyfiles.scale import lease
from manyfiles.scale.executor import InProcessExecutor, NoopJob, run_job

HERE = Path(__file__).resolve().parent
LEASE = 5.0
STOP_BOUND = 20.0     # seconds past the lease within which the shards must have stopped


def _start_client(address: str, folder: Path) -> subprocess.Popen:
    """A client process running a TickJob of 2 shards on the cluster at ``address``."""
    code = ("import sys\n"
            f"sys.path.insert(0, {str(HERE)!r})\n"
            "import cloudpickle, leasejobs\n"
            "cloudpickle.register_pickle_by_value(leasejobs)\n"
            "from manyfiles.errors import ManyfilesError\n"
            "from manyfiles.scale.executor import run_job\n"
            "try:\n"
            f"    run_job(leasejobs.TickJob(folder={str(folder)!r}), {address!r})\n"
            "except ManyfilesError as exc:\n"
            "    sys.exit(f'error: {exc}')\n")
    env = {**os.environ, lease.LEASE_ENV: str(LEASE)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)


def _both_shards_started(folder: Path, client: subprocess.Popen) -> bool:
    assert client.poll() is None, client.stderr.read()
    names = os.listdir(folder)
    return any(n.startswith("0-") for n in names) and any(n.startswith("1-") for n in names)


def test_the_shards_of_a_killed_client_stop(tmp_path: Path, dask_client) -> None:
    client = _start_client(dask_client.scheduler.address, tmp_path)
    try:
        wait_for(lambda: _both_shards_started(tmp_path, client), 120, "both shards started")
    finally:
        client.kill()
    client.wait()
    took = wait_for(lambda: not shards_running(dask_client, "ticks"), LEASE + STOP_BOUND, "shards stopping")
    written = set(os.listdir(tmp_path))
    assert len(written) < 2 * 2000, took                   # they stopped long before their end
    assert not shards_running(dask_client, "ticks") and set(os.listdir(tmp_path)) == written


def test_the_shards_of_a_frozen_client_stop_when_its_lease_lapses(tmp_path: Path, dask_client) -> None:
    """SIGSTOP: the client's connection stays open, so only the beat tells; it stops, the shards
    lapse after the lease.  Continued, the client learns it and fails with one line."""
    client = _start_client(dask_client.scheduler.address, tmp_path)
    try:
        wait_for(lambda: _both_shards_started(tmp_path, client), 120, "both shards started")
        client.send_signal(signal.SIGSTOP)
        took = wait_for(lambda: not shards_running(dask_client, "ticks"), LEASE + STOP_BOUND,
                        "shards stopping")
        written = len(os.listdir(tmp_path))
        assert written < 2 * 2000, took
        client.send_signal(signal.SIGCONT)
        _out, err = client.communicate(timeout=120)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 1, err
    assert err.strip().startswith("error: the job's lease lapsed: this client could not renew it"), err
    assert "$MANYFILES_CLUSTER_LEASE" in err and "rerun to resume" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_shard_whose_worker_lost_the_lease_runs_again_and_carries_its_notes(tmp_path: Path,
                                                                              dask_client) -> None:
    """A shard that stopped on a lapsed lease while its client kept renewing was on a worker cut off
    from the scheduler: the client runs it again (a new task), the job goes on, and the new attempt
    knows what the stopped ones noted (their work is counted once).  Before: the job failed with
    ``LeaseLapsed: ...`` (the multi-host form: tests/netns, a worker cut off from the scheduler)."""
    cloudpickle.register_pickle_by_value(leasejobs)
    report = run_job(LapseJob(folder=str(tmp_path), n=3, lapses=2), dask_client)
    assert (report.items, report.shards, report.reruns) == (3, 3, 6)
    for shard in range(3):
        assert (tmp_path / str(shard)).read_text().splitlines() == ["attempt 0", "attempt 1"]


def test_a_shard_that_keeps_losing_the_lease_ends_the_job_with_one_line(tmp_path: Path, dask_client) -> None:
    from manyfiles.scale._dask import MAX_LAPSES

    cloudpickle.register_pickle_by_value(leasejobs)
    with pytest.raises(lease.LeaseLapsed) as caught:
        run_job(LapseJob(folder=str(tmp_path), n=1, lapses=MAX_LAPSES), dask_client)
    message = str(caught.value)
    assert message.startswith(f"shard 0 stopped {MAX_LAPSES} times, its worker each time cut off from the "
                              "Dask scheduler at tcp://"), message
    assert "$MANYFILES_CLUSTER_LEASE" in message and message.endswith("rerun to resume")
    assert "\n" not in message and os.listdir(tmp_path) == []


def test_in_process_nothing_lapses_and_no_attempt_came_before(tmp_path: Path) -> None:
    assert lease.current() is lease.NO_LEASE and not lease.current().lapsed
    report = run_job(TickJob(folder=str(tmp_path), n=2, ticks=3), InProcessExecutor())
    assert report.items == 6 and report.reruns == 0 and len(os.listdir(tmp_path)) == 6


@pytest.mark.parametrize("value", ["0", "-3", "soon", "inf", "nan"])
def test_a_bad_lease_setting_is_a_usage_error_before_any_cluster_starts(monkeypatch, value) -> None:
    monkeypatch.setenv(lease.LEASE_ENV, value)
    with pytest.raises(UsageError, match=r"MANYFILES_CLUSTER_LEASE=.*: the cluster lease is a number"):
        run_job(NoopJob(), "local:1")
