"""The multi-host scenarios: each builds its own Dask site (a scheduler and two workers, each a
host of the lab) and client host, runs real ``s3pull --cluster`` commands against the lab's S3
host, injects its fault at a moment it observes (the S3 host counts who it serves), and records
what happened in :class:`Outcome`\\ s; tests/netns/test_network_faults.py asserts on them.

They run at the same time, one thread each (a scenario mostly waits: for a cut to last, for a
lease to lapse), so the harness takes about as long as its longest scenario.  Each scenario has
its own bucket and data folder (``root/dest`` and nothing else), and its own Dask settings.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from netlab import Host, Lab, wait_until
from s3util import files_under
from sites import Command, DaskSite, S3Server, base_env, shards_per_worker

from manyfiles.s3.keys import STATE_DIR

PROGRESS_LINE = re.compile(r"^s3pull: [\d,]+ objects[, ]")
CUT = 20.0              # seconds of the short cuts (the blips)
S3_CUT = 60.0           # seconds the workers are cut off from S3 (an outage of a minute, ridden out)
STALL_TIMEOUT = 20.0    # --stall-timeout of the scenario where S3 is gone for good (default 120 s)
LEASE = 10.0            # MANYFILES_CLUSTER_LEASE of the blip scenarios: shorter than the cut
CLIENT_LEASE = 5.0      # ... of the client-cut scenario
# the scheduler drops a worker it lost in ~11 s (Dask's tcp timeout: its default 30 s, at least 11)
FAST_DASK = {"DASK_DISTRIBUTED__COMM__TIMEOUTS__TCP": "11s"}
JOB_TIMEOUT = 240.0     # a command that has not ended by then is a failure of its own
GATE_TIMEOUT = 60.0     # the other scenarios start by then whatever the first one does
FIRST = ("s3-outage",)  # the longest scenario (a minute's cut): it starts alone


@dataclass
class Run:
    """One command: its exit code, stderr, and when it started and ended (monotonic)."""

    code: int | None
    stderr: str
    started: float
    ended: float
    lines: list[tuple[float, str]] = field(default_factory=list)

    @property
    def messages(self) -> list[str]:
        """The stderr lines that are not progress lines."""
        return [line for _, line in self.lines if not PROGRESS_LINE.match(line)]


@dataclass
class Outcome:
    """What a scenario saw: its runs, the bucket as the S3 host holds it, DEST, and named moments."""

    runs: list[Run] = field(default_factory=list)
    bucket: dict[str, str] = field(default_factory=dict)       # key under the prefix -> md5
    dest: dict[str, str] = field(default_factory=dict)         # path under DEST -> md5
    outside: list[str] = field(default_factory=list)           # what the data folder holds but DEST
    leftovers: list[str] = field(default_factory=list)         # files in DEST/.s3pull/tmp
    moments: dict[str, float] = field(default_factory=dict)    # name -> monotonic time
    served: dict[str, dict[str, int]] = field(default_factory=dict)   # moment -> requests per address
    hosts: dict[str, str] = field(default_factory=dict)        # role -> address
    facts: dict[str, object] = field(default_factory=dict)

    def served_by(self, role: str, moment: str) -> int:
        return self.served[moment].get(self.hosts[role], 0)


class Stage:
    """What a scenario works with: the lab, the S3 host, a folder for its logs and one for its data.

    ``gate``: the scenario starts its Dask sites once it is set (the longest scenario goes first,
    alone on the CPUs until its fault is under way, then opens it: :meth:`open_gate`)."""

    def __init__(self, lab: Lab, s3: S3Server, logs: Path, data: Path, name: str,
                 gate: threading.Event | None = None) -> None:
        self.lab, self.s3, self.logs, self.name = lab, s3, logs, name
        self.gate = gate
        self.opens: threading.Event | None = None      # the gate this scenario opens, if it goes first
        self.root = data / name                   # holds DEST and nothing else
        self.root.mkdir(parents=True)
        self.dest = self.root / "dest"
        self.bucket = f"mfnet-{name}"
        self.outcome = Outcome()
        self.t0 = time.monotonic()

    def mark(self, moment: str) -> float:
        now = self.outcome.moments[moment] = time.monotonic()
        self.outcome.served[moment] = self.s3.served()
        return now

    def seed(self, n: int, bucket: str | None = None) -> str:
        """``n`` objects of 300 B to 4 KiB under ``data/`` of a new bucket (returned)."""
        bucket = bucket or self.bucket
        objects = {f"data/{i * 7919 % 4096:03x}/obj-{i:05d}": (300 + i * 37 % 3800, f"{bucket}:{i}")
                   for i in range(n)}
        self.s3.seed(bucket, objects)
        return bucket

    def site(self, env: dict[str, str], tag: str = "") -> DaskSite:
        if self.gate is not None:
            self.gate.wait(GATE_TIMEOUT)
        return DaskSite(self.lab, f"{self.name}{tag}", self.logs, env).start()

    def open_gate(self) -> None:
        """Let the other scenarios start (this one's fault is under way)."""
        if self.opens is not None:
            self.opens.set()

    def sites(self, env: dict[str, str], *tags: str) -> list[DaskSite]:
        """Sites started at the same time (each start mostly waits for its processes)."""
        with ThreadPoolExecutor(len(tags)) as pool:
            return list(pool.map(lambda tag: self.site(env, tag), tags))

    def env(self, **extra: str) -> dict[str, str]:
        return base_env(AWS_ENDPOINT_URL=self.s3.url, MANYFILES_RETRY_BASE="0.05", **extra)

    def pull(self, client: Host, site: DaskSite, env: dict[str, str], *, bucket: str | None = None,
             dest: Path | None = None, jobs: int = 8, log: str = "client",
             extra: tuple[str, ...] = ()) -> Command:
        return Command(client, "s3pull", [f"s3://{bucket or self.bucket}/data/", str(dest or self.dest),
                                          "--cluster", site.address, "--progress", "-j", str(jobs), *extra],
                       env, self.logs / f"{self.name}-{log}.log")

    def finish(self, cmd: Command, timeout: float = JOB_TIMEOUT, into: Outcome | None = None) -> Run:
        """Wait for ``cmd`` to end (a failure after ``timeout``), and record it in ``into`` (default:
        the scenario's outcome)."""
        try:
            code = cmd.wait(timeout)
        except Exception:
            cmd.proc.kill()
            raise
        run = Run(code, cmd.stderr, cmd.started, time.monotonic(), list(cmd.lines()))
        (into or self.outcome).runs.append(run)
        return run

    def settle(self, into: Outcome | None = None, bucket: str | None = None,
               dest: Path | None = None) -> None:
        """Record the bucket, DEST and what else DEST's parent folder holds (default: the
        scenario's own)."""
        o = into or self.outcome
        dest = dest or self.dest
        o.bucket = {k[len("data/"):]: md5 for k, md5 in self.s3.inventory(bucket or self.bucket).items()
                    if k.startswith("data/")}
        o.dest = files_md5(dest)
        o.outside = sorted(n for n in os.listdir(dest.parent) if n != dest.name)
        tmp = dest / STATE_DIR / "tmp"
        o.leftovers = sorted(os.listdir(tmp)) if tmp.is_dir() else []


def files_md5(root: Path) -> dict[str, str]:
    """path under ``root`` -> md5 of every file but s3pull's state folder."""
    return {path: hashlib.md5(data).hexdigest() for path, data in files_under(root).items()}


def newest_write(root: Path) -> float:
    """The latest mtime (wall clock) of anything under ``root``, its state and temp files included."""
    newest = 0.0
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in [".", *filenames]:
            with contextlib.suppress(FileNotFoundError):      # a temp file renamed meanwhile
                newest = max(newest, os.stat(os.path.join(dirpath, name)).st_mtime)
    return newest


def _busy(stage: Stage, host: Host, since: dict[str, int], requests: int = 20) -> Callable[[], bool]:
    """A condition: ``host`` has been served ``requests`` more since the ``since`` snapshot."""
    return lambda: stage.s3.served().get(host.ip, 0) >= since.get(host.ip, 0) + requests


# -- the scenarios --------------------------------------------------------------------------------------

def worker_blip(stage: Stage, how: str) -> None:
    """One worker cut for CUT s mid-job ("link": its cable unplugged; "drop": every packet it sends
    vanishes), then back; the job must end exit 0, DEST exact, in one run, and the other worker keep
    working meanwhile."""
    stage.seed(400)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(LEASE))
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    cut, other = site.worker_hosts
    stage.outcome.hosts.update(cut=cut.ip, other=other.ip, client=client.ip)
    stage.s3.delay(stage.bucket, 0.05)                  # 4 slices of 100, ~1.5 s each at -j 8
    start = stage.s3.served()
    cmd = stage.pull(client, site, env)
    wait_until(_busy(stage, cut, start), 120, f"{stage.name}: the worker to cut downloading")
    peers = [site.scheduler_host, other, client, stage.s3.host]
    cut.link(False) if how == "link" else cut.drop(peers)
    stage.mark("cut")
    time.sleep(CUT)
    stage.mark("healed")
    cut.link(True) if how == "link" else cut.undrop(peers)
    stage.finish(cmd)
    stage.mark("ended")
    stage.settle()


def permanent_cut(stage: Stage) -> None:
    """One worker's cable unplugged for good mid-job: the scheduler drops it (FAST_DASK) and Dask
    runs its shards on the other; exit 0, DEST exact."""
    stage.seed(400)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(LEASE), **FAST_DASK)
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    cut, other = site.worker_hosts
    stage.outcome.hosts.update(cut=cut.ip, other=other.ip)
    stage.s3.delay(stage.bucket, 0.05)
    start = stage.s3.served()
    cmd = stage.pull(client, site, env)
    wait_until(_busy(stage, cut, start), 120, f"{stage.name}: the worker to cut downloading")
    cut.link(False)
    stage.mark("cut")
    stage.finish(cmd)
    stage.mark("ended")
    stage.settle()


def scheduler_cut(stage: Stage) -> None:
    """One worker cut off from the scheduler only (it still reaches S3) for CUT s, longer than the
    lease, while it downloads (slowly: its GETs are answered 0.3 s late): its shards stop when
    the lease lapses there, and run again once their results tell the client; the job goes on,
    exit 0, DEST exact, every object counted once."""
    stage.seed(400)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(CLIENT_LEASE))
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    cut, other = site.worker_hosts
    stage.outcome.hosts.update(cut=cut.ip, other=other.ip)
    stage.s3.delay(stage.bucket, 0.3, cut)              # its 100-object slices last ~15 s at -j 4
    start = stage.s3.served()
    cmd = stage.pull(client, site, env, jobs=4)
    wait_until(_busy(stage, cut, start, 8), 120, f"{stage.name}: the worker to cut downloading")
    cut.drop([site.scheduler_host])
    stage.mark("cut")
    time.sleep(CUT)
    stage.mark("healed")
    stage.s3.delay(stage.bucket, 0, cut)
    cut.undrop([site.scheduler_host])
    stage.finish(cmd)
    stage.mark("ended")
    stage.settle()


def client_cut(stage: Stage) -> None:
    """The client's cable unplugged mid-job, for good: every shard stops writing into DEST within
    the lease (+5 s), the client ends with one line, exit 1; then, the client back, a rerun
    completes DEST exactly."""
    stage.seed(800)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(CLIENT_LEASE))
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    stage.s3.delay(stage.bucket, 0.1)                   # ~10 s of work: still going after the lease
    start = stage.s3.served()
    cmd = stage.pull(client, site, env)
    wait_until(_busy(stage, site.worker_hosts[0], start, 40), 120, f"{stage.name}: downloads going")
    stage.outcome.facts["cut_wall"] = time.time()
    client.link(False)
    stage.mark("cut")
    stage.finish(cmd, timeout=120)
    stage.mark("client ended")
    # watch DEST until well past lease + 5 s after the cut: the newest write must be before that
    wait_until(lambda: time.monotonic() > stage.outcome.moments["cut"] + CLIENT_LEASE + 10, 60, "")
    stage.outcome.facts["newest_write"] = newest_write(stage.dest)
    stage.outcome.facts["files_at_stop"] = files_md5(stage.dest)
    client.link(True)
    stage.s3.delay(stage.bucket, 0)
    stage.finish(stage.pull(client, site, env, log="rerun"))
    stage.settle()


def scheduler_kill(stage: Stage) -> None:
    """The scheduler SIGKILLed mid-job: the client ends with one line, exit 1; a rerun on a new
    scheduler and new workers completes DEST exactly.  Meanwhile (the "spread" outcome) that new
    cluster pulls 5,004 keys: both its workers run a fair part of the shards."""
    stage.seed(600)
    wide = stage.seed(5004, f"{stage.bucket}-wide")
    wide_dest = stage.root.parent / f"{stage.name}-wide" / "dest"
    wide_dest.parent.mkdir()
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(LEASE))
    site, new = stage.sites(env, "", "n")
    client = stage.lab.host(f"{stage.name}c")
    stage.s3.delay(stage.bucket, 0.05)
    start = stage.s3.served()
    cmd = stage.pull(client, site, env)
    wide_cmd = stage.pull(client, new, env, bucket=wide, dest=wide_dest, log="wide")
    wait_until(_busy(stage, site.worker_hosts[0], start, 40), 120, f"{stage.name}: downloads going")
    stage.mark("kill")
    os.kill(site.scheduler.pid, signal.SIGKILL)
    stage.outcome.facts["scheduler"] = site.address
    stage.finish(cmd, timeout=120)
    stage.mark("client ended")
    spread = stage.outcome.facts["spread"] = Outcome()
    run = stage.finish(wide_cmd, into=spread)
    spread.facts["shards"] = shards_per_worker(run.stderr)
    spread.facts["workers"] = {proc.pid for proc in new.workers}
    stage.settle(spread, wide, wide_dest)
    site.stop()                           # the old workers are gone too
    stage.s3.delay(stage.bucket, 0)
    stage.finish(stage.pull(client, new, env, log="rerun"))
    stage.mark("ended")
    stage.settle()


def _first_line(cmd: Command, text: str, since: float, until: float) -> float | None:
    """When ``cmd`` first printed a stderr line holding ``text`` after ``since`` (monotonic), watching
    until ``until``; None if it did not."""
    while time.monotonic() < until:
        for seen, line in cmd.lines():
            if seen >= since and text in line:
                return seen
        if cmd.proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


def s3_outage(stage: Stage) -> None:
    """Both workers cut off from S3 (every packet they send it vanishes) for a minute mid-job, then
    back: the client's progress says the job stalled, with the last error, within 15 s of the cut;
    the job rides the outage out (the stall timeout is 120 s): exit 0, DEST exact, one run."""
    stage.seed(400)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(LEASE))
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    stage.s3.delay(stage.bucket, 0.1)
    start = stage.s3.served()
    cmd = stage.pull(client, site, env)
    wait_until(_busy(stage, site.worker_hosts[0], start), 120, f"{stage.name}: downloads going")
    for worker in site.worker_hosts:
        worker.drop([stage.s3.host])
    cut = stage.mark("cut")
    stage.open_gate()
    seen = _first_line(cmd, "stalled", cut, cut + S3_CUT)
    stage.outcome.facts["stalled_shown_after"] = None if seen is None else seen - cut
    time.sleep(max(0.0, cut + S3_CUT - time.monotonic()))
    for worker in site.worker_hosts:
        worker.undrop([stage.s3.host])
    stage.mark("healed")
    stage.finish(cmd)
    stage.mark("ended")
    stage.settle()


def s3_lost(stage: Stage) -> None:
    """Both workers cut off from S3 for good mid-job (``--stall-timeout 20``): the job ends with one
    line naming the endpoint and the cause, exit 1, within the stall timeout and the retry budget;
    nothing half-written; S3 back, a rerun completes DEST exactly."""
    stage.seed(400)
    env = stage.env(MANYFILES_CLUSTER_LEASE=str(LEASE))
    site = stage.site(env)
    client = stage.lab.host(f"{stage.name}c")
    stage.s3.delay(stage.bucket, 0.1)
    start = stage.s3.served()
    cmd = stage.pull(client, site, env, extra=("--stall-timeout", f"{STALL_TIMEOUT:g}"))
    wait_until(_busy(stage, site.worker_hosts[0], start), 120, f"{stage.name}: downloads going")
    for worker in site.worker_hosts:
        worker.drop([stage.s3.host])
    stage.mark("cut")
    stage.finish(cmd, timeout=120)
    stage.mark("client ended")
    stage.outcome.facts["files_at_stop"] = files_md5(stage.dest)
    for worker in site.worker_hosts:
        worker.undrop([stage.s3.host])
    stage.s3.delay(stage.bucket, 0)
    stage.finish(stage.pull(client, site, env, log="rerun"))
    stage.settle()


SCENARIOS: dict[str, Callable[[Stage], None]] = {
    "link-down": lambda st: worker_blip(st, "link"),
    "silent-drop": lambda st: worker_blip(st, "drop"),
    "permanent-cut": permanent_cut,
    "scheduler-cut": scheduler_cut,
    "client-cut": client_cut,
    "scheduler-kill": scheduler_kill,
    "s3-outage": s3_outage,
    "s3-lost": s3_lost,
}
OUTCOMES = {"spread": "scheduler-kill"}     # outcomes that another scenario produces
