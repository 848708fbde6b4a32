"""The executor seam on a real 2-process LocalCluster: merged reports, errors, progress, worker loss."""

from __future__ import annotations

import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import pytest

from manyfiles import scale, trace
from manyfiles._core.report import Failure, Report
from manyfiles.errors import ManyfilesError, MissingExtra, UsageError
from manyfiles.listing import _cluster as listing_cluster
from manyfiles.scale.executor import (
    ClusterReport,
    InProcessExecutor,
    Job,
    ShardResult,
    connect,
    merge_report,
    parse_cluster,
    run_job,
)
from manyfiles.trace import iotrace

# The jobs below are defined in this test module, which the workers cannot import: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass(kw_only=True)
class CountReport(Report):
    done: int = 0
    bytes: int = 0
    per_kind: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    label: str = ""


@dataclass(frozen=True)
class MarkerJob(Job):
    """Shard i writes ``folder/i.<pid>`` when it starts, sleeps, and reports i items; shards
    below ``fan`` find two more shards each (work found while running)."""

    folder: str
    n: int = 6
    fan: int = 0
    sleep: float = 0.0
    fail: int = -1
    name = "markers"
    unit = "things"

    def shards(self):
        return range(self.n)

    def new_report(self) -> CountReport:
        return CountReport()

    def run(self, shard: int, publish) -> ShardResult:
        Path(self.folder, f"{shard}.{os.getpid()}").touch()
        if shard == self.fail:
            raise UsageError(f"shard {shard} refused")
        deadline = time.monotonic() + self.sleep
        while time.monotonic() < deadline:
            publish(shard // 2, 10, 0)
            time.sleep(0.05)
        report = CountReport(done=shard, bytes=10 * shard, per_kind={"even" if shard % 2 == 0 else "odd": 1},
                             notes=["same note"], label="L")
        if shard == 3:
            report.failures.append(Failure(f"item-{shard}", "broken", "EIO"))
        more = [100 + 2 * shard, 101 + 2 * shard] if shard < self.fan else []
        return ShardResult(report=report, items=shard, bytes=10 * shard, more=more)


def test_merge_report_adds_numbers_concatenates_lists_merges_dicts() -> None:
    # done 1 + 1: small ints are shared objects, the merge must still add them
    a = CountReport(done=1, bytes=5, per_kind={"x": 1}, notes=["n1"], label="")
    a.add_failure("p1", "r1")
    b = CountReport(done=1, bytes=7, per_kind={"x": 2, "y": 1}, notes=["n1", "n2"], label="B", seconds=9)
    b.add_failure("p2", "r2")
    failures = a.failures
    merge_report(a, b)
    assert (a.done, a.bytes, a.per_kind, a.label, a.seconds) == (2, 12, {"x": 3, "y": 1}, "B", 0.0)
    assert a.notes == ["n1", "n2"]
    assert [f.path for f in a.failures] == ["p1", "p2"] and a.failures is failures


def test_merge_report_adds_equal_tallies_and_keeps_frozen_values() -> None:
    """Two slices that each fetched one 200 KiB object with one engine have equal tallies: they
    add up (a comparison that kept the first one left large objects out of s3pull's bytes)."""
    from manyfiles.s3.report import PullReport, Tally
    from manyfiles.shard.layout import Layout
    from manyfiles.shard.report import MigrationReport

    a = PullReport(done=1, engines={"ranged": Tally(1, 204800)})
    merge_report(a, PullReport(done=1, engines={"ranged": Tally(1, 204800)}))
    assert a.engines == {"ranged": Tally(2, 409600)} and a.done == 2
    layout = Layout(levels=(1,), key="prefix")
    m = MigrationReport(op="apply", root="/r", layout=layout)
    merge_report(m, MigrationReport(op="apply", root="/r", layout=layout))
    assert m.layout is layout and m.layout.levels == (1,)


def test_dask_job_merges_every_shard_and_the_shards_they_found(tmp_path: Path, dask_client) -> None:
    job = MarkerJob(folder=str(tmp_path), n=4, fan=2)
    report = scale.run_job(job, dask_client)
    shards = [0, 1, 2, 3, 100, 101, 102, 103]
    assert isinstance(report, ClusterReport) and report.shards == len(shards)
    assert report.done == report.items == sum(shards)                     # read through to the result
    assert report.result.per_kind == {"even": 4, "odd": 4}
    assert report.notes == ["same note"] and report.label == "L"
    assert [f.path for f in report.failures] == ["item-3"] and not report.ok
    assert sum(w.shards for w in report.workers.values()) == len(shards)
    assert sorted(int(n.split(".")[0]) for n in os.listdir(tmp_path)) == shards  # each ran once
    assert report.reruns == 0
    assert "8 shards on" in str(report)


def test_the_same_job_in_process_gives_the_same_report(tmp_path: Path) -> None:
    report = run_job(MarkerJob(folder=str(tmp_path), n=4, fan=2), InProcessExecutor())
    assert (report.shards, report.done, report.result.per_kind) == (8, 412, {"even": 4, "odd": 4})


def test_a_shard_error_stops_the_job_and_keeps_its_class(tmp_path: Path, dask_client) -> None:
    with pytest.raises(UsageError, match=r"shard 2 refused \(on worker .+:\d+\)") as info:
        scale.run_job(MarkerJob(folder=str(tmp_path), n=5, fail=2), dask_client)
    assert info.value.exit_code == 2


def test_progress_shows_the_cluster_total_while_shards_run(tmp_path: Path, dask_client) -> None:
    seen = []
    report = scale.run_job(MarkerJob(folder=str(tmp_path), n=4, sleep=1.0), dask_client, progress=seen.append)
    assert seen[-1].finished and seen[-1].done == report.items == 6 and seen[-1].bytes == 60
    assert seen[-1].failures == 1 and seen[-1].unit == "things"
    # while running, the workers' published counters (shard // 2 per running shard) were summed
    assert any(0 < s.done < 6 and not s.finished for s in seen), seen


def test_a_worker_killed_mid_shard_is_rerun_elsewhere_and_counted_once(tmp_path: Path, dask_client,
                                                                       wait_for_two) -> None:
    job = MarkerJob(folder=str(tmp_path), n=3, sleep=3.0)
    killed = []

    def kill_a_busy_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            started = [n for n in os.listdir(tmp_path)]
            if started:
                pid = int(started[0].split(".")[1])
                time.sleep(0.3)                       # mid-shard: it sleeps 3 s
                os.kill(pid, signal.SIGKILL)
                killed.append(int(started[0].split(".")[0]))
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_busy_worker)
    killer.start()
    report = scale.run_job(job, dask_client)
    killer.join()
    assert killed, "no shard started"
    assert report.shards == 3 and report.items == 0 + 1 + 2          # each shard counted once
    assert report.reruns >= 1
    starts = [n.split(".")[0] for n in os.listdir(tmp_path)]
    assert starts.count(str(killed[0])) == 2                           # the killed shard ran again


@dataclass(frozen=True)
class DieOnceJob(Job):
    """The first attempt of shard 0 SIGKILLs its worker process; every shard then takes ``sleep`` s
    and counts one item."""

    folder: str
    n: int = 8
    sleep: float = 1.0
    name = "die-once"

    def shards(self):
        return range(self.n)

    def new_report(self) -> CountReport:
        return CountReport()

    def run(self, shard: int, publish) -> ShardResult:
        marker = Path(self.folder, f"{shard}.died")
        if shard == 0 and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        deadline = time.monotonic() + self.sleep
        while time.monotonic() < deadline:
            publish(0, 0, 0)
            time.sleep(0.05)
        return ShardResult(report=CountReport(done=1), items=1)


def test_a_local_cluster_is_back_at_its_size_after_dask_closes_a_lost_workers_nanny(tmp_path: Path) -> None:
    """Dask's LocalCluster closes a lost worker's nanny for good when no worker of that name is up
    ``lost-worker-timeout`` (15 s) after the loss: a worker killed twice within 15 s left
    ``--cluster local:N`` one worker short for the rest of the job.  A timeout shorter than a
    restart makes that instant certain; the executor starts the missing worker again."""
    import dask

    # set once distributed is imported (connect imports it): a dask.config.set of a "distributed."
    # key made before removes all of distributed's settings when it ends
    with connect("local:2") as ex, dask.config.set({"distributed.deploy.lost-worker-timeout": "0.1s"}):
        report = ex.run(DieOnceJob(folder=str(tmp_path)))
        ex.client.wait_for_workers(2, timeout=60)
        # the worker started again has our spawn environment too (and left none in this process)
        assert set(ex.client.run(_environ_get, "MALLOC_TRIM_THRESHOLD_").values()) == {None}
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ
    assert (report.items, report.done, report.shards) == (8, 8, 8)
    assert report.reruns >= 1


def test_cluster_argument_forms() -> None:
    assert parse_cluster("local:3") == ("local", 3)
    assert parse_cluster("tcp://10.0.0.5:8786") == ("address", "tcp://10.0.0.5:8786")
    for bad in ("local:0", "local:x", "10.0.0.5:8786", "", "local"):
        with pytest.raises(UsageError, match="--cluster"):
            parse_cluster(bad)
    with pytest.raises(UsageError, match="cluster must be"), connect(42):
        pass


def test_unreachable_scheduler_is_one_line(tmp_path: Path, monkeypatch) -> None:
    from manyfiles.scale import _dask

    monkeypatch.setattr(_dask, "CONNECT_TIMEOUT", "1s")
    with pytest.raises(ManyfilesError, match=r"tcp://127\.0\.0\.1:9: cannot reach the Dask scheduler"):
        listing_cluster.count_tree(tmp_path, cluster="tcp://127.0.0.1:9")


def test_without_dask_cluster_is_a_one_line_missing_extra(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['distributed'] = None\n"
            "from manyfiles.listing import _cluster as listing_cluster\n"
            "try:\n"
            f"    listing_cluster.count_tree({str(tmp_path)!r}, cluster='local:2')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == ('MissingExtra running on a Dask cluster (--cluster) needs the [dask] extra '
                                  '(distributed is not installed): pip install "manyfiles[dask]"'), out.stderr
    assert issubclass(MissingExtra, UsageError)



def _environ_get(name: str) -> str | None:
    """The worker's own variable (``client.run(os.environ.get, ...)`` would read a pickled copy of ours)."""
    return os.environ.get(name)

def test_local_n_starts_a_cluster_traces_its_workers_and_stops_it(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for i in range(20):
        (tree / f"d{i}").mkdir(parents=True)
        for k in range(30):
            (tree / f"d{i}" / f"f{k}").write_bytes(b"")
    # multiprocessing's resource tracker, started by the first spawn of this process, lives as long
    # as the process: started here, before the count, so that it is not taken for the cluster's
    multiprocessing.resource_tracker.ensure_running()
    before = _children()
    out = tmp_path / "run.mftrace"
    with iotrace.tracing(out), connect("local:2") as executor:
        # Dask's default MALLOC_TRIM_THRESHOLD_ makes every getdents buffer an mmap: not in ours
        assert set(executor.client.run(_environ_get, "MALLOC_TRIM_THRESHOLD_").values()) == {None}
        report = listing_cluster.count_tree(tree, cluster=executor, subtree_budget=50, threads=1)
    assert report.entries == 20 * 31
    assert _children() == before                       # the LocalCluster is gone
    ts = trace.load([out])
    worker_pids = {int(f.header["pid"]) for f in ts.files if f.header.get("role") == "worker"}
    assert len(worker_pids) == 2, ts.notes
    listed = [r for r in ts.records() if r.op == "getdents"]
    assert listed and {r.pid for r in listed} <= worker_pids      # the workers listed, not the client
    assert {r.path for r in listed} >= {os.fsencode(tree / f"d{i}") for i in range(20)}


def _children() -> set[int]:
    me = os.getpid()
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        out.add(int(pid))
            except OSError:
                continue
    return out


def test_a_progress_callback_may_ask_dask_while_counters_arrive(tmp_path: Path, dask_client) -> None:
    """The client's progress callback (here: asking the scheduler something each time) runs while
    Dask's event loop delivers the workers' counters: neither may wait for the other (they did:
    the summing lock was held while rendering, and a fastrm kill test hung on it)."""
    asked = []

    def ask(snap) -> None:
        asked.append(len(dask_client.nthreads()))

    outcome: list = []
    runner = threading.Thread(target=lambda: outcome.append(
        scale.run_job(MarkerJob(folder=str(tmp_path), n=8, sleep=1.0), dask_client, progress=ask)))
    runner.start()
    runner.join(120)
    assert not runner.is_alive(), "the job hung"
    assert outcome and outcome[0].items == sum(range(8)) and asked


def test_the_job_shows_a_stall_only_while_every_running_shard_has_stalled() -> None:
    """Workers publish their shard's stall (seconds, last error) with its counters; the client's
    progress says ``stalled Ns: last error: ...`` when nothing moves anywhere (every running shard
    stalled: the shortest stall, aged since heard, the newest error), and stops saying it as soon
    as one shard moves."""
    from manyfiles._core.progress import progress_for
    from manyfiles.scale._jobs import LiveCounts

    seen = []
    with progress_for(seen.append, "s3pull", unit="objects") as p:
        live = LiveCounts(p)
        live.update(0, "a", 5, 50, 0)
        live.update(1, "b", 3, 30, 0, (6.0, "http://10.0.0.2:9000: host unreachable"))
        p.tick(force=True)
        assert seen[-1].stall is None                                    # shard 0 still moves
        live.update(0, "a", 5, 50, 0, [11.0, None])                      # (msgpack sends a list)
        p.tick(force=True)
        stall = seen[-1].stall
        assert 6.0 <= stall.seconds < 60 and stall.error == "http://10.0.0.2:9000: host unreachable"
        assert "stalled 6s: last error: http://10.0.0.2:9000: host unreachable" in str(seen[-1])
        assert seen[-1].done == 8
        live.update(1, "b", 4, 40, 0)                                    # it moves again
        p.tick(force=True)
        assert seen[-1].stall is None and seen[-1].done == 9


def test_a_shard_publishes_at_once_when_its_stall_starts_or_ends() -> None:
    from manyfiles._core.progress import Stall
    from manyfiles.scale._jobs import Throttle

    sent = []
    publish = Throttle(lambda *args: sent.append(args), interval=60.0)
    publish(1)
    publish(2)                                       # throttled
    publish(2, 0, 0, Stall(5.0, "refused"))          # a stall: news
    publish(2, 0, 0, Stall(10.0, "refused"))         # throttled
    publish(3)                                       # moving again: news
    assert sent == [(1, 0, 0, None), (2, 0, 0, Stall(5.0, "refused")), (3, 0, 0, None)]


@dataclass(frozen=True)
class HeardJob(Job):
    """Each shard reports, in ``per_kind``, how its worker judges a refused connection to ``endpoint``."""

    endpoint: str
    name = "heard"

    def shards(self):
        return range(2)

    def new_report(self) -> CountReport:
        return CountReport()

    def run(self, shard: int, publish) -> ShardResult:
        from manyfiles.s3.retry import network_error

        err = network_error(ConnectionRefusedError(111, "Connection refused"), self.endpoint)
        judged = "first contact" if err.first_contact else "outage"
        return ShardResult(report=CountReport(done=1, per_kind={judged: 1}), items=1)


def test_workers_count_the_endpoints_that_answered_the_client(dask_client) -> None:
    """A worker whose first request to S3 meets a cut must ride it out as the outage it is (the client
    listed from that endpoint), not give up after half the stall timeout as on a first contact with an
    endpoint that was never there."""
    from manyfiles.s3.retry import answered

    endpoint = f"http://192.0.2.{os.getpid() % 250 + 1}:9"       # TEST-NET-1, never contacted: a name only
    before = scale.run_job(HeardJob(endpoint), dask_client)
    assert before.result.per_kind == {"first contact": 2}
    answered(endpoint)                                             # the client heard from it (its listing)
    after = scale.run_job(HeardJob(endpoint), dask_client)
    assert after.result.per_kind == {"outage": 2}
