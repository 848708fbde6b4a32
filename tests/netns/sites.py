"""What runs on the lab's hosts (tests/netns/netlab.py): the S3 server, Dask schedulers and workers,
and the commands of a client -- each a real process in its host's namespace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from netlab import Host, Lab, wait_until

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
         "AWS_DEFAULT_REGION": "us-east-1"}
# Dask's diagnostics off (its sampling profiler, the event loop's tick monitor every 20 ms, the system
# monitor every 0.5 s): an idle worker then costs 0.005 CPU-s per second instead of 0.025 here, and
# the lab's two dozen processes share 2 cores with the rest of the suite.  No fault sees them.
QUIET_DASK = {"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False",
              "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL": "1s",
              "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "5s"}
S3_PORT = 9000
DASK_PORT = 8786
START_TIMEOUT = 120       # seconds for a process to come up on a loaded 2-core machine


def base_env(**extra: str) -> dict[str, str]:
    """The environment of every lab process: this one's, without a proxy or an S3 endpoint of the
    outside, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.lower().endswith("_proxy") and not k.startswith(("AWS_", "MANYFILES_", "DASK_"))}
    env.update(CREDS)
    env.update(QUIET_DASK)
    env.update(extra)
    return env


class S3Server:
    """moto on ``host`` (tests/netns/s3host.py), seeded and inspected through its stdin/stdout."""

    def __init__(self, host: Host, log: Path) -> None:
        self.host = host
        self.proc = host.popen([sys.executable, str(HERE / "s3host.py"), host.ip, str(S3_PORT)],
                               env=base_env(), log=None, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=open(log, "ab"))   # noqa: SIM115 (the child holds it)
        self.lock = threading.Lock()
        self.url = self._ask(None)["ready"]

    def _ask(self, cmd: dict | None) -> dict:
        with self.lock:
            if cmd is not None:
                self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
                self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the S3 host exited ({self.proc.poll()})")
        answer = json.loads(line)
        if isinstance(answer, dict) and set(answer) == {"error"}:
            raise RuntimeError(f"the S3 host: {answer['error']}")
        return answer

    def seed(self, bucket: str, objects: dict[str, tuple[int, str]]) -> None:
        """``objects``: key -> (size, seed) of its bytes (``s3util.blob(size, seed)``)."""
        self._ask({"seed": bucket, "objects": objects})

    def delay(self, bucket: str, seconds: float, peer: Host | None = None) -> None:
        """GETs of BUCKET's objects (from ``peer`` only, if given) answered ``seconds`` late (0: on time)."""
        self._ask({"delay": bucket, "seconds": seconds, "from": None if peer is None else peer.ip})

    def inventory(self, bucket: str) -> dict[str, str]:
        """key -> md5 of the bytes the server holds."""
        return self._ask({"inventory": bucket})

    def served(self) -> dict[str, int]:
        """client address -> requests answered so far."""
        return self._ask({"requests": True})


class DaskSite:
    """A Dask scheduler and ``workers`` worker processes (one thread each), each on a host of its own."""

    def __init__(self, lab: Lab, name: str, folder: Path, env: dict[str, str], workers: int = 2) -> None:
        self.lab = lab
        self.name = name
        self.folder = folder
        self.env = env
        self.scheduler_host = lab.host(f"{name}s")
        self.worker_hosts = [lab.host(f"{name}w{i}") for i in range(workers)]
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    @property
    def address(self) -> str:
        return f"tcp://{self.scheduler_host.ip}:{DASK_PORT}"

    def start(self, *, generation: int = 0) -> DaskSite:
        """The scheduler, then the workers; returns once every worker registered."""
        log = self.folder / f"{self.name}-scheduler-{generation}.log"
        self.scheduler = self.scheduler_host.popen(
            [str(BIN / "dask"), "scheduler", "--host", self.scheduler_host.ip, "--port", str(DASK_PORT),
             "--no-dashboard"], env=self.env, log=log)
        wait_until(lambda: "Scheduler at:" in _text(log) or self._died(self.scheduler, log), START_TIMEOUT,
                   f"{self.name}'s scheduler starting")
        logs = []
        self.workers = []
        for i, host in enumerate(self.worker_hosts):
            wlog = self.folder / f"{self.name}-worker{i}-{generation}.log"
            logs.append(wlog)
            self.workers.append(host.popen(
                [str(BIN / "dask"), "worker", self.address, "--host", host.ip, "--nthreads", "1",
                 "--no-nanny", "--no-dashboard", "--name", f"{host.name}"], env=self.env, log=wlog))
        for proc, wlog in zip(self.workers, logs, strict=True):
            wait_until(lambda p=proc, w=wlog: "Registered to:" in _text(w) or self._died(p, w), START_TIMEOUT,
                       f"{self.name}'s workers registering")
        return self

    @staticmethod
    def _died(proc: subprocess.Popen, log: Path) -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {_text(log)[-2000:]}")
        return False

    def stop(self) -> None:
        """SIGKILL the scheduler and the workers (the hosts stay)."""
        for host in [self.scheduler_host, *self.worker_hosts]:
            host.kill()


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


class Command:
    """A client command (a console script of ours) running on a host; stderr goes to a file read as
    it grows, each line stamped with the monotonic time it was first seen (see :meth:`lines`)."""

    def __init__(self, host: Host, script: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.started = time.monotonic()
        self.proc = host.popen([str(BIN / script), *args], env=env, log=log)
        self.seen: list[tuple[float, str]] = []
        self._offset = 0

    def lines(self) -> list[tuple[float, str]]:
        """Every stderr line so far, with when it was first seen here."""
        text = _text(self.log)
        now = time.monotonic()
        for line in text[self._offset:].splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            self._offset += len(line)
            self.seen.append((now, line.rstrip("\n")))
        return self.seen

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.lines()
        return code

    @property
    def stderr(self) -> str:
        return _text(self.log)


WORKER_LINE = re.compile(r"^\S+: (?P<host>[^\s:]+):(?P<pid>\d+): (?P<shards>[\d,]+) shards, ")


def shards_per_worker(stderr: str) -> dict[int, int]:
    """pid -> shards run, from the per-worker lines a cluster command prints after its summary."""
    out = {}
    for line in stderr.splitlines():
        m = WORKER_LINE.match(line)
        if m:
            out[int(m.group("pid"))] = int(m.group("shards").replace(",", ""))
    return out
