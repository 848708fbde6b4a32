"""s3pull on a real 2-process Dask cluster against moto over HTTP: key ranges listed in parallel,
slices downloaded by the workers, every object byte-exact, one merged report, worker loss."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import cloudpickle
import pytest
from s3util import CREDS, blob, files_under

from clusterutil import kill_a_busy_worker, shards_running, wait_for
from manyfiles.s3 import pull
from manyfiles.s3.keys import STATE_DIR
from manyfiles.scale.executor import ClusterReport

KiB = 1024


def _set_environ(env: dict[str, str]) -> None:
    os.environ.update(env)


# shipped by value: the workers cannot import this module.  (``client.run(os.environ.update, ...)``
# would update a pickled copy of os.environ: the workers only had the credentials when the shared
# cluster happened to be started after moto's fixture had set them here.)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def s3_cluster(dask_client, moto_server):
    """The shared cluster, its workers given moto's credentials (a real cluster has its own)."""
    dask_client.run(_set_environ, CREDS)
    return dask_client


def seed(put, n: int, prefix: str = "data/") -> dict[str, bytes]:
    """n objects over hex-named "folders" (cuts fall among hex digits), a few of them larger."""
    want = {}
    for i in range(n):
        key = f"{prefix}{i * 7919 % 4096:03x}/obj-{i:05d}.bin"
        size = 200 * KiB if i % 97 == 0 else 300 + i % 1000
        want[key[len(prefix):]] = put(key, blob(size, key))
    return want


def test_pull_on_the_cluster_installs_every_object_exactly(bucket, settings, s3_cluster, tmp_path) -> None:
    name, put = bucket
    want = seed(put, 400)
    put("other/not-this.txt", b"outside the prefix")
    dest = tmp_path / "dest"
    report = pull(f"s3://{name}/data/", str(dest), settings=settings, cluster=s3_cluster, slice_keys=40,
                  part_size=64 * KiB, ranged_min=128 * KiB)
    assert isinstance(report, ClusterReport) and report.ok, report.failures
    assert files_under(dest) == want
    assert (report.done, report.skipped, report.bytes) == (400, 0, sum(map(len, want.values())))
    assert report.items == 400 and len(report.workers) == 2, report.worker_lines()
    assert report.shards >= 400 // 40 * 2                              # list ranges and slices
    slices = glob.glob(str(dest / STATE_DIR / "shards" / "*.jsonl"))
    assert len(slices) >= 400 // 40                                   # the slices' own state files
    assert (dest / STATE_DIR / "state.jsonl").stat().st_size == 0      # nobody appended to one file
    assert os.listdir(dest / STATE_DIR / "tmp") == []

    again = pull(f"s3://{name}/data/", str(dest), settings=settings, cluster=s3_cluster, slice_keys=40)
    assert (again.done, again.skipped) == (0, 400)                     # each slice read its own records
    local = pull(f"s3://{name}/data/", str(dest), settings=settings)
    assert (local.done, local.skipped) == (0, 400)                     # a local run reads them all


def test_wildcards_filters_and_a_manifest_on_the_cluster(bucket, settings, s3_cluster, tmp_path) -> None:
    name, put = bucket
    want = seed(put, 120)
    picked = {k: v for k, v in want.items() if k.endswith(("1.bin", "3.bin"))}
    dest = tmp_path / "wild"
    report = pull(f"s3://{name}/data/*[13].bin", str(dest), settings=settings, cluster=s3_cluster,
                  slice_keys=25, exclude=["*/obj-0000*"])
    picked = {k: v for k, v in picked.items() if not k.split("/")[1].startswith("obj-0000")}
    assert report.ok and files_under(dest) == picked and report.done == len(picked)

    manifest = tmp_path / "keys.txt"
    keys = sorted(want)[::3]
    manifest.write_text("".join(f"data/{k}\n" for k in keys))
    dest = tmp_path / "listed"
    report = pull(f"s3://{name}/data/", str(dest), settings=settings, cluster=s3_cluster, slice_keys=10,
                  manifest=str(manifest))
    assert report.ok and files_under(dest) == {k: want[k] for k in keys}
    assert report.shards == -(-len(keys) // 10)                         # the client cut the manifest


def test_missing_bucket_on_the_cluster_creates_nothing(settings, s3_cluster, tmp_path) -> None:
    from manyfiles.errors import NotFound

    with pytest.raises(NotFound, match="no such bucket"):
        pull("s3://no-such-bucket-here/x/", str(tmp_path / "d"), settings=settings, cluster=s3_cluster)
    assert not (tmp_path / "d").exists()



@pytest.mark.parametrize(("option", "message"), [({"strategy": "fastest"}, "unknown strategy"),
                                                 ({"concurrency": 0}, "concurrency must be"),
                                                 ({"no_such_option": 1}, "unknown option")])
def test_cluster_options_are_checked_before_anything(tmp_path, option, message) -> None:
    """As without a cluster: a bad option is a UsageError on the client, before the listing and
    before DEST exists (the cluster address is never reached)."""
    from manyfiles.errors import UsageError

    with pytest.raises(UsageError, match=message):
        pull("s3://bucket/x/", str(tmp_path / "d"), cluster="tcp://127.0.0.1:1", **option)
    assert not (tmp_path / "d").exists()

def test_a_worker_killed_mid_slice_loses_nothing(bucket, settings, s3_cluster, wait_for_two,
                                                 tmp_path) -> None:
    name, put = bucket
    want = seed(put, 600)
    dest = tmp_path / "dest"
    # the cluster total says downloads are under way: SIGKILL a worker that is running a shard
    kill_when_downloading, killed = kill_a_busy_worker(s3_cluster, after=60)

    report = pull(f"s3://{name}/data/", str(dest), settings=settings, cluster=s3_cluster, slice_keys=100,
                  part_size=64 * KiB, ranged_min=128 * KiB, progress=kill_when_downloading)
    wait_for_two()
    assert killed, "the job ended before a worker could be killed"
    assert killed[0] not in s3_cluster.run(os.getpid).values()
    assert report.ok, report.failures
    assert report.reruns >= 1
    assert files_under(dest) == want                                    # every object, byte for byte
    # the summary is what happened on disk: every object installed by this run, each counted once
    # (those the lost worker installed too), and their bytes (the large ones' resumed parts too)
    assert (report.done, report.skipped) == (600, 0)
    assert report.bytes == sum(map(len, want.values())) == sum(t.bytes for t in report.engines.values())
    assert report.items == 600
    assert os.listdir(dest / STATE_DIR / "tmp") == []                  # the lost worker's temps too
    # and a rerun finds everything installed (the killed attempt's records or the re-run's)
    again = pull(f"s3://{name}/data/", str(dest), settings=settings, cluster=s3_cluster, slice_keys=100)
    assert (again.done, again.skipped) == (0, 600)


def test_s3pull_cli_cluster(bucket, cli_env, run_cli, tmp_path) -> None:
    name, put = bucket
    want = seed(put, 30)
    dest = tmp_path / "cli"
    proc = run_cli("s3pull", f"s3://{name}/data/", str(dest), "--cluster", "local:1", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert files_under(dest) == want
    err = proc.stderr.decode()
    assert "s3pull: 30 downloaded" in err and "s3pull: " in err.splitlines()[-1] and " shards, " in err
    proc = run_cli("s3pull", f"s3://{name}/data/", str(dest), "--cluster", "local:1", "--dry-run",
                   env=cli_env)
    assert proc.returncode == 2 and "not with a cluster" in proc.stderr.decode()


# -- the lease: a killed client leaves no shard writing -------------------------------------------

LEASE = 5.0          # MANYFILES_CLUSTER_LEASE of the killed client
STOP_BOUND = 20.0    # seconds past the lease within which its shards must have stopped


def test_a_killed_client_leaves_no_shard_writing_into_dest(bucket, proxy, settings, s3_cluster,
                                                            tmp_path) -> None:
    """The client SIGKILLed once the first object is on disk: within the lease (plus a bound) no
    shard of it runs any more, so nothing else lands in DEST, and a local rerun completes it.
    Each slice of 200 objects would take >= 40 s (one connection, 0.2 s per GET through the proxy):
    without the lease, the running ones went on long after the bound."""
    name, put = bucket
    want = seed(put, 600)
    proxy.delay = 0.2
    dest = tmp_path / "dest"
    code = ("import sys\n"
            "from manyfiles.s3 import ClientSettings, pull\n"
            f"pull({f's3://{name}/data/'!r}, {str(dest)!r}, cluster={s3_cluster.scheduler.address!r},\n"
            f"     settings=ClientSettings(endpoint_url={proxy.url!r}, region='us-east-1'),\n"
            "     slice_keys=200, concurrency=1)\n")
    env = {**os.environ, **CREDS, "MANYFILES_CLUSTER_LEASE": str(LEASE)}
    client = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: files_under(dest) if dest.exists() else False, 120, "the first object")
    finally:
        client.kill()
    client.wait()
    assert client.returncode == -signal.SIGKILL, client.stderr.read()

    took = wait_for(lambda: not shards_running(s3_cluster, "s3pull"), LEASE + STOP_BOUND,
                    "the killed client's shards stopping")
    stopped = files_under(dest)
    assert 0 < len(stopped) < len(want), took                        # they stopped mid-job
    assert all(want[k] == v for k, v in stopped.items())             # nothing half-written under a final name
    assert files_under(dest) == stopped                              # nothing arrives any more

    local = pull(f"s3://{name}/data/", str(dest), settings=settings)
    assert local.ok, local.failures
    assert files_under(dest) == want
    assert local.done + local.skipped == len(want)
    assert os.listdir(dest / STATE_DIR / "tmp") == []
