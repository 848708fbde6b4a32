"""s3push on a real 2-process Dask cluster against moto (behind the fault proxy, which checks every
signature and every body's checksum): the files listed here, uploaded by slices on the workers,
every object read back; refusals in the merged report; a worker killed mid-job loses nothing."""

from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
from s3util import CREDS, blob
from test_push import bucket_contents, make_tree, uploads_in_progress

from clusterutil import kill_a_busy_worker
from manyfiles.push import push
from manyfiles.scale.executor import ClusterReport

MiB = 1 << 20
SMALL = dict(part_size=5 * MiB, multipart_threshold=5 * MiB, jobs=4)


def _set_environ(env: dict[str, str]) -> None:
    os.environ.update(env)


cloudpickle.register_pickle_by_value(sys.modules[__name__])    # (the workers cannot import this module)


@pytest.fixture
def cluster(dask_client, moto_direct):
    """The shared cluster, its workers given the test server's credentials."""
    dask_client.run(_set_environ, CREDS)
    return dask_client


def tree_of(n: int) -> dict[str, bytes]:
    files = {f"{i % 7}/f{i:04d}.bin": blob(100 + i % 300, f"c{i}") for i in range(n)}
    files["big/model.bin"] = blob(11 * MiB + 5, "big")        # 3 parts
    return files


def test_push_on_the_cluster_uploads_every_file_by_slices(tmp_path, dest, state, cluster):
    files = tree_of(300)
    src = tmp_path / "src"
    make_tree(src, files)
    with open(os.path.join(os.fsencode(src), b"bad\xff"), "wb") as f:
        f.write(b"x")
    report = push(f"{src}/", dest.url("p/"), settings=dest.settings, retry=dest.retry, state_dir=state,
                  cluster=cluster, **SMALL)
    assert isinstance(report, ClusterReport)
    assert bucket_contents(dest) == {f"p/{k}": v for k, v in files.items()}
    assert [f.code for f in report.failures] == ["bad-name"] and not report.ok
    assert (report.uploaded, report.multipart, report.bytes) == (301, 1, sum(map(len, files.values())))
    assert report.shards >= 3 and report.items == 301                # 300 small files: 100 a slice at most
    assert uploads_in_progress(dest) == []
    with pytest.raises(Exception, match="not with a cluster"):
        push(f"{src}/", dest.url("p/"), settings=dest.settings, cluster=cluster, dry_run=True)


def test_a_worker_killed_mid_job_loses_nothing(tmp_path, dest, state, cluster, wait_for_two):
    files = tree_of(600)
    make_tree(tmp_path / "src", files)
    kill_when_uploading, killed = kill_a_busy_worker(cluster, after=60)

    report = push(f"{tmp_path / 'src'}/", dest.url("p/"), settings=dest.settings, retry=dest.retry,
                  state_dir=state, cluster=cluster, progress=kill_when_uploading, **SMALL)
    wait_for_two()
    assert killed, "the job ended before a worker could be killed"
    assert report.ok, report.failures
    assert report.reruns >= 1
    assert bucket_contents(dest) == {f"p/{k}": v for k, v in files.items()}
    assert report.uploaded + report.skipped == len(files)
    assert uploads_in_progress(dest) == []         # a lost worker's multipart upload resumed or aborted


def test_s3push_cli_cluster(run_cli, tmp_path, dest, state):
    files = {f"d/f{i}.txt": blob(10 + i, f"cli{i}") for i in range(30)}
    make_tree(tmp_path / "src", files)
    env = {**dest.env, "XDG_STATE_HOME": os.fspath(state)}
    proc = run_cli("s3push", f"{tmp_path / 'src'}/", dest.url("p/"), "--cluster", "local:1", env=env)
    assert proc.returncode == 0, proc.stderr
    assert bucket_contents(dest) == {f"p/{k}": v for k, v in files.items()}
    err = proc.stderr.decode()
    assert "s3push: uploaded 30 of 30 files" in err and " shards, " in err.splitlines()[-1]
    proc = run_cli("s3push", f"{tmp_path / 'src'}/", dest.url("p/"), "--cluster", "local:1", "-n", env=env)
    assert (proc.returncode, len(proc.stderr.splitlines())) == (2, 1) and b"not with a cluster" in proc.stderr
